"""Nodes as a user expects them: .numpy(), .to(device) with gradients flowing back, a repr with values, and the
tensor methods a torch port calls (torch's meaning) against float64 NumPy."""

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


# ---- the tensor methods a torch port calls: torch's meaning, against float64 NumPy ---------------------------
AWAY = np.array([[-1.7, -0.9, -0.3, 0.2], [0.7, 1.1, 1.6, -1.3], [0.5, -0.6, 1.9, -1.1]])  # no kink within 0.2
MASK = np.array([[1.0, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 1]])
GATHER = np.array([[3, 0], [1, 1], [2, 0]], np.int32)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


METHODS = {
    "view": (lambda x: x.reshape(2, 6), lambda x: x.view(2, 6), {}),
    "transpose_dims": (lambda x: x.reshape(3, 2, 2).swapaxes(0, 2), lambda x: x.view(3, 2, 2).transpose(0, -1), {}),
    "sum_dim_keepdim": (lambda x: x.sum(1, keepdims=True), lambda x: x.sum(dim=1, keepdim=True), {}),
    "mean_dim": (lambda x: x.mean(0), lambda x: x.mean(dim=0), {}),
    "softmax": (lambda x: _softmax(x, 1), lambda x: x.softmax(1), {}),
    "log_softmax": (lambda x: np.log(_softmax(x, 0)), lambda x: x.log_softmax(dim=0), {}),
    "clamp_min": (lambda x: np.maximum(x, -0.5), lambda x: x.clamp(min=-0.5), {"vals": [AWAY]}),
    "clamp": (lambda x: np.clip(x, -0.5, 0.4), lambda x: x.clamp(-0.5, 0.4), {"vals": [AWAY]}),
    "pow": (lambda x: x**3, lambda x: x.pow(3), {}),
    "abs": (np.abs, lambda x: x.abs(), {"vals": [AWAY]}),
    "exp": (np.exp, lambda x: x.exp(), {}),
    "log": (np.log, lambda x: x.log(), {"low": 0.5, "high": 3.0}),
    "sqrt": (np.sqrt, lambda x: x.sqrt(), {"low": 0.5, "high": 3.0}),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), lambda x: x.sigmoid(), {}),
    "tanh": (np.tanh, lambda x: x.tanh(), {}),
    "relu": (lambda x: np.maximum(x, 0), lambda x: x.relu(), {"vals": [AWAY]}),
    "matmul": (lambda x: x @ x.T, lambda x: x.matmul(x.T), {}),
    "expand": (lambda x: np.broadcast_to(x[:, :1], (2, 3, 1)), lambda x: x[:, :1].expand(2, -1, -1), {}),
    "masked_fill": (lambda x: np.where(x > 0.35, -5.0, x), lambda x: x.masked_fill(x.gt(0.35), -5.0), {"vals": [AWAY]}),
    "chunk": (lambda x: x[:, 2:], lambda x: x.chunk(2, dim=1)[1], {}),
    "split": (lambda x: x[1:], lambda x: x.split([1, 2])[1], {}),
    "gather": (lambda x: np.take_along_axis(x, GATHER, 1), lambda x: x.gather(1, GATHER), {}),
    "index_select": (lambda x: x[:, [3, 1]], lambda x: x.index_select(1, np.array([3, 1], np.int32)), {}),
    "double": (lambda x: x * 2.0, lambda x: x.double() * 2.0, {}),
    "to_dtype": (lambda x: x * 2.0, lambda x: x.to("float64").to(np.float32) * 2.0, {}),
}


@pytest.mark.parametrize(("ref", "fn", "kw"), METHODS.values(), ids=list(METHODS))
def test_torch_tensor_method(check, ref, fn, kw):
    check([(3, 4)], ref, fn, **kw)


def test_torch_tensor_methods_without_gradient(device):
    x = ag.tensor(AWAY.astype(np.float32), device=device)
    np.testing.assert_array_equal(x.argmax(dim=1).to_host(), AWAY.argmax(1))
    np.testing.assert_array_equal(x.argmin(1, keepdim=True).to_host(), AWAY.argmin(1)[:, None])
    np.testing.assert_array_equal(x.argmax().to_host(), AWAY.argmax())
    ties = ag.tensor(np.where(MASK != 0, AWAY, 0.0).astype(np.float32), device=device)
    for name, op in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("ge", np.greater_equal)):
        np.testing.assert_array_equal(getattr(x, name)(ties).to_host(), op(AWAY, np.where(MASK != 0, AWAY, 0.0)) * 1.0)
    assert x.dim() == 2 and x.numel() == 12 and x.contiguous() is x
    assert x.tolist() == AWAY.astype(np.float32).tolist()
    assert x.transpose().shape == x.T.shape == (4, 3) and x.transpose((1, 0)).shape == (4, 3)
    assert x.transpose(axes=(1, 0)).shape == (4, 3)
    with pytest.raises(IndexError, match=r"transpose: dim 2 is out of range for a 2-d Node of shape \(3, 4\)"):
        x.transpose(0, 2)
    with pytest.raises(TypeError, match="sum: give axis or dim, not both"):
        x.sum(axis=0, dim=0)
    with pytest.raises(ValueError, match="chunk: chunks must be a positive int, got 0"):
        x.chunk(0)
    with pytest.raises(ValueError, match=r"expand: -1 is not allowed for the new leading axis 0"):
        x.expand(-1, 3, 4)


def test_casts_and_to(device):
    """``half`` rounds as NumPy's float16, ``long`` / ``int`` truncate toward zero and take no gradient, ``float`` of a
    float32 Node is the Node; ``to`` takes a device, a dtype, or both."""
    values = np.array([1.5, -2.7, 3.2, 1e-4], np.float32)
    x = ag.tensor(values, requires_grad=True, device=device)
    np.testing.assert_array_equal(x.half().to_host(), values.astype(np.float16))  # float16 is storage on every device
    for name, dtype in (("long", np.int64), ("int", np.int32)):
        out = getattr(x, name)()
        assert out.dtype == dtype and not out.requires_grad
        np.testing.assert_array_equal(out.to_host(), values.astype(dtype))
    assert x.float() is x and x.to(device) is x and x.to(dtype=np.float32) is x
    assert x.to(device, np.float64).dtype == np.float64
    with pytest.raises(TypeError, match="to: two dtypes given"):
        x.to("float64", np.float16)


def test_cpu_and_cuda_move_as_torchs(device):
    """``cpu()`` is the NumPy backend; ``cuda()`` an OpenCL GPU, refused with the devices listed where there is none;
    the Module forms move every parameter."""
    import netcl.nn as nn

    x = ag.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True, device=device)
    assert x.cpu().device is nc.get_device("cpu") and nn.Linear(2, 3).cpu().weight.device is nc.get_device("cpu")
    if any(d.is_gpu for d in nc.devices()):
        assert x.cuda().device.is_gpu and nn.Linear(2, 3).cuda().weight.device.is_gpu
    else:
        with pytest.raises(nc.DeviceError, match="torch's name for GPU 0"):
            x.cuda()
