"""Host views of a CPU device's pool blocks: each block mapped once, for host products without a map each call.

A CPU OpenCL device (PoCL, Intel's CPU runtime) keeps its buffers in host memory. ``host_blas`` multiplies
them with NumPy; mapping and unmapping its three operands costs each product more than a small product
itself (see benchmarks/RESULTS.md, "Thirty-ninth session"). Where the device shares its memory with the host
this way, the pool (``memory``) maps each block once, when it is allocated, for as long as the block lives; a
host product then waits for the queue (``finish``) and works on those views.

Keeping a mapping while commands use the buffer is outside what the OpenCL specification defines, so it is
used only where it is seen to work: on the first block of a device, a probe maps two buffers, writes one
from the host, has the device copy it into the other, reads that through its mapping, and does it again with
other values. Only if the host sees every value the device wrote, and the device every value the host
wrote, does the device's pool map its blocks (``coherent``); elsewhere host products keep mapping each call.
``NETCL_HOST_VIEWS=0`` turns the views off (read when a device's pool allocates its first block).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pyopencl as cl

from netcl.core import Device

ENV_VAR = "NETCL_HOST_VIEWS"
#: bytes of each probe buffer
_PROBE_BYTES = 4096


def enabled() -> bool:
    """Whether ``NETCL_HOST_VIEWS`` allows host views (default on)."""
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("0", "false", "no", "off")


def host_memory_device(device: Device) -> bool:
    """A CPU OpenCL device whose buffers live in host memory (mapping them copies nothing)."""
    cl_device = device.cl_device
    if cl_device is None or device.is_gpu or not cl_device.type & cl.device_type.CPU:
        return False
    try:
        return bool(cl_device.host_unified_memory)
    except (cl.Error, AttributeError):  # OpenCL 3.0 may not report it; a CPU device's memory is the host's
        return True


def coherent(device: Device) -> bool:
    """Whether ``device``'s pool keeps its blocks mapped: host views enabled, a host-memory CPU device, and the
    probe (module docstring) passed on it (run once per device)."""
    return enabled() and host_memory_device(device) and _probe(device)


@functools.cache
def _probe(device: Device) -> bool:
    """Two rounds of host write -> device copy -> host read through mappings kept across the copy."""
    queue = device.queue
    try:
        source, target = (cl.Buffer(device.context, cl.mem_flags.READ_WRITE, _PROBE_BYTES) for _ in range(2))
        host_source, host_target = (map_block(queue, buffer, _PROBE_BYTES)[0] for buffer in (source, target))
        for seed in (1, 2):
            host_target[:] = 0
            host_source[:] = np.arange(seed, seed + _PROBE_BYTES, dtype=np.uint32).astype(np.uint8)
            cl.enqueue_copy(queue, target, source)
            queue.finish()
            if not np.array_equal(host_target, host_source):
                return False
        return True
    except cl.Error:
        return False
    finally:
        queue.finish()


def map_block(
    queue: cl.CommandQueue, buffer: cl.Buffer, size: int, blocking: bool = True
) -> tuple[np.ndarray, cl.Event]:
    """The bytes of ``buffer`` mapped for reading and writing until the returned array is dropped (its mapping
    is then unmapped on ``queue``), and the map's event; not ``blocking``: valid once that event completes."""
    flags = cl.map_flags.READ | cl.map_flags.WRITE
    return cl.enqueue_map_buffer(queue, buffer, flags, 0, (size,), np.uint8, is_blocking=blocking)
