"""Row kernels of the eager library (softmax family, norms, class losses, scans, arg-reductions, min/prod,
flip) against float64 NumPy, on PoCL and the NumPy backend: edge values, both kernel modes (rows of
<= 32 elements one per thread, longer ones one per work-group), strided rows, float16 data, and
program reuse across sizes.

Tolerances: values are float32 sums of <= 300 terms of magnitude <= ~10 after one exp/log/rsqrt each
(a few ulps): rtol 1e-5 with atol 1e-6 (1e-5 for the sums of 300 terms); float16 data is rounded to
half on the way in and out, so those checks use the half's resolution (rtol 2e-3).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
import netcl.runtime.ops as R
from netcl.runtime.cache import program_cache
from netcl.runtime.ops import losses as RL
from netcl.runtime.ops import norm as RN
from netcl.runtime.ops import softmaxes as RX


def _t(values, device, dtype=np.float32):
    return nc.tensor(np.asarray(values, dtype), device=device)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("shape, axis", [((4, 7), 1), ((3, 300), -1), ((2, 50, 3), 1), ((2, 3, 4), 0)])
def test_softmax_family_forward(device, shape, axis):
    x = np.random.default_rng(0).uniform(-8, 8, shape).astype(np.float32)
    t = _t(x, device)
    x64 = x.astype(np.float64)
    ref = _softmax(x64, axis)
    np.testing.assert_allclose(R.softmax(t, axis).to_host(), ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(R.log_softmax(t, axis).to_host(), np.log(ref), rtol=1e-5, atol=1e-5)
    lse = np.log(np.exp(x64).sum(axis=axis))
    np.testing.assert_allclose(R.logsumexp(t, axis).to_host(), lse, rtol=1e-6, atol=1e-6)


def test_softmax_family_edge_values(device):
    """Large logits stay finite (the max is subtracted); a row of -inf gives logsumexp -inf and NaN
    softmax (as PyTorch); a NaN anywhere in a row makes the row NaN."""
    x = np.array([[1e4, -1e4, 0.0, 1e4], [-np.inf] * 4, [0.0, np.nan, 1.0, 2.0], [-np.inf, 0.0, -np.inf, 0.0]])
    t = _t(x, device)
    sm, ls, lse = R.softmax(t).to_host(), R.log_softmax(t).to_host(), R.logsumexp(t, -1).to_host()
    np.testing.assert_allclose(sm[0], [0.5, 0, 0, 0.5], atol=1e-7)
    np.testing.assert_allclose(ls[0, [0, 3]], -np.log(2), rtol=1e-6)
    np.testing.assert_allclose(lse[[0, 3]], [1e4 + np.log(2), np.log(2)], rtol=1e-7)
    assert lse[1] == -np.inf and np.all(np.isnan(sm[1]))
    assert np.isnan(lse[2]) and np.all(np.isnan(sm[2])) and np.all(np.isnan(ls[2]))
    np.testing.assert_allclose(sm[3], [0, 0.5, 0, 0.5], atol=1e-7)


def test_logsumexp_axes_and_empty(device):
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)
    t = _t(x, device)
    for axes in [None, (1, 2), (0, 3), (0, 2, 3)]:
        ref = np.log(np.exp(x.astype(np.float64)).sum(axis=axes, keepdims=True))
        np.testing.assert_allclose(R.logsumexp(t, axes, keepdims=True).to_host(), ref, rtol=1e-6, atol=1e-6)
    empty = R.logsumexp(_t(np.zeros((3, 0)), device), 1)
    np.testing.assert_array_equal(empty.to_host(), np.full(3, -np.inf))


def test_softmax_backward_kernels(device):
    rng = np.random.default_rng(2)
    y = _softmax(rng.standard_normal((3, 40)), 1)
    g = rng.standard_normal((3, 40))
    got = RX.softmax_backward(_t(y, device), _t(g, device), 1).to_host()
    np.testing.assert_allclose(got, y * (g - (g * y).sum(1, keepdims=True)), rtol=1e-5, atol=1e-6)
    got = RX.log_softmax_backward(_t(np.log(y), device), _t(g, device), 1).to_host()
    np.testing.assert_allclose(got, g - y * g.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, norm_shape", [((4, 6), (6,)), ((2, 3, 100), (3, 100))])
def test_layer_and_rms_norm_forward_and_stats(device, shape, norm_shape):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
    w, b = rng.standard_normal(norm_shape).astype(np.float32), rng.standard_normal(norm_shape).astype(np.float32)
    x64 = x.astype(np.float64).reshape(-1, int(np.prod(norm_shape)))
    y, mean, rstd = RN.layer_norm_forward(_t(x, device), norm_shape, _t(w, device), _t(b, device), 1e-5)
    ref_rstd = 1 / np.sqrt(x64.var(1) + 1e-5)
    ref = ((x64 - x64.mean(1, keepdims=True)) * ref_rstd[:, None]).reshape(shape) * w + b
    np.testing.assert_allclose(y.to_host(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean.to_host(), x64.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd.to_host(), ref_rstd, rtol=1e-5)
    y, none, rstd = RN.rms_norm_forward(_t(x, device), norm_shape, _t(w, device))
    ref_rstd = 1 / np.sqrt((x64 * x64).mean(1) + np.finfo(np.float32).eps)
    assert none is None
    np.testing.assert_allclose(rstd.to_host(), ref_rstd, rtol=1e-5)
    np.testing.assert_allclose(y.to_host(), (x64 * ref_rstd[:, None]).reshape(shape) * w, rtol=1e-5, atol=1e-5)


def test_layer_norm_of_a_constant_row_is_the_bias(device):
    y = R.layer_norm(_t(np.full((2, 5), 3.0), device), 5, None, _t(np.arange(5), device))
    np.testing.assert_array_equal(y.to_host(), np.tile(np.arange(5, dtype=np.float32), (2, 1)))


def test_norm_parameter_gradients_over_many_rows(device):
    """600 rows: the weight/bias gradient sums in chunks of rows, then a column sum."""
    rng = np.random.default_rng(4)
    x, g = rng.standard_normal((600, 3)).astype(np.float32), rng.standard_normal((600, 3)).astype(np.float32)
    _, mean, rstd = RN.layer_norm_forward(_t(x, device), 3, _t(np.ones(3), device), None)
    _gx, gw, gb = RN.layer_norm_backward(_t(g, device), _t(x, device), mean, rstd, 3, _t(np.ones(3), device))
    x64 = x.astype(np.float64)
    xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(gw.to_host(), (g * xhat).sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gb.to_host(), g.sum(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(6, 4), (3, 4, 50)])
def test_batch_norm_forward_training_and_eval(device, shape):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 2 - 1).astype(np.float32)
    c = shape[1]
    rm, rv = _t(np.zeros(c), device), _t(np.ones(c), device)
    axes = (0, *range(2, len(shape)))
    view = (1, c) + (1,) * (len(shape) - 2)
    x64 = x.astype(np.float64)
    y = R.batch_norm(_t(x, device), rm, rv, training=True, momentum=0.1, eps=1e-5).to_host()
    ref = (x64 - x64.mean(axes, keepdims=True)) / np.sqrt(x64.var(axes, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rm.to_host(), 0.1 * x64.mean(axes), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(rv.to_host(), 0.9 + 0.1 * x64.var(axes, ddof=1), rtol=1e-5)
    y = R.batch_norm(_t(x, device), rm, rv, _t(np.full(c, 2.0), device), None, training=False).to_host()
    ref = (x64 - rm.to_host().reshape(view)) / np.sqrt(rv.to_host().reshape(view) + 1e-5) * 2
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_class_losses_forward(device):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 4, 3)).astype(np.float32)  # (N, C, d1)
    t = rng.integers(0, 4, (5, 3))
    t[1, 2] = -100
    logp = np.moveaxis(np.log(_softmax(x.astype(np.float64), 1)), 1, -1)
    valid = t != -100
    nll = -np.take_along_axis(logp, np.where(valid, t, 0)[..., None], -1)[..., 0]
    rows = np.where(valid, 0.9 * nll - 0.1 * logp.mean(-1), 0)
    got = R.cross_entropy(_t(x, device), t, label_smoothing=0.1, reduction="none").to_host()
    np.testing.assert_allclose(got, rows, rtol=1e-5, atol=1e-6)
    got = R.cross_entropy(_t(x, device), t, label_smoothing=0.1).to_host()
    np.testing.assert_allclose(got, rows.sum() / valid.sum(), rtol=1e-5)
    lp = np.moveaxis(logp, -1, 1)
    got = R.nll_loss(_t(lp, device), t, reduction="sum").to_host()
    np.testing.assert_allclose(got, np.where(valid, nll, 0).sum(), rtol=1e-5)


def test_binary_cross_entropy_terms_clamp_the_logs(device):
    p = _t([0.0, 1.0, 0.25, 0.5], device)
    t = _t([1.0, 0.0, 1.0, 0.0], device)
    np.testing.assert_allclose(RL.bce_terms(p, t).to_host(), [100.0, 100.0, np.log(4), np.log(2)], rtol=1e-6)


def test_scans_arg_reductions_min_prod_flip(device):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 45)).astype(np.float32)
    t = _t(x, device)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(R.cumsum(t, 1).to_host(), np.cumsum(x64, 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(R.cumsum(t, 0).to_host(), np.cumsum(x64, 0), rtol=1e-6, atol=1e-6)
    from netcl.runtime.ops.scan import cumsum

    rev = np.flip(np.cumsum(np.flip(x64, 1), 1), 1)
    np.testing.assert_allclose(cumsum(t, 1, reverse=True).to_host(), rev, rtol=1e-5, atol=1e-5)
    ints = rng.integers(-9, 9, (4, 40)).astype(np.int32)
    ti = _t(ints, device, np.int32)
    got = R.cumsum(ti, 1)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.to_host(), np.cumsum(ints, 1))
    np.testing.assert_array_equal(R.argmax(t, 1).to_host(), np.argmax(x, 1))
    np.testing.assert_array_equal(R.argmin(ti, 0).to_host(), np.argmin(ints, 0))
    assert R.argmax(t).to_host() == np.argmax(x) and R.argmax(t).dtype == np.int64
    np.testing.assert_array_equal(R.min(t, 1).to_host(), x.min(1))
    np.testing.assert_array_equal(R.min(ti).to_host(), ints.min())
    np.testing.assert_allclose(R.prod(_t(x[:, :6], device), 1).to_host(), x64[:, :6].prod(1), rtol=1e-5)
    np.testing.assert_array_equal(R.prod(_t(ints[:, :5], device, np.int32), 1).to_host(), ints[:, :5].prod(1))
    np.testing.assert_array_equal(R.prod(_t(np.zeros((2, 0)), device), 1).to_host(), [1.0, 1.0])
    np.testing.assert_array_equal(R.flip(t, (0, 1)).to_host(), x[::-1, ::-1])


def test_arg_reductions_follow_numpy_on_ties_and_nan(device):
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, np.nan, 5.0, np.nan], [1.0] * 4])
    x = np.concatenate([x, np.zeros((3, 36))], axis=1)  # 40 columns: the work-group kernel
    for width in (4, 40):
        t = _t(x[:, :width], device)
        np.testing.assert_array_equal(R.argmax(t, 1).to_host(), np.argmax(x[:, :width], 1))
        np.testing.assert_array_equal(R.argmin(t, 1).to_host(), np.argmin(x[:, :width], 1))


def test_float16_data_computes_in_float32(device):
    """float16 x: statistics in float32, the output in float16 (weights float32, as amp keeps them)."""
    if device.kind == "opencl" and "cl_khr_fp16" not in device.cl_device.extensions:
        pytest.skip("the OpenCL device has no cl_khr_fp16")
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((4, 40)) * 4).astype(np.float16)
    x64 = x.astype(np.float64)
    t = _t(x, device, np.float16)
    for got, ref in (
        (R.softmax(t), _softmax(x64, 1)),
        (R.layer_norm(t, 40, _t(np.ones(40), device)), (x64 - x64.mean(1, keepdims=True)) / x64.std(1, keepdims=True)),
        (R.batch_norm(t, None, None, training=True), (x64 - x64.mean(0)) / x64.std(0)),
    ):
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.to_host().astype(np.float64), ref, rtol=2e-3, atol=2e-3)
    loss = R.cross_entropy(t, np.arange(4))
    assert loss.dtype == np.float16
    ref = -np.mean(np.log(_softmax(x64, 1))[np.arange(4), np.arange(4)])
    np.testing.assert_allclose(float(loss.to_host()), ref, rtol=2e-3)


def test_row_kernels_are_shape_generic(cl_device):
    """A new row count or row length (within one mode) builds no program."""
    rng = np.random.default_rng(9)

    def run(rows, width):
        x = _t(rng.standard_normal((rows, width)), cl_device)
        _y, mean, rstd = RN.layer_norm_forward(x, width)
        RN.layer_norm_backward(x, x, mean, rstd, width)
        RX.softmax_backward(R.softmax(x), x)
        RL.class_loss_backward("cross_entropy", *_ce(x, rows))
        R.cumsum(x, 1)
        R.argmax(x, 1)

    def _ce(x, rows):
        out, lse, count, t = RL.cross_entropy_forward(x, np.zeros(rows, np.int64))
        return out, x, t, lse, count, "mean"

    for width in (8, 64):  # the one-thread-per-row kernels, then the work-group ones
        run(3, width)
        before = dict(program_cache.stats().misses_by_kind)
        run(17, width + 5)
        after = dict(program_cache.stats().misses_by_kind)
        assert after == before, f"width {width}: new programs {set(after.items()) - set(before.items())}"
