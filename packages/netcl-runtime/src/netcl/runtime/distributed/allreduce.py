"""The all-reduce: deterministic, host-staged, non-blocking, over several tensors at once.

Algorithm (bit-identical on every rank, run to run): the flat staging buffer is cut into one
chunk per rank; an ``Ialltoall`` hands rank r every rank's chunk r; rank r adds them in rank order
0, 1, ..., n-1 (float16 accumulates in float32) and divides by n for a mean; an ``Iallgather``
then gives everyone every reduced chunk. Each element is thus summed once, in a fixed order, on
one rank, and copied everywhere: the traffic of a ring all-reduce, no dependence on MPI's choice
of reduction algorithm.

``AllReduceWork`` is the state machine: copy in (device->pinned host, non-blocking on OpenCL)
-> alltoall -> local reduction -> allgather -> copy out (pinned host->device, non-blocking).
``test()`` advances it (and every earlier all-reduce in flight) as far as it can without
waiting; ``wait()`` finishes it against the group's timeout. Several all-reduces may be in flight:
MPI needs every rank to post its non-blocking collectives in the same order on a communicator, so
the alltoalls run on one communicator and the allgathers on another, each posted strictly in the
order the all-reduces were created (which is the same on every rank, as for any collective).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Tensor
from netcl.runtime.distributed.group import Deadline, mpi, world
from netcl.runtime.distributed.staging import POOL, StagingBuffer

COPYING, EXCHANGING, REDUCED, GATHERING, DONE = "copying", "exchanging", "reduced", "gathering", "done"
_COMPLETE = cl.command_execution_status.COMPLETE


class AllReduceWork:
    """One all-reduce in flight over ``inputs`` (same dtype and device) into ``outputs``.

    ``outputs`` may be ``inputs`` (in place). Nothing in ``inputs``/``outputs`` may be touched
    by other work until ``wait()`` returns (on OpenCL the final uploads are enqueued on the
    device's queue by then, so later kernels on that queue see the result).
    """

    def __init__(
        self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], op: str, wait_for: Sequence[Any] | None = None
    ) -> None:
        w = world()
        self.world = w
        self.seq = w.next_seq
        self.rank, self.size = w.info.rank, w.info.world_size
        self.inputs, self.outputs, self.op = list(inputs), list(outputs), op
        self.device = self.inputs[0].device
        self.dtype = self.inputs[0].dtype
        self.counts = [t.size for t in self.inputs]
        self.total = sum(self.counts)
        self.chunk = max(1, math.ceil(self.total / self.size))
        padded = self.chunk * self.size
        item = self.dtype.itemsize
        self.staging: StagingBuffer | None = POOL.acquire(self.device, 2 * padded * item)
        self.work = self.staging.view(self.dtype, padded, 0)
        self.recv = self.staging.view(self.dtype, padded, padded * item)
        self.work[self.total :] = 0
        self.request: Any = None
        self.events: list[cl.Event] = []
        self.last_event: cl.Event | None = None
        #: monotonic times: exchange posted, completion observed (for overlap accounting)
        self.started_at = time.perf_counter()
        self.comm_started_at: float | None = None
        self.finished_at: float | None = None
        self.phase = COPYING
        w.next_seq += 1
        w.active.append(self)
        self._copy_in(wait_for)

    # ---- stages ----------------------------------------------------------------------------------
    def _copy_in(self, wait_for: Sequence[Any] | None) -> None:
        offset = 0
        if self.device.kind == "opencl":
            queue = self.device.queue
            for t, n in zip(self.inputs, self.counts, strict=True):
                if n:
                    self.events.append(
                        cl.enqueue_copy(
                            queue, self.work[offset : offset + n], t.data, is_blocking=False, wait_for=wait_for
                        )
                    )
                offset += n
            queue.flush()
        else:
            for t, n in zip(self.inputs, self.counts, strict=True):
                self.work[offset : offset + n] = t.data.reshape(-1)
                offset += n
        self.test()

    def _start_exchange(self) -> None:
        MPI = mpi()
        # whole buffers: mpi4py splits them into world-size equal blocks (one chunk per rank)
        send, recv = [self.work.view(np.uint8), MPI.BYTE], [self.recv.view(np.uint8), MPI.BYTE]
        self.request = self.world.exchange_comm.Ialltoall(send, recv)
        self.comm_started_at = time.perf_counter()
        self.phase = EXCHANGING

    def _reduce(self) -> None:
        reduce_parts(self.recv.reshape(self.size, self.chunk), self.work, self.rank, self.op)
        self.phase = REDUCED

    def _start_gather(self) -> None:
        MPI = mpi()
        self.request = self.world.gather_comm.Iallgather(MPI.IN_PLACE, [self.work.view(np.uint8), MPI.BYTE])
        self.phase = GATHERING

    def _copy_out(self) -> None:
        offset = 0
        if self.device.kind == "opencl":
            queue = self.device.queue
            for t, n in zip(self.outputs, self.counts, strict=True):
                if n:
                    self.last_event = cl.enqueue_copy(queue, t.data, self.work[offset : offset + n], is_blocking=False)
                offset += n
            queue.flush()
        else:
            for t, n in zip(self.outputs, self.counts, strict=True):
                t.data.reshape(-1)[...] = self.work[offset : offset + n]
                offset += n
        assert self.staging is not None
        POOL.release(self.staging, self.last_event)
        self.staging = None
        self.finished_at = time.perf_counter()
        self.phase = DONE

    # ---- driving ---------------------------------------------------------------------------------
    def test(self) -> bool:
        """Advance every all-reduce in flight without blocking; True once this one's result is written."""
        for work in list(self.world.active):
            work._advance()
        return self.phase == DONE

    def _advance(self) -> None:
        w = self.world
        if self.phase == COPYING:
            for e in self.events:
                status = e.command_execution_status
                if status < 0:
                    raise RuntimeError(f"a device-to-host copy of an all-reduce failed on the device (status {status})")
                if status != _COMPLETE:
                    return
            if w.exchange_turn != self.seq:
                return
            self.events = []
            self._start_exchange()
            w.exchange_turn += 1
        if self.phase == EXCHANGING:
            if not self.request.Test():
                return
            self._reduce()
        if self.phase == REDUCED:
            if w.gather_turn != self.seq:
                return
            self._start_gather()
            w.gather_turn += 1
        if self.phase == GATHERING:
            if not self.request.Test():
                return
            self._copy_out()
            w.active.remove(self)

    def is_completed(self) -> bool:
        return self.test()

    def wait(self) -> Sequence[Tensor]:
        """Finish (bounded by the group's timeout); returns the outputs."""
        if self.phase == COPYING and self.events:
            cl.wait_for_events(self.events)  # device work: no peer can hang it
        deadline = Deadline()
        while not self.test():
            deadline.check(f"all_reduce({self.op}) of {self.total} {self.dtype} elements")
        return self.outputs


def reduce_parts(parts: np.ndarray, work: np.ndarray, rank: int, op: str) -> None:
    """Rank ``rank``'s share of an all-reduce: ``parts`` (one row per rank, as the alltoall delivered
    them) summed in rank order 0, 1, ..., n-1 (float16 in float32), divided by n for "mean", into
    row ``rank`` of ``work``. Each element's arithmetic depends only on its n addends, not on how
    the buffer was cut, so every caller (one exchange, or a pipeline of chunks) gives the same bits."""
    size, chunk = parts.shape
    mine = work[rank * chunk : (rank + 1) * chunk]
    if parts.dtype == np.float16:
        acc = parts[0].astype(np.float32)
        for r in range(1, size):
            acc += parts[r]
        if op == "mean":
            acc /= np.float32(size)
        mine[...] = acc
    else:
        np.add(parts[0], parts[1], out=mine)
        for r in range(2, size):
            np.add(mine, parts[r], out=mine)
        if op == "mean":
            np.divide(mine, parts.dtype.type(size), out=mine)


def progress() -> None:
    """Advance every all-reduce in flight as far as possible without blocking (call it often)."""
    for work in list(world().active):
        work._advance()
