"""Host-side costs: a cache-hit jit call vs one raw pyopencl launch, replay vs re-enqueue, cold vs warm compile."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np
from measure import rand, time_host

import netcl.autograd as ag
from netcl.core import Device, Tensor
from netcl.jit import jit_compile, workloads
from netcl.runtime.graph import Graph


@dataclass
class Chain8Launch:
    """chain8 jitted on three 1K-element inputs (its plan built), and one raw launch of its kernel:
    ``args`` are the three input buffers, a preallocated output's buffer and the element count."""

    fused: Any
    nodes: list[Any]
    kernel: Any
    global_size: int
    local_size: int
    out: Tensor
    args: list[Any]


def chain8_launch(device: Device) -> Chain8Launch:
    nodes = [ag.tensor(rand((1024,), s), device=device) for s in range(3)]
    fused = jit_compile(workloads.chain8)
    with ag.no_grad():
        fused(*nodes)
    kernel, gsize, local = fused.plan_for(*nodes).fused_steps[0]._forward
    out = Tensor.empty((1024,), np.float32, device)
    args = [n.value.data for n in nodes] + [out.data, np.int32(1024)]
    return Chain8Launch(fused, nodes, kernel, gsize, local, out, args)


def jit_vs_raw_launch(device: Device, repeats: int) -> dict[str, float]:
    """Host µs per cache-hit ``jit_compile`` call (1K elements, grad off) vs a raw launch of its kernel.

    The raw launch is pyopencl's ``kernel(queue, gsize, lsize, *args)`` with the arguments
    ready (buffers and an ``np.int32``), writing one preallocated output; the jit call
    allocates its output, checks its signature and returns a Node.
    """
    setup = chain8_launch(device)
    fused, nodes, kernel, buffers = setup.fused, setup.nodes, setup.kernel, setup.args
    queue = device.queue
    gsizes, lsizes = (setup.global_size,), (setup.local_size,)

    def raw() -> None:
        kernel(queue, gsizes, lsizes, *buffers)

    def jitted() -> None:
        with ag.no_grad():
            fused(*nodes)

    raw_us = time_host(raw, repeats, 200)
    queue.finish()
    jit_us = time_host(jitted, repeats, 200)
    queue.finish()
    return {"jit_call_us": jit_us, "raw_launch_us": raw_us, "ratio": jit_us / raw_us}


def replay_vs_enqueue(device: Device, repeats: int) -> dict[str, float]:
    """Host µs per kernel: ``Graph.execute`` of the un-fused chain8 vs launching its kernels again."""
    nodes = [ag.tensor(rand((1024,), s), device=device) for s in range(3)]

    def step() -> object:
        with ag.no_grad():
            return workloads.chain8(*nodes)

    step()
    graph = Graph()
    with graph.capture(device.queue, inputs=[n.value for n in nodes]):
        step()
    kernels = len(graph.launches)
    graph.execute()
    replay_us = time_host(graph.execute, repeats, 50) / kernels
    device.queue.finish()
    eager_us = time_host(step, repeats, 50) / kernels
    device.queue.finish()
    return {"kernels": kernels, "replay_us_per_kernel": replay_us, "eager_us_per_kernel": eager_us}


_COMPILE_SCRIPT = textwrap.dedent(
    """
    import time, numpy as np
    start = time.perf_counter()
    import netcl.autograd as ag
    from netcl.jit import jit_compile, workloads
    from netcl.runtime.cache import program_cache
    nodes = [ag.tensor(np.ones(4096, np.float32), requires_grad=True, device={spec!r}) for _ in range(3)]
    f = jit_compile(workloads.chain8)
    with ag.Tape() as tape:
        out = f(*nodes)
    tape.backward(out, grad=out.value)
    out.to_host()
    s = program_cache.stats()
    print(time.perf_counter() - start, s.builds, s.disk_hits)
    """
)


def cold_vs_warm_compile(device: Device) -> dict[str, float]:
    """Seconds for a fresh process to build chain8 (forward + backward), then again with a warm disk cache."""
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, NETCL_CACHE_DIR=cache_dir, PYOPENCL_NO_CACHE="1", POCL_KERNEL_CACHE="0")
        runs = []
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-c", _COMPILE_SCRIPT.format(spec=device.spec)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            seconds, builds, disk_hits = done.stdout.split()[-3:]
            runs.append((float(seconds), int(builds), int(disk_hits)))
    (cold, cold_builds, _), (warm, warm_builds, warm_hits) = runs
    return {
        "cold_s": cold,
        "warm_s": warm,
        "cold_builds": cold_builds,
        "warm_builds": warm_builds,
        "warm_disk_hits": warm_hits,
    }
