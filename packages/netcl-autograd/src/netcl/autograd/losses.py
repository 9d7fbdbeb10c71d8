"""Differentiable losses, each one ``apply_op`` call named after its JIT primitive.

``mse_loss``, ``bce_with_logits`` and ``smooth_l1`` return the mean over all elements (a 0-d
Node). ``cross_entropy``, ``nll_loss`` and ``binary_cross_entropy`` (PyTorch's signatures, with
``reduction=``) live in ``netcl.autograd.losses_class`` and are re-exported here. ``weighted_bce`` and
``weighted_smooth_l1`` are the elementwise terms of
the detection loss in docs/architecture.md (no reduction) with gradients w.r.t. ``pred`` only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op
from netcl.autograd.losses_class import binary_cross_entropy, cross_entropy, nll_loss
from netcl.core import Tensor
from netcl.runtime import ops as R  # noqa: N812  (R: the runtime op library)
from netcl.runtime.ops._table import numpy_sigmoid

_Grads = list[Tensor | None]


__all__ = [
    "bce_with_logits",
    "binary_cross_entropy",
    "cross_entropy",
    "mse_loss",
    "nll_loss",
    "smooth_l1",
    "weighted_bce",
    "weighted_smooth_l1",
]


def np_bce_logits(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """NumPy twin of PRIMITIVE_PREAMBLE's BCE_LOGITS."""
    return np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))


#: Overflow-free logistic function (the eager NumPy backend's SIGMOID).
np_sigmoid = numpy_sigmoid


def np_smooth_l1(d: np.ndarray, beta: float) -> np.ndarray:
    """NumPy twin of SMOOTH_L1: 0.5*d*d/beta inside |d| < beta, |d| - 0.5*beta outside."""
    a = np.abs(d)
    return np.where(a < beta, 0.5 * d * d / (beta if beta > 0 else 1.0), a - 0.5 * beta)


def np_smooth_l1_grad(d: np.ndarray, beta: float) -> np.ndarray:
    """NumPy twin of SMOOTH_L1_GRAD: d/beta inside the band, sign(d) outside."""
    return np.where(np.abs(d) < beta, d / (beta if beta > 0 else 1.0), np.sign(d))


def _needs(x: Any) -> bool:
    return isinstance(x, Node) and x.requires_grad


def _reduce(grad: Tensor | None, like: Any) -> Tensor | None:
    return None if grad is None else R.sum_to_shape(grad, tuple(like.shape))


def _scaled(g: Tensor, count: int) -> Tensor:
    """The upstream gradient of a mean, divided by the element count (a 0-d tensor)."""
    return R.mul(g, 1.0 / count)


def mse_loss(pred: Any, target: Any) -> Node:
    """mean((pred - target) ** 2); target broadcasts against pred."""

    def forward(p: Tensor, t: Tensor) -> Tensor:
        d = R.sub(p, t)
        return R.mean(R.mul(d, d))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t = values
        d = R.sub(p, t)
        gd = R.mul(d, R.mul(g, 2.0 / d.size))
        return [_reduce(gd, p) if _needs(pred) else None, _reduce(R.neg(gd), t) if _needs(target) else None]

    return apply_op(forward, grad, pred, target, op_name="mse_loss")


def bce_with_logits(pred: Any, target: Any) -> Node:
    """mean(max(x, 0) - x*t + log1p(exp(-|x|))): binary cross-entropy on logits, overflow-free."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        x, t = values
        gs = _scaled(g, math.prod(np.broadcast_shapes(tuple(x.shape), tuple(t.shape))))
        gx = R.elementwise("BCE_LOGITS_GRAD({0}, {1}) * {2}", _np_bce_grad, x, t, gs) if _needs(pred) else None
        gt = R.mul(R.neg(x), gs) if _needs(target) else None
        return [_reduce(gx, x), _reduce(gt, t)]

    return apply_op(
        lambda x, t: R.mean(R.elementwise("BCE_LOGITS({0}, {1})", np_bce_logits, x, t)),
        grad,
        pred,
        target,
        op_name="bce_with_logits",
    )


def _np_bce_grad(x: np.ndarray, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    return (np_sigmoid(x) - t) * g


def smooth_l1(pred: Any, target: Any, beta: float = 1.0) -> Node:
    """mean(smooth_l1(pred - target, beta)); plain L1 when ``beta == 0``."""
    beta = float(beta)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t = values
        gs = _scaled(g, math.prod(np.broadcast_shapes(tuple(p.shape), tuple(t.shape))))
        gd = R.elementwise(
            "SMOOTH_L1_GRAD({0} - {1}, {2}) * {3}", lambda a, b, c, s: np_smooth_l1_grad(a - b, c) * s, p, t, beta, gs
        )
        return [_reduce(gd, p) if _needs(pred) else None, _reduce(R.neg(gd), t) if _needs(target) else None]

    return apply_op(
        lambda p, t: R.mean(
            R.elementwise("SMOOTH_L1({0} - {1}, {2})", lambda a, b, c: np_smooth_l1(a - b, c), p, t, beta)
        ),
        grad,
        pred,
        target,
        op_name="smooth_l1",
        attrs={"beta": beta},
    )


def weighted_bce(pred: Any, target: Any, weight: Any) -> Node:
    """Elementwise ``weight * bce_logits(pred, target)``; gradient w.r.t. ``pred`` only."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t, w = values
        gp = R.elementwise(
            "{2} * BCE_LOGITS_GRAD({0}, {1}) * {3}", lambda a, b, c, s: c * (np_sigmoid(a) - b) * s, p, t, w, g
        )
        return [_reduce(gp, p), None, None]

    return apply_op(
        lambda p, t, w: R.elementwise("{2} * BCE_LOGITS({0}, {1})", lambda a, b, c: c * np_bce_logits(a, b), p, t, w),
        grad,
        pred,
        target,
        weight,
        op_name="weighted_bce",
    )


def weighted_smooth_l1(pred: Any, target: Any, weight: Any, beta: float = 0.05) -> Node:
    """Elementwise ``weight * smooth_l1(pred - target, beta)``; gradient w.r.t. ``pred`` only.

    ``beta`` defaults to the detection loss's 0.05 (see docs/architecture.md).
    """
    beta = float(beta)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t, w = values
        gp = R.elementwise(
            "{2} * SMOOTH_L1_GRAD({0} - {1}, {3}) * {4}",
            lambda a, b, c, bt, s: c * np_smooth_l1_grad(a - b, bt) * s,
            p,
            t,
            w,
            beta,
            g,
        )
        return [_reduce(gp, p), None, None]

    return apply_op(
        lambda p, t, w: R.elementwise(
            "{2} * SMOOTH_L1({0} - {1}, {3})", lambda a, b, c, bt: c * np_smooth_l1(a - b, bt), p, t, w, beta
        ),
        grad,
        pred,
        target,
        weight,
        op_name="weighted_smooth_l1",
        attrs={"beta": beta},
    )
