"""Row scans and arg-reductions: ``cumsum`` (forward or reversed), ``argmax``/``argmin``, and ``flip``.

All run on the ``_rows`` skeleton along one axis (``argmax``/``argmin`` with ``axis=None`` take the
flattened tensor as one row). ``cumsum``: serial rows run a plain loop; a work-group row scans
blocks of its lane count in local memory (Hillis-Steele) carrying the running total between blocks.
``cumsum(..., reverse=True)`` sums from the end: it is cumsum's gradient, in one kernel. Float data
is summed in float32 (float64 for float64) and returned in its dtype; integer and bool data in
int64, returned as int64 (NumPy's cumsum of int32).

``argmax``/``argmin`` return int64 indices (NumPy's ``intp`` on 64-bit hosts): the first index of
the extreme value, and the first NaN when there is one (as NumPy). No gradient. ``argmax_into`` is
greedy decoding's pick: the same argmax of each row, stored as int32 into given tensors at a position.

``flip`` reverses axes through the strided-copy kernel (a view with negative strides).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Tensor, contiguous_strides
from netcl.core.dtypes import int32, int64, refuse_bfloat16
from netcl.runtime.launch import launch
from netcl.runtime.ops import _rows
from netcl.runtime.ops._common import (
    ARG_DTYPES,
    MAX_LOCAL,
    get_kernel,
    index_ctype,
    normalize_axes,
    pow2_ceil,
    storage_ctype,
)
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.strided import strided_copy
from netcl.runtime.variable import Variable

_TWINS = "netcl.runtime.numpy_twins.scan"


def _check(x: Any, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    return x


def _one_axis(x: Tensor, axis: Any, op: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if x.ndim == 0:
        if int(axis) in (0, -1):
            return 0
        raise np.exceptions.AxisError(f"{op}: axis {axis} is out of range for a 0-d tensor")
    return normalize_axes(int(axis), x.ndim, op)[0]


# ---- cumsum ---------------------------------------------------------------------------------------
def cumsum_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype.kind == "f" else int64


_SERIAL_SCAN = (
    "    ACC run = 0;\n"
    "    for (IDX i = 0; i < R; ++i) { const IDX j = REV ? R - 1 - i : i; run += (ACC)x[AT(j)]; y[AT(j)] = (YT)run; }"
)

_GROUP_SCAN = (
    "    ACC carry = 0;\n"
    "    const int lid = get_local_id(0), n = get_local_size(0);\n"
    "    for (IDX start = 0; start < R; start += LSIZE) {\n"
    "        const IDX i = start + LID;\n"
    "        const IDX j = REV ? R - 1 - i : i;\n"
    "        scratch_a[lid] = i < R ? (ACC)x[AT(j)] : (ACC)0;\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        for (int off = 1; off < n; off <<= 1) {\n"
    "            const ACC t = lid >= off ? scratch_a[lid - off] : (ACC)0;\n"
    "            barrier(CLK_LOCAL_MEM_FENCE);\n"
    "            scratch_a[lid] += t;\n"
    "            barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        }\n"
    "        if (i < R) y[AT(j)] = (YT)(carry + scratch_a[lid]);\n"
    "        carry += scratch_a[n - 1];\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }"
)


def cumsum(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    """Running sums along ``axis`` (from the end with ``reverse``); ints and bools give int64."""
    _check(x, "cumsum")
    refuse_bfloat16("cumsum", x.dtype)
    ax = _one_axis(x, axis, "cumsum")
    out_dtype = cumsum_dtype(x.dtype)
    x.device.check_dtype(out_dtype)
    return cumsum_along(x, ax, reverse, out_dtype)


@backend_op(_TWINS)
def cumsum_along(x: Tensor, ax: int, reverse: bool, out_dtype: np.dtype) -> Tensor:
    """``cumsum`` of a checked call along the normalized axis ``ax`` into ``out_dtype``."""
    out = Tensor.empty(x.shape, out_dtype, x.device)
    if x.size == 0:
        return out
    outer, R, inner = _rows.row_split(x.shape or (1,), ax, ax)
    layout = _rows.layout_of(inner)
    acc = _rows.acc_ctype(x.dtype) if x.dtype.kind == "f" else "long"
    idx = index_ctype(x.size)
    name = "netcl_cumsum"

    def make(mode: str) -> str:
        body = (_GROUP_SCAN if mode == "group" else _SERIAL_SCAN).replace("YT", storage_ctype(out_dtype))
        body = body.replace("REV", "1" if reverse else "0")
        params = [f"__global const {storage_ctype(x.dtype)}* x", f"__global {storage_ctype(out_dtype)}* y"]
        return _rows.source(name, params, body, layout, mode, acc, idx, [x.dtype, out_dtype])

    key = (layout, x.dtype.str, out_dtype.str, bool(reverse), acc, idx)
    _rows.run(key, x.device, make, name, [None, None], outer * inner, R, inner, idx, x, out)
    return out


# ---- argmax / argmin ----------------------------------------------------------------------------------
def argmax(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """int64 index of the maximum along ``axis`` (None: of the flattened tensor); first one on ties,
    the first NaN when there is one (as NumPy)."""
    return _arg("argmax", x, axis, keepdims)


def argmin(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """int64 index of the minimum along ``axis`` (see ``argmax``)."""
    return _arg("argmin", x, axis, keepdims)


def _better(kind: str, floating: bool) -> str:
    cmp = ">" if kind == "argmax" else "<"
    nan = " || (a != a && b == b)" if floating else ""
    return f"#define BETTER(a, b) ((a) {cmp} (b){nan})\n"


_ARG_LOOP = (
    "    ACC best = 0;\n"
    "    long at = -1;\n"
    "    for (IDX i = LID; i < R; i += LSIZE) {\n"
    "        const ACC v = (ACC)x[AT(i)];\n"
    "        if (at < 0 || BETTER(v, best)) { best = v; at = (long)i; }\n"
    "    }\n"
)

#: Merge two (best value, its index) partials: the better value, the lower index on a tie; index -1: none.
_ARG_COMBINE = (
    "const ACC b1 = s0[lid], b2 = s0[lid + h];",
    "const long a1 = s1[lid], a2 = s1[lid + h];",
    "if (a1 < 0 || (a2 >= 0 && (BETTER(b2, b1) || (!BETTER(b1, b2) && a2 < a1)))) {",
    "    s0[lid] = b2; s1[lid] = a2;",
    "}",
)
_ARG_HELPER = _rows.tree_reduce_c("netcl_row_argbest", ["ACC", "long"], _ARG_COMBINE)
_ARG_TREE = f"    __local long sidx[{MAX_LOCAL}];\n    netcl_row_argbest(&best, &at, scratch_a, sidx);\n"


def _arg(kind: str, x: Tensor, axis: int | None, keepdims: bool) -> Tensor:
    _check(x, kind)
    refuse_bfloat16(kind, x.dtype)
    if x.size == 0:
        raise ValueError(f"{kind}: x of shape {x.shape} is empty, which has no {kind[3:]}imum")
    if axis is None:
        out_shape = (1,) * x.ndim if keepdims else ()
        split, ax = (1, x.size, 1), None
    else:
        ax = _one_axis(x, axis, kind)
        shape = x.shape or (1,)
        out_shape = tuple((1 if i == ax else d) for i, d in enumerate(x.shape) if keepdims or i != ax)
        split = _rows.row_split(shape, ax, ax)
    return arg_best(kind, x, ax, out_shape, split)


@backend_op(_TWINS, device_arg="x")
def arg_best(kind: str, x: Tensor, ax: int | None, out_shape: tuple[int, ...], split: tuple[int, int, int]) -> Tensor:
    """``argmax``/``argmin`` (``kind``) of a checked call along ``ax`` (None: flattened); ``split``: outer, R, inner."""
    out = Tensor.empty(out_shape, int64, x.device)
    outer, R, inner = split
    layout = _rows.layout_of(inner)
    floating = x.dtype.kind == "f"
    acc = _rows.acc_ctype(x.dtype) if floating else "long"
    idx = index_ctype(x.size)
    name = f"netcl_{kind}"

    def make(mode: str) -> str:
        params = [f"__global const {storage_ctype(x.dtype)}* x", "__global long* out"]
        return _arg_source(kind, name, x.dtype, params, "out[row] = at;", layout, mode, acc, idx)

    key = (layout, x.dtype.str, acc, idx)
    _rows.run(key, x.device, make, name, [None, None], outer * inner, R, inner, idx, x, out)
    return out


def _arg_source(
    kind: str, name: str, dtype: np.dtype, params: list[str], store: str, layout: str, mode: str, acc: str, idx: str
) -> str:
    """An arg-reduction row kernel: ``at`` (the row's best index) found, then lane 0 runs ``store``."""
    body = _ARG_LOOP + (_ARG_TREE if mode == "group" else "") + f"    if (LID == 0) {{ {store} }}"
    helpers = _better(kind, dtype.kind == "f") + (_ARG_HELPER if mode == "group" else "")
    return _rows.source(name, params, body, layout, mode, acc, idx, [dtype], helpers=helpers)


# ---- greedy decoding's pick ---------------------------------------------------------------------------
def argmax_into(x: Tensor, ids: Tensor, table: Tensor, pos: int | Variable) -> None:
    """Greedy decoding's next tokens without a host read: for each row ``b`` of the float ``x`` ``(B, V)``
    (logits), its ``argmax`` (the first index on ties, the first NaN when there is one) is stored as
    int32 into ``ids[b, 0]`` (``ids`` ``(B, 1)`` int32: the next step's input) and ``table[b, pos]``
    (``table`` ``(B, T)`` int32: the tokens so far). ``pos`` is an int or a ``Variable`` read at launch
    (or replay). Shapes, dtypes and ``pos``'s range are checked before the launch."""
    op = "argmax_into"
    for arg, t in (("x", x), ("ids", ids), ("table", table)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {arg} must be a Tensor, got {type(t).__name__}")
        if t.device is not x.device:
            raise ValueError(f"{op}: {arg} is on {t.device}, x on {x.device}")
    refuse_bfloat16(op, x.dtype)
    if x.ndim != 2 or x.shape[1] == 0 or x.dtype.kind != "f":
        raise ValueError(f"{op}: x must be a non-empty (B, V) float tensor, got shape {x.shape} dtype {x.dtype}")
    batch = x.shape[0]
    if ids.shape != (batch, 1) or ids.dtype != int32:
        raise ValueError(f"{op}: ids must be an int32 ({batch}, 1) tensor, got shape {ids.shape} dtype {ids.dtype}")
    if table.ndim != 2 or table.shape[0] != batch or table.dtype != int32:
        raise ValueError(
            f"{op}: table must be an int32 ({batch}, T) tensor, got shape {table.shape} dtype {table.dtype}"
        )
    highest = pos.max_value if isinstance(pos, Variable) else pos
    if isinstance(highest, bool) or not isinstance(highest, (int, np.integer)) or not 0 <= highest < table.shape[1]:
        raise ValueError(f"{op}: pos must lie in [0, {table.shape[1] - 1}] (table's columns), got {pos!r}")
    if batch:
        store_argmax(x, ids, table, pos)


@backend_op(_TWINS, device_arg="x")
def store_argmax(x: Tensor, ids: Tensor, table: Tensor, pos: int | Variable) -> None:
    """``argmax_into`` of a checked call."""
    x = x.contiguous()  # a strided view is read through its gathered copy
    batch, V = x.shape
    mode = _rows.pick_mode(V)
    acc, idx = _rows.acc_ctype(x.dtype), index_ctype(max(x.size, table.size))
    name = "netcl_argmax_into"
    params = [
        f"__global const {storage_ctype(x.dtype)}* x",
        "__global int* ids",
        "__global int* table",
        "const int pos",
        "const IDX T",
    ]
    store = "ids[row] = (int)at; table[row * T + pos] = (int)at;"
    source = _arg_source("argmax", name, x.dtype, params, store, _rows.CONTIG, mode, acc, idx)
    it = ARG_DTYPES[idx]
    resolved = get_kernel(
        ("argmax_into", mode, x.dtype.str, acc, idx),
        x.device,
        lambda: source,
        name,
        [None, None, None, np.int32, it, it, it, it],
    )
    local = min(resolved.max_local, max(16, pow2_ceil(-(-V // _rows.PER_LANE)))) if mode == "group" else 1
    T = table.shape[1]
    launch(
        resolved.kernel,
        batch * local,
        local,
        x,
        ids,
        table,
        pos if isinstance(pos, Variable) else np.int32(pos),
        it.type(T),
        it.type(batch),
        it.type(V),
        it.type(1),
        queue=x.device.queue,
    )


# ---- flip ----------------------------------------------------------------------------------------
def flip(x: Tensor, axis: int | Sequence[int] | None = None) -> Tensor:
    """x with the order of elements along ``axis`` (None: every axis) reversed; a copy."""
    _check(x, "flip")
    axes = normalize_axes(axis, x.ndim, "flip")
    strides = list(contiguous_strides(x.shape))
    offset = 0
    for a in axes:
        offset += (x.shape[a] - 1) * strides[a] if x.shape[a] else 0
        strides[a] = -strides[a]
    return strided_copy(x, x.shape, strides, offset)


__all__ = ["argmax", "argmax_into", "argmin", "cumsum", "cumsum_dtype", "flip"]
