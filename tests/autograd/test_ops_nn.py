"""softmax family, losses and normalizations vs float64 NumPy references, one ``check_op`` line per case.

References are written directly from the definitions (no netcl code). Tolerances: forwards are
float32 row reductions of <= 24 terms of magnitude <= e**2, within 1e-5 relative / 1e-5 absolute
of float64; gradients (float32 against exact float64 finite differences of the reference, rows of
<= 24 terms) within check_op's 1e-4 absolute / 1e-3 relative.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_logsumexp(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis) if axis is not None else out.reshape(())


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(check, device, axis):
    check([(2, 3, 4)], lambda x: np_softmax(x, axis), lambda x: ag.softmax(x, axis))


@pytest.mark.parametrize("axis", [-1, 1])
def test_log_softmax(check, device, axis):
    check([(2, 3, 4)], lambda x: np.log(np_softmax(x, axis)), lambda x: ag.log_softmax(x, axis))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_rows_longer_than_a_vector(check, device, op):  # a CPU device's float32 rows: vectors, then a tail
    reference = {"softmax": np_softmax, "log_softmax": lambda x: np.log(np_softmax(x))}[op]
    check([(3, 37)], reference, getattr(ag, op))


def test_rows_keep_nan_and_an_all_minus_inf_row(device):
    x = np.zeros((3, 37), np.float32)
    x[0, 5], x[1, 35], x[2] = np.nan, np.nan, -np.inf  # NaN in a vector, NaN in the tail, nothing but -inf
    t = ag.tensor(x, device=device)
    assert np.isnan(ag.softmax(t).to_host()).all() and np.isnan(ag.log_softmax(t).to_host()[:2]).all()
    lse = ag.logsumexp(t, axis=1).to_host()
    assert np.isnan(lse[:2]).all() and lse[2] == -np.inf  # torch's logsumexp of an all -inf row


def test_log_softmax_large_logits_stay_finite(check, device):
    x = ag.tensor(np.array([[1e4, 0.0, -1e4]], np.float32))
    np.testing.assert_allclose(ag.log_softmax(x).to_host(), [[0.0, -1e4, -2e4]], rtol=1e-6)


@pytest.mark.parametrize(("axis", "keepdims"), [(None, False), (1, False), ((0, 2), True), (-1, True)])
def test_logsumexp(check, device, axis, keepdims):
    check(
        [(2, 3, 4)],
        lambda x: np_logsumexp(x, axis, keepdims),
        lambda x: ag.logsumexp(x, axis, keepdims),
    )


# ---- losses ------------------------------------------------------------------------------------
def np_cross_entropy(x, t, smoothing=0.0, ignore_index=-100, reduction="mean"):
    logp = np.log(np_softmax(x, 1))
    logp = np.moveaxis(logp, 1, -1)  # (N, d..., C)
    valid = t != ignore_index
    picked = np.take_along_axis(logp, np.where(valid, t, 0)[..., None], -1)[..., 0]
    loss = -((1 - smoothing) * picked + smoothing * logp.mean(-1)) * valid
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / valid.sum()


def np_nll(logp, t, ignore_index=-100, reduction="mean"):
    valid = t != ignore_index
    picked = np.take_along_axis(np.moveaxis(logp, 1, -1), np.where(valid, t, 0)[..., None], -1)[..., 0]
    loss = -picked * valid
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / valid.sum()


T4 = np.array([1, 0, 4, 2])
T_IGN = np.array([1, -100, 4, 2])
T_SPATIAL = np.array([[[0, 2], [1, 1]], [[2, 0], [7, 1]]])  # 7: the ignore_index of that case
T37 = np.array([3, 16, 35, -100])  # 37 classes: targets in a CPU's vectors, at a vector's start, in the tail; ignored


@pytest.mark.parametrize(
    ("shape", "target", "kwargs"),
    [
        ((4, 5), T4, {}),
        ((4, 5), T4, {"label_smoothing": 0.1}),
        ((4, 5), T_IGN, {}),
        ((4, 5), T_IGN, {"label_smoothing": 0.2, "reduction": "sum"}),
        ((4, 5), T4, {"reduction": "none"}),
        ((2, 3, 2, 2), T_SPATIAL, {"ignore_index": 7}),
        ((2, 3, 2, 2), T_SPATIAL, {"ignore_index": 7, "reduction": "none", "label_smoothing": 0.3}),
        ((4, 37), T37, {"label_smoothing": 0.1}),
        ((4, 37), T37, {"reduction": "none"}),
    ],
)
def test_cross_entropy(check, device, shape, target, kwargs):
    ref_kwargs = {
        "smoothing": kwargs.get("label_smoothing", 0.0),
        **{k: v for k, v in kwargs.items() if k != "label_smoothing"},
    }
    check(
        [shape],
        lambda x: np_cross_entropy(x, target, **ref_kwargs),
        lambda x: ag.cross_entropy(x, target, **kwargs),
    )


def test_cross_entropy_tensor_target(check, device):
    labels = ag.tensor(T4.astype(np.int32), device=device).value
    check([(4, 5)], lambda x: np_cross_entropy(x, T4), lambda x: ag.cross_entropy(x, labels))


@pytest.mark.parametrize(
    ("shape", "target", "kwargs"),
    [((4, 5), T4, {}), ((4, 5), T_IGN, {"reduction": "sum"}), ((2, 3, 2, 2), T_SPATIAL, {"ignore_index": 7})],
)
def test_nll_loss(check, device, shape, target, kwargs):
    check(
        [shape],
        lambda x: np_nll(x, target, **kwargs),
        lambda x: ag.nll_loss(x, target, **kwargs),
    )


def np_bce(p, t, w=1.0, reduction="mean"):
    loss = -w * (t * np.log(p) + (1 - t) * np.log(1 - p))
    loss = np.broadcast_to(loss, p.shape)
    return loss if reduction == "none" else loss.sum() if reduction == "sum" else loss.mean()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(check, device, reduction):
    # probabilities and targets in [0.1, 0.9): the logs stay far from the -100 clamp
    check(
        [(3, 4), (3, 4)],
        lambda p, t: np_bce(p, t, reduction=reduction),
        lambda p, t: ag.binary_cross_entropy(p, t, reduction=reduction),
        low=0.1,
        high=0.9,
    )


def test_binary_cross_entropy_weight(check, device):
    check(
        [(3, 4), (3, 4), (1, 4)],
        lambda p, t, w: np_bce(p, t, w),
        lambda p, t, w: ag.binary_cross_entropy(p, t, w),
        low=0.1,
        high=0.9,
        requires_grad=[True, True, False],
    )


def test_binary_cross_entropy_clamps_logs(check, device):
    p = ag.tensor(np.array([0.0, 1.0], np.float32))
    t = ag.tensor(np.array([1.0, 0.0], np.float32))
    np.testing.assert_allclose(ag.binary_cross_entropy(p, t, reduction="none").to_host(), [100.0, 100.0])


# ---- normalizations ----------------------------------------------------------------------------
def np_layer_norm(x, ndim, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - ndim, x.ndim))
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def np_rms_norm(x, ndim, w=None, eps=1e-5):
    axes = tuple(range(x.ndim - ndim, x.ndim))
    return x / np.sqrt((x * x).mean(axes, keepdims=True) + eps) * (1 if w is None else w)


def test_layer_norm_affine(check, device):
    check(
        [(3, 4), (4,), (4,)],
        lambda x, w, b: np_layer_norm(x, 1, w, b),
        lambda x, w, b: ag.layer_norm(x, 4, w, b),
    )


@pytest.mark.parametrize("shape, wants", [((200, 3), None), ((2, 70, 3), [True, False, True]), ((70, 3), [0, 1, 0])])
def test_layer_norm_parameter_gradients_over_row_blocks(check, device, shape, wants):
    """Many rows: the weight and bias gradients are sums over several blocks of rows, each wanted on its own."""
    reference, op = (lambda x, w, b: np_layer_norm(x, 1, w, b)), (lambda x, w, b: ag.layer_norm(x, 3, w, b))
    check([shape, (3,), (3,)], reference, op, requires_grad=wants)


@pytest.mark.parametrize("C", [33, 257, 520, 1030, 2100])
def test_row_ops_over_row_lengths(check, device, C):
    """Rows on either side of the GPU row kernels' lane-count steps (``rowwise.row_lanes``: 8 elements a lane or
    more, 32 to 256 lanes), forward and gradients against float64 (finite differences of the reference)."""
    check([(3, C)], np_softmax, lambda x: ag.softmax(x, -1), gradcheck=False)
    ln = (lambda x, w, b: np_layer_norm(x, 1, w, b)), (lambda x, w, b: ag.layer_norm(x, C, w, b))
    check([(3, C), (C,), (C,)], *ln, gradcheck=False)


def test_layer_norm_two_dims_no_affine(check, device):
    check([(2, 3, 4)], lambda x: np_layer_norm(x, 2), lambda x: ag.layer_norm(x, (3, 4)))


def np_group_norm(x, groups, w=None, b=None, eps=1e-5):
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    y = ((g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + eps)).reshape(x.shape)
    per_channel = (c,) + (1,) * (x.ndim - 2)
    return y * (1 if w is None else w.reshape(per_channel)) + (0 if b is None else b.reshape(per_channel))


def test_group_norm_affine(check, device):
    check(
        [(2, 6, 3, 2), (6,), (6,)], lambda x, w, b: np_group_norm(x, 3, w, b), lambda x, w, b: ag.group_norm(x, 3, w, b)
    )


def test_group_norm_no_affine_3d(check, device):
    check([(3, 4, 5)], lambda x: np_group_norm(x, 2, eps=1e-3), lambda x: ag.group_norm(x, 2, eps=1e-3))


def test_rms_norm(check, device):
    check(
        [(3, 5), (5,)],
        lambda x, w: np_rms_norm(x, 1, w, 1e-5),
        lambda x, w: ag.rms_norm(x, (5,), w, eps=1e-5),
    )


def test_rms_norm_default_eps(check, device):
    eps = float(np.finfo(np.float32).eps)
    check([(2, 6)], lambda x: np_rms_norm(x, 1, eps=eps), lambda x: ag.rms_norm(x, 6))


def np_batch_norm_train(x, w, b, eps=1e-5):
    axes = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return y * w.reshape(shape) + b.reshape(shape)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 2)])
def test_batch_norm_training(check, device, shape):
    check(
        [shape, (3,), (3,)],
        lambda x, w, b: np_batch_norm_train(x, w, b),
        lambda x, w, b: ag.batch_norm(x, None, None, w, b, training=True),
    )


def test_batch_norm_eval(check, device):
    mean, var = np.array([0.5, -1.0, 0.0]), np.array([2.0, 0.5, 1.0])
    rm = ag.tensor(mean.astype(np.float32), device=device).value
    rv = ag.tensor(var.astype(np.float32), device=device).value
    shape = (1, 3, 1)
    check(
        [(2, 3, 4), (3,), (3,)],
        lambda x, w, b: (
            (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-5) * w.reshape(shape) + b.reshape(shape)
        ),
        lambda x, w, b: ag.batch_norm(x, rm, rv, w, b),
    )


def test_batch_norm_updates_running_stats_in_place(check, device):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    rm = ag.tensor(np.array([1.0, 2.0], np.float32), device=device).value
    rv = ag.tensor(np.array([1.0, 3.0], np.float32), device=device).value
    ag.batch_norm(ag.tensor(x, device=device), rm, rv, training=True, momentum=0.25)
    xd = x.astype(np.float64)
    expect_mean = 0.75 * np.array([1.0, 2.0]) + 0.25 * xd.mean((0, 2))
    expect_var = 0.75 * np.array([1.0, 3.0]) + 0.25 * xd.var((0, 2), ddof=1)  # unbiased, as torch
    np.testing.assert_allclose(rm.to_host(), expect_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv.to_host(), expect_var, rtol=1e-5, atol=1e-6)


def test_float16_rows_compute_in_float32(check, device):
    # float16 inputs: the row kernels load half (vload_half, also where float16 is storage-only) and
    # compute in float32; results keep float16
    x = np.random.default_rng(2).uniform(-3, 3, (4, 8)).astype(np.float16)
    node = ag.tensor(x, device=device)
    ref = np_softmax(x.astype(np.float64))
    out = ag.softmax(node)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.to_host().astype(np.float64), ref, atol=1e-3)  # half rounding: 2**-11
    ln = ag.layer_norm(node, 8)
    np.testing.assert_allclose(ln.to_host().astype(np.float64), np_layer_norm(x.astype(np.float64), 1), atol=4e-3)
    loss = ag.cross_entropy(node, np.array([0, 1, 2, 3]))
    assert loss.dtype == np.float32
    np.testing.assert_allclose(
        loss.to_host(), np_cross_entropy(x.astype(np.float64), np.array([0, 1, 2, 3])), rtol=1e-5
    )
