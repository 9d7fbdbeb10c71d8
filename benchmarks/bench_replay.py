"""Host cost per kernel of ``Graph.execute`` vs re-enqueueing the same kernels by hand and vs ``launch``.

Run: ``pytest benchmarks/bench_replay.py`` (pytest-benchmark). A captured sequence of
``N_KERNELS`` tiny kernels is replayed; every round starts on an idle queue (``finish`` in
the untimed setup), so what is timed is host-side enqueue work. The replay test also
measures the baselines itself, side by side, and stores the per-kernel microseconds and the
ratios in ``extra_info`` (``ratio_replay_vs_*`` < 1 means replay is cheaper per kernel):

* ``set_args_enqueue``: ``kernel.set_args(...)`` + ``cl.enqueue_nd_range_kernel`` per kernel,
  what an eager caller that re-sets arguments pays;
* ``enqueue_only``: ``cl.enqueue_nd_range_kernel`` alone with arguments already set, the floor;
* ``launch``: ``netcl.runtime.launch`` per kernel (argument conversion, checks, capture hook).

``replay_keeping_results`` keeps each replay's result alive into the next replay, which then
copies it out of the graph's buffer first (``netcl.runtime.replay_results``): what collecting
losses costs over dropping them.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.runtime.cache import program_cache
from netcl.runtime.graph import Graph, capture_graph
from netcl.runtime.launch import launch

N_KERNELS = 50
SIZE = 64
ROUNDS = 300
SRC = """
__kernel void axpb(__global const float *x, __global float *y, float a, int n) {
    int i = get_global_id(0); if (i < n) y[i] = a * x[i] + 1.0f;
}
"""


class Workload:
    """``N_KERNELS`` launches of one tiny kernel, ping-ponging between two buffers."""

    def __init__(self, device: nc.Device) -> None:
        self.device = device
        self.queue = device.queue
        handle = program_cache.get_or_compile("bench_replay", SRC, device.context)
        self.kernel = handle.kernel("axpb", [None, None, np.float32, np.int32])
        self.x = nc.tensor(np.ones(SIZE, np.float32), device=device)
        self.x2 = nc.tensor(np.full(SIZE, 2.0, np.float32), device=device)
        self.bufs = [nc.Tensor.empty(SIZE, device=device) for _ in range(2)]
        self.steps = []
        src = self.x
        for i in range(N_KERNELS):
            dst = self.bufs[i % 2]
            self.steps.append((src, dst))
            src = dst
        self.raw_args = [
            (s.data, d.data, np.float32(0.5), np.int32(SIZE)) for s, d in self.steps
        ]  # what set_args receives
        self.graph: Graph = capture_graph(self.queue, self.eager, self.x)
        self.graph.execute()
        # a second capture for replay_keeping_results, so its kept result never lands a copy on
        # the replays of self.graph timed beside it
        self.graph_kept: Graph = capture_graph(self.queue, self.eager, self.x)
        self.kept = self.graph_kept.execute()
        self.queue.finish()
        # separate kernel objects with their arguments pre-set, for the enqueue-only floor
        self.preset = []
        for args in self.raw_args:
            k = cl.Kernel(self.kernel.program, "axpb")
            k.set_args(*args)
            self.preset.append(k)

    def eager(self, x: nc.Tensor) -> nc.Tensor:
        for i in range(N_KERNELS):
            src = x if i == 0 else self.bufs[(i - 1) % 2]
            launch(self.kernel, SIZE, None, src, self.bufs[i % 2], 0.5, SIZE)
        return self.bufs[(N_KERNELS - 1) % 2]

    def set_args_enqueue(self) -> None:
        k, q, enqueue = self.kernel, self.queue, cl.enqueue_nd_range_kernel
        for args in self.raw_args:
            k.set_args(*args)
            enqueue(q, k, (SIZE,), (SIZE,))

    def enqueue_only(self) -> None:
        q, enqueue = self.queue, cl.enqueue_nd_range_kernel
        for k in self.preset:
            enqueue(q, k, (SIZE,), (SIZE,))

    def launch_each(self) -> None:
        k, q = self.kernel, self.queue
        for s, d in self.steps:
            launch(k, SIZE, SIZE, s, d, 0.5, SIZE, queue=q)

    def replay(self) -> None:
        self.graph.execute(self.x)

    def replay_keeping_results(self) -> None:
        """``out = g.execute(x)`` in a loop: the previous result is still referenced when the next
        replay starts, so that replay first copies it out of the graph's buffer (one device copy)."""
        self.kept = self.graph_kept.execute(self.x)

    def replay_rebinding(self) -> None:
        """Alternates the input buffer, so every replay rebinds the dynamic slot."""
        self.graph.execute(self.x2)
        self.graph.execute(self.x)


@pytest.fixture(scope="module")
def work() -> Workload:
    if not any(d.kind == "opencl" for d in nc.devices()):
        pytest.skip("no OpenCL device")
    return Workload(nc.get_device("opencl"))


def per_kernel_us(fns: dict[str, tuple[Callable[[], None], int]], queue: cl.CommandQueue, repeats: int = 200):
    """Median host microseconds per kernel of each ``fn`` (name -> (fn, kernels it enqueues)).

    The functions are timed round-robin in a shuffled order, each call starting on an idle
    queue, so load from other processes (or PoCL's worker threads) spreads evenly over them.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    rng = random.Random(0)
    for _ in range(repeats):
        rng.shuffle(order)
        for name, (fn, _kernels) in order:
            queue.finish()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    queue.finish()
    return {name: statistics.median(times[name]) / kernels * 1e6 for name, (_fn, kernels) in fns.items()}


def run(benchmark, fn: Callable[[], None], queue: cl.CommandQueue) -> None:
    benchmark.pedantic(fn, setup=queue.finish, rounds=ROUNDS, iterations=1, warmup_rounds=10)
    queue.finish()


def test_replay_results_match_eager(work):
    expected = np.ones(SIZE, np.float64)
    for _ in range(N_KERNELS):
        expected = 0.5 * expected + 1.0
    np.testing.assert_allclose(work.graph.execute(work.x).to_host(), expected, rtol=1e-6)


def test_replay(benchmark, work):
    """Graph.execute of the captured sequence; ratios against the baselines in extra_info."""
    run(benchmark, work.replay, work.queue)
    measured = per_kernel_us(
        {
            "replay": (work.replay, N_KERNELS),
            "set_args_enqueue": (work.set_args_enqueue, N_KERNELS),
            "enqueue_only": (work.enqueue_only, N_KERNELS),
            "launch": (work.launch_each, N_KERNELS),
            "replay_rebinding": (work.replay_rebinding, 2 * N_KERNELS),
            "replay_keeping_results": (work.replay_keeping_results, N_KERNELS),
        },
        work.queue,
    )
    benchmark.extra_info["kernels"] = N_KERNELS
    benchmark.extra_info["device"] = work.device.name
    for name, us in measured.items():
        benchmark.extra_info[f"{name}_us_per_kernel"] = round(us, 3)
    for name in ("set_args_enqueue", "enqueue_only", "launch"):
        benchmark.extra_info[f"ratio_replay_vs_{name}"] = round(measured["replay"] / measured[name], 3)
    print(
        "\nper-kernel host us: "
        + ", ".join(f"{k}={v:.2f}" for k, v in measured.items())
        + f"; replay/set_args_enqueue={measured['replay'] / measured['set_args_enqueue']:.2f}"
        + f", replay/enqueue_only={measured['replay'] / measured['enqueue_only']:.2f}"
        + f", replay/launch={measured['replay'] / measured['launch']:.2f}"
    )


def test_replay_rebinding_inputs(benchmark, work):
    """Two replays per round with alternating inputs: the dynamic slot is rebound each time."""
    run(benchmark, work.replay_rebinding, work.queue)
    benchmark.extra_info["kernels"] = 2 * N_KERNELS


def test_set_args_enqueue(benchmark, work):
    """Baseline: kernel.set_args + cl.enqueue_nd_range_kernel for each kernel."""
    run(benchmark, work.set_args_enqueue, work.queue)
    benchmark.extra_info["kernels"] = N_KERNELS


def test_enqueue_only(benchmark, work):
    """Floor: cl.enqueue_nd_range_kernel alone, arguments already set."""
    run(benchmark, work.enqueue_only, work.queue)
    benchmark.extra_info["kernels"] = N_KERNELS


def test_launch(benchmark, work):
    """netcl.runtime.launch for each kernel."""
    run(benchmark, work.launch_each, work.queue)
    benchmark.extra_info["kernels"] = N_KERNELS
