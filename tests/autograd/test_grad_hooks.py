"""Grad-ready hooks and end-of-backward callbacks (what DistributedDataParallel builds on)."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.autograd import engine


def test_hook_sees_final_gradient_before_later_nodes(device):
    # loss = sum(w2 * relu(w1 * x)): w2's gradient is final before w1's grad_fn chain runs.
    x = ag.tensor([1.0, -2.0, 3.0], device=device)
    w1 = ag.tensor([0.5, 0.5, 2.0], requires_grad=True, device=device)
    w2 = ag.tensor([1.0, 2.0, 3.0], requires_grad=True, device=device)
    seen: list[tuple[str, np.ndarray]] = []
    w1.register_grad_ready_hook(lambda node, g: seen.append(("w1", g.to_host())))
    w2.register_grad_ready_hook(lambda node, g: seen.append(("w2", g.to_host())))
    with ag.Tape() as tape:
        h = ag.relu(w1 * x)
        loss = ag.sum(w2 * h)
    tape.backward(loss)
    assert [name for name, _ in seen] == ["w2", "w1"]  # reverse topological order
    np.testing.assert_allclose(seen[0][1], [0.5, 0.0, 6.0])  # h
    np.testing.assert_allclose(seen[1][1], [1.0, 0.0, 9.0])  # w2 * x * (w1 * x > 0)
    np.testing.assert_allclose(w1.grad.to_host(), seen[1][1])


def test_hook_gets_accumulated_gradient_and_grad_is_untouched_until_stored(device):
    w = ag.tensor([1.0, 2.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        loss = ag.sum(w * 3.0)
    tape.backward(loss)
    first = w.grad
    before = first.to_host()
    got = []

    def hook(node, g):
        assert node is w
        assert w.grad is first  # backward has not stored anything yet
        got.append(g)

    w.register_grad_ready_hook(hook)
    with ag.Tape() as tape:
        loss = ag.sum(w * 3.0)
    tape.backward(loss)
    np.testing.assert_array_equal(first.to_host(), before)  # the old buffer was not added into
    assert got[0] is w.grad  # what the hook saw is what was stored
    np.testing.assert_allclose(w.grad.to_host(), [6.0, 6.0])


def test_callbacks_run_after_grads_are_stored_once_each(device):
    w = ag.tensor([1.0, 2.0], requires_grad=True, device=device)
    b = ag.tensor([0.5, 0.5], requires_grad=True, device=device)
    order = []

    def callback():
        order.append(("cb", w.grad is not None and b.grad is not None))

    def hook(node, g):
        order.append(("hook", node is w))
        engine.queue_callback(callback)  # queued twice (two hooks): runs once

    w.register_grad_ready_hook(hook)
    b.register_grad_ready_hook(hook)
    with ag.Tape() as tape:
        loss = ag.sum(w * w + b)
    tape.backward(loss)
    assert [o[0] for o in order] == ["hook", "hook", "cb"]
    assert order[-1] == ("cb", True)


def test_failed_backward_runs_no_callback(device):
    w = ag.tensor([1.0, 2.0], requires_grad=True, device=device)
    ran = []

    def bad_grad(grad_out, values, out):
        raise ValueError("broken rule")

    def hook(node, g):
        engine.queue_callback(lambda: ran.append(1))

    w.register_grad_ready_hook(hook)
    with ag.Tape() as tape:
        y = ag.apply_op(lambda v: v, bad_grad, w * 2.0, op_name="bad")
        loss = ag.sum(y + w)
    with pytest.raises(ValueError, match="broken rule"):
        tape.backward(loss)
    assert ran == [] and w.grad is None
    with pytest.raises(RuntimeError, match="only valid during a backward"):
        engine.queue_callback(lambda: None)


def test_hook_remove_and_bad_hook(device):
    w = ag.tensor([1.0], requires_grad=True, device=device)
    calls = []
    handle = w.register_grad_ready_hook(lambda node, g: calls.append(1))
    handle.remove()
    handle.remove()  # idempotent
    with ag.Tape() as tape:
        loss = ag.sum(w * 2.0)
    tape.backward(loss)
    assert calls == []
    with pytest.raises(TypeError, match="hook must be callable"):
        w.register_grad_ready_hook(3)
