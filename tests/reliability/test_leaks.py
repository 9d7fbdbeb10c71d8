"""Leaks: repeated training steps keep the device-memory pool flat after warm-up.

After a warm-up, every further step must find the pool exactly where it was: the same bytes
and blocks held by live tensors, nothing more reserved from the device, no fresh device
allocation (every buffer comes back from the pool), no kernel rebuilt and no new JIT plan. The
default count is 200 steps; ``--hypothesis-profile=long`` (or NETCL_RELIABILITY_LONG=1) also
runs 10,000. Python's cyclic garbage collector is disabled during the loop, so a buffer that is
only freed by a reference cycle's collection counts as a leak too.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.autograd.graph import CompiledGraph
from netcl.jit import jit_compile
from netcl.runtime import memory
from netcl.runtime import ops as R
from netcl.runtime.cache import program_cache

WARMUP = 20
COUNTS = [200, pytest.param(10_000, marks=pytest.mark.long)]
LR = 0.01


@jit_compile
def head_loss(x, w, b, t):
    """A fused elementwise head: broadcast weight and bias, GELU, squared error."""
    d = ag.gelu(x * w + b) - t
    return d * d


def _model(device):
    rng = np.random.default_rng(0)
    w = ag.tensor(rng.normal(size=(1, 16)).astype(np.float32), requires_grad=True, device=device)
    b = ag.tensor(np.zeros((1, 16), np.float32), requires_grad=True, device=device)
    data = [
        (
            ag.tensor(rng.normal(size=(32, 16)).astype(np.float32), device=device),
            ag.tensor(rng.normal(size=(32, 16)).astype(np.float32), device=device),
        )
        for _ in range(4)
    ]
    return [w, b], data


def _step(params, x, t):
    w, b = params
    with ag.Tape() as tape:
        loss = head_loss(x, w, b, t).sum()
    tape.backward(loss)
    for p in params:
        R.add_(p.value, R.mul(p.grad, -LR))
    return loss


def _snapshot(device):
    gc.collect()  # automatic collection is off (no_gc); collect what the steps left in cycles
    device.queue.finish()
    s = memory.memory_stats(device)
    return {
        "allocated_bytes": s.allocated_bytes,
        "active_blocks": s.active_blocks,
        "reserved_bytes": s.reserved_bytes,
        "fresh_allocations": s.fresh_allocations,
        "builds": program_cache.stats().builds,
        "plans": head_loss.cache_info()["entries"],
    }


@pytest.fixture
def no_gc():
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if enabled:
        gc.enable()


@pytest.mark.parametrize("count", COUNTS)
def test_jitted_training_step_keeps_memory_flat(cl_device, no_gc, count):
    params, data = _model(cl_device)

    def run(steps):
        for i in range(steps):
            for p in params:
                p.grad = None
            loss = _step(params, *data[i % len(data)])
        return float(loss.to_host())

    first = run(WARMUP)
    before = _snapshot(cl_device)
    last = run(count)
    assert _snapshot(cl_device) == before
    assert np.isfinite(last) and last != first


@pytest.mark.parametrize("count", COUNTS)
def test_replayed_compiled_graph_keeps_memory_flat(cl_device, no_gc, count):
    params, data = _model(cl_device)
    graph = CompiledGraph(params=params)
    with graph:
        graph.outputs = _step(params, *data[0])
    graph.compile(list(data[0]))

    def run(steps):
        for i in range(steps):
            out = graph.replay(list(data[i % len(data)]))
        return float(out.to_host())

    first = run(WARMUP)
    before = _snapshot(cl_device)
    last = run(count)
    assert _snapshot(cl_device) == before
    assert np.isfinite(last) and last != first


def test_eager_and_jitted_steps_agree_so_the_loop_is_real(cl_device):
    """The step the leak tests repeat computes the right thing (checked against NumPy float64)."""
    params, data = _model(cl_device)
    w0, b0 = (p.to_host().astype(np.float64) for p in params)
    x, t = (v.to_host().astype(np.float64) for v in data[0])
    loss = float(_step(params, *data[0]).to_host())
    u = 0.7978845608028654 * ((x * w0 + b0) + 0.044715 * (x * w0 + b0) ** 3)
    expected = (((0.5 * (x * w0 + b0) * (1 + np.tanh(u))) - t) ** 2).sum()
    assert loss == pytest.approx(expected, rel=1e-4)
    assert not np.allclose(params[0].to_host(), w0)  # the update ran
