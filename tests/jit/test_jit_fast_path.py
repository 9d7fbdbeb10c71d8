"""The cache-hit path of a one-kernel jit plan without gradients (``Plan.fast``): same results as
the general path, results never overwritten while referenced, recycled once dropped, captured."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.jit import jit_compile, workloads
from netcl.jit.fused_step import RING_SIZE
from netcl.runtime import memory
from netcl.runtime.graph import Graph

N = 257
# float32 elementwise chains of O(1) values against float64: a few ulps per op
RTOL, ATOL = 1e-5, 1e-6


def _rand(seed: int, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _scaled(x, s):
    return ag.tanh(x * s) + s


def test_fast_path_is_taken_without_gradients_only(cl_device):
    fused = jit_compile(workloads.chain8)
    args = [ag.tensor(_rand(s), device=cl_device) for s in range(3)]
    with ag.no_grad():
        assert fused.plan_for(*args).fast is not None
    grads = [ag.tensor(_rand(s), requires_grad=True, device=cl_device) for s in range(3)]
    assert fused.plan_for(*grads).fast is None  # a gradient goes through autograd
    with ag.no_grad():
        assert fused.plan_for(*grads).fast is not None


def test_results_match_float64_and_are_never_overwritten_while_held(cl_device):
    fused = jit_compile(workloads.chain8)
    held = []
    with ag.no_grad():
        for seed in range(3 * RING_SIZE):
            host = [_rand(seed + k) for k in range(3)]
            held.append((fused(*[ag.tensor(h, device=cl_device) for h in host]), host))
    assert len({id(out.value.data) for out, _ in held}) == len(held)
    for out, host in held:
        expected = workloads.chain8_reference(*(h.astype(np.float64) for h in host))
        np.testing.assert_allclose(out.to_host(), expected, rtol=RTOL, atol=ATOL)


def test_dropped_results_are_recycled_without_new_allocations(cl_device, settled_memory):
    fused = jit_compile(workloads.chain8)
    args = [ag.tensor(_rand(s), device=cl_device) for s in range(3)]
    expected = workloads.chain8_reference(*(_rand(s).astype(np.float64) for s in range(3)))
    with ag.no_grad():
        fused(*args)
        before = settled_memory(cl_device)
        for _ in range(50):
            out = fused(*args)
            view = out.value.reshape((1, N))  # a view holds the buffer as well
            del out
            np.testing.assert_allclose(view.to_host().reshape(-1), expected, rtol=RTOL, atol=ATOL)
            del view
    after = settled_memory(cl_device)
    assert after.fresh_allocations == before.fresh_allocations
    assert after.allocated_bytes == before.allocated_bytes


def test_tensor_and_scalar_arguments_and_several_outputs(cl_device):
    scaled = jit_compile(_scaled)

    @jit_compile
    def two(x, y):
        h = x * y
        return ag.sigmoid(h), h + y

    x, y = _rand(1), _rand(2)
    xt = ag.tensor(x, device=cl_device).value  # a bare Tensor argument
    with ag.no_grad():
        for s in (0.5, 2, np.float64(-1.25)):
            out = scaled(xt, s)
            assert isinstance(out, ag.Node)
            np.testing.assert_allclose(out.to_host(), np.tanh(x * np.float32(s)) + np.float32(s), rtol=RTOL, atol=ATOL)
        p, q = two(ag.tensor(x, device=cl_device), ag.tensor(y, device=cl_device))
    assert scaled.cache_info()["hits"] == 2
    np.testing.assert_allclose(p.to_host(), 1 / (1 + np.exp(-(x * y.astype(np.float64)))), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(q.to_host(), x * y.astype(np.float64) + y, rtol=RTOL, atol=ATOL)


def test_a_capture_records_the_fast_call_and_replays_it(cl_device):
    fused = jit_compile(workloads.chain8)
    args = [ag.tensor(_rand(s), device=cl_device) for s in range(3)]
    with ag.no_grad():
        fused(*args)  # compiled: the call below is a cache hit
        graph = Graph()
        with graph.capture(cl_device.queue, inputs=[a.value for a in args]):
            graph.outputs = fused(*args).value
    assert [s.name for s in graph.launches] == ["fused_forward"]
    new = [_rand(10 + s) for s in range(3)]
    out = graph.execute(*[nc.tensor(h, device=cl_device) for h in new])
    expected = workloads.chain8_reference(*(h.astype(np.float64) for h in new))
    np.testing.assert_allclose(out.to_host(), expected, rtol=RTOL, atol=ATOL)


def test_numpy_backend_has_no_fast_path():
    fused = jit_compile(workloads.chain8)
    args = [ag.tensor(_rand(s), device="cpu") for s in range(3)]
    with ag.no_grad():
        assert fused.plan_for(*args).fast is None
        out = fused(*args)
    expected = workloads.chain8_reference(*(_rand(s).astype(np.float64) for s in range(3)))
    np.testing.assert_allclose(out.to_host(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("nbytes_over", [False, True])
def test_large_outputs_come_from_the_allocator(cl_device, nbytes_over, monkeypatch):
    from netcl.jit import fused_step

    if nbytes_over:
        monkeypatch.setattr(fused_step, "RING_MAX_BYTES", 16)
    fused = jit_compile(workloads.chain8)
    args = [ag.tensor(_rand(s), device=cl_device) for s in range(3)]
    with ag.no_grad():
        outs = [fused(*args) for _ in range(3)]
    expected = workloads.chain8_reference(*(_rand(s).astype(np.float64) for s in range(3)))
    for out in outs:
        np.testing.assert_allclose(out.to_host(), expected, rtol=RTOL, atol=ATOL)
    assert memory.memory_stats(cl_device).active_blocks >= 3


@pytest.mark.parametrize("trusted", [True, False])
def test_the_ring_serves_small_outputs_only_where_reference_counts_are_trusted(cl_device, trusted, monkeypatch):
    """Results dropped at once: the ring hands its free buffer out again without asking the allocator; where
    ``RING_COUNTS_TRUSTED`` is False (CPython 3.14, free-threaded builds) every call asks it."""
    from netcl.jit import fused_step

    monkeypatch.setattr(fused_step, "RING_COUNTS_TRUSTED", trusted)
    fused = jit_compile(workloads.chain8)
    args = [ag.tensor(_rand(s), device=cl_device) for s in range(3)]
    expected = workloads.chain8_reference(*(_rand(s).astype(np.float64) for s in range(3)))
    with ag.no_grad():
        np.testing.assert_allclose(fused(*args).to_host(), expected, rtol=RTOL, atol=ATOL)
        before = memory.memory_stats(cl_device)
        for _ in range(5):
            fused(*args)
        after = memory.memory_stats(cl_device)
    requests = (after.served_from_pool + after.fresh_allocations) - (before.served_from_pool + before.fresh_allocations)
    assert requests == (0 if trusted else 5)


def test_a_replay_result_and_a_parameter_as_arguments(cl_device):
    """Tensor subclasses (a graph's ReplayResult) and Node subclasses (nn.Parameter) on the fast path."""
    import netcl.nn as nn
    from netcl.runtime.graph import capture_graph
    from netcl.runtime.ops import mul

    x = nc.tensor(_rand(1), device=cl_device)
    graph = capture_graph(cl_device.queue, lambda t: mul(t, 2.0), x)
    doubled = graph.execute(x)
    assert type(doubled) is not nc.Tensor and isinstance(doubled, nc.Tensor)
    weight = nn.Parameter(_rand(2), device=cl_device)
    scaled = jit_compile(_scaled)
    with ag.no_grad():
        scaled(doubled, 0.5)
        out = scaled(doubled, 0.5)  # cache hit: the fast path
        both = jit_compile(lambda a, b: a * b)
        both(doubled, weight)
        product = both(doubled, weight)
    np.testing.assert_allclose(out.to_host(), np.tanh(2 * _rand(1) * 0.5) + 0.5, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(product.to_host(), 2 * _rand(1).astype(np.float64) * _rand(2), rtol=RTOL, atol=ATOL)
