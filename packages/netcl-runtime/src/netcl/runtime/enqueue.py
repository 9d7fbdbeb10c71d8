"""The cheapest enqueue of a kernel whose arguments are already set: ``enqueuer(queue, kernel, g, l)``.

A hot path (a cache-hit jit call, a graph replay) enqueues the same kernel object with the
same sizes again and again, so everything that does not change is prepared once and the
call itself is one C-level ``functools.partial``.

Two ways to enqueue a kernel whose arguments are set: a direct ctypes call of the loader's
``clEnqueueNDRangeKernel`` with ``event=NULL`` (prepared ``size_t`` arrays, no ``argtypes``
conversion), and pyopencl's positional ``_cl.enqueue_nd_range_kernel``, which always requests and
wraps an event. The default (``NETCL_DIRECT_ENQUEUE`` unset or ``auto``) is the direct call on NVIDIA
platforms and pyopencl's positional call elsewhere, the cheaper one on each by measurement (see
benchmarks/RESULTS.md, "Measurements moved out of source docstrings", enqueue.py);
``NETCL_DIRECT_ENQUEUE=1`` / ``0`` forces one. The direct call goes through the very
loader pyopencl loaded (found in ``/proc/self/maps``), so the queue and kernel handles are the
ones pyopencl made; where that loader cannot be found, pyopencl's call is used. Callers that
need an event (timing, ``wait_for``, the last command of a replay) use ``cl.enqueue_nd_range_kernel``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import pyopencl as cl
import pyopencl._cl as _cl

from netcl.runtime.errors import LaunchError

ENV_VAR = "NETCL_DIRECT_ENQUEUE"


def loaded_opencl() -> ctypes.CDLL | None:
    """The OpenCL ICD loader this process already uses (pyopencl's), or None."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libOpenCL" in line and "/" in line})
    except OSError:
        pass
    if not paths:
        found = ctypes.util.find_library("OpenCL")
        paths = [found] if found else []
    for path in paths:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


@functools.cache
def direct_function() -> Callable[..., int] | None:
    """The loader's ``clEnqueueNDRangeKernel`` for ctypes calls (None where it cannot be found)."""
    lib = loaded_opencl()
    if lib is None or not hasattr(lib, "clEnqueueNDRangeKernel"):
        return None
    fn = lib.clEnqueueNDRangeKernel
    fn.restype = ctypes.c_int32  # no argtypes: every argument is passed as a prepared ctypes object
    return fn


def direct_enabled(queue: cl.CommandQueue | None = None) -> bool:
    """Whether enqueuers on ``queue`` call ``clEnqueueNDRangeKernel`` directly by default.

    ``NETCL_DIRECT_ENQUEUE=1`` / ``0`` decide; unset or ``auto``: on NVIDIA platforms (where it is measured
    cheaper: see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", enqueue.py), off elsewhere
    and when no queue is given.
    """
    setting = os.environ.get(ENV_VAR, "auto").strip().lower()
    if setting in ("1", "true", "on", "yes"):
        return True
    if setting not in ("", "auto") or queue is None:
        return False
    key = queue.context.int_ptr
    auto = _AUTO.get(key)
    if auto is None:
        auto = _AUTO[key] = "nvidia" in queue.device.platform.vendor.lower()
    return auto


#: context int_ptr -> whether its platform gets direct enqueues by default
_AUTO: dict[int, bool] = {}


def enqueuer(
    queue: cl.CommandQueue,
    kernel: cl.Kernel,
    global_size: Sequence[int],
    local_size: Sequence[int] | None,
    direct: bool | None = None,
) -> tuple[Callable[[], Any], bool]:
    """``(enqueue, returns_status)``: ``enqueue()`` enqueues ``kernel`` (arguments already set).

    With ``returns_status`` (the direct path) ``enqueue()`` returns the OpenCL status, 0 on
    success (pass anything else to ``raise_status``), and makes no event; otherwise it
    returns the ``cl.Event`` and raises pyopencl's errors itself. The caller keeps ``queue``
    and ``kernel`` alive while it uses ``enqueue``; sizes must already be valid (``launch``
    checks them). ``direct`` True/False picks the path (True falls back to pyopencl's where the
    loader cannot be found); None follows ``direct_enabled(queue)``.
    """
    gsize = tuple(int(g) for g in global_size)
    lsize = None if local_size is None else tuple(int(v) for v in local_size)
    function = direct_function() if (direct_enabled(queue) if direct is None else direct) else None
    if function is None:
        call = functools.partial(_cl.enqueue_nd_range_kernel, queue, kernel, gsize, lsize, None, None, False, False)
        return call, False
    dims = len(gsize)
    array = ctypes.c_size_t * dims
    call = functools.partial(
        function,
        ctypes.c_void_p(queue.int_ptr),
        ctypes.c_void_p(kernel.int_ptr),
        ctypes.c_uint(dims),
        None,
        array(*gsize),
        None if lsize is None else array(*lsize),
        ctypes.c_uint(0),
        None,
        None,
    )
    return call, True


def raise_status(status: int, kernel: cl.Kernel) -> None:
    """Raise the ``LaunchError`` of a failed direct enqueue of ``kernel``."""
    raise LaunchError(f"clEnqueueNDRangeKernel of kernel {kernel.function_name!r} failed with OpenCL status {status}")
