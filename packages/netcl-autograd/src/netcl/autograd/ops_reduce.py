"""Differentiable reductions beyond sum/mean/max: ``min``, ``prod``, ``var``/``std``, ``cumsum``, the
index reductions ``argmax``/``argmin`` (no gradient), and ``flip`` (``logsumexp`` is in ops_softmax).

``axis`` is NumPy's (None: all axes; an int or a tuple, negatives allowed; ``argmax``/``argmin``/
``cumsum`` take one int, ``argmax``/``argmin`` also None for the flattened tensor). Gradients:
``min`` shares among tied minima (as ``max``); ``prod`` is the product of the other elements, exact
with zeros in the slice (one zero: only it gets a gradient; two or more: none); ``var``
``2 (x - mean) / (n - ddof)``; ``cumsum`` the reversed
cumulative sum of the gradient (one kernel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op
from netcl.autograd.ops import attrs_axis, kept_shape, normalize_axes
from netcl.core import Tensor
from netcl.runtime.ops import pointwise, reduce, scan

Operand = Any  # Node | Tensor
Axis = int | Sequence[int] | None
_Grads = list[Tensor | None]


def _axes(x: Operand, axis: Axis) -> tuple[int, ...]:
    if not hasattr(x, "shape"):
        raise TypeError(f"expected a Node or Tensor, got {type(x).__name__}")
    return normalize_axes(axis, len(x.shape))


def _reduction(name: str, forward: Any, grad: Any, x: Operand, axis: Axis, keepdims: bool, **extra: Any) -> Node:
    attrs = {"axis": attrs_axis(axis), "keepdims": keepdims, **extra}
    return apply_op(forward, grad, x, op_name=name, attrs=attrs)


def min(x: Operand, axis: Axis = None, keepdims: bool = False) -> Node:
    """Minimum over ``axis``; the gradient is shared equally among tied minima."""
    axes = _axes(x, axis)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        kept = kept_shape(v.shape, axes)
        mask = pointwise.eq(v, out.reshape(kept))
        # where, not mask * share: an element that is not a minimum gets 0 even when the share is NaN
        return [pointwise.where(mask, pointwise.div(g.reshape(kept), reduce.sum(mask, axes, True)), 0.0)]

    return _reduction("min", lambda v: reduce.min(v, axes, keepdims), grad, x, axis, keepdims)


def _np_prod_grad(v: np.ndarray, g: np.ndarray, out: np.ndarray, zeros: np.ndarray, rest: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return g * np.where(zeros == 0, out / v, np.where((v == 0) & (zeros == 1), rest, 0))


def prod(x: Operand, axis: Axis = None, keepdims: bool = False) -> Node:
    """Product over ``axis``; the gradient is the product of the other elements (exact with zeros)."""
    axes = _axes(x, axis)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        kept = kept_shape(v.shape, axes)
        is_zero = pointwise.eq(v, 0.0)
        zeros = reduce.sum(is_zero, axes, True)  # zeros in each slice
        rest = reduce.prod(pointwise.where(is_zero, 1.0, v), axes, True)  # product of the non-zero elements
        expr = "{1} * WHERE(EQ({3}, 0.0f), {2} / {0}, WHERE(EQ({0}, 0.0f) * EQ({3}, 1.0f), {4}, 0.0f))"
        return [pointwise.elementwise(expr, _np_prod_grad, v, g.reshape(kept), out.reshape(kept), zeros, rest)]

    return _reduction("prod", lambda v: reduce.prod(v, axes, keepdims), grad, x, axis, keepdims)


def _np_sq_dev(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    return (v - m) * (v - m)


def _np_var_grad(v: np.ndarray, m: np.ndarray, g: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return g * scale * (v - m)


def _moments(v: Tensor, axes: tuple[int, ...], keepdims: bool, unbiased: bool) -> tuple[Tensor, Tensor, float]:
    """(mean with kept dims, variance, 1 / (n - ddof)) of ``v`` over ``axes``."""
    n = math.prod(v.shape[a] for a in axes)
    dof = n - (1 if unbiased else 0)
    inv = 1.0 / dof if dof > 0 else math.nan  # NumPy and PyTorch: NaN when n <= ddof
    m = reduce.mean(v, axes, True)
    sq = pointwise.elementwise("({0} - {1}) * ({0} - {1})", _np_sq_dev, v, m)
    return m, pointwise.mul(reduce.sum(sq, axes, keepdims), inv), inv


def var(x: Operand, axis: Axis = None, keepdims: bool = False, unbiased: bool = False) -> Node:
    """Variance over ``axis``: mean squared deviation (``unbiased=True`` divides by n - 1)."""
    axes = _axes(x, axis)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        m = reduce.mean(v, axes, True)
        inv = _moments_scale(v, axes, unbiased)
        kept = kept_shape(v.shape, axes)
        return [pointwise.elementwise("{2} * {3} * 2.0f * ({0} - {1})", _np_var_grad2, v, m, g.reshape(kept), inv)]

    return _reduction(
        "var", lambda v: _moments(v, axes, keepdims, unbiased)[1], grad, x, axis, keepdims, unbiased=unbiased
    )


def _np_var_grad2(v: np.ndarray, m: np.ndarray, g: np.ndarray, inv: np.ndarray) -> np.ndarray:
    return g * inv * 2 * (v - m)


def _moments_scale(v: Tensor, axes: tuple[int, ...], unbiased: bool) -> float:
    dof = math.prod(v.shape[a] for a in axes) - (1 if unbiased else 0)
    return 1.0 / dof if dof > 0 else math.nan


def std(x: Operand, axis: Axis = None, keepdims: bool = False, unbiased: bool = False) -> Node:
    """Standard deviation over ``axis`` (sqrt of ``var``); the gradient is ``(x - mean) / ((n - ddof) std)``."""
    axes = _axes(x, axis)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        m = reduce.mean(v, axes, True)
        inv = _moments_scale(v, axes, unbiased)
        kept = kept_shape(v.shape, axes)
        expr = "{2} * {3} * ({0} - {1}) / {4}"
        return [
            pointwise.elementwise(
                expr,
                lambda a, b, c, d, e: c * d * (a - b) / e,
                v,
                m,
                g.reshape(kept),
                inv,
                out.reshape(kept),
            )
        ]

    return _reduction(
        "std",
        lambda v: pointwise.sqrt(_moments(v, axes, keepdims, unbiased)[1]),
        grad,
        x,
        axis,
        keepdims,
        unbiased=unbiased,
    )


def cumsum(x: Operand, axis: int) -> Node:
    """Running sums along ``axis`` (one scan kernel); the gradient is the reversed running sum."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [scan.cumsum(g, axis, reverse=True)]

    return apply_op(lambda v: scan.cumsum(v, axis), grad, x, op_name="cumsum", attrs={"axis": axis})


def argmax(x: Operand, axis: int | None = None, keepdims: bool = False) -> Node:
    """int64 index of the maximum along ``axis`` (None: of the flattened tensor; NumPy's semantics:
    first index on ties, the first NaN when there is one); not differentiable."""
    return apply_op(
        lambda v: scan.argmax(v, axis, keepdims), None, x, op_name="argmax", attrs={"axis": axis, "keepdims": keepdims}
    )


def argmin(x: Operand, axis: int | None = None, keepdims: bool = False) -> Node:
    """int64 index of the minimum along ``axis`` (see ``argmax``); not differentiable."""
    return apply_op(
        lambda v: scan.argmin(v, axis, keepdims), None, x, op_name="argmin", attrs={"axis": axis, "keepdims": keepdims}
    )


def flip(x: Operand, axis: Axis = None) -> Node:
    """Reverse the order of elements along ``axis`` (None: every axis); the gradient is flipped back."""
    _axes(x, axis)  # AxisError before anything runs

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [scan.flip(g, axis)]

    return apply_op(lambda v: scan.flip(v, axis), grad, x, op_name="flip", attrs={"axis": attrs_axis(axis)})


__all__ = ["argmax", "argmin", "cumsum", "flip", "min", "prod", "std", "var"]
