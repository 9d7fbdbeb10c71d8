"""Replay results are never silently wrong: Graph.execute, CompiledGraph.replay, FusedGraph.execute.

Each path replays into the same captured buffers. A training loop that collects its losses must
read back each step's own loss (the issue: three batches with MSE 0.745, 0.833, 2.260 read back
as 2.260 three times), and a result too large to be copied out when the next replay runs must
raise ``StaleResultError`` when read, not return the newer value. Losses are checked against a
float64 NumPy twin of the same steps: float32 sums of a few dozen O(1) terms agree to ~1e-6
relative, so rtol 1e-5; a stale (wrong-step) loss is off by O(1).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.autograd.graph import CompiledGraph
from netcl.jit import fuse_graph
from netcl.runtime import ops as R
from netcl.runtime.errors import ReplayError, StaleResultError
from netcl.runtime.graph import capture_graph
from netcl.runtime.replay_results import ReplayResult

RTOL = 1e-5
B, F, K = 6, 4, 3
LR = 0.1


def batches(count: int = 3):
    rng = np.random.default_rng(3)
    xs = [(rng.normal(size=(B, F)) * (i + 1)).astype(np.float32) for i in range(count)]
    y = rng.normal(size=(B, K)).astype(np.float32)
    w = rng.normal(scale=0.5, size=(F, K)).astype(np.float32)
    return xs, y, w


def numpy_losses(xs, y, w, train: bool):
    """MSE of x @ w against y per batch, with an SGD step on w after each when ``train``."""
    w = w.astype(np.float64)
    losses = []
    for x in xs:
        d = x.astype(np.float64) @ w - y
        losses.append(np.mean(d * d))
        if train:
            w = w - LR * (2.0 / d.size) * x.T.astype(np.float64) @ d
    return losses


def mse(pred, target):
    d = pred - target
    return ag.mean(d * d)


def sgd(params):
    for p in params:
        R.add_(p.value, R.mul(p.grad, -LR))


# ---- Graph.execute ------------------------------------------------------------------------------
def _mse_tensors(x: nc.Tensor, w: nc.Tensor, y: nc.Tensor) -> nc.Tensor:
    d = R.sub(R.matmul(x, w), y)
    return R.mean(R.mul(d, d))


def test_graph_collected_losses_read_back_correctly(device):
    xs, y, w = batches()
    xt = [nc.tensor(x, device=device) for x in xs]
    wt, yt = nc.tensor(w, device=device), nc.tensor(y, device=device)
    graph = capture_graph(None, _mse_tensors, xt[0], wt, yt)
    losses = [graph.execute(x, wt, yt) for x in xt]
    got = [float(loss.to_host()) for loss in losses]
    np.testing.assert_allclose(got, numpy_losses(xs, y, w, train=False), rtol=RTOL)
    assert len(set(got)) == 3  # the three batches really differ


def test_graph_result_over_snapshot_bytes_raises_stale_result_error(cl_device):
    xs, y, w = batches()
    xt = [nc.tensor(x, device=cl_device) for x in xs]
    wt, yt = nc.tensor(w, device=cl_device), nc.tensor(y, device=cl_device)
    graph = capture_graph(None, _mse_tensors, xt[0], wt, yt)
    graph.snapshot_bytes = 0  # every result counts as large: none is copied out
    first = graph.execute(xt[0], wt, yt)
    view = first.reshape(1)
    kept = graph.execute(xt[1], wt, yt, copy_outputs=True)
    second = graph.execute(xt[2], wt, yt)
    reference = numpy_losses(xs, y, w, train=False)
    assert first.is_stale and view.is_stale and not second.is_stale
    for stale in (first, view):
        with pytest.raises(StaleResultError, match=r"replay #1 of .* overwritten by replay #2") as info:
            stale.to_host()
        assert ".item()" in str(info.value) and "copy_outputs=True" in str(info.value)
    assert isinstance(info.value, ReplayError)
    with pytest.raises(StaleResultError):
        R.add(first, 1.0)  # using it in an op is a read too
    np.testing.assert_allclose(float(kept.to_host()), reference[1], rtol=RTOL)
    np.testing.assert_allclose(float(second.to_host()), reference[2], rtol=RTOL)


def test_graph_result_and_its_view_are_copied_out_when_kept(cl_device, settled_memory):
    xs, y, w = batches()
    xt = [nc.tensor(x, device=cl_device) for x in xs]
    wt, yt = nc.tensor(w, device=cl_device), nc.tensor(y, device=cl_device)
    graph = capture_graph(None, _mse_tensors, xt[0], wt, yt)
    reference = numpy_losses(xs, y, w, train=False)

    def allocations() -> int:
        stats = settled_memory(cl_device)
        return stats.fresh_allocations + stats.served_from_pool

    graph.execute(xt[0], wt, yt)
    start = allocations()
    graph.execute(xt[1], wt, yt)  # the previous result was dropped: nothing to copy
    graph.execute(xt[2], wt, yt)
    assert allocations() == start
    first = graph.execute(xt[0], wt, yt)
    view = first.reshape(1, 1)
    start = allocations()
    second = graph.execute(xt[1], wt, yt)  # `first` (and its view) is alive: one copy
    assert allocations() == start + 1
    assert isinstance(first, ReplayResult) and not first.is_stale
    np.testing.assert_allclose(float(first.to_host()), reference[0], rtol=RTOL)
    np.testing.assert_allclose(view.to_host(), [[reference[0]]], rtol=RTOL)
    np.testing.assert_allclose(float(second.to_host()), reference[1], rtol=RTOL)


# ---- CompiledGraph.replay (OpenCL only: on the NumPy backend there are no launches to capture) -----
def _compiled(device):
    xs, y, w = batches()
    params = [ag.tensor(w, requires_grad=True, device=device)]
    xn = [ag.tensor(x, device=device) for x in xs]
    yn = ag.tensor(y, device=device)
    graph = CompiledGraph(params)
    with graph:
        loss = mse(ag.matmul(xn[0], params[0]), yn)
        loss.backward()
        sgd(params)
        graph.outputs = loss
    graph.compile([xn[0], yn])
    return graph, xn, yn, xs, y, w


def test_compiled_graph_collected_losses_read_back_correctly(cl_device):
    graph, xn, yn, xs, y, w = _compiled(cl_device)
    captured = float(graph.outputs.to_host())
    losses = [graph.replay([x, yn]) for x in xn]  # the capture ran step 0 already
    reference = numpy_losses([xs[0], *xs], y, w, train=True)
    np.testing.assert_allclose([captured] + [loss.item() for loss in losses], reference, rtol=RTOL)
    assert all(isinstance(loss, ag.Node) and loss is not graph.outputs for loss in losses)


def test_compiled_graph_stale_result_and_copy_outputs(cl_device):
    graph, xn, yn, xs, y, w = _compiled(cl_device)
    graph.graph.snapshot_bytes = 0
    reference = numpy_losses([xs[0], *xs], y, w, train=True)
    first = graph.replay([xn[0], yn])
    kept = graph.replay([xn[1], yn], copy_outputs=True)
    with pytest.raises(StaleResultError, match=r"replay #1 of CompiledGraph over 1 params .* by replay #2"):
        first.item()
    third = graph.replay([xn[2], yn])
    np.testing.assert_allclose(kept.item(), reference[2], rtol=RTOL)
    np.testing.assert_allclose(third.item(), reference[3], rtol=RTOL)


def test_compiled_graph_refuses_the_numpy_backend():
    with pytest.raises(ReplayError, match="NumPy backend"), CompiledGraph([ag.tensor([1.0], device="cpu")]):
        pass


# ---- FusedGraph.execute ---------------------------------------------------------------------------
def _fused(device, train: bool):
    xs, y, w = batches()
    params = [ag.tensor(w, requires_grad=True, device=device)]
    xn = [ag.tensor(x, device=device) for x in xs]
    yn = ag.tensor(y, device=device)

    def model(x):
        return ag.matmul(x, params[0])

    step = (lambda: sgd(params)) if train else None
    graph = fuse_graph(model, xn[0], yn, mse, params=params, optimizer_step=step)
    return graph, xn, yn, xs, y, w


@pytest.mark.parametrize("train", [False, True], ids=["no_update", "sgd"])
def test_fused_graph_collected_losses_read_back_correctly(device, train):
    graph, xn, yn, xs, y, w = _fused(device, train)
    losses = [graph.execute(x, yn) for x in xn]  # the loop
    reference = numpy_losses([xs[0], *xs], y, w, train=train)[1:]  # fuse_graph ran step 0 on xs[0]
    np.testing.assert_allclose([loss.item() for loss in losses], reference, rtol=RTOL)
    assert len({round(v, 4) for v in reference}) == 3


def test_fused_graph_stale_result_and_copy_outputs(cl_device):
    graph, xn, yn, xs, y, w = _fused(cl_device, train=False)
    graph.graph.snapshot_bytes = 0
    reference = numpy_losses(xs, y, w, train=False)
    first = graph.execute(xn[0], yn)
    kept = graph.execute(xn[1], yn, copy_outputs=True)
    with pytest.raises(StaleResultError, match=r"replay #1 of FusedGraph fused_step_model .* replay #2"):
        first.to_host()
    np.testing.assert_allclose(kept.item(), reference[1], rtol=RTOL)
