"""Host staging for collectives: page-locked (pinned) buffers MPI reads and writes directly.

On OpenCL a staging buffer is a ``CL_MEM_ALLOC_HOST_PTR`` buffer mapped once for its lifetime:
the driver allocates it page-locked, so device<->host copies into it run at full DMA speed and
without an extra bounce, and MPI works on the mapped NumPy view. On the NumPy backend it is a
plain array. Buffers are pooled per device; one handed back with a pending event (the upload
that still reads it) is reused only after that event completes.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Device

_ALIGN = 64


class StagingBuffer:
    """``nbytes`` of host memory (pinned and mapped on OpenCL); ``view(dtype, count, offset)``."""

    def __init__(self, device: Device, nbytes: int) -> None:
        self.device = device
        self.nbytes = max(int(nbytes), _ALIGN)
        self.cl_buffer: cl.Buffer | None = None
        self.pending: cl.Event | None = None
        if device.kind == "opencl":
            flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
            self.cl_buffer = cl.Buffer(device.context, flags, size=self.nbytes)
            self.host, _ = cl.enqueue_map_buffer(
                device.queue,
                self.cl_buffer,
                cl.map_flags.READ | cl.map_flags.WRITE,
                0,
                (self.nbytes,),
                np.uint8,
                is_blocking=True,
            )
        else:
            self.host = np.empty(self.nbytes, np.uint8)

    def view(self, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
        """``count`` elements of ``dtype`` starting ``offset`` bytes in."""
        dtype = np.dtype(dtype)
        return self.host[offset : offset + count * dtype.itemsize].view(dtype)

    def ready(self) -> None:
        """Wait for the last upload that reads this buffer (if any)."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None


class StagingPool:
    """Staging buffers of every device, reused by size (the smallest free one that fits)."""

    def __init__(self) -> None:
        self._free: dict[Device, list[StagingBuffer]] = {}
        self._lock = threading.Lock()

    def acquire(self, device: Device, nbytes: int) -> StagingBuffer:
        with self._lock:
            free = self._free.setdefault(device, [])
            fits = [b for b in free if b.nbytes >= nbytes]
            buffer = min(fits, key=lambda b: b.nbytes) if fits else None
            if buffer is not None:
                free.remove(buffer)
        if buffer is None:
            return StagingBuffer(device, _round_up(nbytes))
        buffer.ready()
        return buffer

    def release(self, buffer: StagingBuffer, pending: Any = None) -> None:
        """Return ``buffer``; ``pending`` is an event that must complete before it is reused."""
        buffer.pending = pending
        with self._lock:
            self._free.setdefault(buffer.device, []).append(buffer)

    def clear(self) -> None:
        with self._lock:
            buffers = [b for free in self._free.values() for b in free]
            self._free = {}
        for b in buffers:
            b.ready()


def _round_up(nbytes: int) -> int:
    """Sizes round up to 1/8 of their power of two, so nearby sizes share buffers."""
    if nbytes <= 4096:
        return 4096
    step = 1 << max(nbytes.bit_length() - 4, 12)
    return -(-nbytes // step) * step


POOL = StagingPool()
