"""Nodes as a user expects them: .numpy(), .to(device) with gradients flowing back, a repr with values."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc


def test_numpy_and_repr_show_values(device):
    x = ag.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True, device=device)
    np.testing.assert_array_equal(x.numpy(), [1.0, 2.0, 3.0])
    assert repr(x) == f"Node([1., 2., 3.], device={device.spec}, dtype=float32, op='tensor', requires_grad=True)"
    y = x * 2.0
    assert repr(y).startswith("Node([2., 4., 6.], ") and "op='mul_scalar_right'" in repr(y)


def test_to_another_device_carries_the_gradient_back(device):
    other = "cpu" if device.kind == "opencl" else "opencl"
    if other == "opencl" and not nc.usable_opencl_devices():
        other = "cpu"
    x = ag.tensor(np.array([1.0, -2.0, 3.0], np.float32), requires_grad=True, device=device)
    assert x.to(device) is x
    with ag.Tape() as tape:
        moved = (x * 3.0).to(other)
        loss = ag.sum(moved * moved)
    tape.backward(loss)
    assert moved.device is nc.get_device(other) and x.grad.device is device
    np.testing.assert_array_equal(x.grad.to_host(), 18.0 * np.array([1.0, -2.0, 3.0], np.float32))  # exact


def test_arithmetic_on_grad_tensors(device):
    w = ag.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True, device=device)
    with ag.Tape() as tape:
        loss = ag.sum(w * w)
    tape.backward(loss)
    step = w.grad * 0.5  # a plain SGD step written by hand: grad tensors support arithmetic
    np.testing.assert_array_equal((w.value - step).to_host(), [0.0, 0.0])


def test_requires_grad_in_place_as_torch(device):
    """``requires_grad_`` flips a leaf's flag and returns it; integer values and computed nodes are refused."""
    w = ag.tensor(np.array([1.0, 2.0], np.float32), device=device)
    assert w.requires_grad_() is w and w.requires_grad
    with ag.Tape() as tape:
        loss = ag.sum(w * w)
    tape.backward(loss)
    np.testing.assert_array_equal(w.grad.to_host(), [2.0, 4.0])
    assert not w.requires_grad_(False).requires_grad
    with pytest.raises(TypeError, match="only floating-point tensors can require grad, got dtype int32"):
        ag.tensor(np.array([1, 2], np.int32), device=device).requires_grad_()
    with pytest.raises(RuntimeError, match="only leaves can stop requiring grad"):
        (w.requires_grad_() * 2.0).requires_grad_(False)
