"""``linear`` (torch's ``nn.functional.linear``) is one differentiable op: ``x @ weight.T + bias`` through the
runtime's matmul reading the weight transposed (no transpose copy), with the weight gradient ``grad.T @ x``
and the bias gradient summed over the leading dimensions. Under ``netcl.amp.autocast`` its product runs with
float16 operands and float32 accumulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from netcl.autograd import autocast_mode, ops
from netcl.autograd.engine import Node, apply_op
from netcl.core import ShapeError, Tensor
from netcl.core.dtypes import float32
from netcl.runtime.ops import linalg, pointwise
from netcl.runtime.ops.precision import at_matmul_precision


def _needs(x: Any) -> bool:
    return isinstance(x, Node) and x.requires_grad


def _shape(x: Any, arg: str) -> tuple[int, ...]:
    if not hasattr(x, "shape"):
        raise TypeError(f"linear: {arg} must be a Node or Tensor, got {type(x).__name__}")
    return tuple(x.shape)


def linear(x: Any, weight: Any, bias: Any = None) -> Node:
    """``x @ weight.T + bias``: x (..., in_features), weight (out_features, in_features), bias (out_features,)."""
    x_shape, w_shape = _shape(x, "x"), _shape(weight, "weight")
    if len(w_shape) != 2:
        raise ShapeError(f"linear: weight must be 2-d (out_features, in_features), got shape {w_shape}")
    out_features, in_features = w_shape
    if not x_shape or x_shape[-1] != in_features:
        raise ShapeError(f"linear: x has shape {x_shape}, expected (..., {in_features}) for weight {w_shape}")
    if bias is not None and _shape(bias, "bias") != (out_features,):
        raise ShapeError(f"linear: bias has shape {tuple(bias.shape)}, expected ({out_features},)")
    rows = math.prod(x_shape[:-1])
    low = autocast_mode.low_dtype_for(x, weight)
    precision = autocast_mode.fallback_precision(x, weight)  # autocast on a device without float16

    def product(a: Tensor, b: Tensor, **kw: Any) -> Tensor:
        if low is None:
            return linalg.matmul(a, b, **kw)
        return linalg.matmul(autocast_mode.lower(a, low), autocast_mode.lower(b, low), out_dtype=float32, **kw)

    def product_grad(shape: tuple[int, ...], addend: Tensor | None, a: Tensor, b: Tensor, **kw: Any) -> Tensor:
        if low is None:
            return ops.product_grad(shape, addend, a, b, **kw)
        a, b = autocast_mode.lower(a, low), autocast_mode.lower(b, low)
        return ops.product_grad(shape, addend, a, b, out_dtype=float32, **kw)

    def forward(xv: Tensor, wv: Tensor, bv: Tensor | None = None) -> Tensor:
        x2 = xv.reshape(rows, in_features)
        if bv is not None and low is None and float32 == bv.dtype == xv.dtype == wv.dtype:  # added in the store
            return linalg.matmul(x2, wv, transpose_b=True, bias=bv).reshape(*x_shape[:-1], out_features)
        out = product(x2, wv, transpose_b=True)
        if bv is not None:
            out = pointwise.add(out, bv)
        return out.reshape(*x_shape[:-1], out_features)

    def grad(
        g: Tensor, values: tuple[Any, ...], out: Tensor, addends: Sequence[Tensor | None] = (None, None, None)
    ) -> list[Tensor | None]:
        xv, wv = values[0], values[1]
        g2 = g.reshape(rows, out_features)
        gx = gw = None
        if _needs(x):
            add_x = None if addends[0] is None else addends[0].reshape(rows, in_features)
            gx = product_grad((rows, in_features), add_x, g2, wv).reshape(x_shape)
        if _needs(weight):
            gw = product_grad(w_shape, addends[1], g2, xv.reshape(rows, in_features), transpose_a=True)
        if bias is None:
            return [gx, gw]
        return [gx, gw, ops.sum_grad(addends[2], g2, 0) if _needs(bias) else None]

    args = (x, weight) if bias is None else (x, weight, bias)
    # attrs: what a tracer (netcl.jit) needs to run the product itself, e.g. with ops after it in its store
    attrs = {"autocast": None if low is None else str(low), "precision": precision, "bias": bias is not None}
    at = at_matmul_precision  # the op's forward and gradient alike
    return apply_op(
        at(precision, forward), at(precision, grad), *args, op_name="linear", attrs=attrs, folds_addends=True
    )


__all__ = ["linear"]
