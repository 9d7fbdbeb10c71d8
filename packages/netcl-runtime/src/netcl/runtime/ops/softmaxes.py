"""``softmax``, ``log_softmax`` and ``logsumexp``: one row kernel forward, one backward (``_rows``).

Forward: each lane folds its elements into an online-softmax pair (running max ``m``, sum ``s`` of
``exp(v - m)``: one ``exp`` per element, the max subtracted, so logits of 1e4 stay finite), the
pairs combine by a tree, and the row is written as ``exp(v - m) / s``, ``(v - m) - log(s)`` or (one
value) ``m + log(s)``. A row of only -inf gives ``logsumexp = -inf`` and NaN softmax (as PyTorch).
Backward, from the saved output: ``y (g - sum(g y))`` for softmax, ``g - exp(y) sum(g)`` for
log_softmax, ``g exp(x - lse)`` for logsumexp; one kernel each.

Values are computed in float32 (float64 for float64 data); float16 data is read and written as
half. ``axis`` is any axis (an inner one reads the row strided); ``logsumexp`` also takes a tuple
of axes or None (neighbouring axes are one row; others are moved last by a transpose first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.runtime.ops import _rows
from netcl.runtime.ops._common import normalize_axes, storage_ctype, wrap_numpy
from netcl.runtime.ops.layout import transpose

_FORWARD_TAIL = {
    "softmax": (
        "    const ACC inv = (ACC)1 / s;\n"
        "    for (IDX i = LID; i < R; i += LSIZE) y[AT(i)] = (YT)(exp((ACC)x[AT(i)] - m) * inv);"
    ),
    "log_softmax": (
        "    const ACC ls = log(s);\n"
        "    for (IDX i = LID; i < R; i += LSIZE) y[AT(i)] = (YT)(((ACC)x[AT(i)] - m) - ls);"
    ),
    "logsumexp": "    if (LID == 0) y[row] = (YT)(m + log(s));",
}


def _forward_source(kind: str, mode: str, layout: str, x: Tensor, out_dtype: np.dtype, acc: str, idx: str) -> str:
    body = (
        "    ACC m = -INFINITY, s = 0;\n"
        "    for (IDX i = LID; i < R; i += LSIZE) {\n"
        f"        const ACC v = (ACC)x[AT(i)];\n        {_rows.MAXSUM_STEP}\n"
        "    }\n"
        "    ROW_MAXSUM(m, s);\n" + _FORWARD_TAIL[kind]
    ).replace("YT", storage_ctype(out_dtype))
    params = [f"__global const {storage_ctype(x.dtype)}* x", f"__global {storage_ctype(out_dtype)}* y"]
    return _rows.source(f"netcl_{kind}", params, body, layout, mode, acc, idx, [x.dtype, out_dtype])


def _row_view(x: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, tuple[int, int, int], tuple[int, ...] | None]:
    """(tensor whose reduced axes are one block, its (outer, R, inner), the permutation applied or None)."""
    if axes and axes == tuple(range(axes[0], axes[-1] + 1)):
        return x, _rows.row_split(x.shape, axes[0], axes[-1]), None
    perm = tuple(a for a in range(x.ndim) if a not in axes) + axes
    moved = transpose(x, perm)
    return moved, _rows.row_split(moved.shape, x.ndim - len(axes), x.ndim - 1), perm


def _launch_forward(kind: str, x: Tensor, out: Tensor, split: tuple[int, int, int]) -> Tensor:
    outer, R, inner = split
    layout = _rows.layout_of(inner)
    acc = _rows.acc_ctype(x.dtype)
    idx = _rows.index_for(x.size)
    key = (kind, layout, x.dtype.str, out.dtype.str, acc, idx)

    def make(mode: str) -> str:
        return _forward_source(kind, mode, layout, x, out.dtype, acc, idx)

    _rows.run(key, x.device, make, f"netcl_{kind}", [None, None], outer * inner, R, inner, idx, x, out)
    return out


def _axis(x: Tensor, axis: int, op: str) -> int:
    if x.ndim == 0:
        raise np.exceptions.AxisError(f"{op}: x must have at least one dimension, got a 0-d tensor")
    return normalize_axes(axis, x.ndim, op)[0] if isinstance(axis, (int, np.integer)) else _bad_axis(axis, op)


def _bad_axis(axis: Any, op: str) -> int:
    raise TypeError(f"{op}: axis must be an int, got {axis!r}")


def _check(x: Any, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    _rows.require_float(x, op)
    return x


def _np(x: Tensor) -> np.ndarray:
    return np.asarray(x.data, dtype=_rows.acc_dtype(x.dtype))


# ---- softmax and log_softmax ------------------------------------------------------------------------
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along ``axis``; one kernel."""
    return _softmax("softmax", x, axis)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """(x - max) - log(sum(exp(x - max))) along ``axis``; one kernel."""
    return _softmax("log_softmax", x, axis)


def _softmax(kind: str, x: Tensor, axis: int) -> Tensor:
    ax = _axis(_check(x, kind), axis, kind)
    if x.device.kind == "cpu":
        with np.errstate(all="ignore"):
            v = _np(x)
            m = np.max(v, axis=ax, keepdims=True)
            m = np.where(np.isneginf(m), 0, m)  # an all -inf row: exp(-inf - 0) = 0, then 0/0 = NaN as the kernel
            z = v - m
            s = np.sum(np.exp(z), axis=ax, keepdims=True)
            result = np.exp(z) / s if kind == "softmax" else z - np.log(s)
        return wrap_numpy(result, x.device, x.dtype)
    out = Tensor.empty(x.shape, x.dtype, x.device)
    if x.size == 0:
        return out
    return _launch_forward(kind, x, out, _rows.row_split(x.shape, ax, ax))


_BACKWARD_BODY = {
    "softmax": (
        "    ACC d = 0;\n"
        "    for (IDX i = LID; i < R; i += LSIZE) d += (ACC)g[AT(i)] * (ACC)y[AT(i)];\n"
        "    d = ROW_SUM(d);\n"
        "    for (IDX i = LID; i < R; i += LSIZE) gx[AT(i)] = (GT)((ACC)y[AT(i)] * ((ACC)g[AT(i)] - d));"
    ),
    "log_softmax": (
        "    ACC d = 0;\n"
        "    for (IDX i = LID; i < R; i += LSIZE) d += (ACC)g[AT(i)];\n"
        "    d = ROW_SUM(d);\n"
        "    for (IDX i = LID; i < R; i += LSIZE) gx[AT(i)] = (GT)((ACC)g[AT(i)] - exp((ACC)y[AT(i)]) * d);"
    ),
}


def softmax_backward(y: Tensor, g: Tensor, axis: int = -1) -> Tensor:
    """Gradient of ``softmax`` from its output ``y``: ``y * (g - sum(g * y))``; one kernel."""
    return _softmax_backward("softmax", y, g, axis)


def log_softmax_backward(y: Tensor, g: Tensor, axis: int = -1) -> Tensor:
    """Gradient of ``log_softmax`` from its output ``y``: ``g - exp(y) * sum(g)``; one kernel."""
    return _softmax_backward("log_softmax", y, g, axis)


def _softmax_backward(kind: str, y: Tensor, g: Tensor, axis: int) -> Tensor:
    ax = _axis(y, axis, f"{kind}_backward")
    if tuple(g.shape) != tuple(y.shape):
        raise ValueError(f"{kind}_backward: g has shape {g.shape}, expected the output's {y.shape}")
    if y.device.kind == "cpu":
        with np.errstate(all="ignore"):
            yv, gv = _np(y), _np(g)
            if kind == "softmax":
                result = yv * (gv - np.sum(gv * yv, axis=ax, keepdims=True))
            else:
                result = gv - np.exp(yv) * np.sum(gv, axis=ax, keepdims=True)
        return wrap_numpy(result, y.device, g.dtype)
    gx = Tensor.empty(y.shape, g.dtype, y.device)
    if y.size == 0:
        return gx
    outer, R, inner = _rows.row_split(y.shape, ax, ax)
    layout = _rows.layout_of(inner)
    acc = _rows.acc_ctype(g.dtype)
    idx = _rows.index_for(y.size)
    name = f"netcl_{kind}_backward"

    def make(mode: str) -> str:
        params = [
            f"__global const {storage_ctype(y.dtype)}* y",
            f"__global const {storage_ctype(g.dtype)}* g",
            f"__global {storage_ctype(g.dtype)}* gx",
        ]
        body = _BACKWARD_BODY[kind].replace("GT", storage_ctype(g.dtype))
        return _rows.source(name, params, body, layout, mode, acc, idx, [y.dtype, g.dtype])

    key = (layout, y.dtype.str, g.dtype.str, acc, idx)
    _rows.run(key, y.device, make, name, [None] * 3, outer * inner, R, inner, idx, y, g, gx)
    return gx


# ---- logsumexp -------------------------------------------------------------------------------------
def logsumexp(x: Tensor, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) over ``axis`` (None: all; int or tuple), max-subtracted; -inf over empty axes."""
    axes = normalize_axes(axis, _check(x, "logsumexp").ndim, "logsumexp")
    out_shape = tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keepdims or i not in axes)
    empty = math.prod(x.shape[a] for a in axes) == 0
    if x.device.kind == "cpu":
        if empty:
            return wrap_numpy(np.full(out_shape, -np.inf), x.device, x.dtype)
        with np.errstate(all="ignore"):
            v = _np(x)
            m = np.max(v, axis=axes, keepdims=True)
            m = np.where(np.isfinite(m), m, 0)  # rows of -inf (or +inf) as the kernel: -inf (+inf)
            result = np.log(np.sum(np.exp(v - m), axis=axes, keepdims=True)) + m
        return wrap_numpy(result.reshape(out_shape), x.device, x.dtype)
    out = Tensor.empty(out_shape, x.dtype, x.device)
    if out.size == 0:
        return out
    if empty:
        from netcl.runtime.ops.pointwise import fill_

        return fill_(out, -math.inf)
    view, split, _ = _row_view(x, axes)
    return _launch_forward("logsumexp", view, out, split)


def logsumexp_backward(x: Tensor, lse: Tensor, g: Tensor, axis: int | Sequence[int] | None = None) -> Tensor:
    """Gradient of ``logsumexp`` over ``axis``: ``g * exp(x - lse)`` (``lse``, ``g`` of the output's
    shape, with or without the kept dims); one kernel (plus transposes for non-neighbouring axes)."""
    axes = normalize_axes(axis, x.ndim, "logsumexp_backward")
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    if lse.size != math.prod(kept) or g.size != lse.size:
        raise ValueError(f"logsumexp_backward: lse {lse.shape} and g {g.shape} must hold {math.prod(kept)} values")
    if x.device.kind == "cpu":
        with np.errstate(all="ignore"):
            result = _np(g).reshape(kept) * np.exp(_np(x) - _np(lse).reshape(kept))
        return wrap_numpy(result, x.device, g.dtype)
    if x.size == 0:
        return Tensor.empty(x.shape, g.dtype, x.device)
    view, (outer, R, inner), perm = _row_view(x, axes)
    gx = Tensor.empty(view.shape, g.dtype, x.device)
    layout = _rows.layout_of(inner)
    acc = _rows.acc_ctype(g.dtype)
    idx = _rows.index_for(x.size)
    name = "netcl_logsumexp_backward"
    st = storage_ctype(g.dtype)

    def make(mode: str) -> str:
        params = [
            f"__global const {storage_ctype(x.dtype)}* x",
            f"__global const {storage_ctype(lse.dtype)}* lse",
            f"__global const {st}* g",
            f"__global {st}* gx",
        ]
        body = (
            "    const ACC l = (ACC)lse[row], gg = (ACC)g[row];\n"
            f"    for (IDX i = LID; i < R; i += LSIZE) gx[AT(i)] = ({st})(gg * exp((ACC)x[AT(i)] - l));"
        )
        return _rows.source(name, params, body, layout, mode, acc, idx, [x.dtype, lse.dtype, g.dtype])

    key = (layout, x.dtype.str, lse.dtype.str, g.dtype.str, acc, idx)
    _rows.run(key, x.device, make, name, [None] * 4, outer * inner, R, inner, idx, view, lse, g, gx)
    if perm is None:
        return gx
    return transpose(gx, tuple(int(i) for i in np.argsort(perm)))


__all__ = ["log_softmax", "log_softmax_backward", "logsumexp", "logsumexp_backward", "softmax", "softmax_backward"]
