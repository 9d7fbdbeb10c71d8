"""Main-thread CPU microseconds per eager op of ``bench_eager.OPS``, for before/after comparisons on a
shared machine: ``time.thread_time`` counts neither PoCL's worker threads nor other processes' load, which
move ``bench_eager.py``'s wall-clock medians by tens of percent on a 2-core host.

``python benchmarks/eager_thread_time.py [--device SPEC] [--samples 9] [--json PATH]`` prints, per op,
the median over ``--samples`` samples of ``bench_eager.INNER`` calls (no_grad, and inside a ``Tape``
with inputs that require grad), and cProfile's Python calls per op. To compare two trees, run it in
alternating processes with each tree's packages first on ``PYTHONPATH`` and take the median per op.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_eager

import netcl.autograd as ag
import netcl.core as nc


def thread_us(fn: Callable[[], object], sync: Callable[[], None], samples: int, context: Any = nullcontext) -> float:
    """Median main-thread CPU us per call of ``fn`` (``INNER`` calls per sample inside one ``context()``)."""
    with context():
        for _ in range(10):
            fn()
    sync()
    values = []
    for _ in range(samples):
        with context():
            start = time.thread_time_ns()
            for _ in range(bench_eager.INNER):
                fn()
            values.append((time.thread_time_ns() - start) / bench_eager.INNER / 1e3)
        sync()
    return statistics.median(values)


def calls_per_op(fn: Callable[[], object], sync: Callable[[], None], context: Any = nullcontext) -> float:
    """Python calls per call of ``fn`` (cProfile's count over 100 calls, after a warm-up and a collection)."""
    with context():
        for _ in range(10):
            fn()
    sync()
    gc.collect()
    profiler = cProfile.Profile()
    with context():
        profiler.enable()
        for _ in range(100):
            fn()
        profiler.disable()
    sync()
    return pstats.Stats(profiler).total_calls / 100


def raw_enqueue_us(device: Any, samples: int) -> float | None:
    """Main-thread CPU us per raw pyopencl launch of a prepared 1K-element add kernel (``bench_eager``'s
    ``raw enqueue``); None off OpenCL."""
    if device.kind != "opencl":
        return None
    import pyopencl as cl
    import pyopencl._cl as _cl

    source = (
        "__kernel void add(__global const float *a, __global const float *b, __global float *c)"
        "{ size_t i = get_global_id(0); c[i] = a[i] + b[i]; }"
    )
    kernel = cl.Kernel(cl.Program(device.context, source).build(), "add")
    n = bench_eager.SIDE * bench_eager.SIDE
    buffers = [cl.Buffer(device.context, cl.mem_flags.READ_WRITE, size=4 * n) for _ in range(3)]
    kernel.set_args(*buffers)  # the kernel does not keep its arguments alive: ``enqueue`` holds them
    queue = device.queue

    def enqueue() -> None:
        _cl.enqueue_nd_range_kernel(queue, kernel, (n,), (256,), None, None, False, False)

    enqueue.buffers = buffers  # type: ignore[attr-defined]

    return thread_us(enqueue, queue.finish, samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--samples", type=int, default=9)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    device = nc.get_device(args.device)
    sync = device.queue.finish if device.kind == "opencl" else (lambda: None)
    host = bench_eager._host_inputs()
    plain = bench_eager._netcl_inputs(device, host, False)
    tracked = bench_eager._netcl_inputs(device, host, True)
    rows: dict[str, dict[str, float]] = {}
    print(f"main-thread CPU us per op on {device!r}, median of {args.samples} x {bench_eager.INNER} calls")
    raw = raw_enqueue_us(device, args.samples)
    if raw is not None:
        print(f"{'raw enqueue':<16}{raw:>10.2f}")
    print(f"{'op':<16}{'no_grad':>10}{'recording':>11}{'calls':>13}")
    for name, (op, _) in bench_eager.OPS.items():
        with ag.no_grad():
            no_grad = thread_us(lambda op=op: op(plain), sync, args.samples)
        recording = thread_us(lambda op=op: op(tracked), sync, args.samples, ag.Tape)
        with ag.no_grad():
            calls = calls_per_op(lambda op=op: op(plain), sync)
        calls_rec = calls_per_op(lambda op=op: op(tracked), sync, ag.Tape)
        rows[name] = {"no_grad": no_grad, "recording": recording, "calls": calls, "calls_recording": calls_rec}
        print(f"{name:<16}{no_grad:>10.2f}{recording:>11.2f}{calls:>7.0f} /{calls_rec:>4.0f}", flush=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"device": repr(device), "raw_enqueue": raw, "ops": rows}, indent=1))


if __name__ == "__main__":
    main()
