"""``netcl.nn.functional`` (torch's ``F``): every function in torch's argument order and defaults against float64
NumPy, one ``check`` line per case (forward within 1e-5, gradients by central differences of the reference).

The activations' inputs stay away from their kinks (0, the clamps' bounds, hardsigmoid's +-3), so the finite
differences straddle none. Positional arguments are torch's: ``max_pool2d``'s fifth is ``dilation`` and its sixth
``ceil_mode``, ``conv_transpose2d``'s sixth ``output_padding``, ``huber_loss``'s third ``reduction``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn.functional as F
from netcl.core import ShapeError

KINK_FREE = np.array([[-1.7, -0.9, -0.3, 0.2], [0.7, 1.1, 1.6, -1.3]])
LABELS = np.array([0, 3, -100, 2], np.int32)  # 4 rows of 5 classes, one ignored
CLASS_W = np.array([0.5, 2.0, 1.0, 3.0, 0.25])
BINARY = np.array([[0.0, 1.0, 0.3, 1.0], [1.0, 0.0, 0.8, 0.0]])
POS_W = np.array([0.5, 3.0, 1.0, 2.0])  # one per class of the last axis
PROBS = np.array([[0.2, 0.0, 0.5, 0.3, 0.0], [0.1, 0.1, 0.1, 0.3, 0.4], [1.0, 0, 0, 0, 0], [0.25, 0.25, 0, 0.25, 0.25]])


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _log_softmax(x, axis):
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def _class_loss(logp, labels, weight, reduction):
    kept = labels != -100
    safe = np.where(kept, labels, 0)
    w = (np.ones(logp.shape[1]) if weight is None else weight)[safe] * kept
    loss = -logp[np.arange(len(labels)), safe] * w
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / w.sum()}[reduction]


def _bce_logits(x, t, w, pw):
    return w * ((1 - t) * _softplus(x) + pw * t * _softplus(-x))


def _pool(x, k, s, fn):
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    return np.array(
        [
            [
                [[fn(x[i, j, a * s : a * s + k, b * s : b * s + k]) for b in range(ow)] for a in range(oh)]
                for j in range(c)
            ]
            for i in range(n)
        ]
    )


def _conv2d(x, w, b, stride, padding):
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    o, _, kh, kw = w.shape
    oh, ow = (x.shape[2] - kh) // stride + 1, (x.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], o, oh, ow))
    for a in range(oh):
        for c in range(ow):
            patch = x[:, :, a * stride : a * stride + kh, c * stride : c * stride + kw]
            out[:, :, a, c] = np.einsum("nchw,ochw->no", patch, w)
    return out + b[None, :, None, None]


def _conv_transpose2d(x, w, b, stride, padding, output_padding):
    n, _, h, wd = x.shape
    _, cout, kh, kw = w.shape
    full = np.zeros((n, cout, (h - 1) * stride + kh + output_padding, (wd - 1) * stride + kw + output_padding))
    for i in range(h):
        for j in range(wd):
            full[:, :, i * stride : i * stride + kh, j * stride : j * stride + kw] += np.einsum(
                "nc,cohw->nohw", x[:, :, i, j], w
            )
    hout = (h - 1) * stride - 2 * padding + kh + output_padding
    wout = (wd - 1) * stride - 2 * padding + kw + output_padding
    return full[:, :, padding : padding + hout, padding : padding + wout] + b[None, :, None, None]


def _norm(x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)


ERF = np.vectorize(math.erf)

#: name -> (input shapes, float64 reference, netcl.nn.functional call, check_op keywords)
CASES = {
    "relu": ([(2, 4)], lambda x: np.maximum(x, 0), F.relu, {"vals": [KINK_FREE]}),
    "relu6": ([(2, 4)], lambda x: np.clip(x, 0, 6), lambda x: F.relu6(x, inplace=True), {"vals": [KINK_FREE * 4]}),
    "hardtanh": (
        [(2, 4)],
        lambda x: np.clip(x, -0.5, 0.25),
        lambda x: F.hardtanh(x, -0.5, 0.25),
        {"vals": [KINK_FREE]},
    ),
    "hardsigmoid": ([(2, 4)], lambda x: np.clip(x / 6 + 0.5, 0, 1), F.hardsigmoid, {"vals": [KINK_FREE * 2.5]}),
    "hardswish": ([(2, 4)], lambda x: x * np.clip(x / 6 + 0.5, 0, 1), F.hardswish, {"vals": [KINK_FREE * 2.5]}),
    "elu": ([(2, 4)], lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)), lambda x: F.elu(x, 0.5), {"vals": [KINK_FREE]}),
    "leaky_relu": (
        [(2, 4)],
        lambda x: np.where(x > 0, x, 0.2 * x),
        lambda x: F.leaky_relu(x, 0.2),
        {"vals": [KINK_FREE]},
    ),
    "gelu": ([(2, 4)], lambda x: 0.5 * x * (1 + ERF(x / math.sqrt(2))), F.gelu, {}),
    "gelu_tanh": (
        [(2, 4)],
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        lambda x: F.gelu(x, approximate="tanh"),
        {},
    ),
    "silu": ([(2, 4)], lambda x: x * _sig(x), F.silu, {}),
    "mish": ([(2, 4)], lambda x: x * np.tanh(_softplus(x)), F.mish, {}),
    "sigmoid": ([(2, 4)], _sig, F.sigmoid, {}),
    "tanh": ([(2, 4)], np.tanh, F.tanh, {}),
    "softplus": (
        [(2, 4)],
        lambda x: np.where(2 * x > 1, x, np.log1p(np.exp(2 * x)) / 2),
        lambda x: F.softplus(x, 2, 1),
        {"vals": [KINK_FREE]},
    ),
    "softsign": ([(2, 4)], lambda x: x / (1 + np.abs(x)), F.softsign, {"vals": [KINK_FREE]}),
    "logsigmoid": ([(2, 4)], lambda x: -_softplus(-x), F.logsigmoid, {"low": -30.0, "high": 30.0}),
    "softmax": ([(3, 4)], lambda x: np.exp(_log_softmax(x, 1)), lambda x: F.softmax(x, dim=1), {}),
    "log_softmax": ([(3, 4)], lambda x: _log_softmax(x, 0), lambda x: F.log_softmax(x, 0), {}),
    "softmin": ([(3, 4)], lambda x: np.exp(_log_softmax(-x, 1)), lambda x: F.softmin(x, 1), {}),
    "glu": ([(2, 6, 3)], lambda x: x[:, :3] * _sig(x[:, 3:]), lambda x: F.glu(x, 1), {}),
    "normalize": ([(3, 4)], lambda x: x / np.sqrt((x**2).sum(1, keepdims=True)), F.normalize, {}),
    "normalize_p1": ([(2, 4)], lambda x: x / np.abs(x).sum(0), lambda x: F.normalize(x, 1, 0), {"vals": [KINK_FREE]}),
    "kl_div_batchmean": (
        [(4, 5)],
        lambda x: np.where(PROBS > 0, PROBS * (np.log(np.where(PROBS > 0, PROBS, 1)) - x), 0).sum() / 4,
        lambda x: F.kl_div(x, PROBS, reduction="batchmean"),
        {},
    ),
    "kl_div_log_target": (
        [(4, 5)],
        lambda x: np.exp(-PROBS) * (-PROBS - x),
        lambda x: F.kl_div(x, -PROBS, reduction="none", log_target=True),
        {},
    ),
    "mse_loss": ([(2, 4), (2, 4)], lambda a, b: ((a - b) ** 2).mean(), F.mse_loss, {}),
    "mse_loss_sum": (
        [(2, 4), (2, 4)],
        lambda a, b: ((a - b) ** 2).sum(),
        lambda a, b: F.mse_loss(a, b, reduction="sum"),
        {},
    ),
    "l1_loss": (
        [(2, 4), (2, 4)],
        lambda a, b: np.abs(a - b),
        lambda a, b: F.l1_loss(a, b, reduction="none"),
        {"vals": [KINK_FREE, KINK_FREE.T.reshape(2, 4)]},
    ),
    "smooth_l1_loss": (
        [(2, 4), (2, 4)],
        lambda a, b: np.where(np.abs(a - b) < 0.5, (a - b) ** 2, np.abs(a - b) - 0.25).sum(),
        lambda a, b: F.smooth_l1_loss(a, b, reduction="sum", beta=0.5),
        {"vals": [KINK_FREE, KINK_FREE[::-1]]},
    ),
    "huber_loss": (
        [(2, 4), (2, 4)],
        lambda a, b: np.where(np.abs(a - b) < 0.7, 0.5 * (a - b) ** 2, 0.7 * (np.abs(a - b) - 0.35)),
        lambda a, b: F.huber_loss(a, b, "none", 0.7),
        {"vals": [KINK_FREE, KINK_FREE[::-1]]},
    ),
    "binary_cross_entropy": (
        [(2, 4)],
        lambda p: (-(BINARY * np.log(p) + (1 - BINARY) * np.log(1 - p)) * POS_W).mean(),
        lambda p: F.binary_cross_entropy(p, ag.tensor(BINARY.astype(np.float32), device=p.device), POS_W),
        {"low": 0.1, "high": 0.9},
    ),
    "bce_with_logits_pos_weight": (
        [(2, 4)],
        lambda x: _bce_logits(x, BINARY, 1.0, POS_W).sum(),
        lambda x: F.binary_cross_entropy_with_logits(
            x, ag.tensor(BINARY.astype(np.float32), device=x.device), reduction="sum", pos_weight=POS_W
        ),
        {"low": -30.0, "high": 30.0},
    ),
    "bce_with_logits_weights": (
        [(2, 4)],
        lambda x: _bce_logits(x, BINARY, np.array([[2.0], [0.5]]), POS_W),
        lambda x: F.binary_cross_entropy_with_logits(
            x,
            ag.tensor(BINARY.astype(np.float32), device=x.device),
            np.array([[2.0], [0.5]]),
            reduction="none",
            pos_weight=POS_W,
        ),
        {},
    ),
    "cross_entropy_weight": (
        [(4, 5)],
        lambda x: _class_loss(_log_softmax(x, 1), LABELS, CLASS_W, "mean"),
        lambda x: F.cross_entropy(x, LABELS, CLASS_W),
        {},
    ),
    "cross_entropy": (
        [(4, 5)],
        lambda x: _class_loss(_log_softmax(x, 1), LABELS, None, "sum"),
        lambda x: F.cross_entropy(x, LABELS, reduction="sum"),
        {},
    ),
    "nll_loss_weight": (
        [(4, 5)],
        lambda x: _class_loss(x, LABELS, CLASS_W, "none"),
        lambda x: F.nll_loss(x, LABELS, CLASS_W, reduction="none"),
        {},
    ),
    "conv2d": (
        [(2, 3, 5, 5), (4, 3, 3, 3), (4,)],
        lambda x, w, b: _conv2d(x, w, b, 2, 1),
        lambda x, w, b: F.conv2d(x, w, bias=b, stride=2, padding=1),
        {"gradcheck": False},
    ),
    "conv_transpose2d": (
        [(2, 3, 3, 3), (3, 2, 3, 3), (2,)],
        lambda x, w, b: _conv_transpose2d(x, w, b, 2, 1, 1),
        lambda x, w, b: F.conv_transpose2d(x, w, b, 2, 1, 1),
        {"gradcheck": False},
    ),
    "conv1d": (
        [(2, 3, 9), (4, 3, 3), (4,)],
        lambda x, w, b: _conv2d(x[:, :, None], w[:, :, None], b, 2, 0)[:, :, 0],
        lambda x, w, b: F.conv1d(x, w, b, 2),
        {"gradcheck": False},
    ),
    "max_pool1d": ([(2, 3, 8)], lambda x: x.reshape(2, 3, 4, 2).max(-1), lambda x: F.max_pool1d(x, 2), {}),
    "avg_pool1d": ([(2, 3, 9)], lambda x: x.reshape(2, 3, 3, 3).mean(-1), lambda x: F.avg_pool1d(x, (3,)), {}),
    "adaptive_avg_pool1d": (
        [(2, 3, 8)],
        lambda x: x.reshape(2, 3, 2, 4).mean(-1),
        lambda x: F.adaptive_avg_pool1d(x, 2),
        {},
    ),
    "max_pool2d_ceil": (
        [(1, 2, 5, 5)],
        lambda x: _pool(np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf), 2, 2, np.max),
        lambda x: F.max_pool2d(x, 2, 2, 0, 1, True),
        {},
    ),
    "avg_pool2d": ([(1, 2, 4, 4)], lambda x: _pool(x, 2, 2, np.mean), lambda x: F.avg_pool2d(x, 2), {}),
    "adaptive_avg_pool2d": (
        [(2, 3, 4, 4)],
        lambda x: x.mean(axis=(2, 3), keepdims=True),
        lambda x: F.adaptive_avg_pool2d(x, 1),
        {},
    ),
    "layer_norm": (
        [(3, 4), (4,), (4,)],
        lambda x, w, b: _norm(x, -1, 1e-5) * w + b,
        lambda x, w, b: F.layer_norm(x, [4], w, b),
        {"grad_atol": 1e-3, "gradcheck": False},
    ),
    "rms_norm": (
        [(3, 4), (4,)],
        lambda x, w: x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + 1e-6) * w,
        lambda x, w: F.rms_norm(x, [4], w, eps=1e-6),
        {"grad_atol": 1e-3, "gradcheck": False},
    ),
    "group_norm": (
        [(2, 4, 3)],
        lambda x: _norm(x.reshape(2, 2, 6), -1, 1e-5).reshape(2, 4, 3),
        lambda x: F.group_norm(x, 2),
        {"grad_atol": 1e-3, "gradcheck": False},
    ),
    "embedding": (
        [(5, 3)],
        lambda t: t[np.array([[1, 4], [0, 1]])],
        lambda t: F.embedding(ag.tensor(np.array([[1, 4], [0, 1]], np.int32), device=t.device), t),
        {},
    ),
    "pad_reflect": (
        [(1, 2, 4)],
        lambda x: np.pad(x, ((0, 0), (0, 0), (2, 1)), mode="reflect"),
        lambda x: F.pad(x, (2, 1), "reflect"),
        {},
    ),
}


@pytest.mark.parametrize(("shapes", "ref", "fn", "kw"), CASES.values(), ids=list(CASES))
def test_functional(check, shapes, ref, fn, kw):
    check(shapes, ref, fn, **kw)


def test_pos_weight_gradient_at_zero_logit(device):
    """At x = 0 the gradient is w ((1 + (pw - 1) t) / 2 - pw t), not the 0 of a kink-based composition."""
    x = ag.tensor(np.zeros((2, 4), np.float32), requires_grad=True, device=device)
    t = ag.tensor(BINARY.astype(np.float32), device=device)
    F.binary_cross_entropy_with_logits(x, t, reduction="sum", pos_weight=POS_W).backward()
    np.testing.assert_allclose(x.grad.to_host(), (1 + (POS_W - 1) * BINARY) / 2 - POS_W * BINARY, rtol=1e-6)


def test_normalize_of_a_zero_row_has_torchs_gradient(device):
    """An all-zero row divides by eps: its gradient is g / eps (torch's), not the NaN of 0 * inf."""
    x = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 2.0]], np.float32)
    node = ag.tensor(x, requires_grad=True, device=device)
    ag.sum(F.normalize(node, eps=1e-6)).backward()
    grad = node.grad.to_host()
    np.testing.assert_allclose(grad[0], 1e6, rtol=1e-6)
    np.testing.assert_allclose(grad[1], (1 - x[1] * x[1].sum() / 9) / 3, rtol=1e-6, atol=1e-7)


def test_refusals_name_the_argument(device):
    x = ag.tensor(np.ones((1, 1, 4, 4), np.float32), device=device)
    with pytest.raises(
        ValueError, match=r"max_pool2d: return_indices=True is not supported \(netcl keeps no indices\)"
    ):
        F.max_pool2d(x, 2, return_indices=True)
    with pytest.raises(ValueError, match=r"max_pool2d: netcl pools without dilation \(1\), got dilation=2"):
        F.max_pool2d(x, 2, 2, 0, 2)
    with pytest.raises(ValueError, match=r"avg_pool2d: divisor_override=3 is not supported"):
        F.avg_pool2d(x, 2, divisor_override=3)
    with pytest.raises(ValueError, match=r"embedding: max_norm=1\.0 is not supported"):
        F.embedding(ag.tensor(np.zeros(2, np.int32), device=device), x.reshape(4, 4), max_norm=1.0)
    with pytest.raises(ValueError, match="gelu: approximate must be 'none' or 'tanh', got 'erf'"):
        F.gelu(x, "erf")
    with pytest.raises(ValueError, match=r"cross_entropy: reduction must be one of \('mean', 'sum', 'none'\)"):
        F.cross_entropy(x.reshape(4, 4), np.zeros(4, np.int32), reduction="avg")
    with pytest.raises(ShapeError, match=r"target has shape \(4, 4\), expected the input's \(1, 16\)"):
        F.binary_cross_entropy_with_logits(x.reshape(1, 16), x.reshape(4, 4))
    with pytest.raises(ShapeError, match=r"pos_weight of shape \(3,\) does not broadcast to \(4, 4\)"):
        F.binary_cross_entropy_with_logits(x.reshape(4, 4), x.reshape(4, 4), pos_weight=np.ones(3))
    with pytest.raises(ValueError, match=r"normalize: netcl takes p = 1 or 2, got p=3"):
        F.normalize(x, 3)
    with pytest.raises(ValueError, match=r"glu: the halved dimension 1 must have an even length, got 1"):
        F.glu(x, 1)
    with pytest.raises(ShapeError, match=r"kl_div: target has shape \(4, 4\), expected the input's \(1, 1, 4, 4\)"):
        F.kl_div(x, np.ones((4, 4)))
    with pytest.raises(ShapeError, match=r"conv1d: input must be \(N, C, L\), got shape \(1, 1, 4, 4\)"):
        F.conv1d(x, x)
    with pytest.raises(ValueError, match=r"max_pool1d: kernel_size must be an int or a 1-tuple of ints, got \(2, 2\)"):
        F.max_pool1d(x.reshape(1, 4, 4), (2, 2))
    with pytest.raises(ValueError, match=r"huber_loss: delta must be > 0, got 0\.0"):
        F.huber_loss(x, x, delta=0.0)


def test_one_hot_as_torchs(device):
    """int64 rows of the identity; the count from the labels with -1; a label past the count raises IndexError at
    the next read (the check of the ``index_select`` it runs as), a float label or a bad count before anything."""
    labels = ag.tensor(np.array([[0, 2], [1, 3]], np.int32), dtype=np.int32, device=device)
    got = F.one_hot(labels)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.to_host(), np.eye(4, dtype=np.int64)[[[0, 2], [1, 3]]])
    assert F.one_hot(labels, 6).shape == (2, 2, 6)
    with pytest.raises(IndexError, match=r"index value 3 is out of range along axis 0: expected 0 <= index < 3"):
        F.one_hot(labels, 3).to_host()
    with pytest.raises(TypeError, match="one_hot: the labels must be integers, got dtype float32"):
        F.one_hot(ag.tensor(np.zeros(2, np.float32), device=device))
    with pytest.raises(ValueError, match="one_hot: num_classes must be a positive int or -1, got 0"):
        F.one_hot(labels, 0)
