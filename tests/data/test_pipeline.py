"""netcl.data's fast paths: batch gathers, copies enqueued ahead, persistent workers, out-of-band process batches."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyopencl as cl
import pytest

from netcl.data import DataLoader, Dataset, Subset, TensorDataset, default_collate
from netcl.data.loader import COPY_AHEAD


def _arrays(n: int = 11) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.standard_normal((n, 2, 3)), rng.integers(0, 255, (n, 4), dtype=np.uint8), np.arange(n) * 10


# ---- gather_batch ----------------------------------------------------------------------------------------
def test_gather_batch_equals_default_collate_of_the_items():
    x, img, y = _arrays()
    dataset = TensorDataset(x, img, y)
    indices = [4, 0, 10, -1, 4]  # repeats and a negative index, as dataset[i] takes them
    gathered = dataset.gather_batch(indices, lambda shape, dtype: np.full(shape, 77, dtype))
    reference = default_collate([dataset[i] for i in indices])
    assert len(gathered) == 3
    for got, want in zip(gathered, reference, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)  # x: float64 -> float32 is one rounding on both paths
    assert gathered[0].dtype == np.float32


def test_gather_batch_of_a_subset_maps_the_indices():
    x, _, y = _arrays()
    subset = Subset(TensorDataset(x, y), [9, 2, 5, 7])
    gathered = subset.gather_batch([3, 1], lambda shape, dtype: np.empty(shape, dtype))
    np.testing.assert_array_equal(gathered[1], [70, 20])
    np.testing.assert_array_equal(gathered[0], x[[7, 2]].astype(np.float32))
    assert Subset(list(range(5)), [1, 2]).gather_batch([0], np.empty) is None  # the wrapped dataset has none


def test_gather_batch_declines_strings_and_checks_range():
    names = np.array(["a", "bb", "ccc"])
    dataset = TensorDataset(names, np.arange(3))
    assert dataset.gather_batch([0, 1], np.empty) is None
    (batch,) = list(DataLoader(dataset, batch_size=3, device="cpu"))
    assert batch[0] == ["a", "bb", "ccc"]  # item by item: strings stay a list, as default_collate keeps them
    with pytest.raises(IndexError, match="index 3 is out of range for 3 items"):
        TensorDataset(np.arange(3)).gather_batch([0, 3], np.empty)


class GatherFails(Dataset):
    """``gather_batch`` raises; item 5 raises in ``__getitem__``: the loader reports item 5."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError(f"no record {i}")
        return np.full(2, i, np.float32)

    def gather_batch(self, indices, alloc):
        raise RuntimeError("gather_batch is broken")


@pytest.mark.parametrize("num_workers, worker_type", [(0, "thread"), (2, "thread"), (2, "process")])
def test_a_failing_gather_falls_back_to_items_and_names_the_index(device, num_workers, worker_type):
    loader = DataLoader(GatherFails(), batch_size=4, device=device, num_workers=num_workers, worker_type=worker_type)
    iterator = iter(loader)
    np.testing.assert_array_equal(next(iterator).to_host()[:, 0], [0, 1, 2, 3])
    with pytest.raises(KeyError, match=r"dataset\[5\] raised KeyError.*no record 5"):
        next(iterator)


# ---- copies ahead ------------------------------------------------------------------------------------------
def test_copies_of_built_batches_are_enqueued_ahead(cl_device):
    x, _, y = _arrays(24)
    loader = DataLoader(TensorDataset(x, y), batch_size=2, device=cl_device, num_workers=2, prefetch_factor=2)
    iterator = iter(loader)
    first = next(iterator)
    for future in list(iterator.producer.futures.values()):
        future.result()  # every submitted batch is built
    second = next(iterator)
    # batch 1 was handed out; batches 2 and 3 were built, so their copies are already on the copy stream
    assert len(iterator.uploaded) == COPY_AHEAD and iterator.collected == 2 + COPY_AHEAD
    rest = list(iterator)
    got = np.concatenate([b[1].to_host() for b in [first, second, *rest]])
    np.testing.assert_array_equal(got, y)


class _TrackedCopy:
    """Stands in for a host-to-device copy event; records whether it was dropped before its copy completed."""

    dropped_early: ClassVar[list[str]] = []
    kept: ClassVar[list[object]] = []

    def __init__(self, event) -> None:
        self.event = event

    def __getattr__(self, name):
        return getattr(self.event, name)

    def __del__(self) -> None:
        if self.event.command_execution_status != cl.command_execution_status.COMPLETE:
            _TrackedCopy.dropped_early.append(repr(self.event))
            _TrackedCopy.kept.append(self.event)  # dropping it here would wait for the copy (a pyopencl NannyEvent)


def test_the_main_thread_never_waits_for_a_copy(cl_device, monkeypatch):
    """The default queue is held by a user event, so no copy can complete: handing out batches must not wait."""
    x, _, y = _arrays(16)
    loader = DataLoader(TensorDataset(x, y), batch_size=2, device=cl_device, num_workers=0)
    real_copy = cl.enqueue_copy
    monkeypatch.setattr(cl, "enqueue_copy", lambda *a, **k: _TrackedCopy(real_copy(*a, **k)))
    _TrackedCopy.dropped_early.clear()
    gate = cl.UserEvent(cl_device.context)
    cl.enqueue_barrier(cl_device.queue, wait_for=[gate])  # every copy waits for the default queue's marker
    iterator = iter(loader)
    held = [next(iterator) for _ in range(3)]
    assert iterator.copying, "the copies of the batches handed out are still in flight"
    assert _TrackedCopy.dropped_early == []
    gate.set_status(cl.command_execution_status.COMPLETE)
    rest = list(iterator)
    got = np.concatenate([b[1].to_host() for b in [*held, *rest]])
    np.testing.assert_array_equal(got, y)
    assert _TrackedCopy.dropped_early == []
    _TrackedCopy.kept.clear()


# ---- persistent workers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_persistent_workers_serve_every_epoch(device, worker_type):
    x, img, y = _arrays(10)
    loader = DataLoader(
        TensorDataset(x, img, y),
        batch_size=3,
        shuffle=True,
        seed=5,
        device=device,
        num_workers=2,
        worker_type=worker_type,
        persistent_workers=True,
    )
    reference = DataLoader(TensorDataset(x, img, y), batch_size=3, shuffle=True, seed=5, device=device)
    producers = []
    for _ in range(3):
        iterator = iter(loader)
        producers.append(iterator.producer)
        batches = list(iterator)
        expected = list(reference)
        assert len(batches) == len(expected) == 4
        for got, want in zip(batches, expected, strict=True):
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a.to_host(), b.to_host())
    assert producers[0] is producers[1] is producers[2]
    if worker_type == "process":
        assert all(p.is_alive() for p in producers[0].processes)
    early = iter(loader)  # an epoch left early stops its workers; the next epoch starts new ones
    next(early)
    early.close()
    assert early.producer is producers[0] and loader._parked is None
    if worker_type == "process":
        assert producers[0].processes == []
    assert iter(loader).producer is not producers[0]


def test_persistent_workers_arguments():
    with pytest.raises(ValueError, match="persistent_workers=True needs num_workers > 0"):
        DataLoader(TensorDataset(np.zeros((3, 2))), device="cpu", persistent_workers=True)
    with pytest.raises(TypeError, match="persistent_workers must be a bool, got 1"):
        DataLoader(TensorDataset(np.zeros((3, 2))), device="cpu", num_workers=1, persistent_workers=1)


# ---- process batches ----------------------------------------------------------------------------------------
class Mixed(Dataset):
    """Items with a non-contiguous array (pickled in band), a large one (out of band), numbers and a string."""

    def __len__(self):
        return 7

    def __getitem__(self, i):
        big = np.arange(4096, dtype=np.float64).reshape(64, 64) * (i + 1)
        return {"big": big, "strided": big[::8, ::16], "label": i, "name": f"n{i}"}


def with_view(items):
    """``default_collate`` plus a non-contiguous view of the stacked big arrays."""
    return {**default_collate(items), "view": np.stack([item["big"] for item in items])[:, ::3, 1::2]}


def test_process_batches_arrive_out_of_band_intact(device):
    for collate_fn in (None, with_view):
        loader = DataLoader(
            Mixed(), batch_size=3, device=device, num_workers=2, worker_type="process", collate_fn=collate_fn
        )
        reference = DataLoader(Mixed(), batch_size=3, device=device, collate_fn=collate_fn)
        for got, want in zip(loader, reference, strict=True):
            assert got["name"] == want["name"]
            for key in got.keys() - {"name"}:
                assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
                np.testing.assert_array_equal(got[key].to_host(), want[key].to_host())
