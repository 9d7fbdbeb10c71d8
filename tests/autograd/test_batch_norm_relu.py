"""batch_norm_relu: ``relu(batch_norm(x) [+ residual])`` as one op, bit for bit the composition.

The fused op computes the same float32 normalized value as ``batch_norm`` (same kernel arithmetic), and
the add and the ReLU are exact, so its output, the running statistics it updates and every gradient
(the ReLU's mask is a product by 0 or 1: exact) must equal the unfused ``batch_norm`` -> ``add`` ->
``relu`` bit for bit, on PoCL and the NumPy backend. An independent float64 NumPy reference checks the
values themselves (1e-5: float32 statistics over at most 150 values per channel), and gradcheck the
gradients by finite differences at points kept away from the ReLU's kink.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.autograd.gradcheck import gradcheck
from netcl.core import ShapeError, Tensor
from netcl.runtime.ops import batchnorm as BN

SHAPES = [(4, 3, 5, 5), (4, 3, 4, 4), (6, 5)]  # S % 4 != 0, float4 loads, (N, C)


def _bits(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.to_host()).view(np.uint32)


def _run(device, shape, fused: bool, residual: bool, training: bool, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    C = shape[1]

    def leaf(a, grad=True):
        return ag.tensor(np.asarray(a, np.float32), device=device, requires_grad=grad)

    x, r = leaf(rng.normal(size=shape)), leaf(rng.normal(size=shape))
    w, b = leaf(rng.normal(size=C)), leaf(rng.normal(size=C))
    rm = Tensor.from_host(device, rng.normal(size=C).astype(np.float32))
    rv = Tensor.from_host(device, rng.uniform(0.5, 2.0, C).astype(np.float32))
    nbt = Tensor.from_host(device, np.zeros((), np.int64)) if training else None
    g = rng.normal(size=shape).astype(np.float32)
    with ag.Tape() as tape:
        if fused:
            y = ag.batch_norm_relu(
                x, rm, rv, w, b, training, 0.1, 1e-5, residual=r if residual else None, num_batches_tracked=nbt
            )
        else:
            z = ag.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5, num_batches_tracked=nbt)
            y = ag.relu(z + r if residual else z)
    tape.backward(y, grad=Tensor.from_host(device, g))
    out = [y.value, x.grad, w.grad, b.grad, rm, rv] + ([r.grad] if residual else [])
    return [_bits(t) for t in out] + ([nbt.to_host()] if training else [])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("training", [True, False])
def test_bitwise_the_composition(device, shape, residual, training):
    fused = _run(device, shape, True, residual, training)
    unfused = _run(device, shape, False, residual, training)
    for i, (got, ref) in enumerate(zip(fused, unfused, strict=True)):
        np.testing.assert_array_equal(got, ref, err_msg=f"result {i}")


@pytest.mark.parametrize("shape", SHAPES[:2])
@pytest.mark.parametrize("training", [True, False])
def test_bitwise_with_chunked_channels(cl_device, monkeypatch, shape, training):
    """The GPU's chunked launches (``_parts``: stage 0 stores each chunk's sums, stage 1 adds them), forced here:
    the residual's gradient is stored in stage 0 and read back by stage 1's dx pass."""
    monkeypatch.setattr(BN, "_parts", lambda device, channels, vectors, backward=False: 3)
    fused = _run(cl_device, shape, True, True, training)
    unfused = _run(cl_device, shape, False, True, training)
    for i, (got, ref) in enumerate(zip(fused, unfused, strict=True)):
        np.testing.assert_array_equal(got, ref, err_msg=f"result {i}")


def test_values_against_float64(device):
    rng = np.random.default_rng(3)
    shape = (5, 4, 3, 2)
    x, r = rng.normal(size=shape), rng.normal(size=shape)
    w, b = rng.normal(size=4), rng.normal(size=4)
    axes, ch = (0, 2, 3), (1, 4, 1, 1)
    mu, var = x.mean(axis=axes), x.var(axis=axes)
    ref = np.maximum((x - mu.reshape(ch)) / np.sqrt(var.reshape(ch) + 1e-5) * w.reshape(ch) + b.reshape(ch) + r, 0)
    t = [Tensor.from_host(device, a.astype(np.float32)) for a in (x, w, b, r)]
    y, mean, rstd = BN.batch_norm_forward(t[0], None, None, t[1], t[2], True, relu=True, residual=t[3])
    np.testing.assert_allclose(y.to_host(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean.to_host(), mu, rtol=1e-5, atol=1e-6)
    # the backward against the float64 formula of the masked gradient
    g = rng.normal(size=shape)
    gm = g * (ref > 0)
    n = x.size // 4
    xh = (x - mu.reshape(ch)) / np.sqrt(var.reshape(ch) + 1e-5)
    dx = (w.reshape(ch) / np.sqrt(var.reshape(ch) + 1e-5)) * (
        gm - gm.mean(axis=axes).reshape(ch) - xh * (gm * xh).sum(axis=axes).reshape(ch) / n
    )
    gx, gw, gb, gr = BN.batch_norm_relu_backward(
        Tensor.from_host(device, g.astype(np.float32)), y, t[0], mean, rstd, t[1], True, (True, True, True, True)
    )
    np.testing.assert_allclose(gx.to_host(), dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gw.to_host(), (gm * xh).sum(axis=axes), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gb.to_host(), gm.sum(axis=axes), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(gr.to_host(), gm.astype(np.float32))


def test_residual_gradient_alone(device):
    """Evaluation with only the residual's gradient wanted: the kernel's second loop stores the masked g."""
    rng = np.random.default_rng(4)
    shape = (3, 2, 4, 4)
    t = [Tensor.from_host(device, rng.normal(size=s).astype(np.float32)) for s in (shape, shape, (2,), (2,))]
    x, r, rm = t[0], t[1], t[2]
    rv = Tensor.from_host(device, np.array([0.5, 2.0], np.float32))
    y, mean, rstd = BN.batch_norm_forward(x, rm, rv, None, None, False, relu=True, residual=r)
    g = Tensor.from_host(device, rng.normal(size=shape).astype(np.float32))
    gx, gw, gb, gr = BN.batch_norm_relu_backward(g, y, x, mean, rstd, None, False, (False, False, False, True))
    assert gx is None and gw is None and gb is None
    np.testing.assert_array_equal(gr.to_host(), g.to_host() * (y.to_host() > 0))


def test_gradcheck(device):
    rng = np.random.default_rng(5)
    half = rng.uniform(0.5, 2.0, (2, 3, 2, 2)) * rng.choice([-1, 1], (2, 3, 2, 2))
    xs = np.concatenate([half, -half])  # each channel's mean is 0: x_hat = x / std, away from 0
    w = ag.tensor(rng.uniform(0.5, 1.5, 3).astype(np.float32), device=device, requires_grad=True)
    b = ag.tensor(np.zeros(3, np.float32), device=device, requires_grad=True)
    x = ag.tensor(xs.astype(np.float32), device=device, requires_grad=True)
    assert gradcheck(lambda x, w, b: ag.batch_norm_relu(x, None, None, w, b, True), x, w, b)
    # with a residual: z = bn(x) + r chosen at +-(0.2..1), away from the kink by far more than eps's effect
    bn = ag.batch_norm(x, None, None, w, b, True).value.to_host()
    target = rng.uniform(0.2, 1.0, xs.shape) * rng.choice([-1, 1], xs.shape)
    r = ag.tensor((target - bn).astype(np.float32), device=device, requires_grad=True)
    assert gradcheck(lambda x, w, b, r: ag.batch_norm_relu(x, None, None, w, b, True, residual=r), x, w, b, r)


def test_errors_before_any_launch(device):
    x = Tensor.from_host(device, np.ones((2, 3, 4), np.float32))
    with pytest.raises(ShapeError, match="residual must have x's shape"):
        ag.batch_norm_relu(x, None, None, training=True, residual=Tensor.from_host(device, np.ones((2, 3), np.float32)))
    with pytest.raises(ShapeError, match="residual must have x's shape"):
        BN.batch_norm_forward(x, None, None, None, None, True, relu=True, residual=x.reshape(2, 12, 1))
    with pytest.raises(ValueError, match="pass relu=True with residual"):
        BN.batch_norm_forward(x, None, None, None, None, True, residual=x)
    with pytest.raises(TypeError, match="relu must be a bool"):
        BN.batch_norm_forward(x, None, None, None, None, True, relu=1)
    y, mean, rstd = BN.batch_norm_forward(x, None, None, None, None, True, relu=True)
    with pytest.raises(ValueError, match="residual's gradient exists only"):
        BN._backward(x, x, None, mean, rstd, None, True, (True, False, False, True))
    with pytest.raises(ShapeError, match="out \\(the ReLU epilogue's output\\)"):
        BN.batch_norm_relu_backward(x, y.reshape(2, 12, 1), x, mean, rstd, None, True)
