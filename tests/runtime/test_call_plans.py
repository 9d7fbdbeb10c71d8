"""Layer-call plans (``netcl.runtime.ops.call_plans``) of conv2d, its gradients and batch_norm: a repeat call
of one signature reuses its plan; a change of shape, option, matmul precision or ``NETCL_WINOGRAD`` makes a
new plan whose results equal, bit for bit, a computation with every plan dropped first; arguments that are bad
in a new way still raise before any launch once their signature's good twin has a plan; a plan made eagerly
is recorded by a capture and replays as eager runs; ``clear_caches`` drops the plans."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime.cache import clear_caches
from netcl.runtime.capture import capture_graph
from netcl.runtime.ops import batchnorm as BN
from netcl.runtime.ops import call_plans, conv, conv_winograd
from netcl.runtime.ops.precision import matmul_precision
from tests.autograd.helpers import raises_before_launch


def _made(name: str) -> int:
    """How many plans cache ``name`` has made so far."""
    return call_plans.plan_cache_info()[name][1]


def _direct(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """float64 cross-correlation (N, C, H, W) x (O, C, KH, KW), the test's independent reference."""
    n, _, h, width = x.shape
    o, _c, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (width + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def _tensors(device, *arrays):
    return [nc.tensor(a.astype(np.float32), device=device) for a in arrays]


def test_conv2d_reuses_its_plan_and_a_new_signature_makes_one(device, monkeypatch):
    """Same signature: no new plan and the same bits. Each variant (no Winograd, im2col, stride 2, another
    padding, batch and precision, F(4x4) by the environment) makes one plan, whose result equals a
    computation with no plans kept and the float64 reference (sums of 144 float32 products of N(0, 1)
    values, F(4x4)'s transforms growing the error: atol 2e-3)."""
    rng = np.random.default_rng(0)
    x64, w64 = rng.standard_normal((2, 16, 6, 6)), rng.standard_normal((16, 16, 3, 3))
    x, w = _tensors(device, x64, w64)
    call_plans.clear_plans()  # whatever other tests planned, this signature's first call makes a plan
    first = _made("conv2d")
    y1 = conv.conv2d(x, w, None, 1, 1).to_host()
    assert _made("conv2d") == first + 1
    y2 = conv.conv2d(x, w, None, 1, 1).to_host()
    assert _made("conv2d") == first + 1
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_allclose(y1, _direct(x64, w64, 1, 1), rtol=0, atol=2e-3)

    def variant(args, kwargs, xv=x, x_ref=x64, precision="highest"):
        before = _made("conv2d")
        with matmul_precision(precision):
            planned = conv.conv2d(xv, w, None, *args, **kwargs).to_host()
            again = conv.conv2d(xv, w, None, *args, **kwargs).to_host()
            assert _made("conv2d") == before + 1, (args, kwargs)
            call_plans.clear_plans()
            fresh = conv.conv2d(xv, w, None, *args, **kwargs).to_host()
        np.testing.assert_array_equal(planned, fresh)
        np.testing.assert_array_equal(planned, again)
        np.testing.assert_allclose(planned, _direct(x_ref, w64, *args), rtol=0, atol=2e-3)

    variant((1, 1), {"winograd": False})
    variant((1, 1), {"implicit": False})
    variant((2, 1), {})
    variant((1, 0), {})
    x3_64 = rng.standard_normal((3, 16, 6, 6))
    variant((1, 1), {}, *_tensors(device, x3_64), x3_64)
    variant((1, 1), {}, precision="tf32x3")
    monkeypatch.setenv(conv_winograd.ENV_VAR, "4")
    variant((1, 1), {})


@pytest.mark.parametrize("winograd", [None, False], ids=["winograd", "implicit"])
def test_conv_gradients_reuse_their_plans(device, winograd):
    """dx and dw of one signature make one plan each, with and without an addend; the planned results equal
    a computation with no plans kept, and with an addend they are the plain ones plus the addend."""
    rng = np.random.default_rng(1)
    shapes = [(2, 16, 6, 6), (16, 16, 3, 3), (2, 16, 6, 6), (2, 16, 6, 6), (16, 16, 3, 3)]
    x, w, g, ex, ew = _tensors(device, *(rng.standard_normal(s) for s in shapes))
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
    assert conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1) is geo

    def both(**kw):
        dx = conv.conv2d_backward_input(g, w, geo, 1, winograd=winograd, addend=kw.get("ax")).to_host()
        dw = conv.conv2d_backward_weight(g, x, w.shape, geo, 1, winograd=winograd, addend=kw.get("aw")).to_host()
        return dx, dw

    call_plans.clear_plans()
    before = _made("conv2d-gradient")
    plain = both()
    assert _made("conv2d-gradient") == before + 2
    for got, want in zip(both(), plain, strict=True):
        np.testing.assert_array_equal(got, want)
    summed = both(ax=ex, aw=ew)
    assert _made("conv2d-gradient") == before + 4
    both(ax=ex, aw=ew)
    assert _made("conv2d-gradient") == before + 4
    call_plans.clear_plans()
    for got, want in zip(both(ax=ex, aw=ew), summed, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(summed[0], plain[0] + ex.to_host())
    np.testing.assert_array_equal(summed[1], plain[1] + ew.to_host())


def test_batch_norm_reuses_its_plans(device):
    """batch_norm forward and backward of one signature make one plan each; another eps or ``needs`` makes
    another; results equal a computation with no plans kept (the running statistics updated each call)."""
    rng = np.random.default_rng(2)
    x, g, w, b = _tensors(device, rng.standard_normal((4, 3, 5, 4)), rng.standard_normal((4, 3, 5, 4)),
                          rng.standard_normal(3), rng.standard_normal(3))  # fmt: skip

    def run(eps=1e-5, needs=(True, True, True)):
        rm, rv = nc.tensor(np.zeros(3, np.float32), device=device), nc.tensor(np.ones(3, np.float32), device=device)
        y, mean, rstd = BN.batch_norm_forward(x, rm, rv, w, b, True, 0.1, eps)
        grads = BN.batch_norm_backward(g, x, mean, rstd, w, True, needs)
        return [t.to_host() for t in (y, mean, rstd, rm, rv, *grads) if t is not None]

    call_plans.clear_plans()
    before = (_made("batch_norm"), _made("batch_norm_backward"))
    first = run()
    assert (_made("batch_norm"), _made("batch_norm_backward")) == (before[0] + 1, before[1] + 1)
    for got, want in zip(run(), first, strict=True):
        np.testing.assert_array_equal(got, want)
    assert (_made("batch_norm"), _made("batch_norm_backward")) == (before[0] + 1, before[1] + 1)
    other = run(eps=1e-3, needs=(True, False, True))
    assert (_made("batch_norm"), _made("batch_norm_backward")) == (before[0] + 2, before[1] + 2)
    call_plans.clear_plans()
    for got, want in zip(run(eps=1e-3, needs=(True, False, True)), other, strict=True):
        np.testing.assert_array_equal(got, want)
    xs = x.to_host().astype(np.float64)
    mean = xs.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(first[1], mean, rtol=0, atol=1e-6)  # sums of 80 N(0, 1) values, float32
    assert len(other) == 7  # y, mean, rstd, rm, rv, dx, db: no dweight


def _good_conv(device):
    x = nc.tensor(np.ones((1, 16, 6, 6), np.float32), device=device)
    w = nc.tensor(np.ones((16, 16, 3, 3), np.float32), device=device)
    conv.conv2d(x, w, None, 1, 1)  # the good signature has a plan now
    return x, w


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda x, w, d: conv.conv2d(x, w, None, True, 1), ValueError, r"conv2d: stride must be an int or a pair"),
        (lambda x, w, d: conv.conv2d(x, w, None, 0, 1), ValueError, r"conv2d: stride must be >= 1, got 0"),
        (lambda x, w, d: conv.conv2d(x, w, None, 1, 1, 1, 1.0), ValueError, r"groups must be a positive int"),
        (lambda x, w, d: conv.conv2d(x, w, None, 1, 1, winograd=1), ValueError, r"winograd must be None, True"),
        (lambda x, w, d: conv.conv2d(np.ones(x.shape, np.float32), w, None, 1, 1), TypeError, r"conv2d: x must be"),
        (
            lambda x, w, d: conv.conv2d(x, w, nc.tensor(np.ones(4, np.float32), device=d), 1, 1),
            ShapeError,
            r"b must have shape \(16,\)",
        ),
        (
            lambda x, w, d: conv.conv2d(x, nc.tensor(np.ones((16, 8, 3, 3), np.float32), device=d), None, 1, 1),
            ShapeError,
            r"expects 8 input channels",
        ),
    ],
)
def test_bad_conv_arguments_raise_after_a_good_plan(device, call, error, match):
    x, w = _good_conv(device)
    raises_before_launch(device, error, match, lambda: call(x, w, device))


def test_bad_batch_norm_arguments_raise_after_a_good_plan(device):
    x = nc.tensor(np.ones((4, 3, 2, 2), np.float32), device=device)
    w = nc.tensor(np.ones(3, np.float32), device=device)
    _, mean, rstd = BN.batch_norm_forward(x, None, None, w, None, True, 0.1, 1e-5)
    BN.batch_norm_backward(x, x, mean, rstd, w, True)
    raises_before_launch(
        device, ValueError, r"eps must be > 0", lambda: BN.batch_norm_forward(x, None, None, w, None, True, 0.1, 0.0)
    )
    raises_before_launch(
        device,
        TypeError,
        r"momentum must be a number",
        lambda: BN.batch_norm_forward(x, None, None, w, None, True, "0.1"),
    )
    short = nc.tensor(np.ones(2, np.float32), device=device)
    raises_before_launch(
        device,
        ShapeError,
        r"weight must have shape \(3,\)",
        lambda: BN.batch_norm_forward(x, None, None, short, None, True),
    )
    wide = nc.tensor(np.ones(3, np.float64), dtype="float64", device=device) if device.computes(np.float64) else None
    if wide is not None:
        raises_before_launch(
            device,
            DTypeError,
            r"mean and rstd must be float32",
            lambda: BN.batch_norm_backward(x, x, wide, rstd, w, True),
        )
    other = x.reshape(2, 3, 4, 2)
    raises_before_launch(
        device,
        ShapeError,
        r"must be one \(N, C, \*\) shape",
        lambda: BN.batch_norm_backward(other, x, mean, rstd, w, True),
    )


def test_a_capture_records_planned_calls(cl_device):
    """A step whose conv and batch_norm signatures have plans is captured whole; its replay on new inputs
    equals eager runs bit for bit."""
    rng = np.random.default_rng(3)
    x, w, g = _tensors(cl_device, rng.standard_normal((2, 16, 6, 6)), rng.standard_normal((16, 16, 3, 3)),
                       rng.standard_normal((2, 16, 6, 6)))  # fmt: skip
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)

    def step(x, g):
        y = conv.conv2d(x, w, None, 1, 1)
        z, mean, rstd = BN.batch_norm_forward(y, None, None, None, None, True)
        dz = BN.batch_norm_backward(g, y, mean, rstd, None, True)[0]
        return z, conv.conv2d_backward_input(dz, w, geo, 1), conv.conv2d_backward_weight(dz, x, w.shape, geo, 1)

    step(x, g)  # plans made eagerly
    graph = capture_graph(cl_device.queue, step, x, g)
    assert len(graph) >= 6
    x2, g2 = _tensors(cl_device, rng.standard_normal((2, 16, 6, 6)), rng.standard_normal((2, 16, 6, 6)))
    for got, want in zip(graph.execute(x2, g2), step(x2, g2), strict=True):
        np.testing.assert_array_equal(got.to_host(), want.to_host())


def test_clear_caches_drops_the_plans(device):
    _good_conv(device)
    assert call_plans.plan_cache_info()["conv2d"][0] >= 1
    clear_caches()
    assert all(held == 0 for held, _ in call_plans.plan_cache_info().values())


def test_a_pooling_signature_is_checked_once_and_bad_calls_still_raise(device):
    """``pool_geometry``: a repeat of one signature (x's shape and dtype, the windows, ceil mode, the op) makes no
    new geometry and returns the same one; another makes one; arguments bad in a new way raise every time."""
    from netcl.runtime.ops import pool

    x = nc.tensor(np.zeros((2, 3, 8, 8), np.float32), device=device)
    call_plans.clear_plans()
    first = _made("pool-geometry")
    geo = pool.pool_geometry(x, 2, None, 0, "max_pool2d")
    assert pool.pool_geometry(x, 2, None, 0, "max_pool2d") is geo and _made("pool-geometry") == first + 1
    assert (geo.OH, geo.OW) == (4, 4)
    ceil = pool.pool_geometry(x, 3, 2, 1, "max_pool2d", True)
    assert (ceil.OH, ceil.OW) == (5, 5) and _made("pool-geometry") == first + 2  # torch: ceil((8 + 2 - 3) / 2) + 1
    for _ in range(2):
        with pytest.raises(ValueError, match="padding 2 must be at most half of kernel_size 2"):
            pool.pool_geometry(x, 2, None, 2, "max_pool2d")
        with pytest.raises(ShapeError, match="4-d"):
            pool.pool_geometry(nc.tensor(np.zeros((3, 8, 8), np.float32), device=device), 2, None, 0, "max_pool2d")
        with pytest.raises(TypeError, match="floating-point"):
            pool.pool_geometry(nc.tensor(np.zeros((2, 3, 8, 8), np.int32), device=device), 2, None, 0, "max_pool2d")
