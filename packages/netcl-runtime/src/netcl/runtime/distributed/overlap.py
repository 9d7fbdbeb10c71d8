"""Overlapped all-reduce: buckets reduced on a thread and an OpenCL queue of their own, in chunks.

``OverlapReducer`` (one per ``DistributedDataParallel``) owns a thread, a second command queue on
the device's context and a communicator of its own. ``submit`` marks the point of the device's
queue where a bucket's gradients are complete (an event: the marker after the kernels that made
them) and hands the bucket to the thread; the caller goes on enqueueing the rest of the backward.
The thread pipelines the bucket in chunks of ``chunk_bytes``: every chunk's device -> pinned host
copy is enqueued on the reducer's queue at once, waiting on that event only; then chunk by chunk,
as its copy lands, alltoall -> reduction in rank order (``reduce_parts``) -> allgather -> pinned
host -> device copy, so the copies of one chunk run beside the exchange of another and the whole
beside the backward. The reduction of each element is the one ``AllReduceWork`` does, so the
results are bit-identical to the non-overlapped path on every rank.

``OverlapWork.wait`` (bounded by the group's timeout, like every collective) returns once the
thread has enqueued the last upload and puts a barrier on the device's queue behind it, so later
kernels there read the reduced gradients. A rank that dies makes the thread's exchange time out:
``wait`` raises that ``DistributedTimeoutError`` and every later bucket of the reducer fails at once.
Buckets are served strictly in submission order, the same on every rank, as MPI requires.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor
from netcl.runtime.distributed.allreduce import reduce_parts
from netcl.runtime.distributed.errors import DistributedError
from netcl.runtime.distributed.group import Deadline, mpi, wait_requests, world
from netcl.runtime.distributed.staging import POOL

#: Pipeline chunk: large enough that MPI and the copies run near full speed, small enough that a
#: 25 MB bucket is several chunks deep.
DEFAULT_CHUNK_BYTES = 4 << 20
#: Seconds a waiting caller sleeps on the work's completion between timeout checks.
_WAIT_SLICE = 0.01


def threads_supported() -> bool:
    """Whether the MPI library lets a second thread communicate (``MPI_THREAD_MULTIPLE``)."""
    MPI = mpi()
    return bool(MPI.Query_thread() >= MPI.THREAD_MULTIPLE)


class ThreadedWork:
    """One bucket's all-reduce run by a reducer's thread, starting once the event ``ready`` (the
    point of the device's queue where the inputs are complete) has: ``wait()`` blocks (bounded by
    the group's timeout) until the thread is done, raises its error, and puts a barrier on the
    device's queue behind the thread's uploads (``uploaded``), so later kernels there read the results."""

    def __init__(
        self,
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        op: str,
        ready: Any,
        limits: tuple[float, int, int],
    ) -> None:
        self.inputs, self.outputs, self.op, self.ready = list(inputs), list(outputs), op, ready
        self.device: Device = self.inputs[0].device
        self.dtype = self.inputs[0].dtype
        self.total = sum(t.size for t in self.inputs)
        self.limits = limits  #: (timeout, rank, world size): waits never consult the (maybe broken) group
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.uploaded: Any = None  #: an event after the last upload (OpenCL)
        self.comm_started_at: float | None = None
        self.finished_at: float | None = None

    def test(self) -> bool:
        """Whether the thread is done with this bucket (its uploads enqueued)."""
        return self.done.is_set()

    is_completed = test

    def wait(self) -> list[Tensor]:
        """The outputs, once reduced; raises the thread's error (a timeout of a peer, say)."""
        if not self.done.is_set():
            deadline = Deadline(*self.limits)
            while not self.done.wait(_WAIT_SLICE):  # the thread drives the exchange: block, do not spin
                deadline.check(f"all_reduce({self.op}) of {self.total} {self.dtype} elements (overlapped)")
        if self.error is not None:
            raise self.error
        if self.uploaded is not None:
            cl.enqueue_barrier(self.device.queue, wait_for=[self.uploaded])
            self.uploaded = None
        return self.outputs

    def release(self) -> None:
        """Hand back what the work holds after it failed (nothing here)."""


class OverlapWork(ThreadedWork):
    """One bucket's host-staged all-reduce on the reducer's thread (see the module)."""

    def __init__(
        self,
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        op: str,
        ready: Any,
        chunk_bytes: int,
        limits: tuple[float, int, int],
    ) -> None:
        super().__init__(inputs, outputs, op, ready, limits)
        item = self.dtype.itemsize
        size = limits[2]
        #: pipeline chunk in elements: a multiple of the rank count (each rank reduces an equal share)
        self.per_chunk = max(size, (chunk_bytes // item) // size * size)
        self.chunks = max(1, math.ceil(self.total / self.per_chunk))
        # acquired here, on the caller's thread: a new pinned buffer is mapped through the device's queue
        self.staging = POOL.acquire(self.device, 2 * self.chunks * self.per_chunk * item)

    def release(self) -> None:
        if self.staging is not None:
            POOL.release(self.staging)
            self.staging = None


class Exchange(Protocol):
    """What a reducer's thread runs each work on (it holds no reference to the reducer, so dropping
    the reducer stops the thread)."""

    what: str  #: named in the error of the works after a failed one

    def run(self, work: ThreadedWork) -> None: ...

    def stopped(self, failed: bool) -> None:
        """On the thread, after the last work (``failed``: one of them raised): free what it holds."""


def serve(jobs: queue.Queue, exchange: Exchange) -> None:
    """A reducer thread: the works in submission order (the same on every rank) until None. An error
    goes to the work's waiter, and every later work fails at once with it (a timeout stays one)."""
    failure: BaseException | None = None
    try:
        while True:
            work = jobs.get()
            if work is None:
                return
            try:
                if failure is not None:
                    kind = type(failure) if isinstance(failure, DistributedError) else DistributedError
                    raise kind(f"an earlier {exchange.what} failed: {failure}")
                exchange.run(work)
            except BaseException as exc:  # handed to the waiting caller
                failure = failure or exc
                work.error = exc
                work.release()
            finally:
                work.done.set()
    finally:
        exchange.stopped(failure is not None)


class ThreadedReducer:
    """What every bucket reducer shares: the job queue, the thread that ``serve``s it with an
    ``Exchange``, the marker a work waits for, and ``close`` (or garbage collection) to stop it."""

    def _start(self, device: Device, name: str, exchange: Exchange) -> None:
        info = world().info
        self.device, self.limits = device, (info.timeout, info.rank, info.world_size)
        self.jobs: queue.Queue[ThreadedWork | None] = queue.Queue()
        self.thread = threading.Thread(
            target=serve, args=(self.jobs, exchange), name=f"{name}-{info.rank}", daemon=True
        )
        self.thread.start()
        _LIVE.add(self)

    def _ready(self) -> Any:
        """A marker after the work enqueued so far on the device's queue (None on the NumPy backend)."""
        if self.device.kind != "opencl":
            return None
        ready = cl.enqueue_marker(self.device.queue)
        self.device.queue.flush()
        return ready

    def close(self, wait: bool = False) -> None:
        """Stop the thread after the works already submitted; ``wait``: and join it (at most the group's
        timeout), so that what it holds (a communicator, a CUDA stream) is freed before this returns."""
        if self.thread.is_alive():
            self.jobs.put(None)
            if wait:
                self.thread.join(self.limits[0])

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()


#: every reducer whose thread may still run: stopped and joined at interpreter exit
_LIVE: weakref.WeakSet[ThreadedReducer] = weakref.WeakSet()


@atexit.register
def _close_live_reducers() -> None:
    """Stop and join every reducer thread before the interpreter tears down: a daemon thread still
    inside ``ncclCommDestroy`` while the process exits aborts it ("terminate called without an active
    exception", seen on 4 ranks). The NCCL exchange needs no MPI to stop; the MPI one holds nothing."""
    for reducer in list(_LIVE):
        with contextlib.suppress(Exception):
            reducer.close(wait=True)


class OverlapReducer(ThreadedReducer):
    """A thread, a queue and a communicator that all-reduce buckets beside the caller's work.

    Construction is collective (it duplicates the group's communicator): every rank builds its
    reducers in the same order. ``close()`` (or garbage collection) stops the thread.
    """

    def __init__(self, device: Device, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if not (isinstance(chunk_bytes, int) and chunk_bytes > 0):
            raise ValueError(f"chunk_bytes must be an int > 0, got {chunk_bytes!r}")
        w = world()
        self.chunk_bytes = chunk_bytes
        comm, request = w.comm.Idup()
        wait_requests([request], "overlapped all-reduce setup (communicator)")
        cl_queue = cl.CommandQueue(device.context, device.cl_device) if device.kind == "opencl" else None
        self._start(device, "netcl-allreduce", _StagedExchange(comm, cl_queue, w.info))

    def submit(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], op: str) -> OverlapWork:
        """Start the all-reduce of ``inputs`` into ``outputs`` once the work enqueued so far on the
        device's queue (the kernels that made ``inputs``) completes. Keep both alive until ``wait``."""
        work = OverlapWork(inputs, outputs, op, self._ready(), self.chunk_bytes, self.limits)
        self.jobs.put(work)
        return work


# ---- the thread ----------------------------------------------------------------------------------
class _StagedExchange:
    """The host-staged pipeline (``_run``) on the reducer's communicator and queue."""

    what = "overlapped all-reduce"

    def __init__(self, comm: Any, cl_queue: Any, info: Any) -> None:
        self.comm, self.cl_queue = comm, cl_queue
        self.rank, self.size, self.timeout = info.rank, info.world_size, info.timeout

    def run(self, work: ThreadedWork) -> None:
        assert isinstance(work, OverlapWork)
        _run(work, self.comm, self.cl_queue, self.rank, self.size, self.timeout)

    def stopped(self, failed: bool) -> None:
        pass


def _segments(counts: list[int], start: int, stop: int) -> list[tuple[int, int, int, int]]:
    """(tensor, element offset in it, offset in the flat bucket, elements) covering [start, stop)."""
    out, base = [], 0
    for i, n in enumerate(counts):
        lo, hi = max(start, base), min(stop, base + n)
        if lo < hi:
            out.append((i, lo - base, lo, hi - lo))
        base += n
    return out


def _run(work: OverlapWork, comm: Any, cl_queue: Any, rank: int, size: int, timeout: float) -> None:
    MPI = mpi()
    dtype, item = work.dtype, work.dtype.itemsize
    counts = [t.size for t in work.inputs]
    per_chunk, chunks = work.per_chunk, work.chunks
    span = chunks * per_chunk
    staging = work.staging
    assert staging is not None
    flat, recv = staging.view(dtype, span, 0), staging.view(dtype, span, span * item)
    opencl = cl_queue is not None
    bounds = [(c * per_chunk, min(work.total, (c + 1) * per_chunk)) for c in range(chunks)]
    downloads: list[list[Any]] = []
    if opencl:  # every chunk's copy now: they wait on the gradients' event, not on the queue
        for start, stop in bounds:
            events = []
            for i, off, pos, n in _segments(counts, start, stop):
                events.append(
                    cl.enqueue_copy(
                        cl_queue,
                        flat[pos : pos + n],
                        work.inputs[i].data,
                        src_offset=off * item,
                        wait_for=[work.ready],
                        is_blocking=False,
                    )
                )
            downloads.append(events)
        cl_queue.flush()
    for c, (start, stop) in enumerate(bounds):
        padded = -(-(stop - start) // size) * size
        mine, theirs = flat[start : start + padded], recv[start : start + padded]
        if opencl:
            if downloads[c]:
                cl.wait_for_events(downloads[c])  # device work: no peer can hang it
        else:
            for i, off, pos, n in _segments(counts, start, stop):
                flat[pos : pos + n] = work.inputs[i].data.reshape(-1)[off : off + n]
        mine[stop - start :] = 0
        if work.comm_started_at is None:
            work.comm_started_at = time.perf_counter()
        _wait(comm.Ialltoall([mine.view(np.uint8), MPI.BYTE], [theirs.view(np.uint8), MPI.BYTE]), rank, size, timeout)
        reduce_parts(theirs.reshape(size, padded // size), mine, rank, work.op)
        _wait(comm.Iallgather(MPI.IN_PLACE, [mine.view(np.uint8), MPI.BYTE]), rank, size, timeout)
        for i, off, pos, n in _segments(counts, start, stop):
            if opencl:
                out = work.outputs[i].data
                cl.enqueue_copy(cl_queue, out, flat[pos : pos + n], dst_offset=off * item, is_blocking=False)
            else:
                work.outputs[i].data.reshape(-1)[off : off + n] = flat[pos : pos + n]
        if opencl:
            cl_queue.flush()
    last = cl.enqueue_marker(cl_queue) if opencl else None
    if opencl:
        cl_queue.flush()
    POOL.release(staging, last)
    work.staging = None
    work.uploaded = last
    work.finished_at = time.perf_counter()


def _wait(request: Any, rank: int, size: int, timeout: float) -> None:
    deadline = Deadline(timeout, rank, size)
    while not request.Test():
        deadline.check("an overlapped all-reduce's exchange")
