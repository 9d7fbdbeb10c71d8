"""matmul on CPU OpenCL devices through the host BLAS, zero-copy.

A CPU OpenCL device (PoCL, Intel's CPU runtime) keeps its buffers in host memory, so mapping
one costs no copy; NumPy's ``matmul`` (OpenBLAS, on every core) then runs on the mapped arrays
and writes straight into the mapped output buffer. A GEMM kernel written for GPUs is many
times slower there (``mlp_block``'s (16384 x 64) @ (64 x 256): 17.6 ms on Debian's PoCL, 2.1 ms
with NumPy's BLAS).

Capture/replay: a host call is not a kernel, so a ``Graph`` could not replay it. While a
capture records on the device's queue, ``matmul`` does not take this path: it launches the
GEMM kernel, which the graph records and replays like any other (see ``applies``).
``NETCL_HOST_BLAS=0`` turns the path off.
"""

from __future__ import annotations

import os

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor
from netcl.runtime import capture

ENV_VAR = "NETCL_HOST_BLAS"
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def enabled() -> bool:
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


def applies(device: Device, a: Tensor, b: Tensor, result: np.dtype) -> bool:
    """Whether ``a @ b`` on ``device`` runs on the host BLAS: a host-memory CPU OpenCL device,
    both operands already of the float32/float64 result dtype, and no capture recording on the
    device's queue (a capture records the GEMM kernel instead, which it can replay)."""
    return (
        result in _DTYPES
        and a.dtype == result
        and b.dtype == result
        and host_memory_device(device)
        and not capture.is_recording(device.queue)
        and enabled()
    )


def matmul(
    a: Tensor,
    b: Tensor,
    out_shape: tuple[int, ...],
    result: np.dtype,
    *,
    transpose_a: bool = False,
    transpose_b: bool = False,
) -> Tensor:
    """``a @ b`` into a new tensor of ``out_shape``: map both operands, NumPy ``matmul`` into the
    mapped output, unmap. Blocks until the work queued before it on the device's queue is done."""
    device = a.device
    queue = device.queue
    out = Tensor.empty(out_shape, result, device)
    if out.size == 0:
        return out
    a_host, a_map = _map(queue, a, cl.map_flags.READ)
    b_host, b_map = _map(queue, b, cl.map_flags.READ)
    out_host, out_map = _map(queue, out, cl.map_flags.WRITE_INVALIDATE_REGION)
    try:
        if a.size == 0 or b.size == 0:  # K == 0: a sum over nothing
            out_host.fill(0)
        else:
            if transpose_a:
                a_host = np.swapaxes(a_host, -1, -2)
            if transpose_b:
                b_host = np.swapaxes(b_host, -1, -2)
            np.matmul(a_host, b_host, out=out_host)
    finally:
        for mapped in (out_map, b_map, a_map):
            if mapped is not None:
                mapped.base.release()
    return out


def _map(queue: cl.CommandQueue, tensor: Tensor, flags: int) -> tuple[np.ndarray, np.ndarray | None]:
    """A host array viewing ``tensor``'s buffer (blocking map), and the mapping to release."""
    if tensor.nbytes == 0:
        return np.empty(tensor.shape, tensor.dtype), None
    mapped, _ = cl.enqueue_map_buffer(queue, tensor.data, flags, 0, tensor.shape, tensor.dtype, is_blocking=True)
    return mapped, mapped
