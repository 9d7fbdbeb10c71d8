"""`hatch run bench --workload launch`: host cost of launches, one table.

Rows: a raw pyopencl launch (``kernel(queue, gsize, lsize, *args)``) vs a cache-hit
``jit_compile`` call of the same kernel (chain8, 1K elements, grad off) and their ratio
(target <= 1.3); ``Graph.execute`` µs per captured kernel for the un-fused chain8 (8 kernels)
and for 50 tiny kernels (bench_replay's workload), next to the enqueue-only floor (target
<= 4 µs on the GPU); the candidate enqueue paths of ``netcl.runtime.enqueue``; and an
optimizer step over the MLP's 6 parameters, multi-tensor vs one kernel per parameter (host
µs, and whether their results are bit-identical). Host
times are the median of wall-clock samples and, beside them, the fastest thread-CPU sample
(less disturbed by other processes on a shared machine).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from dispatch import jit_vs_raw_launch, replay_vs_enqueue
from enqueue_paths import enqueue_paths, thread_us
from measure import rand

import netcl.autograd as ag
from netcl.core import Device, get_device
from netcl.jit import jit_compile, workloads
from netcl.runtime import enqueue


def thread_times(device: Device) -> dict[str, float]:
    """Thread-CPU µs: raw launch, cache-hit jit call, ratio (same kernel, 1K elements)."""
    nodes = [ag.tensor(rand((1024,), s), device=device) for s in range(3)]
    fused = jit_compile(workloads.chain8)
    with ag.no_grad():
        fused(*nodes)
    kernel, gsize, local = fused.plan_for(*nodes).fused_steps[0]._forward
    out = ag.tensor(np.zeros(1024, np.float32), device=device).value
    args = [n.value.data for n in nodes] + [out.data, np.int32(1024)]
    queue, g, loc = device.queue, (gsize,), (local,)

    def raw() -> None:
        kernel(queue, g, loc, *args)

    def jitted() -> None:
        fused(*nodes)

    with ag.no_grad():
        raw_us, jit_us = thread_us(raw, queue), thread_us(jitted, queue)
    return {"raw_launch_cpu_us": raw_us, "jit_call_cpu_us": jit_us, "ratio_cpu": jit_us / raw_us}


def replay_50(device: Device) -> dict[str, float]:
    """bench_replay's 50 tiny kernels: replay vs enqueue-only vs launch, µs per kernel (median wall)."""
    from bench_replay import N_KERNELS, Workload, per_kernel_us

    work = Workload(device)
    measured = per_kernel_us(
        {
            "replay50": (work.replay, N_KERNELS),
            "enqueue_only50": (work.enqueue_only, N_KERNELS),
            "launch50": (work.launch_each, N_KERNELS),
        },
        work.queue,
        repeats=100,
    )
    return {f"{k}_us_per_kernel": v for k, v in measured.items()}


def optimizer_steps(device: Device) -> dict[str, float]:
    """Host µs of one ``opt.step()`` over the MLP's 6 parameters: multi-tensor vs one kernel each, and
    whether 3 steps of both give bit-identical parameters (SGD momentum 0.9 and Adam)."""
    from netcl import nn
    from netcl.optim import SGD, Adam
    from netcl.optim.optimizer import Optimizer

    shapes = [(784, 512), (512,), (512, 512), (512,), (512, 10), (10,)]
    rng = np.random.default_rng(0)
    values = [(0.01 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    results: dict[str, float] = {}
    for cls, kwargs in ((SGD, {"lr": 1e-3, "momentum": 0.9}), (Adam, {"lr": 1e-3})):
        finals = []
        for multi in (True, False):
            params = [nn.Parameter(v, device=device) for v in values]
            opt = cls(params, **kwargs)
            if not multi:  # the per-parameter kernels, as before multi-tensor updates
                opt.update_many = lambda batch, group, hyper, opt=opt: Optimizer.update_many(opt, batch, group, hyper)
            for step_grads in grads:
                for p, g in zip(params, step_grads, strict=True):
                    p.grad = ag.tensor(g, device=device).value
                opt.step()
            finals.append([p.to_host() for p in params])
            label = f"{cls.__name__.lower()}_step_{'multi' if multi else 'per_param'}"
            results[f"{label}_cpu_us"] = thread_us(opt.step, device.queue, inner=100, repeats=5)
        same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(*finals, strict=True))
        results[f"{cls.__name__.lower()}_multi_bit_identical"] = float(same)
    return results


def run(device_spec: str | None = None, quick: bool = False) -> dict[str, float]:
    device = get_device(device_spec)
    if device.kind != "opencl":
        print("launch costs are an OpenCL measurement; the device is the NumPy backend")
        return {}
    repeats = 5 if quick else 15
    direct = enqueue.direct_enabled(device.queue) and enqueue.direct_function() is not None
    results: dict[str, float] = {"direct_enqueue": float(direct)}
    steps: list[Callable[[], dict]] = [
        lambda: jit_vs_raw_launch(device, repeats),
        lambda: thread_times(device),
        lambda: replay_vs_enqueue(device, repeats),
        lambda: replay_50(device),
        lambda: {f"path_{k}": v for k, v in enqueue_paths(device).items()},
        lambda: optimizer_steps(device),
    ]
    start = time.perf_counter()
    for step in steps:
        results.update(step())
    print(f"launch costs on {device.name} ({time.perf_counter() - start:.1f} s)")
    for name, value in results.items():
        print(f"  {name:<34} {value:9.3f}")
    return results


if __name__ == "__main__":
    run()
