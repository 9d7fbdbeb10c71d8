"""netcl.data.DataLoader: batches against NumPy references, order by (seed, epoch), workers, bad inputs."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from netcl.core import Tensor
from netcl.data import DataLoader, Dataset, DistributedSampler, TensorDataset, WorkerDiedError, default_collate

N = 23  # not a multiple of the batch sizes below: every loader has a partial last batch


def _data(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.standard_normal((n, 3, 5)), np.arange(n, dtype=np.int64) * 10


def _labels(loader: DataLoader) -> list[int]:
    """The epoch's order: item i has label 10 * i."""
    return [int(v) // 10 for _, y in loader for v in y.to_host()]


# ---- contents ------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_workers, worker_type", [(0, "thread"), (2, "thread"), (2, "process")])
def test_batches_equal_numpy_reference(device, num_workers, worker_type):
    x, y = _data()
    loader = DataLoader(
        TensorDataset(x, y), batch_size=4, device=device, num_workers=num_workers, worker_type=worker_type
    )
    for _ in range(2):  # the second epoch reuses the loader's pinned buffers
        batches = list(loader)  # every batch kept: a reused host or device buffer would show here
    assert len(batches) == len(loader) == 6
    for k, (xb, yb) in enumerate(batches):
        assert isinstance(xb, Tensor) and xb.device is device and yb.device is device
        assert xb.dtype == np.float32 and yb.dtype == np.int64  # float64 arrives as float32, as Tensor.from_host
        # float64 -> float32 is one rounding of each value: equal to NumPy's cast
        np.testing.assert_array_equal(xb.to_host(), x[4 * k : 4 * k + 4].astype(np.float32))
        np.testing.assert_array_equal(yb.to_host(), y[4 * k : 4 * k + 4])
    assert batches[-1][0].shape == (3, 3, 5)  # the partial last batch


def test_drop_last(device):
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=4, drop_last=True, device=device)
    shapes = [xb.shape for xb, _ in loader]
    assert len(loader) == 5 and shapes == [(4, 3, 5)] * 5


def test_dict_items_strings_and_numbers(device):
    class Records(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return {"image": np.full((2, 2), i, np.uint8), "label": i, "weight": 0.5 * i, "name": f"item{i}"}

    (first, second) = list(DataLoader(Records(), batch_size=3, device=device))
    np.testing.assert_array_equal(first["image"].to_host(), np.stack([np.full((2, 2), i, np.uint8) for i in range(3)]))
    assert first["image"].dtype == np.uint8
    np.testing.assert_array_equal(first["label"].to_host(), np.array([0, 1, 2]))
    np.testing.assert_array_equal(second["weight"].to_host(), np.array([1.5, 2.0], np.float32))
    assert second["name"] == ["item3", "item4"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_custom_collate_fn(device, num_workers):
    x, y = _data()

    def collate(items):
        xs = np.stack([item[0] for item in items])
        return {"mean": xs.mean(axis=(1, 2)), "count": np.array([len(items)], np.int32)}

    loader = DataLoader(TensorDataset(x, y), batch_size=5, collate_fn=collate, device=device, num_workers=num_workers)
    batches = list(loader)
    for k, batch in enumerate(batches):
        part = x[5 * k : 5 * k + 5]
        np.testing.assert_allclose(batch["mean"].to_host(), part.mean(axis=(1, 2)).astype(np.float32), rtol=1e-7)
        assert batch["count"].to_host().tolist() == [len(part)] and batch["count"].dtype == np.int32


def test_tensor_dataset_of_netcl_tensors(device):
    x, y = _data(6)
    dataset = TensorDataset(Tensor.from_host(device, x), y)
    (xb,) = [b[0] for b in DataLoader(dataset, batch_size=6, device=device)]
    np.testing.assert_array_equal(xb.to_host(), x.astype(np.float32))


def test_default_collate_matches_numpy_stack():
    items = [(np.arange(3.0) + i, i) for i in range(4)]
    xs, ys = default_collate(items)
    np.testing.assert_array_equal(xs, np.stack([np.arange(3.0) + i for i in range(4)]).astype(np.float32))
    np.testing.assert_array_equal(ys, np.arange(4))


# ---- order -----------------------------------------------------------------------------------------
def test_shuffle_order_is_a_function_of_seed_and_epoch():
    x, y = _data()
    dataset = TensorDataset(x, y)

    def epochs(**kwargs):
        loader = DataLoader(dataset, batch_size=4, shuffle=True, seed=11, device="cpu", **kwargs)
        return [_labels(loader) for _ in range(3)]  # each iter(loader) is the next epoch

    reference = epochs()
    assert epochs(num_workers=1) == reference
    assert epochs(num_workers=2) == reference
    assert epochs(num_workers=2, worker_type="process") == reference
    assert epochs() == reference  # a re-run with the same seed
    assert all(sorted(order) == list(range(N)) for order in reference)  # each epoch visits every item once
    assert reference[0] != reference[1] != reference[2]  # epochs differ
    assert reference[0] == np.random.default_rng([11, 0]).permutation(N).tolist()  # the documented seeding
    other = DataLoader(dataset, batch_size=4, shuffle=True, seed=12, device="cpu")
    assert _labels(other) != reference[0]


def test_set_epoch_replays_an_epoch(device):
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True, seed=3, device=device, num_workers=2)
    first, second = _labels(loader), _labels(loader)
    loader.set_epoch(1)
    assert _labels(loader) == second
    loader.set_epoch(0)
    assert _labels(loader) == first


def test_distributed_sampler_in_loader_follows_set_epoch():
    x, y = _data()
    sampler = DistributedSampler(N, num_replicas=2, rank=1, shuffle=True, seed=4)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, sampler=sampler, device="cpu")
    loader.set_epoch(3)
    assert _labels(loader) == DistributedSampler(N, num_replicas=2, rank=1, seed=7).indices().tolist()


def test_seed_none_follows_manual_seed():
    from netcl.runtime import manual_seed

    x, y = _data()
    manual_seed(5)
    a = _labels(DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True, device="cpu"))
    manual_seed(5)
    b = _labels(DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True, device="cpu"))
    assert a == b and sorted(a) == list(range(N))


# ---- workers: errors and lifetime ----------------------------------------------------------------------
class Failing(Dataset):
    """Item 13 raises (a KeyError: its type survives the trip from a worker)."""

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 13:
            raise KeyError(f"no record {i}")
        return np.full(2, i, np.float32)


@pytest.mark.parametrize("num_workers, worker_type", [(0, "thread"), (2, "thread"), (2, "process")])
def test_worker_exception_reraised_with_item_index(device, num_workers, worker_type):
    loader = DataLoader(Failing(), batch_size=4, device=device, num_workers=num_workers, worker_type=worker_type)
    iterator = iter(loader)
    for k in range(3):  # items 0-11 load, whenever the workers reach item 13
        np.testing.assert_array_equal(next(iterator).to_host()[:, 0], np.arange(4 * k, 4 * k + 4))
    with pytest.raises(KeyError, match=r"dataset\[13\] raised KeyError.*no record 13"):
        next(iterator)
    assert iterator.closed  # the workers are stopped
    with pytest.raises(StopIteration):
        next(iterator)


class Killing(Dataset):
    """Item 3 kills the worker process that loads it."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return np.full(2, i, np.float32)


def test_killed_process_worker_ends_the_epoch_with_an_error(device):
    loader = DataLoader(Killing(), batch_size=2, device=device, num_workers=2, worker_type="process")
    iterator = iter(loader)
    processes = list(iterator.producer.processes)
    np.testing.assert_array_equal(next(iterator).to_host(), [[0, 0], [1, 1]])
    # batch 1 (items 2, 3) went to worker 1, which dies at item 3
    with pytest.raises(WorkerDiedError, match=r"worker process 1 .*killed by signal SIGKILL.*dataset indices \[2, 3\]"):
        next(iterator)
    assert iterator.closed and not any(p.is_alive() for p in processes)


class FrozenCount(Dataset):
    """Each item is the number of objects outside the garbage collector in the process that loads it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import gc

        return np.array([gc.get_freeze_count()], np.int64)


def test_forked_workers_never_collect_what_they_inherited():
    """Everything alive at the fork is frozen in the child: collecting an inherited OpenCL object there crashes."""
    import gc

    assert gc.get_freeze_count() == 0
    loader = DataLoader(FrozenCount(), batch_size=2, device="cpu", num_workers=2, worker_type="process")
    counts = np.concatenate([batch.to_host()[:, 0] for batch in loader])
    assert (counts > 1000).all(), counts  # the interpreter, numpy, pytest and netcl: far more than 1000 objects
    assert gc.get_freeze_count() == 0  # the parent collects its own objects again


def test_closing_an_iterator_early_stops_its_workers(device):
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=2, device=device, num_workers=2)
    iterator = iter(loader)
    xb, _ = next(iterator)
    iterator.close()
    np.testing.assert_array_equal(xb.to_host(), x[:2].astype(np.float32))
    assert iterator.producer.pool._shutdown
    assert list(iterator) == []


# ---- bad inputs ----------------------------------------------------------------------------------------
class Ragged(Dataset):
    def __init__(self, bad_shape=None, bad_dtype=None):
        self.bad_shape, self.bad_dtype = bad_shape, bad_dtype

    def __len__(self):
        return 8

    def __getitem__(self, i):
        shape = (4,) if i == self.bad_shape else (3,)
        dtype = np.int32 if i == self.bad_dtype else np.float32
        return np.zeros(shape, dtype), i


@pytest.mark.parametrize("num_workers", [0, 2])
def test_inconsistent_items_name_the_index(num_workers):
    shape = DataLoader(Ragged(bad_shape=6), batch_size=4, device="cpu", num_workers=num_workers)
    with pytest.raises(ValueError, match=r"dataset index 6\[0\]: it is array of shape \(4,\).*index 4 is .*\(3,\)"):
        list(shape)
    dtype = DataLoader(Ragged(bad_dtype=1), batch_size=4, device="cpu", num_workers=num_workers)
    with pytest.raises(ValueError, match=r"dataset index 1\[0\]: it is .*dtype int32.*index 0 is .*float32"):
        list(dtype)


def test_inconsistent_structure_names_the_index():
    class Mixed(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return (np.zeros(2), i) if i != 2 else (np.zeros(2), i, "extra")

    with pytest.raises(ValueError, match=r"dataset index 2: it is tuple of 3 fields.*index 0 is tuple of 2 fields"):
        list(DataLoader(Mixed(), batch_size=4, device="cpu"))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1, got 0"),
        ({"batch_size": -2}, ValueError, "batch_size must be an int >= 1, got -2"),
        ({"batch_size": 2.0}, ValueError, "batch_size must be an int >= 1, got 2.0"),
        ({"num_workers": -1}, ValueError, "num_workers must be an int >= 0, got -1"),
        ({"prefetch_factor": 0}, ValueError, "prefetch_factor must be an int >= 1, got 0"),
        ({"worker_type": "fiber"}, ValueError, "worker_type must be one of"),
        ({"collate_fn": 3}, TypeError, "collate_fn must be callable"),
        ({"seed": -1}, ValueError, "seed must be an int >= 0, got -1"),
        ({"sampler": list(range(9)), "shuffle": True}, ValueError, "mutually exclusive"),
        ({"sampler": list(range(9))}, ValueError, "the sampler yields 9 indices but the dataset has only 8 items"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        DataLoader(Ragged(), device="cpu", **kwargs)


def test_empty_dataset_and_bad_sampler_index():
    with pytest.raises(ValueError, match=r"the dataset is empty \(len\(dataset\) == 0\)"):
        DataLoader(TensorDataset(np.zeros((0, 2))), device="cpu")
    with pytest.raises(TypeError, match="needs a map-style dataset"):
        DataLoader(iter(range(3)), device="cpu")
    loader = DataLoader(Ragged(), batch_size=2, sampler=[0, 1, 8, 2], device="cpu")
    with pytest.raises(IndexError, match=r"the sampler yielded index 8, outside the dataset's range \[0, 8\)"):
        list(loader)
