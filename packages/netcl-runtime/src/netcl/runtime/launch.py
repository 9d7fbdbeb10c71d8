"""``launch``: the one function through which every kernel launch in netcl goes."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pyopencl as cl

from netcl.core import Tensor
from netcl.core.devices import devices
from netcl.runtime import capture as _capture
from netcl.runtime.cache import KernelHandle
from netcl.runtime.errors import LaunchError

#: cl.Kernel objects hold their arguments, so setting them and enqueueing must not interleave.
_LAUNCH_LOCK = threading.Lock()
_QUEUE_OF_CONTEXT: dict[int, cl.CommandQueue] = {}
_PREFERRED_LOCAL = (256, 128, 64, 32, 16, 8, 4, 2, 1)


def launch(
    kernel: KernelHandle | cl.Kernel,
    global_size: int | Sequence[int],
    local_size: int | Sequence[int] | None,
    *args: Any,
    queue: cl.CommandQueue | None = None,
    wait_for: Sequence[cl.Event] | None = None,
) -> cl.Event:
    """Set ``args`` on ``kernel`` and enqueue it; returns the event.

    ``args`` may be ``cl.Buffer``, ``Tensor`` (its buffer is passed), numpy scalars, or Python
    numbers when the kernel's scalar dtypes were declared (``KernelHandle.kernel(name, dtypes)``).
    With ``local_size=None`` a 1-D launch gets the largest of 256, 128, ... that divides the
    global size and the kernel allows; other shapes leave the choice to the driver.
    ``queue`` defaults to the default queue of the device that owns the kernel's context.
    If a capture is recording on the queue, the launch is also recorded.
    """
    cl_kernel = kernel if isinstance(kernel, cl.Kernel) else kernel.kernel()
    gsize = (global_size,) if isinstance(global_size, int) else tuple(global_size)
    if any(g <= 0 for g in gsize):
        raise LaunchError(f"global size {gsize} must be positive in every dimension")
    if local_size is None:
        lsize = _pick_local_size(cl_kernel, gsize)
    else:
        lsize = (local_size,) if isinstance(local_size, int) else tuple(local_size)
        if len(lsize) != len(gsize) or any(g % loc for g, loc in zip(gsize, lsize, strict=True)):
            raise LaunchError(f"local size {lsize} must divide global size {gsize} in every dimension")
    if queue is None:
        queue = default_queue_for(cl_kernel.context)
    raw = [a.data if isinstance(a, Tensor) else a for a in args]
    with _LAUNCH_LOCK:
        try:
            cl_kernel.set_args(*raw)
        except (cl.LogicError, TypeError, ValueError) as exc:
            raise LaunchError(f"cannot set arguments of kernel {cl_kernel.function_name!r}: {exc}") from exc
        event = cl.enqueue_nd_range_kernel(queue, cl_kernel, gsize, lsize, wait_for=wait_for)
    if _capture.RECORDING:
        _capture.record(queue, cl_kernel, gsize, lsize, raw)
    return event


def default_queue_for(context: cl.Context) -> cl.CommandQueue:
    """The default queue of the netcl device that owns ``context``."""
    key = context.int_ptr
    queue = _QUEUE_OF_CONTEXT.get(key)
    if queue is None:
        for device in devices():
            if device.kind == "opencl" and "context" in device.__dict__ and device.context == context:
                queue = device.queue
                break
        else:
            raise LaunchError("kernel's context belongs to no netcl device; pass queue= explicitly")
        _QUEUE_OF_CONTEXT[key] = queue
    return queue


def _pick_local_size(kernel: cl.Kernel, gsize: tuple[int, ...]) -> tuple[int, ...] | None:
    if len(gsize) != 1:
        return None
    device = kernel.context.devices[0]
    limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device)
    for size in _PREFERRED_LOCAL:
        if size <= limit and gsize[0] % size == 0:
            return (size,)
    return None
