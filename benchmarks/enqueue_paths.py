"""Host µs per enqueue of one 1K-element kernel by each candidate path (see netcl.runtime.enqueue).

``python benchmarks/enqueue_paths.py`` prints one JSON object: the pyopencl paths, the direct
ctypes call of the ICD loader's ``clEnqueueNDRangeKernel`` with and without an event, and the
cost of setting one buffer argument. Thread CPU time (``time.thread_time``) is used, so other
processes on a shared machine disturb it less than wall-clock; the queue is drained between
samples.
"""

from __future__ import annotations

import ctypes
import functools
import json
import time
from collections.abc import Callable

import pyopencl as cl
import pyopencl._cl as _cl
from dispatch import chain8_launch

from netcl.core import Device, get_device
from netcl.runtime import enqueue as enqueue_module


def thread_us(fn: Callable[[], object], queue: cl.CommandQueue, inner: int = 500, repeats: int = 9) -> float:
    """Fastest of ``repeats`` samples of thread CPU µs per call (``inner`` calls per sample)."""
    for _ in range(20):
        fn()
    queue.finish()
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(inner):
            fn()
        best = min(best, (time.thread_time() - start) / inner * 1e6)
        queue.finish()
    return best


def enqueue_paths(device: Device) -> dict[str, float]:
    setup = chain8_launch(device)
    kernel, gsize, local, out, args = setup.kernel, setup.global_size, setup.local_size, setup.out, setup.args
    queue = device.queue
    g, loc = (gsize,), (local,)
    private = cl.Kernel(kernel.program, kernel.function_name)
    private.set_args(*args)
    results: dict[str, float] = {}

    def invoker() -> None:
        kernel(queue, g, loc, *args)

    def set_args_enqueue() -> None:
        kernel.set_args(*args)
        cl.enqueue_nd_range_kernel(queue, kernel, g, loc)

    preset = functools.partial(_cl.enqueue_nd_range_kernel, queue, private, g, loc, None, None, False, False)
    multi = (3, out.data)

    def set_one_buffer() -> None:
        private._set_arg_multi(multi)

    results["invoker_us"] = thread_us(invoker, queue)
    results["set_args_enqueue_us"] = thread_us(set_args_enqueue, queue)
    results["preset_pyopencl_us"] = thread_us(preset, queue)
    results["set_one_buffer_us"] = thread_us(set_one_buffer, queue)
    lib = enqueue_module.loaded_opencl()
    if lib is not None:
        fn = lib.clEnqueueNDRangeKernel
        fn.restype = ctypes.c_int32
        size = ctypes.c_size_t * 1
        event = ctypes.c_void_p()
        release = lib.clReleaseEvent
        common = (ctypes.c_void_p(queue.int_ptr), ctypes.c_void_p(private.int_ptr), ctypes.c_uint(1), None)
        sizes = (size(gsize), size(local), ctypes.c_uint(0), None)
        no_event = functools.partial(fn, *common, *sizes, None)
        with_event = functools.partial(fn, *common, *sizes, ctypes.byref(event))

        def direct_with_event() -> None:
            with_event()
            release(event)

        results["preset_direct_no_event_us"] = thread_us(no_event, queue)
        results["preset_direct_event_us"] = thread_us(direct_with_event, queue)
    return results


if __name__ == "__main__":
    device = get_device()
    print(json.dumps({"device": device.name, **enqueue_paths(device)}))
