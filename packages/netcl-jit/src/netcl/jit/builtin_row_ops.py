"""The built-in row ops, one ``RowOp`` entry each: the reductions along the last axis, the softmax family,
the norms and ``cross_entropy`` (per-row losses of integer class targets).

Each entry puts side by side: the shape rule, when a traced node seeds a row group, its decomposition
into row-IR statements (``row_ir.Builder``: elementwise primitives and ``sum``/``max`` reductions over the
row, from which ``row_ir.backward_program`` derives the gradient) and, for the ops autograd asks through
its row hook, the eager provider (a cached ``jit_compile`` of the op itself). ``register_builtin_row_ops``
runs once at import of netcl.jit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.jit.row_ir import COLIDX, ELEM, INDEX, ROW, Builder
from netcl.jit.row_ops import Cached, RowOp, register_row_op
from netcl.jit.shapes import class_loss_dtype, class_loss_shape, reduction_shape, same_shape

_F32 = np.dtype(np.float32)


# ---- helpers ---------------------------------------------------------------------------------
def value_of(x: Any) -> Any:
    """The Tensor behind a Node (anything else as it is)."""
    return x.value if isinstance(x, Node) else x


def is_float32_tensor(x: Any) -> bool:
    """Whether ``x`` (a Node or Tensor) holds a float32 tensor on an OpenCL device or the NumPy backend."""
    v = value_of(x)
    return isinstance(v, Tensor) and v.dtype == _F32 and v.device.kind in ("opencl", "cpu")


def _last_axis(axis: Any, ndim: int) -> bool:
    if axis is None:
        return ndim == 1
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    return len(axes) == 1 and isinstance(axes[0], (int, np.integer)) and int(axes[0]) % max(ndim, 1) == ndim - 1


def _all_traced(node: Any) -> bool:
    return all(kind == "node" for kind, _ in node.arg_layout)


def _rename(b: Builder, value: str, var: str) -> str:
    """Give the last statement (which computed ``value``) the node's name."""
    stmt = b.stmts[-1]
    assert stmt.var == value
    del b.kinds[value]
    stmt.var = var
    b.kinds[var] = stmt.kind
    return var


# ---- reductions along the last axis: sum, mean, max, min, var, std ----------------------------
def reduction_seed(node: Any) -> bool:
    """One traced input, reduced along its last axis (the attribute ``axis``)."""
    x = node.inputs[0]
    return len(node.inputs) == 1 and _all_traced(node) and _last_axis(node.attrs.get("axis", -1), len(x.shape))


def _plain_reduction(how: str):
    def emit(b: Builder, args: list[str], attrs: dict, var: str) -> str:
        return b.reduce(how, args[0], var=var)

    return emit


def _mean(b: Builder, args: list[str], attrs: dict, var: str) -> str:
    return b.scalar("mul", b.reduce("sum", args[0]), 1.0 / b.C, var=var)


def _moment(root: bool):
    """var (``root`` False) or std: the mean squared deviation, two passes (the mean, then the squares)."""

    def emit(b: Builder, args: list[str], attrs: dict, var: str) -> str:
        centered = b.prim("sub", [args[0], b.mean(args[0])])
        dof = b.C - (1 if attrs.get("unbiased") else 0)
        squares = b.reduce("sum", b.prim("mul", [centered, centered]))
        if not root:
            return b.scalar("mul", squares, 1.0 / dof, var=var)
        return b.prim("sqrt", [b.scalar("mul", squares, 1.0 / dof)], var=var)

    return emit


# ---- the softmax family ----------------------------------------------------------------------
def _exp_rows(b: Builder, x: str) -> tuple[str, str, str, str]:
    """``(shift, d, exp(d), sum(exp(d)))`` with ``d = x - shift``, the row max as the shift."""
    shift = b.reduce("max", x, grad=False)  # carries no gradient: the results do not depend on it
    d = b.prim("sub", [x, shift])
    e = b.prim("exp", [d])
    return shift, d, e, b.reduce("sum", e)


def _softmax(b: Builder, args: list[str], attrs: dict, var: str) -> str:
    _, _, e, total = _exp_rows(b, args[0])
    return b.prim("div", [e, total], var=var)


def _log_softmax(b: Builder, args: list[str], attrs: dict, var: str) -> str:
    _, d, _, total = _exp_rows(b, args[0])
    return b.prim("sub", [d, b.prim("log", [total])], var=var)


def _logsumexp(b: Builder, args: list[str], attrs: dict, var: str) -> str:
    shift, _, _, total = _exp_rows(b, args[0])
    return b.prim("add", [shift, b.prim("log", [total])], var=var)


def _softmax_provider(name: str):
    """``ag.softmax`` / ``ag.log_softmax`` along the last axis."""

    def provide(args: tuple, attrs: dict, cached: Cached) -> Any:
        x = args[0]
        if attrs["axis"] != value_of(x).ndim - 1:
            return None
        op = getattr(ag, name)
        return cached((name,), lambda: lambda x: op(x, -1))(x)

    return provide


# ---- the norms -------------------------------------------------------------------------------
def norm_seed(node: Any) -> bool:
    """Normalized over the last axis alone, its weight and bias (if any) float32 of shape ``(C,)``."""
    C = node.inputs[0].shape[-1]
    if tuple(node.attrs.get("normalized_shape", ())) != (C,) or "has_weight" not in node.attrs:
        return False
    return all(p.shape == (C,) and p.dtype == _F32 for p in node.inputs[1:])


def _norm(centered: bool):
    """layer_norm (``centered``) or rms_norm: ``x' * rsqrt(mean(x'^2) + eps) * weight + bias``."""

    def emit(b: Builder, args: list[str], attrs: dict, var: str) -> str:
        x, params = args[0], iter(args[1:])
        eps = float(attrs.get("eps", 1e-5))
        shifted = b.prim("sub", [x, b.mean(x)]) if centered else x
        var_ = b.mean(b.prim("mul", [shifted, shifted]))
        y = b.prim("mul", [shifted, b.prim("rsqrt", [b.scalar("add", var_, eps)])])
        if attrs.get("has_weight"):
            y = b.prim("mul", [y, next(params)])
        if attrs.get("has_bias"):
            y = b.prim("add", [y, next(params)])
        return _rename(b, y, var)

    return emit


def _layer_norm_provider(args: tuple, attrs: dict, cached: Cached) -> Any:
    x, weight, bias = args
    params = [p for p in (weight, bias) if p is not None]
    if tuple(attrs["normalized_shape"]) != (value_of(x).shape[-1],) or not all(map(is_float32_tensor, params)):
        return None
    eps, has_w, has_b = attrs["eps"], weight is not None, bias is not None

    def make():
        def layer_norm(x, *p):
            w = p[0] if has_w else None
            b = p[-1] if has_b else None
            return ag.layer_norm(x, x.shape[-1], w, b, eps)

        return layer_norm

    return cached(("layer_norm", eps, has_w, has_b), make)(x, *params)


def _rms_norm_provider(args: tuple, attrs: dict, cached: Cached) -> Any:
    x, weight = args[0], args[1]
    params = [weight] if weight is not None else []
    if tuple(attrs["normalized_shape"]) != (value_of(x).shape[-1],) or not all(map(is_float32_tensor, params)):
        return None
    eps = attrs["eps"]

    def make():
        return lambda x, *p: ag.rms_norm(x, x.shape[-1], p[0] if p else None, eps)

    return cached(("rms_norm", eps, weight is not None, False), make)(x, *params)


# ---- cross_entropy of integer class targets --------------------------------------------------
def cross_entropy_seed(node: Any) -> bool:
    """(N, C) logits, (N,) int32 targets, per-row losses (reduction "none")."""
    x = node.inputs[0]
    target = node.inputs[1] if len(node.inputs) == 2 else None
    if len(x.shape) != 2 or target is None or target.dtype != np.int32 or target.shape != x.shape[:1]:
        return False
    return node.attrs.get("reduction") == "none" and _all_traced(node)


def _cross_entropy(b: Builder, args: list[str], attrs: dict, var: str) -> str:
    """Per row: ``lse(x) - sum(q * x)`` with ``q = (1 - s) one_hot(t) + s / C``; 0 where ``t == ignore_index``."""
    x, target = args
    _, d, _, total = _exp_rows(b, x)
    hit = b.expr(f"EQ({COLIDX}, {target})", ELEM)  # no gradient: the target is an index
    smoothing = float(attrs.get("label_smoothing", 0.0))
    picked = b.reduce("sum", b.prim("mul", [hit, d]))
    loss = b.prim("sub", [b.prim("log", [total]), b.scalar("mul", picked, 1.0 - smoothing)])
    if smoothing:
        loss = b.prim("sub", [loss, b.scalar("mul", b.reduce("sum", d), smoothing / b.C)])
    valid = b.expr(f"NE({target}, {float(attrs.get('ignore_index', -100))}f)", ROW)
    return b.prim("mul", [loss, valid], var=var)


# ---- the table ---------------------------------------------------------------------------------
_REDUCE_ATTRS = ("axis", "keepdims")
_NORM_ATTRS = ("normalized_shape", "eps", "has_weight", "has_bias")

BUILTIN_ROW_OPS = (
    RowOp("sum", reduction_shape, reduction_seed, _plain_reduction("sum"), _REDUCE_ATTRS),
    RowOp("max", reduction_shape, reduction_seed, _plain_reduction("max"), _REDUCE_ATTRS),
    RowOp("min", reduction_shape, reduction_seed, _plain_reduction("min"), _REDUCE_ATTRS),
    RowOp("mean", reduction_shape, reduction_seed, _mean, _REDUCE_ATTRS),
    RowOp("var", reduction_shape, reduction_seed, _moment(False), (*_REDUCE_ATTRS, "unbiased")),
    RowOp("std", reduction_shape, reduction_seed, _moment(True), (*_REDUCE_ATTRS, "unbiased")),
    RowOp("softmax", same_shape, reduction_seed, _softmax, ("axis",), provider=_softmax_provider("softmax")),
    RowOp(
        "log_softmax", same_shape, reduction_seed, _log_softmax, ("axis",), provider=_softmax_provider("log_softmax")
    ),
    RowOp("logsumexp", reduction_shape, reduction_seed, _logsumexp, _REDUCE_ATTRS),
    RowOp("layer_norm", same_shape, norm_seed, _norm(True), _NORM_ATTRS, provider=_layer_norm_provider),
    RowOp("rms_norm", same_shape, norm_seed, _norm(False), _NORM_ATTRS, provider=_rms_norm_provider),
    RowOp(
        "cross_entropy",
        class_loss_shape,
        cross_entropy_seed,
        _cross_entropy,
        ("ignore_index", "reduction", "label_smoothing"),
        operand_kind=INDEX,
        dtype=class_loss_dtype,
        class_target=1,
    ),
)


def register_builtin_row_ops() -> None:
    """Register every built-in row op (called once at import of netcl.jit)."""
    for op in BUILTIN_ROW_OPS:
        register_row_op(op)
