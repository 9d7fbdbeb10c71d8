"""matmul on CPU OpenCL devices through the host BLAS, zero-copy.

A CPU OpenCL device (PoCL, Intel's CPU runtime) keeps its buffers in host memory, so mapping
one costs no copy; NumPy's ``matmul`` (OpenBLAS, on every core) then runs on the mapped arrays
and writes straight into the mapped output buffer: on the pool's host views of the blocks where the
device's pool keeps them (``netcl.runtime.host_views``: no map per product), else on maps made for it.
A GEMM kernel written for GPUs is many times slower there (see benchmarks/RESULTS.md, "Measurements
moved out of source docstrings", host_blas.py).

Capture/replay: a capture on the device's queue records the host call as a graph command
(``HostMatmul``) holding the three buffers, so a replay maps and multiplies them again, with
new input buffers where the graph's inputs changed; the GPU GEMM kernel is never recorded on a
CPU device (it is far slower there than the host product, same pointer).
``NETCL_HOST_BLAS=0`` turns the path off. The products ``gemm_cpu`` takes do not come here (on a device of 16-wide
float vectors nearly all of them, small 2-D ones elsewhere; ``gemm_cpu.plan``): a kernel shaped for CPU devices runs
them without a map or a wait.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor, host_pool
from netcl.core.profile_hooks import ACTIVE as _PROFILERS
from netcl.core.profile_hooks import HOST, now, report
from netcl.runtime import capture
from netcl.runtime.host_views import host_memory_device
from netcl.runtime.memory import host_view

ENV_VAR = "NETCL_HOST_BLAS"
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("0", "false", "no", "off")


def applies(device: Device, a: Tensor, b: Tensor, result: np.dtype) -> bool:
    """Whether ``a @ b`` on ``device`` runs on the host BLAS: a host-memory CPU OpenCL device and
    both operands already of the float32/float64 result dtype."""
    return result in _DTYPES and a.dtype == result and b.dtype == result and host_memory(device) and enabled()


@functools.cache
def host_memory(device: Device) -> bool:
    """``host_memory_device``, asked once per device (a pyopencl info query per product otherwise)."""
    return host_memory_device(device)


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
    out = Tensor.empty(out_shape, result, device)
    if out.size == 0:
        return out
    command = HostMatmul(a.shape, b.shape, out.shape, result, transpose_a, transpose_b)
    capture.record_command(device.queue, command, [a.data, b.data, out.data], keep=(a, b, out))
    start = now() if _PROFILERS else 0
    command.run(device.queue, a.data, b.data, out.data)
    if start:
        report(HOST, command.__name__, device.queue, None, start, args=(a, b))
    return out


class HostMatmul:
    """One host BLAS product on three buffers of fixed shapes; a graph replays it as a command."""

    __name__ = "host_matmul"

    def __init__(self, a_shape, b_shape, out_shape, dtype: np.dtype, transpose_a: bool, transpose_b: bool) -> None:
        self.shapes = (tuple(a_shape), tuple(b_shape), tuple(out_shape))
        self.dtype, self.transpose_a, self.transpose_b = np.dtype(dtype), transpose_a, transpose_b

    def __call__(self, queue: cl.CommandQueue, a, b, out, wait_for=None) -> cl.Event:
        """Replay: wait for ``wait_for``, multiply, and return a marker of the queue."""
        if wait_for:
            cl.wait_for_events(list(wait_for))
        self.run(queue, a, b, out)
        return cl.enqueue_marker(queue)

    def run(self, queue: cl.CommandQueue, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer) -> None:
        """``np.matmul`` of ``a`` and ``b`` into ``out``, once the queue's earlier work is done: on the pool's
        host views of the three (``memory.host_view``) after a finish of the queue, else on maps of them (waiting
        for the three maps at once), unmapped after."""
        a_shape, b_shape, out_shape = self.shapes
        views = (host_view(a, a_shape, self.dtype), host_view(b, b_shape, self.dtype))
        if views[0] is not None and views[1] is not None:
            written = host_view(out, out_shape, self.dtype)
            if written is not None:
                queue.finish()
                self._multiply(*views, written)
                return
        events: list[cl.Event] = []
        try:
            a_host, a_map = _map(queue, a, a_shape, self.dtype, cl.map_flags.READ, events)
            b_host, b_map = _map(queue, b, b_shape, self.dtype, cl.map_flags.READ, events)
            out_host, out_map = _map(queue, out, out_shape, self.dtype, cl.map_flags.WRITE_INVALIDATE_REGION, events)
        finally:
            if events:  # one wait for all three maps: each blocking map is a round trip to the driver's thread
                cl.wait_for_events(events)
        try:
            self._multiply(a_host, b_host, out_host)
        finally:
            for mapped in (out_map, b_map, a_map):
                if mapped is not None:
                    mapped.base.release()

    def _multiply(self, a_host: np.ndarray, b_host: np.ndarray, out_host: np.ndarray) -> None:
        """The product of the host arrays (transposed as asked) into ``out_host``."""
        if a_host.size == 0 or b_host.size == 0:  # K == 0: a sum over nothing
            out_host.fill(0)
            return
        if self.transpose_a:
            a_host = np.swapaxes(a_host, -1, -2)
        if self.transpose_b:
            b_host = np.swapaxes(b_host, -1, -2)
        with np.errstate(all="ignore"):  # inf/NaN as IEEE arithmetic says, silently, as the kernels do
            host_pool.matmul(a_host, b_host, out=out_host)


def _map(
    queue: cl.CommandQueue,
    buffer: cl.Buffer,
    shape: tuple[int, ...],
    dtype: np.dtype,
    flags: int,
    events: list[cl.Event],
) -> tuple[np.ndarray, np.ndarray | None]:
    """A host array of ``shape`` viewing ``buffer`` (a non-blocking map: valid once the map's event,
    appended to ``events``, completes), and the mapping to release."""
    if int(np.prod(shape)) == 0:
        return np.empty(shape, dtype), None
    mapped, event = cl.enqueue_map_buffer(queue, buffer, flags, 0, shape, dtype, is_blocking=False)
    events.append(event)
    return mapped, mapped
