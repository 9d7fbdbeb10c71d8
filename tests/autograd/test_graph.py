"""A 2-layer MLP trained eagerly (vs a float64 NumPy twin) and with CompiledGraph capture/replay."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.autograd.graph import CompiledGraph
from netcl.runtime import ops as R
from netcl.runtime.errors import ReplayError

N, D, H, C = 8, 4, 6, 3
LR = 0.5


def init_params(seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.normal(scale=0.5, size=(D, H)).astype(np.float32),
        np.zeros(H, np.float32),
        rng.normal(scale=0.5, size=(H, C)).astype(np.float32),
        np.zeros(C, np.float32),
    ]


def make_batches(count, seed=1):
    rng = np.random.default_rng(seed)
    teacher = rng.normal(size=(D, C))
    batches = []
    for _ in range(count):
        x = rng.normal(size=(N, D)).astype(np.float32)
        batches.append((x, np.argmax(x @ teacher, axis=1).astype(np.int32)))
    return batches


def mlp_loss(params, x, y):
    w1, b1, w2, b2 = params
    h = ag.relu(ag.matmul(x, w1) + b1)
    return ag.cross_entropy(ag.matmul(h, w2) + b2, y)


def train_step(params, x, y):
    """Forward, backward and an in-place SGD update of the parameter buffers."""
    with ag.Tape() as tape:
        loss = mlp_loss(params, x, y)
    tape.backward(loss)
    for p in params:
        R.add_(p.value, R.mul(p.grad, -LR))
    return loss


def numpy_step(params, x, y):
    """The same step in float64 NumPy; returns the loss and updates ``params`` in place."""
    w1, b1, w2, b2 = params
    pre = x @ w1 + b1
    h = np.maximum(pre, 0)
    logits = h @ w2 + b2
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(p[np.arange(N), y]))
    dlogits = p.copy()
    dlogits[np.arange(N), y] -= 1
    dlogits /= N
    dh = dlogits @ w2.T * (pre > 0)
    grads = [x.T @ dh, dh.sum(0), h.T @ dlogits, dlogits.sum(0)]
    for param, grad in zip(params, grads, strict=True):
        param -= LR * grad
    return loss


def test_mlp_trains_eagerly_and_matches_numpy(device):
    batches = make_batches(4)
    params = [ag.tensor(p, requires_grad=True, device=device) for p in init_params()]
    reference = [p.astype(np.float64) for p in init_params()]
    losses = []
    for step in range(12):
        x, y = batches[step % len(batches)]
        for p in params:
            p.grad = None
        loss = train_step(params, ag.tensor(x, device=device), ag.tensor(y, device=device))
        losses.append(float(loss.to_host()))
        expected = numpy_step(reference, x.astype(np.float64), y)
        assert losses[-1] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert losses[-1] < 0.5 * losses[0]
    for p, ref in zip(params, reference, strict=True):
        np.testing.assert_allclose(p.to_host(), ref, atol=1e-4)


def test_compiled_graph_replay_agrees_with_eager(cl_device):
    device = cl_device
    batches = [(ag.tensor(x, device=device), ag.tensor(y, device=device)) for x, y in make_batches(5)]

    eager = [ag.tensor(p, requires_grad=True, device=device) for p in init_params()]
    eager_losses = []
    for x, y in batches:
        for p in eager:
            p.grad = None
        eager_losses.append(float(train_step(eager, x, y).to_host()))

    params = [ag.tensor(p, requires_grad=True, device=device) for p in init_params()]
    graph = CompiledGraph(params=params)
    x0, y0 = batches[0]
    with graph:
        loss = train_step(params, x0, y0)
        graph.outputs = loss
    assert graph.state == "captured" and len(graph.graph.launches) > 10
    compiled_losses = [float(loss.to_host())]
    graph.compile([x0, y0])
    replayed = [graph.replay([x, y]) for x, y in batches[1:]]
    # each replay's result keeps its own value; the captured loss Node shows the latest replay
    assert all(out is not loss and out.shape == () for out in replayed)
    assert float(loss.to_host()) == float(replayed[-1].to_host())
    compiled_losses += [float(out.to_host()) for out in replayed]

    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-5, atol=1e-6)
    assert compiled_losses[-1] < compiled_losses[0]
    for p, q in zip(params, eager, strict=True):
        np.testing.assert_allclose(p.to_host(), q.to_host(), atol=1e-5)
        np.testing.assert_allclose(p.grad.to_host(), q.grad.to_host(), atol=1e-5)
        assert p.value.grad is p.grad

    # a later entry restores the captured gradient buffers
    for p in params:
        p.grad = None
    with graph:
        pass
    assert all(p.grad is g for p, g in zip(params, graph.grads, strict=True))

    wrong = ag.tensor(np.zeros((N + 1, D), np.float32), device=device)
    with pytest.raises(ReplayError, match="input 0"):
        graph.replay([wrong, y0])
    with pytest.raises(ReplayError, match="2 inputs"):
        graph.replay([x0])


def test_replay_rewrites_gradients_without_zeroing(cl_device, launch_counter):
    """The recorded backward writes every gradient buffer from scratch, also where a parameter is used
    twice (two contributions added): replays enqueue no fills of the gradients, and after several
    replays each gradient is that step's own, not a sum over replays."""
    device = cl_device
    rng = np.random.default_rng(4)
    w = ag.tensor(rng.normal(size=(D, D)).astype(np.float32), requires_grad=True, device=device)
    xs = [ag.tensor(rng.normal(size=(N, D)).astype(np.float32), device=device) for _ in range(4)]

    def step(x):
        with ag.Tape() as tape:
            loss = ag.sum(ag.tanh(ag.matmul(ag.matmul(x, w), w)))  # w twice: its gradient is a sum
        tape.backward(loss)
        return loss

    graph = CompiledGraph(params=[w])
    with graph:
        graph.outputs = step(xs[0])
    graph.compile([xs[0]])
    for x in xs[1:]:
        with launch_counter(device.queue) as counter:
            graph.replay([x])
        assert not [s for s in counter.graph.steps if "fill" in s.name.lower()], counter.graph.steps
        got = w.grad.to_host()
        w.grad = None
        step(x)
        np.testing.assert_allclose(got, w.grad.to_host(), rtol=1e-6, atol=1e-6)
        graph.restore_grads()


def test_compiled_graph_errors(device):
    params = [ag.tensor(np.ones(2, np.float32), requires_grad=True, device=device)]
    graph = CompiledGraph(params=params)
    with pytest.raises(ReplayError, match="capture a step"):
        graph.replay([])
    if device.kind == "cpu":
        with pytest.raises(ReplayError, match="NumPy backend"), graph:
            pass
        return
    with pytest.raises(ValueError, match="boom"), graph:
        raise ValueError("boom")
    assert graph.state == "empty"  # a failed capture can be retried
    with graph:
        (params[0] * 2.0).sum().backward()
    assert graph.state == "captured"
    with pytest.raises(ReplayError, match="compile"):
        graph.replay([params[0]])


def test_compiled_graph_replay_refuses_a_changed_mode_or_parameter(cl_device):
    """The lower-level capture checks what ``fuse_graph`` checks: after ``eval()`` of a module the step read, a
    frozen parameter or a parameter given another tensor, ``replay`` raises before enqueueing anything;
    switched back, it replays."""
    from netcl import nn
    from netcl.runtime import StaleCaptureError

    model = nn.Sequential(nn.Linear(D, H, device=cl_device), nn.Dropout(0.5))
    x = ag.tensor(np.ones((N, D), np.float32), device=cl_device)
    graph = CompiledGraph(params=model.parameters())
    with graph:
        graph.outputs = ag.sum(model(x))
        graph.outputs.backward()
    graph.compile([x])
    model.eval()
    with pytest.raises(StaleCaptureError, match=r"Dropout \(captured in training mode, now in eval mode\)"):
        graph.replay([x])
    model.train()
    model[0].weight.requires_grad_(False)
    with pytest.raises(StaleCaptureError, match=rf"parameter 0 \(shape \({H}, {D}\)\) was captured"):
        graph.replay([x])
    model[0].weight.requires_grad_(True)
    model[0].weight.value = model[0].weight.value.copy()
    with pytest.raises(StaleCaptureError, match="parameter 0 holds another tensor than at capture"):
        graph.replay([x])
