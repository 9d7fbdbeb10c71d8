"""Pinned host buffers for batches: page-locked memory the host-to-device copy reads at DMA speed.

On OpenCL a buffer is a ``CL_MEM_ALLOC_HOST_PTR`` buffer mapped once for its lifetime (the driver
allocates it page-locked); ``array(shape, dtype)`` views the mapping. A buffer goes back to the
pool with the event of the copy that reads it and is handed out again only after that event has
completed, so a worker never overwrites a batch that is still being uploaded. Without OpenCL, or
with ``pinned=False``, buffers are ordinary NumPy memory.
"""

from __future__ import annotations

import threading

import numpy as np
import pyopencl as cl

from netcl.core import Device

_ALIGN = 64


def _round_up(nbytes: int) -> int:
    """Sizes round up to 1/8 of their power of two (at least 4 KiB), so nearby sizes share buffers."""
    if nbytes <= 4096:
        return 4096
    step = 1 << max(nbytes.bit_length() - 4, 12)
    return -(-nbytes // step) * step


class PinnedBuffer:
    """``nbytes`` of host memory; pinned and mapped when made on an OpenCL queue."""

    def __init__(self, nbytes: int, queue: cl.CommandQueue | None) -> None:
        self.nbytes = nbytes
        self.pending: cl.Event | None = None
        self.cl_buffer: cl.Buffer | None = None
        if queue is not None:
            flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
            self.cl_buffer = cl.Buffer(queue.context, flags, size=nbytes)
            self.host, _ = cl.enqueue_map_buffer(
                queue, self.cl_buffer, cl.map_flags.READ | cl.map_flags.WRITE, 0, (nbytes,), np.uint8, is_blocking=True
            )
        else:
            self.host = np.empty(nbytes, np.uint8)

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype`` at the start of the buffer."""
        count = int(np.prod(shape, dtype=np.int64))
        return self.host[: count * dtype.itemsize].view(dtype).reshape(shape)

    def copied(self) -> bool:
        """Whether the copy that last read this buffer has completed (a status query, no wait)."""
        if self.pending is None:
            return True
        if self.pending.command_execution_status == cl.command_execution_status.COMPLETE:
            self.pending = None
            return True
        return False

    def ready(self) -> None:
        """Wait for the copy that last read this buffer."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None


class PinnedPool:
    """Pinned buffers of one device, reused by size; thread-safe (workers take, the loader returns)."""

    def __init__(self, device: Device, queue: cl.CommandQueue | None, pinned: bool = True) -> None:
        self.device = device
        # buffers are mapped on a queue of their own: the copy queue waits for the default queue, so a
        # blocking map there would wait for the steps enqueued so far
        self.queue = cl.CommandQueue(queue.context, queue.device) if pinned and queue is not None else None
        self._free: list[PinnedBuffer] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> PinnedBuffer:
        """The smallest free buffer of at least ``nbytes`` whose last copy has completed, or a new one.

        A free buffer whose copy is still running is not waited for: that copy may itself wait for the
        device's default queue, and a worker blocked on it would stall the pipeline. The loader bounds
        how many copies are in flight (``loader.MAX_COPYING``), which bounds how many buffers exist.
        """
        with self._lock:
            fits = [b for b in self._free if b.nbytes >= nbytes and b.copied()]
            buffer = min(fits, key=lambda b: b.nbytes) if fits else None
            if buffer is not None:
                self._free.remove(buffer)
        if buffer is None:
            return PinnedBuffer(_round_up(max(nbytes, _ALIGN)), self.queue)
        return buffer

    def give(self, buffer: PinnedBuffer, pending: cl.Event | None = None) -> None:
        """Return ``buffer``; ``pending`` is the copy that must complete before it is reused."""
        buffer.pending = pending
        with self._lock:
            self._free.append(buffer)

    def clear(self) -> None:
        """Wait for every pending copy and drop the buffers."""
        with self._lock:
            buffers, self._free = self._free, []
        for buffer in buffers:
            buffer.ready()


class BatchBuffers:
    """The pinned buffers one batch was built into: an ``alloc`` for ``collate`` that records what it took."""

    def __init__(self, pool: PinnedPool) -> None:
        self.pool = pool
        self.taken: list[PinnedBuffer] = []

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buffer = self.pool.take(nbytes)
        self.taken.append(buffer)
        return buffer.array(tuple(shape), dtype)

    def release(self, pending: cl.Event | None = None) -> None:
        """Give every buffer back, each to be reused after ``pending``."""
        for buffer in self.taken:
            self.pool.give(buffer, pending)
        self.taken = []
