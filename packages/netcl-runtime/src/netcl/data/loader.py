"""``DataLoader``: batches of a map-style dataset as netcl Tensors on a device (torch.utils.data's arguments).

Order. Indices come from the sampler in the main thread and are grouped into batches there;
workers only build the batches they are given and the loader hands them out in sampler order, so
the batches of an epoch are the same for any ``num_workers`` and any ``worker_type``. With
``shuffle=True`` the order is a function of ``(seed, epoch)``: each ``iter(loader)`` uses the
loader's current epoch and then advances it by one; ``set_epoch(e)`` sets it (and passes it on to
a sampler that has ``set_epoch``, such as ``DistributedSampler``).

Movement (OpenCL devices). Workers collate each batch into pinned host buffers; the main thread
enqueues the host-to-device copies on a copy ``Stream`` of its own and, before handing batch n
out, puts a barrier on the device's default queue that waits for batch n's copies only. As batch n
is handed out, the copies of batches n+1 and n+2 are enqueued (those whose host batch is ready), so
they run while the step that consumes batch n computes. Each copy first waits for a marker of the
default queue placed when it is enqueued: the caching allocator may give the new batch a block
that work enqueued before then still reads. Neither the main thread nor a worker waits for a copy:
copy events are kept until their copies complete (dropping one would wait), pinned buffers whose
copy is still running are not reused, and only with ``MAX_COPYING`` batches still copying (the host
that far ahead of the device) does the loader wait for the oldest. On the NumPy backend a batch's
arrays become the Tensors' storage directly.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor, get_device
from netcl.data.collate import batch_dtype
from netcl.data.errors import BatchBuildError
from netcl.data.pinned import BatchBuffers, PinnedPool
from netcl.data.sampler import BatchSampler, RandomSampler, SequentialSampler, check_epoch, check_seed
from netcl.data.workers import HostBatch, InlineProducer, ProcessProducer, ThreadProducer, build_batch
from netcl.runtime.scheduler import Stream

WORKER_TYPES = ("thread", "process")
#: batches whose copies are enqueued before the step that consumes the current one
COPY_AHEAD = 2
#: uploaded batches whose copies may be in flight at once; beyond it the loader waits for the oldest
#: (the host is then that many steps ahead of the device, so the wait costs nothing)
MAX_COPYING = 8


def _positive_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"DataLoader: {name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class DataLoader:
    """Iterate over ``dataset`` in batches of ``batch_size`` items, as netcl Tensors on ``device``.

    Arguments mean what torch.utils.data.DataLoader's do. ``num_workers`` threads (or processes,
    ``worker_type="process"`` or a ``multiprocessing_context``: for items whose Python work holds
    the GIL) build batches ahead, at most ``num_workers * prefetch_factor`` of them.
    ``pin_memory`` stages batches in page-locked host memory on OpenCL devices. ``device``
    defaults to netcl's default device; ``seed`` (default: drawn from netcl's global generator,
    see ``netcl.runtime.manual_seed``) seeds the shuffle. ``persistent_workers``: the workers of an
    epoch that ran to its end serve the next epoch too (an epoch left early or failed stops its
    own). Each leaf of a batch is a ``Tensor`` (float64 data arrives as float32); strings stay lists
    of strings. Without a ``collate_fn``, a dataset with ``gather_batch(indices, alloc)`` (as
    ``TensorDataset`` has) builds each batch in one call instead of item by item.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        sampler: Any = None,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        prefetch_factor: int = 2,
        pin_memory: bool = True,
        device: Device | str | None = None,
        seed: int | None = None,
        worker_type: str | None = None,
        multiprocessing_context: Any = None,
        persistent_workers: bool = False,
    ) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(
                f"DataLoader needs a map-style dataset (with __getitem__ and __len__), got {type(dataset).__name__}"
            )
        self.dataset = dataset
        length = len(dataset)
        if length == 0:
            raise ValueError("DataLoader: the dataset is empty (len(dataset) == 0); there is nothing to batch")
        self.batch_size = _positive_int("batch_size", batch_size, 1)
        self.num_workers = _positive_int("num_workers", num_workers, 0)
        self.prefetch_factor = _positive_int("prefetch_factor", prefetch_factor, 1)
        if not isinstance(persistent_workers, bool):
            raise TypeError(f"DataLoader: persistent_workers must be a bool, got {persistent_workers!r}")
        if persistent_workers and self.num_workers == 0:
            raise ValueError("DataLoader: persistent_workers=True needs num_workers > 0 (there are no workers to keep)")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"DataLoader: collate_fn must be callable or None, got {type(collate_fn).__name__}")
        if worker_type is None:
            worker_type = "process" if multiprocessing_context is not None else "thread"
        if worker_type not in WORKER_TYPES:
            raise ValueError(f"DataLoader: worker_type must be one of {WORKER_TYPES}, got {worker_type!r}")
        if seed is None:
            from netcl.runtime.ops.random import next_seed

            seed = next_seed()
        self.seed = check_seed(seed)
        if sampler is not None and shuffle:
            raise ValueError("DataLoader: sampler and shuffle=True are mutually exclusive (the sampler sets the order)")
        if sampler is None:
            sampler = RandomSampler(length, seed=self.seed) if shuffle else SequentialSampler(length)
            self._owns_sampler = True
        else:
            if not hasattr(sampler, "__iter__"):
                raise TypeError(f"DataLoader: sampler must be an iterable of indices, got {type(sampler).__name__}")
            if hasattr(sampler, "__len__") and len(sampler) > length:
                raise ValueError(
                    f"DataLoader: the sampler yields {len(sampler)} indices but the dataset has only {length} items; "
                    "a sampler may not be longer than its dataset (use RandomSampler(replacement=True, "
                    "num_samples=...) on a dataset of that length to draw more)"
                )
            self._owns_sampler = False
        self.sampler = sampler
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.batch_sampler = BatchSampler(sampler, self.batch_size, self.drop_last)
        self.collate_fn = collate_fn
        self.pin_memory = bool(pin_memory)
        self.device = get_device(device)
        self.worker_type = worker_type
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        #: the workers a finished epoch left for the next one (persistent_workers)
        self._parked: Any = None
        self.epoch = 0
        self._copy_stream: Stream | None = None
        self._pinned: PinnedPool | None = None

    def _staging(self) -> tuple[Stream | None, PinnedPool | None]:
        """The copy Stream and the pinned buffer pool, made at the first iteration and kept across epochs."""
        if self.device.kind != "opencl":
            return None, None
        if self._copy_stream is None:
            self._copy_stream = Stream(device=self.device)
            self._pinned = PinnedPool(self.device, self._copy_stream.queue, self.pin_memory)
        return self._copy_stream, self._pinned

    def _alloc_factory(self) -> BatchBuffers | None:
        """Buffers for one batch: pinned ones on OpenCL devices, None (plain NumPy memory) otherwise."""
        return BatchBuffers(self._pinned) if self._pinned is not None else None

    def _producer(self, build: Callable[[list[int], str], HostBatch]) -> Any:
        """The workers for a new epoch: those a finished epoch parked, else new ones."""
        if self._parked is not None:
            producer, self._parked = self._parked, None
            return producer
        if self.num_workers == 0:
            return InlineProducer(build)
        if self.worker_type == "thread":
            return ThreadProducer(build, self.num_workers)
        return ProcessProducer(
            self.dataset, self.collate_fn, self.num_workers, self.multiprocessing_context, self._alloc_factory
        )

    def _park(self, producer: Any) -> bool:
        """Keep an idle ``producer`` for the next epoch; False when it is not wanted (the caller stops it)."""
        if not self.persistent_workers or self._parked is not None:
            return False
        self._parked = producer
        return True

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._parked is not None:
                self._parked.close()

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter(loader)`` uses (then it advances by one per iteration)."""
        self.epoch = check_epoch(epoch)
        if not self._owns_sampler and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)

    def __iter__(self) -> _LoaderIterator:
        if self._owns_sampler:
            self.sampler.set_epoch(self.epoch)
        iterator = _LoaderIterator(self)
        self.epoch += 1
        return iterator

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __repr__(self) -> str:
        return (
            f"DataLoader(len(dataset)={len(self.dataset)}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, num_workers={self.num_workers} ({self.worker_type}s), "
            f"device={self.device.spec}, seed={self.seed}, epoch={self.epoch})"
        )


def _map_leaves(batch: Any, fn: Callable[[np.ndarray], Any]) -> Any:
    """``batch`` with ``fn`` applied to every array leaf (lists of strings are left alone)."""
    if isinstance(batch, np.ndarray):
        return fn(batch)
    if isinstance(batch, dict):
        return {key: _map_leaves(value, fn) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        mapped = [_map_leaves(value, fn) for value in batch]
        return tuple(mapped) if isinstance(batch, tuple) else mapped
    return batch


class _LoaderIterator(Iterator[Any]):
    """One epoch of a ``DataLoader``; ``close()`` (or the end of the epoch) stops its workers."""

    def __init__(self, loader: DataLoader) -> None:
        self.device = device = loader.device
        self.length = len(loader.dataset)
        self.opencl = device.kind == "opencl"
        self.copy_stream, self.pool = loader._staging()
        dataset, collate_fn, alloc_factory = loader.dataset, loader.collate_fn, loader._alloc_factory

        def build(indices: list[int], worker: str) -> HostBatch:
            return build_batch(dataset, indices, collate_fn, alloc_factory, worker)

        self.loader = loader
        self.inline = loader.num_workers == 0
        self.producer: Any = loader._producer(build)
        self.in_flight = 1 if self.inline else loader.num_workers * loader.prefetch_factor
        self.batches = iter(loader.batch_sampler)
        self.submitted = 0  # tickets handed to the producer
        self.collected = 0  # tickets taken back from it (and uploaded)
        self.sampler_done = False
        self.uploaded: deque[tuple[Any, cl.Event | None]] = deque()
        #: each uploaded batch's marker with its host-to-device copy events, kept until the marker completes:
        #: dropping a pyopencl copy event from host memory (a NannyEvent) waits for that copy
        self.copying: deque[tuple[cl.Event, list[cl.Event]]] = deque()
        self.closed = False
        #: an error building batch n+1 while batch n was handed out: raised when batch n+1 is asked for
        self.deferred: BaseException | None = None

    # ---- host side -----------------------------------------------------------------------
    def _submit(self) -> None:
        """Hand batches to the producer until ``in_flight`` are being built or the sampler ends."""
        while not self.sampler_done and self.submitted - self.collected < self.in_flight:
            indices = next(self.batches, None)
            if indices is None:
                self.sampler_done = True
                return
            bad = [i for i in indices if not 0 <= i < self.length]
            if bad:
                raise IndexError(
                    f"DataLoader: the sampler yielded index {bad[0]}, outside the dataset's range [0, {self.length})"
                )
            self.producer.submit(self.submitted, indices)
            self.submitted += 1

    def _collect(self) -> HostBatch:
        try:
            result = self.producer.result(self.collected)
        except BatchBuildError as failure:
            failure.reraise()
        self.collected += 1
        return result

    # ---- device side ---------------------------------------------------------------------
    def _tensor(self, array: np.ndarray) -> Tensor:
        dtype = self.device.check_dtype(batch_dtype(array.dtype))
        if array.dtype != dtype or not array.flags.c_contiguous:
            array = np.ascontiguousarray(array, dtype=dtype)
        return Tensor(array, array.shape, dtype, self.device)

    def _upload(self, host: HostBatch) -> None:
        """Start batch ``host``'s copies to the device (NumPy backend: wrap its arrays)."""
        batch, buffers = host
        if not self.opencl:
            self.uploaded.append((_map_leaves(batch, self._tensor), None))
            return
        compute, copy = self.device.queue, self.copy_stream.queue
        # the new tensors may reuse blocks that work enqueued so far on the default queue still reads
        marker = cl.enqueue_marker(compute)
        compute.flush()
        cl.enqueue_barrier(copy, wait_for=[marker])

        copies: list[cl.Event] = []

        def upload(array: np.ndarray) -> Tensor:
            dtype = self.device.check_dtype(array.dtype)
            tensor = Tensor.empty(array.shape, dtype, self.device)
            if array.nbytes:
                copies.append(cl.enqueue_copy(copy, tensor.data, np.ascontiguousarray(array), is_blocking=False))
            return tensor

        tensors = _map_leaves(batch, upload)
        event = cl.enqueue_marker(copy)
        copy.flush()
        self._retire_copies()
        self.copying.append((event, copies))
        if buffers is not None:
            buffers.release(event)
        self.uploaded.append((tensors, event))

    def _retire_copies(self) -> None:
        """Drop the copy events of uploaded batches whose copies have completed (a status query, no wait);
        with ``MAX_COPYING`` batches still copying, wait for the oldest."""
        complete = cl.command_execution_status.COMPLETE
        while self.copying and (
            len(self.copying) >= MAX_COPYING or self.copying[0][0].command_execution_status == complete
        ):
            self.copying.popleft()[0].wait()

    def _upload_ready(self) -> None:
        """Start the copies of the next ``COPY_AHEAD`` batches that are built, so they overlap the coming step.

        An error building one of them is kept in ``deferred`` and raised when that batch is asked for.
        """
        while (
            self.opencl
            and self.deferred is None
            and len(self.uploaded) < COPY_AHEAD
            and self.collected < self.submitted
            and self.producer.ready(self.collected)
        ):
            try:
                self._upload(self._collect())
            except Exception as exc:
                self.deferred = exc

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        try:
            if not self.uploaded and self.deferred is not None:
                raise self.deferred
            self._submit()
            if not self.uploaded:
                if self.collected == self.submitted:
                    self.close()
                    raise StopIteration
                self._upload(self._collect())
            batch, event = self.uploaded.popleft()
            self._submit()
            self._upload_ready()
            if event is not None:
                cl.enqueue_barrier(self.device.queue, wait_for=[event])
            return batch
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise

    def __iter__(self) -> _LoaderIterator:
        return self

    def close(self) -> None:
        """Stop the workers; wait for the copies of batches never handed out (the pinned pool stays with the loader)."""
        if self.closed:
            return
        self.closed = True
        finished = self.sampler_done and self.collected == self.submitted and self.deferred is None
        if not (finished and self.loader._park(self.producer)):
            for _, buffers in self.producer.close():
                if buffers is not None:
                    buffers.release()
        if self.copy_stream is not None:
            self.copy_stream.finish()  # a dropped batch's blocks must not be reused under a running copy
        self.copying.clear()
        self.uploaded.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
