"""Math ops of issue 12 vs float64 NumPy references, one ``check`` line per case (PoCL and NumPy backend).

Reductions, softmax family, norms, activations, flip, 1-D matmul and the classification losses.
``check`` compares the forward with the reference, the gradients with central differences of the
reference, and runs ``ag.gradcheck``. Tolerances: the forwards here sum at most 120 float32 terms of
magnitude <= ~8 (softmax/logsumexp/norms also one exp/rsqrt each), so 1e-5 absolute/relative holds with
margin (measured worst: ~2e-6); gradients of the norms chain two row sums, checked at grad_atol 1e-4.
Rows of 40 elements take the work-group (tree) kernels, shorter rows the one-thread-per-row kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc


def distinct(shape, seed=0, step=0.1):
    """Values ``step`` apart in random order: no ties (min/argmax), even after +-1e-3 steps."""
    n = int(np.prod(shape))
    return (np.random.default_rng(seed).permutation(n) * step - n * step / 2).reshape(shape)


# ---- references --------------------------------------------------------------------------------------
def np_logsumexp(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    return x - np_logsumexp(x, axis, keepdims=True)


def np_layer_norm(x, ndim, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - ndim, x.ndim))
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


F32_EPS = float(np.finfo(np.float32).eps)


def np_rms_norm(x, ndim, w=None, eps=F32_EPS):
    axes = tuple(range(x.ndim - ndim, x.ndim))
    return x / np.sqrt((x * x).mean(axes, keepdims=True) + eps) * (1 if w is None else w)


def np_batch_norm(x, w, b, eps=1e-5):
    axes = (0, *range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return y * w.reshape(shape) + b.reshape(shape)


def np_cross_entropy(x, t, smoothing=0.0, ignore=-100, reduction="mean"):
    logp = np.moveaxis(np_log_softmax(x, 1), 1, -1)
    valid = t != ignore
    picked = np.take_along_axis(logp, np.where(valid, t, 0)[..., None], -1)[..., 0]
    rows = np.where(valid, -(1 - smoothing) * picked - smoothing * logp.mean(-1), 0.0)
    return _reduce(rows, valid, reduction)


def np_nll(lp, t, ignore=-100, reduction="mean"):
    lp = np.moveaxis(lp, 1, -1)
    valid = t != ignore
    rows = np.where(valid, -np.take_along_axis(lp, np.where(valid, t, 0)[..., None], -1)[..., 0], 0.0)
    return _reduce(rows, valid, reduction)


def _reduce(rows, valid, reduction):
    if reduction == "none":
        return rows
    return rows.sum() / valid.sum() if reduction == "mean" else rows.sum()


def np_bce(p, t, w=1.0):
    return -w * (t * np.log(p) + (1 - t) * np.log(1 - p))


# ---- reductions --------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis, keepdims", [(None, False), (1, False), ((0, 2), True)])
def test_min(check, axis, keepdims):
    check(
        [(2, 3, 4)],
        lambda x: np.min(x, axis=axis, keepdims=keepdims),
        lambda x: ag.min(x, axis, keepdims),
        vals=[distinct((2, 3, 4))],
    )


@pytest.mark.parametrize("reduce", [ag.min, ag.max])
def test_min_max_gradient_goes_only_to_the_extremum_also_when_nan(device, reduce):
    """d min / d x is 0 away from the minimum even where the upstream gradient is NaN (not 0 * NaN)."""
    x = np.zeros((2, 4), np.float32)
    x[1, 3] = 1.0 if reduce is ag.max else -1.0
    node = ag.tensor(x, requires_grad=True, device=device)
    with ag.Tape() as tape:
        out = reduce(node, -1)
    tape.backward(out, grad=ag.tensor(np.float32([1.0, np.nan]), device=device).value)
    expected = np.float32([[0.25] * 4, [0, 0, 0, np.nan]])
    np.testing.assert_array_equal(node.grad.to_host(), expected)


@pytest.mark.parametrize("fn, ref", [(ag.argmax, np.argmax), (ag.argmin, np.argmin)])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_argmax_argmin(check, fn, ref, axis):
    check([(3, 5)], lambda x: ref(x, axis=axis), lambda x: fn(x, axis), vals=[distinct((3, 5))], requires_grad=[False])


def test_argmax_keepdims_dtype_and_long_rows(device):
    x = distinct((3, 70), seed=2)
    out = ag.argmax(ag.tensor(x.astype(np.float32), device=device), axis=1, keepdims=True)
    assert out.dtype == np.int64 and out.shape == (3, 1) and not out.requires_grad
    np.testing.assert_array_equal(out.to_host(), np.argmax(x, axis=1)[:, None])


@pytest.mark.parametrize("axis, keepdims, unbiased", [(None, False, False), (1, True, True), ((0, 2), False, True)])
def test_var(check, axis, keepdims, unbiased):
    ddof = int(unbiased)
    check(
        [(2, 3, 4)],
        lambda x: np.var(x, axis=axis, keepdims=keepdims, ddof=ddof),
        lambda x: ag.var(x, axis, keepdims, unbiased=unbiased),
    )


@pytest.mark.parametrize("axis, keepdims, unbiased", [(None, False, False), (-1, True, True)])
def test_std(check, axis, keepdims, unbiased):
    ddof = int(unbiased)
    check(
        [(3, 5)],
        lambda x: np.std(x, axis=axis, keepdims=keepdims, ddof=ddof),
        lambda x: ag.std(x, axis, keepdims, unbiased=unbiased),
    )


@pytest.mark.parametrize(
    "shape, axis, keepdims",
    [((2, 3, 4), None, False), ((2, 3, 4), 1, True), ((2, 3, 4), (0, 2), False), ((2, 40), -1, False)],
)
def test_logsumexp(check, shape, axis, keepdims):
    check([shape], lambda x: np_logsumexp(x, axis, keepdims), lambda x: ag.logsumexp(x, axis, keepdims))


@pytest.mark.parametrize("shape, axis", [((3, 5), 1), ((2, 3, 4), 0), ((2, 3, 4), -2), ((2, 40), 1)])
def test_cumsum(check, shape, axis):
    check([shape], lambda x: np.cumsum(x, axis=axis), lambda x: ag.cumsum(x, axis), atol=1e-5, rtol=1e-5)


def test_prod(check):
    check([(3, 4)], lambda x: np.prod(x, axis=1), lambda x: ag.prod(x, 1), low=0.5, high=1.5)


def test_prod_all_keepdims(check):
    check([(2, 3)], lambda x: np.prod(x, keepdims=True), lambda x: ag.prod(x, keepdims=True), low=0.5, high=1.5)


def test_prod_with_zeros(check):
    # row 0 has one zero (only it gets a gradient), row 1 two (no gradient), row 2 none
    rows = [[0.0, 1.5, -0.7, 1.2], [0.0, 0.9, 0.0, -1.3], [1.1, -0.8, 1.4, 0.6]]
    check([(3, 4)], lambda x: np.prod(x, axis=-1), lambda x: ag.prod(x, -1), vals=[rows])


# ---- softmax family and norms ------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axis", [((3, 5), -1), ((2, 3, 4), 1), ((2, 40), 1), ((2, 40, 3), 1)])
def test_softmax(check, shape, axis):
    check([shape], lambda x: np_softmax(x, axis), lambda x: ag.softmax(x, axis))


@pytest.mark.parametrize("shape, axis", [((3, 5), -1), ((2, 3, 4), 0), ((2, 40), -1)])
def test_log_softmax(check, shape, axis):
    check([shape], lambda x: np_log_softmax(x, axis), lambda x: ag.log_softmax(x, axis))


def test_layer_norm(check):
    check(
        [(3, 5), (5,), (5,)],
        lambda x, w, b: np_layer_norm(x, 1, w, b),
        lambda x, w, b: ag.layer_norm(x, 5, w, b),
        grad_atol=1e-4,
    )


def test_layer_norm_two_axes_no_affine(check):
    check([(2, 3, 4)], lambda x: np_layer_norm(x, 2), lambda x: ag.layer_norm(x, (3, 4)), grad_atol=1e-4)


def test_layer_norm_long_rows(check):
    check(
        [(2, 40), (40,), (40,)],
        lambda x, w, b: np_layer_norm(x, 1, w, b, 1e-3),
        lambda x, w, b: ag.layer_norm(x, (40,), w, b, eps=1e-3),
        grad_atol=1e-4,
    )


def test_rms_norm(check):
    check([(3, 5), (5,)], lambda x, w: np_rms_norm(x, 1, w), lambda x, w: ag.rms_norm(x, 5, w), grad_atol=1e-4)


def test_rms_norm_long_rows_eps(check):
    check([(2, 40)], lambda x: np_rms_norm(x, 1, eps=1e-2), lambda x: ag.rms_norm(x, [40], eps=1e-2), grad_atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 2), (40, 2)])
def test_batch_norm_training(check, device, shape):
    c = shape[1]
    rm, rv = nc.tensor(np.zeros(c, np.float32), device=device), nc.tensor(np.ones(c, np.float32), device=device)
    check(
        [shape, (c,), (c,)],
        np_batch_norm,
        lambda x, w, b: ag.batch_norm(x, rm, rv, w, b, training=True),
        grad_atol=1e-4,
    )


def test_batch_norm_eval(check, device):
    mean, var = np.array([0.5, -1.0, 0.2]), np.array([0.5, 2.0, 1.5])
    rm, rv = nc.tensor(mean.astype(np.float32), device=device), nc.tensor(var.astype(np.float32), device=device)
    shape = (1, 3, 1)

    def ref(x, w, b):
        return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-5) * w.reshape(shape) + b.reshape(shape)

    check([(2, 3, 4), (3,), (3,)], ref, lambda x, w, b: ag.batch_norm(x, rm, rv, w, b, training=False))
    np.testing.assert_array_equal(rm.to_host(), mean.astype(np.float32))  # eval leaves them alone


def test_batch_norm_updates_running_stats_in_place(device):
    x = np.random.default_rng(3).standard_normal((4, 3, 5)) * 2 + 1
    rm = nc.tensor(np.full(3, 0.5, np.float32), device=device)
    rv = nc.tensor(np.full(3, 2.0, np.float32), device=device)
    ag.batch_norm(ag.tensor(x.astype(np.float32), device=device), rm, rv, training=True, momentum=0.2)
    x = x.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(rm.to_host(), 0.8 * 0.5 + 0.2 * x.mean((0, 2)), rtol=1e-5)
    np.testing.assert_allclose(rv.to_host(), 0.8 * 2.0 + 0.2 * x.var((0, 2), ddof=1), rtol=1e-5)


# ---- activations -------------------------------------------------------------------------------------
def _sigmoid(x):
    return 0.5 * (1 + np.tanh(0.5 * x))


ACTIVATIONS = [
    ("silu", lambda x: x * _sigmoid(x), ag.silu, {}),
    ("leaky_relu", lambda x: np.where(x > 0, x, 0.1 * x), lambda x: ag.leaky_relu(x, 0.1), {}),
    ("leaky_relu_default", lambda x: np.where(x > 0, x, 0.01 * x), ag.leaky_relu, {}),
    # beta 2, threshold 3: both branches; inputs kept 0.1 away from the switch at x = 1.5
    (
        "softplus",
        lambda x: np.where(2 * x > 3, x, np.log1p(np.exp(2 * x)) / 2),
        lambda x: ag.softplus(x, 2.0, 3.0),
        {"vals": [[[-2.0, -0.3, 0.4, 1.2, 1.6], [1.9, -1.1, 0.05, 2.5, -3.0], [0.7, 1.4, -0.6, 3.5, 1.0]]]},
    ),
    ("softplus_default", lambda x: np.log1p(np.exp(x)), ag.softplus, {}),
    ("elu", lambda x: np.where(x > 0, x, 1.5 * np.expm1(x)), lambda x: ag.elu(x, 1.5), {}),
    ("sin", np.sin, ag.sin, {}),
    ("cos", np.cos, ag.cos, {}),
    ("rsqrt", lambda x: 1 / np.sqrt(x), ag.rsqrt, {"low": 0.5, "high": 2.0}),
    ("log1p", np.log1p, ag.log1p, {"low": -0.5, "high": 2.0}),
]


@pytest.mark.parametrize("name, ref, fn, kwargs", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation(check, name, ref, fn, kwargs):
    check([(3, 5)], ref, fn, **kwargs)


def test_ne(check):
    b = [[0.0, 1.0, 2.0], [3.0, 0.0, 5.0]]
    a = [[0.0, 1.5, 2.0], [3.0, 4.0, 5.5]]
    check([(2, 3), (2, 3)], lambda x, y: (x != y) * 1.0, ag.ne, vals=[a, b], requires_grad=[False, False])
    check([(2, 3)], lambda x: (x != 2.0) * 1.0, lambda x: ag.ne(x, 2.0), vals=[a], requires_grad=[False])


# ---- flip and 1-D matmul -------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [None, 1, (0, 2), -1])
def test_flip(check, axis):
    check([(2, 3, 4)], lambda x: np.flip(x, axis), lambda x: ag.flip(x, axis))


@pytest.mark.parametrize("a, b", [((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((2, 3, 4), (4,)), ((4,), (2, 4, 3))])
def test_matmul_one_d(check, a, b):
    check([a, b], np.matmul, ag.matmul, atol=1e-5)


# ---- classification losses ---------------------------------------------------------------------------
LABELS = np.array([2, 0, 1, 2])
IGNORED = np.array([2, -100, 1, 0])
LABELS_3D = np.array([[0, 2, 1, 1], [2, -100, 0, 1]])  # targets of (2, 3, 4) logits, one ignored


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"label_smoothing": 0.1},
        {"reduction": "sum"},
        {"reduction": "none", "label_smoothing": 0.2},
    ],
)
def test_cross_entropy_options(check, kwargs):
    check(
        [(4, 3)],
        lambda x: np_cross_entropy(
            x, LABELS, kwargs.get("label_smoothing", 0.0), -100, kwargs.get("reduction", "mean")
        ),
        lambda x: ag.cross_entropy(x, LABELS, **kwargs),
    )


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_ignore_index(check, reduction):
    check(
        [(4, 3)],
        lambda x: np_cross_entropy(x, IGNORED, reduction=reduction),
        lambda x: ag.cross_entropy(x, IGNORED, reduction=reduction),
    )


def test_cross_entropy_custom_ignore_index(check):
    t = np.array([2, 1, 1, 0])
    check([(4, 3)], lambda x: np_cross_entropy(x, t, ignore=1), lambda x: ag.cross_entropy(x, t, ignore_index=1))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_spatial(check, device, smoothing):
    labels = ag.tensor(LABELS_3D.astype(np.int64), device=device)  # an int64 Tensor target
    check(
        [(2, 3, 4)],
        lambda x: np_cross_entropy(x, LABELS_3D, smoothing),
        lambda x: ag.cross_entropy(x, labels, label_smoothing=smoothing),
    )


def test_cross_entropy_many_classes(check):
    t = np.array([39, 0])
    check([(2, 40)], lambda x: np_cross_entropy(x, t, 0.05), lambda x: ag.cross_entropy(x, t, label_smoothing=0.05))


def test_cross_entropy_rows_longer_than_a_work_group(check):
    """700 classes: the class-loss kernels stride each row over a 256-wide work-group."""
    t = np.array([699, 0, 300])
    check(
        [(3, 700)],
        lambda x: np_cross_entropy(x, t, 0.1),
        lambda x: ag.cross_entropy(x, t, label_smoothing=0.1),
        gradcheck=False,
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(check, reduction):
    check(
        [(4, 3)],
        lambda x: np_nll(x, IGNORED, reduction=reduction),
        lambda x: ag.nll_loss(x, IGNORED, reduction=reduction),
    )


def test_nll_loss_of_log_softmax_spatial(check):
    check(
        [(2, 3, 4)],
        lambda x: np_nll(np_log_softmax(x, 1), LABELS_3D),
        lambda x: ag.nll_loss(ag.log_softmax(x, 1), LABELS_3D),
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(check, reduction):
    reduce = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction]
    check(
        [(2, 3), (2, 3)],
        lambda p, t: reduce(np_bce(p, t)),
        lambda p, t: ag.binary_cross_entropy(p, t, reduction=reduction),
        low=0.1,
        high=0.9,
    )


def test_binary_cross_entropy_weight(check, device):
    w = np.array([0.5, 2.0, 1.0])
    weight = nc.tensor(w.astype(np.float32), device=device)
    check(
        [(2, 3), (2, 3)],
        lambda p, t: np.mean(np_bce(p, t, w)),
        lambda p, t: ag.binary_cross_entropy(p, t, weight),
        low=0.1,
        high=0.9,
        requires_grad=[True, False],
    )


def test_cross_entropy_mean_with_every_target_ignored_is_nan(device):
    x = ag.tensor(np.zeros((2, 3), np.float32), requires_grad=True, device=device)
    with ag.Tape() as tape:
        loss = ag.cross_entropy(x, np.array([-100, -100]))
    assert np.isnan(loss.item())  # 0 / 0, as PyTorch
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), np.zeros((2, 3)))  # ignored rows get no gradient
