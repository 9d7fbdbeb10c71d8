"""Row-wise kernels: softmax, log_softmax, logsumexp, layer_norm and rms_norm over trailing axes.

The input is viewed as ``(rows, C)`` (the reduced axes moved last by one materialized transpose
when they are not trailing already). One work-group takes one row: its threads stride over the
row, then a tree in local memory combines their partials (max, then sum of ``exp(x - max)`` for
the softmax family; sum, then sum of squares around the mean for the norms). The kernels (and the
class losses', ``class_loss``) are ``RowKernel`` bodies on the ``_rows`` skeleton and its tree, with
``row_lanes(C)`` lanes per row (at most the kernel's limit). ``rows`` and ``C`` are kernel arguments, so the
program is built once per dtype, index width and mode.

Forwards also return per-row statistics (softmax: the max subtracted and the sum of exponentials;
norms: mean and 1/std) in float32 (float64 for float64 input); the backward kernels recompute
from them in one pass per row, except the autograd softmax and log_softmax, whose backward reads
the output alone (``softmax_backward_from_output``). Float16 inputs are loaded with ``vload_half`` and computed in
float32 inside the kernels; outputs keep the input dtype (float16 stored with ``vstore_half_rte``,
bfloat16 likewise through ``storage_io``), so the kernels need no ``cl_khr_fp16`` and run where
float16 and bfloat16 are storage-only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float32, float64, is_floating
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime import results
from netcl.runtime.cache import register_cache
from netcl.runtime.ops import _common, _rows
from netcl.runtime.ops._common import (
    ARG_DTYPES,
    compute_ctype,
    normalize_axes,
    pow2_ceil,
    remember,
    storage_ctype,
    storage_pragmas,
)
from netcl.runtime.ops._grid import index_ctype, launch_prepared
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.layout import transpose
from netcl.runtime.ops.storage_io import helpers_c, load_macro, store_macro

_TWINS = "netcl.runtime.numpy_twins.rowwise"

#: Softmax-family modes (compile-time, one program each).
SOFTMAX, LOG_SOFTMAX, LOGSUMEXP = 0, 1, 2
MODE_NAMES = {SOFTMAX: "softmax", LOG_SOFTMAX: "log_softmax", LOGSUMEXP: "logsumexp"}
LAYER, RMS = 0, 1


@dataclass(frozen=True)
class RowKernel:
    """A row kernel on the ``_rows`` skeleton (templates over ``row_format``): ``netcl_{name}`` with ``params``
    (before the skeleton's ``rows, R, inner``), compile-time ``defines`` and a ``body`` that runs after
    ``_PROLOGUE`` (``lid``, the lane count ``L``, the row length ``C``; the skeleton's ``row``, ``ROW_SUM``
    and ``scratch_a``)."""

    name: str
    params: str
    defines: str
    body: str


_PROLOGUE = "    const int lid = (int)LID, L = (int)LSIZE;\n    const {idx} C = R;\n"

_LOAD_STORE = """
/* loads and stores of the storage type: float16 / bfloat16 through storage_io's C (no cl_khr_fp16) */
{storage_helpers}#define LD(p, i) {load}
#define ST(p, i, v) {store}
inline {ct} netcl_max_nan(const {ct} a, const {ct} b) {{ return (a > b || a != a) ? a : b; }}
"""

_SHIFT_SUM = """/* The shift of a row (its max; 0 for an all -inf row, which then sums to 0: logsumexp -inf) and,
   in *sum, the sum of exp(x - shift) over the row: every work-item of the group calls it. */
inline {ct} netcl_row_shift_sum(__global const {st}* xr, const {idx} C, __local {ct}* scratch, {ct}* sum) {{
    const int lid = (int)LID, L = (int)LSIZE;
    {ct} m = -INFINITY;
    for ({idx} i = lid; i < C; i += L) m = netcl_max_nan(m, LD(xr, i));
    m = netcl_tree_max(m, scratch);
    const {ct} shift = isinf(m) ? ({ct})0 : m;
    {ct} s = 0;
    for ({idx} i = lid; i < C; i += L) s += exp(LD(xr, i) - shift);
    *sum = netcl_row_sum(s, scratch);
    return shift;
}}
/* out[i] = exp(xr[i] - shift) * inv over the row (out and xr point at the row) */
inline void netcl_row_exp_scale(__global {st}* out, __global const {st}* xr, const {ct} shift, const {ct} inv,
                                const {idx} C) {{
    for ({idx} i = LID; i < C; i += LSIZE) ST(out, i, (exp(LD(xr, i) - shift) * inv));
}}
/* gx[i] = g[i] - exp(y[i]) * acc over the row (log_softmax's gradient from its output) */
inline void netcl_row_sub_exp_scale(__global {st}* gx, __global const {st}* g, __global const {st}* y, const {ct} acc,
                                    const {idx} C) {{
    for ({idx} i = LID; i < C; i += LSIZE) ST(gx, i, (LD(g, i) - exp(LD(y, i)) * acc));
}}
"""

#: ``_SHIFT_SUM``'s helpers for float32 rows a work-item each (CPU devices): the row in ``float{vw}`` vectors, whose
#: ``exp`` is the vector builtin (a CPU compiler neither vectorizes one work-item's loop nor maps a scalar ``exp``
#: call to a vector one), the tail element by element. Max and NaN as ``netcl_max_nan``; the sums' order is fixed:
#: a vector's lanes join in lane order (``netcl_lanes_sum``, also the norms'), then the tail.
_SHIFT_SUM_VECTOR = """
inline float netcl_lanes_sum(const float{vw} v) {{
    float t[{vw}];
    vstore{vw}(v, 0, t);
    float s = 0.0f;
    for (int k = 0; k < {vw}; ++k) s += t[k];
    return s;
}}
inline float netcl_row_shift_vector(__global const float* xr, const {idx} C) {{
    float t[{vw}];
    float{vw} mv = (float{vw})(-INFINITY);
    {idx} i = 0;
    for (; i + {vw} <= C; i += {vw}) {{
        const float{vw} v = vload{vw}(0, xr + i);
        mv = select(v, mv, (mv > v) | (mv != mv));
    }}
    vstore{vw}(mv, 0, t);
    float m = -INFINITY;
    for (int k = 0; k < {vw}; ++k) m = netcl_max_nan(m, t[k]);
    for (; i < C; ++i) m = netcl_max_nan(m, xr[i]);
    return isinf(m) ? 0.0f : m;
}}
/* the sum of exp(x - shift) over the row, each exponential also stored in e when e is not 0 */
inline float netcl_row_exp_sum_vector(__global const float* xr, const float shift, const {idx} C, __global float* e) {{
    float{vw} sv = (float{vw})0.0f;
    {idx} i = 0;
    for (; i + {vw} <= C; i += {vw}) {{
        const float{vw} v = exp(vload{vw}(0, xr + i) - shift);
        if (e) vstore{vw}(v, 0, e + i);
        sv += v;
    }}
    float s = netcl_lanes_sum(sv);
    for (; i < C; ++i) {{
        const float v = exp(xr[i] - shift);
        if (e) e[i] = v;
        s += v;
    }}
    return s;
}}
inline float netcl_row_shift_sum(__global const float* xr, const {idx} C, __local float* scratch, float* sum) {{
    const float shift = netcl_row_shift_vector(xr, C);
    *sum = netcl_row_exp_sum_vector(xr, shift, C, 0);
    return shift;
}}
/* softmax of a row: the exponentials stored as they are summed, then scaled in place (one exp an element) */
inline float netcl_row_softmax_vector(__global float* out, __global const float* xr, const {idx} C, float* sum) {{
    const float shift = netcl_row_shift_vector(xr, C);
    const float s = netcl_row_exp_sum_vector(xr, shift, C, out);
    const float inv = 1.0f / s;
    {idx} i = 0;
    for (; i + {vw} <= C; i += {vw}) vstore{vw}(vload{vw}(0, out + i) * inv, 0, out + i);
    for (; i < C; ++i) out[i] *= inv;
    *sum = s;
    return shift;
}}
inline void netcl_row_sub_exp_scale(__global float* gx, __global const float* g, __global const float* y,
                                    const float acc, const {idx} C) {{
    {idx} i = 0;
    for (; i + {vw} <= C; i += {vw}) vstore{vw}(vload{vw}(0, g + i) - exp(vload{vw}(0, y + i)) * acc, 0, gx + i);
    for (; i < C; ++i) gx[i] = g[i] - exp(y[i]) * acc;
}}
"""

_SOFTMAX_FORWARD = RowKernel(
    "softmax_rows",
    ("__global const {st}* x, __global {st}* out, __global {ct}* rowmax, __global {ct}* rowsum"),
    "#define MODE {mode}\n",
    """    __global const {st}* xr = x + row * C;
    {ct} s;
#if MODE == 0 && {vector}
    const {ct} shift = netcl_row_softmax_vector(out + row * C, xr, C, &s);
#else
    const {ct} shift = netcl_row_shift_sum(xr, C, scratch_a, &s);
#endif
    if (lid == 0) {{ rowmax[row] = shift; rowsum[row] = s; }}
#if MODE == 2
    if (lid == 0) ST(out, row, (shift + log(s)));
#elif MODE == 1
    const {ct} ls = log(s);  /* (x - max) - log(s): no rounding of max + log(s) at large |max| */
    for ({idx} i = lid; i < C; i += L) ST(out, row * C + i, ((LD(xr, i) - shift) - ls));
#elif !({vector})  /* (the vector helper above wrote the softmax row itself) */
    netcl_row_exp_scale(out + row * C, xr, shift, ({ct})1 / s, C);
#endif
""",
)

_SOFTMAX_BACKWARD = RowKernel(
    "softmax_rows_backward",
    (
        "__global const {st}* x, __global const {st}* g, __global const {ct}* rowmax, "
        "__global const {ct}* rowsum, __global {st}* gx"
    ),
    "#define MODE {mode}\n",
    """    const {ct} shift = rowmax[row], inv = ({ct})1 / rowsum[row];
    __global const {st}* xr = x + row * C;
#if MODE == 2
    const {ct} gr = LD(g, row);
    for ({idx} i = lid; i < C; i += L) ST(gx, row * C + i, (gr * exp(LD(xr, i) - shift) * inv));
#elif MODE == 1
    {ct} gs = 0;
    for ({idx} i = lid; i < C; i += L) gs += LD(g, row * C + i);
    gs = ROW_SUM(gs);
    for ({idx} i = lid; i < C; i += L)
        ST(gx, row * C + i, (LD(g, row * C + i) - exp(LD(xr, i) - shift) * inv * gs));
#else
    {ct} dot = 0;
    for ({idx} i = lid; i < C; i += L) dot += LD(g, row * C + i) * exp(LD(xr, i) - shift) * inv;
    dot = ROW_SUM(dot);
    for ({idx} i = lid; i < C; i += L) {{
        const {ct} y = exp(LD(xr, i) - shift) * inv;
        ST(gx, row * C + i, (y * (LD(g, row * C + i) - dot)));
    }}
#endif
""",
)

#: softmax / log_softmax backward from the forward's output y alone (torch's rule): softmax y * (g - sum(g y)),
#: log_softmax g - exp(y) sum(g); no statistics kept between the passes
_SOFTMAX_BACKWARD_FROM_OUT = RowKernel(
    "softmax_rows_backward_out",
    "__global const {st}* y, __global const {st}* g, __global {st}* gx",
    "#define MODE {mode}\n",
    """    {ct} acc = 0;
#if MODE == 1
    for ({idx} i = lid; i < C; i += L) acc += LD(g, row * C + i);
    acc = ROW_SUM(acc);
    netcl_row_sub_exp_scale(gx + row * C, g + row * C, y + row * C, acc, C);
#else
    for ({idx} i = lid; i < C; i += L) acc += LD(g, row * C + i) * LD(y, row * C + i);
    acc = ROW_SUM(acc);
    for ({idx} i = lid; i < C; i += L)
        ST(gx, row * C + i, (LD(y, row * C + i) * (LD(g, row * C + i) - acc)));
#endif
""",
)

#: The norms' float32 rows on a CPU (a work-item a row, ``row_format``'s ``vector`` width): each loop first runs
#: over ``float{vector}`` vectors up to ``i0``, then the loop of every device finishes the row from ``i0`` (0
#: elsewhere); a sum's vector lanes join it in lane order (``netcl_lanes_sum`` of the row helpers), a fixed order.
_NORM_FORWARD = RowKernel(
    "norm_rows",
    (
        "__global const {st}* x, __global const {st}* w, __global const {st}* b, __global {st}* out, "
        "__global {ct}* mean, __global {ct}* rstd, const {ct} eps"
    ),
    "#define MODE {mode}\n#define HAS_W {has_w}\n#define HAS_B {has_b}\n",
    """    __global const {st}* xr = x + row * C;
    {idx} i0 = 0;
    {ct} mu = 0;
#if MODE == 0
#if {vector}
    {{
        float{vector} sv = (float{vector})0.0f;
        for (; i0 + {vector} <= C; i0 += {vector}) sv += vload{vector}(0, xr + i0);
        mu = netcl_lanes_sum(sv);
    }}
#endif
    for ({idx} i = lid + i0; i < C; i += L) mu += LD(xr, i);
    mu = ROW_SUM(mu) / ({ct})C;
#endif
    {ct} v = 0;
    i0 = 0;
#if {vector}
    {{
        float{vector} qv = (float{vector})0.0f;
        for (; i0 + {vector} <= C; i0 += {vector}) {{
            const float{vector} d = vload{vector}(0, xr + i0) - mu;
            qv += d * d;
        }}
        v = netcl_lanes_sum(qv);
    }}
#endif
    for ({idx} i = lid + i0; i < C; i += L) {{ const {ct} d = LD(xr, i) - mu; v += d * d; }}
    v = ROW_SUM(v) / ({ct})C;
    const {ct} r = ({ct})1 / sqrt(v + eps);
    if (lid == 0) {{ mean[row] = mu; rstd[row] = r; }}
    i0 = 0;
#if {vector}
    for (; i0 + {vector} <= C; i0 += {vector}) {{
        float{vector} y = (vload{vector}(0, xr + i0) - mu) * r;
#if HAS_W
        y *= vload{vector}(0, w + i0);
#endif
#if HAS_B
        y += vload{vector}(0, b + i0);
#endif
        vstore{vector}(y, 0, out + row * C + i0);
    }}
#endif
    for ({idx} i = lid + i0; i < C; i += L) {{
        {ct} y = (LD(xr, i) - mu) * r;
#if HAS_W
        y *= LD(w, i);
#endif
#if HAS_B
        y += LD(b, i);
#endif
        ST(out, row * C + i, y);
    }}
""",
)

_NORM_BACKWARD = RowKernel(
    "norm_rows_backward",
    (
        "__global const {st}* x, __global const {st}* g, __global const {st}* w, "
        "__global const {ct}* mean, __global const {ct}* rstd, __global {st}* gx"
    ),
    "#define MODE {mode}\n#define HAS_W {has_w}\n",
    """    const {ct} mu = mean[row], r = rstd[row];
    {ct} a = 0, bsum = 0;
    {idx} i0 = 0;
#if {vector}
    {{
        float{vector} av = (float{vector})0.0f, bv = (float{vector})0.0f;
        for (; i0 + {vector} <= C; i0 += {vector}) {{
            float{vector} gy = vload{vector}(0, g + row * C + i0);
#if HAS_W
            gy *= vload{vector}(0, w + i0);
#endif
            av += gy;
            bv += gy * ((vload{vector}(0, x + row * C + i0) - mu) * r);
        }}
        a = netcl_lanes_sum(av);
        bsum = netcl_lanes_sum(bv);
    }}
#endif
    for ({idx} i = lid + i0; i < C; i += L) {{
        {ct} gy = LD(g, row * C + i);
#if HAS_W
        gy *= LD(w, i);
#endif
        a += gy;
        bsum += gy * ((LD(x, row * C + i) - mu) * r);
    }}
#if MODE == 0
    a = ROW_SUM(a) / ({ct})C;
#else
    a = 0;
#endif
    bsum = ROW_SUM(bsum) / ({ct})C;
    i0 = 0;
#if {vector}
    for (; i0 + {vector} <= C; i0 += {vector}) {{
        float{vector} gy = vload{vector}(0, g + row * C + i0);
#if HAS_W
        gy *= vload{vector}(0, w + i0);
#endif
        const float{vector} xhat = (vload{vector}(0, x + row * C + i0) - mu) * r;
        vstore{vector}(r * (gy - a - xhat * bsum), 0, gx + row * C + i0);
    }}
#endif
    for ({idx} i = lid + i0; i < C; i += L) {{
        {ct} gy = LD(g, row * C + i);
#if HAS_W
        gy *= LD(w, i);
#endif
        const {ct} xhat = (LD(x, row * C + i) - mu) * r;
        ST(gx, row * C + i, (r * (gy - a - xhat * bsum)));
    }}
""",
)


def row_helpers(fmt: dict[str, Any], mode: str = "group") -> str:
    """The helpers of the row kernels, after the skeleton's (``netcl_row_sum``): ``LD``/``ST``, the NaN-keeping
    max tree ``netcl_tree_max(v, scratch)`` (``_rows.tree_reduce_c``) and ``netcl_row_shift_sum``. In the
    skeleton's "serial" mode (a work-item a row) the trees are the lane's own value and there is no scratch."""
    if mode == "group":
        max_nan = "s0[lid] = netcl_max_nan(s0[lid], s0[lid + h]);"
        trees = _rows.tree_reduce_c("netcl_tree_max", fmt["ct"], max_nan)
    else:
        trees = "#define netcl_tree_max(v, scratch) (v)\n#define netcl_row_sum(v, scratch) (v)\n#define scratch_a 0\n"
    vw = fmt.get("vector", 0)
    shift_sum = _SHIFT_SUM_VECTOR.format(vw=vw, **fmt) if mode == "serial" and vw else _SHIFT_SUM.format(**fmt)
    return _LOAD_STORE.format(**fmt) + trees + shift_sum


def row_mode(device: Device) -> str:
    """How the row kernels take their rows on ``device``: a work-group a row ("group": lanes stride the row and
    a local-memory tree combines them) on GPUs; a work-item a row ("serial") on CPU devices, whose compilers
    vectorize across work-items and run a tree's barrier-separated levels one after another (layer_norm over
    (512, 512) on PoCL 2.1 ms as groups, see benchmarks/RESULTS.md, "isnan on PoCL")."""
    return "group" if device.is_gpu else "serial"


def stats_dtype(dtype: np.dtype) -> np.dtype:
    """dtype of the saved row statistics (and of the kernels' arithmetic): float64 stays, else float32."""
    return float64 if dtype == float64 else float32


def _check_float(x: Any, op: str) -> None:
    # anything with a shape and a dtype passes the type check: autograd's checks also run on the
    # traced values of jit_compile (shape and dtype known, no data yet)
    if not isinstance(x, Tensor) and not all(hasattr(x, a) for a in ("shape", "dtype", "ndim")):
        raise TypeError(f"{op}: x must be a Tensor, got {type(x).__name__}")
    if not is_floating(x.dtype):
        raise DTypeError(f"{op}: x must be a floating-point tensor, got dtype {x.dtype}")


#: Elements a lane of a row's work-group takes at least, and the fewest lanes a row gets (``row_lanes``)
ROW_PER_LANE, ROW_MIN_LANES = 8, 32


def row_lanes(cols: int) -> int:
    """Lanes of the work-group that takes a row of ``cols`` elements on a GPU: ``ROW_PER_LANE`` elements a lane
    or more, at least ``ROW_MIN_LANES`` (a power of two; the launch caps it at the kernel's limit, 256 on the
    H200). One element a lane spent most of a short row's time in the trees' barriers (benchmarks/RESULTS.md,
    "Forty-fourth session"). Fixed by ``cols`` alone, so a row's sums keep one order."""
    return max(ROW_MIN_LANES, pow2_ceil(-(-cols // ROW_PER_LANE)))


def run_row_kernel(
    kernel: RowKernel,
    fmt: dict[str, Any],
    device: Device,
    rows: int,
    cols: int,
    buffers: Sequence[Any],
    extra=(),
) -> Any:
    """Launch ``kernel`` on the ``_rows`` skeleton: one work-group of ``row_lanes(cols)`` lanes (at most the
    kernel's limit) per row of ``cols`` contiguous elements, or one work-item per row on a CPU (``row_mode``);
    ``extra`` scalars follow the buffers. Returns
    the ``PreparedLaunch`` it went through (None for zero rows), for a caller's plan."""

    def source(mode: str) -> str:
        body = (_PROLOGUE + kernel.body).format(**fmt)
        helpers = kernel.defines.format(**fmt) + row_helpers(fmt, mode)
        stats = float64 if fmt["ct"] == "double" else float32  # float16 data: loads and stores only
        name = f"netcl_{kernel.name}"
        return _rows.source(name, [kernel.params.format(**fmt)], body, _rows.CONTIG, mode, fmt["ct"], fmt["idx"],
                            [stats], helpers)  # fmt: skip

    key = fmt.key if type(fmt) is RowFormat else ("rowwise", *sorted(fmt.items()))
    types = [None] * len(buffers) + [np.dtype(type(v)) for v in extra]
    name = f"netcl_{kernel.name}"
    if rows <= 0:
        return None
    mode = row_mode(device)
    lanes = row_lanes(cols) if mode == "group" else None
    prepared = _rows.prepare(key, device, source, name, types, rows, cols, 1, fmt["idx"], mode, lanes)
    prepared.call(*[b.data if isinstance(b, Tensor) else b for b in buffers], *extra)
    return prepared


class RowFormat(dict):
    """``row_format``'s fields, with ``key``: the program-cache key of a row kernel formatted with them
    (sorted once, not per launch). Shared by every call of one signature: read it, never change it."""

    __slots__ = ("key",)


#: (dtype, element count, mode, flags) -> its RowFormat
_FORMATS: dict[tuple, RowFormat] = {}
register_cache(_FORMATS.clear)


def row_format(x: Tensor, mode: int, **flags: int) -> dict[str, Any]:
    """The template fields of a row kernel over ``x``'s dtype, size and device (pragmas, storage and compute
    types, ``LD`` / ``ST`` expressions, index type; ``vector``: the ``floatN`` width of the serial float32 helpers on
    a CPU, else 0), the softmax-family ``mode`` and compile-time
    ``flags``: what ``RowKernel`` texts are formatted with, and part of the program's cache key.
    Memoized per (dtype, size, mode, device, flags): the returned mapping is shared, a caller copies it to extend it."""
    memo = (x.dtype, x.size, mode, x.device, *flags.items())
    fmt = _FORMATS.get(memo)
    if fmt is not None:
        return fmt
    vector = x.device.vector_width if row_mode(x.device) == "serial" and x.dtype == float32 else 0
    st, ct = storage_ctype(x.dtype), compute_ctype(stats_dtype(x.dtype))
    fmt = RowFormat(
        {
            "pragmas": storage_pragmas([x.dtype, stats_dtype(x.dtype)]),
            "load": load_macro(x.dtype, ct),
            "store": store_macro(x.dtype, ct),
            "storage_helpers": helpers_c([x.dtype]),
            "st": st,
            "ct": ct,
            "idx": index_ctype(x.size),
            "mode": mode,
            "vector": vector,
            **flags,
        }
    )
    fmt.key = ("rowwise", *sorted(fmt.items()))
    return remember(_FORMATS, memo, fmt)


# ---- layout: reduced axes last ---------------------------------------------------------------
def rows_layout(x: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, tuple[int, ...], int, int]:
    """(x as a contiguous (rows, C) tensor, the permutation applied, rows, C)."""
    kept = tuple(a for a in range(x.ndim) if a not in axes)
    perm = kept + axes
    moved = x if perm == tuple(range(x.ndim)) else transpose(x, perm)
    C = math.prod(x.shape[a] for a in axes)
    rows = math.prod(x.shape[a] for a in kept)
    return moved.reshape(rows, C), perm, rows, C


def restore_rows(flat: Tensor, x_shape: tuple[int, ...], perm: tuple[int, ...]) -> Tensor:
    permuted = flat.reshape(tuple(x_shape[a] for a in perm))
    if perm == tuple(range(len(perm))):
        return permuted
    return transpose(permuted, _inverse(perm))


# ---- softmax family --------------------------------------------------------------------------
def softmax_forward(
    x: Tensor, axes: tuple[int, ...], mode: int, keep_stats: bool = True
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(out, rowmax, rowsum) of softmax / log_softmax / logsumexp over ``axes`` (normalized).

    ``out`` has x's shape, except for logsumexp where it is the flat ``(rows,)`` result. With ``keep_stats``
    False the caller will not read the statistics: a planned call writes them into scratch buffers of its
    device (no allocation) and rowmax and rowsum may be None.
    """
    if type(x) is Tensor:
        plan = _SOFTMAX_PLANS.get((x.shape, x.dtype, axes, mode, x.device))
        if plan is not None:  # OpenCL, axes already last: a shape, dtype and axes done before
            return _planned_softmax(x, plan, keep_stats)
    _check_float(x, MODE_NAMES[mode])
    flat, perm, rows, C = rows_layout(x, axes)
    out, rowmax, rowsum = softmax_rows(x, axes, mode, flat, perm, rows, C)
    if mode != LOGSUMEXP:
        out = restore_rows(out, x.shape, perm)
    return out, rowmax, rowsum


@backend_op(_TWINS)
def softmax_rows(
    x: Tensor, axes: tuple[int, ...], mode: int, flat: Tensor, perm: tuple[int, ...], rows: int, cols: int
) -> tuple[Tensor, Tensor, Tensor]:
    """``softmax_forward`` on ``flat``, x (``axes`` moved last by ``perm``) as (rows, cols): (out (rows, cols), or
    (rows,) for logsumexp; rowmax; rowsum). On OpenCL it remembers the call's plan for the next one."""
    sd = stats_dtype(x.dtype)
    out = Tensor.empty((rows,) if mode == LOGSUMEXP else (rows, cols), x.dtype, x.device)
    stats = [Tensor.empty((rows,), sd, x.device) for _ in range(2)]
    prepared = run_row_kernel(_SOFTMAX_FORWARD, row_format(x, mode), x.device, rows, cols, [flat, out, *stats])
    if prepared is not None and type(x) is Tensor:
        moved = None if perm == tuple(range(x.ndim)) else tuple(x.shape[a] for a in perm)
        out_shape = out.shape if mode == LOGSUMEXP else moved or x.shape
        restore = None if moved is None or mode == LOGSUMEXP else _inverse(perm)
        plan = (
            prepared,
            out_shape,
            out.nbytes,
            rows,
            stats[0].nbytes,
            sd,
            None if moved is None else perm,
            restore,
        )
        remember(_SOFTMAX_PLANS, (x.shape, x.dtype, axes, mode, x.device), plan)
    return out, stats[0], stats[1]


#: (shape, dtype, axes, mode, device) -> (prepared launch, kernel output shape, its bytes, rows, stats bytes,
#: stats dtype, the permutation that moves the axes last or None, the one that moves them back or None) of
#: an OpenCL softmax-family forward: the checks and layout done once
_SOFTMAX_PLANS: dict[tuple, tuple] = {}
register_cache(_SOFTMAX_PLANS.clear)


def softmax_plan(x: Any, axis: Any, mode: int) -> tuple[tuple[int, ...], tuple] | None:
    """(the normalized axes, the plan) of a softmax-family call over ``axis`` on an OpenCL tensor whose shape,
    dtype, axis and mode a call planned before (no check left to make), or None where there is no such plan."""
    if type(x) is not Tensor or type(axis) is not int:
        return None
    key = (x.shape, x.dtype, axis, mode, x.device)
    found = _SOFTMAX_CALLS.get(key)
    if found is None:  # this axis as written not asked for yet: normalized, then the plan of the normalized axes
        ndim = len(x.shape)
        if not -ndim <= axis < ndim:
            return None
        axes = (axis % ndim,)
        plan = _SOFTMAX_PLANS.get((x.shape, x.dtype, axes, mode, x.device))
        if plan is None:
            return None
        found = remember(_SOFTMAX_CALLS, key, (axes, plan))
    return found


#: (shape, dtype, axis as the caller wrote it (an int), mode, device) -> (normalized axes, plan) of ``_SOFTMAX_PLANS``
_SOFTMAX_CALLS: dict[tuple, tuple] = {}
register_cache(_SOFTMAX_CALLS.clear)


def planned_softmax_output(x: Tensor, plan: tuple) -> Tensor:
    """The output of ``softmax_plan``'s plan on x; the kernel writes the statistics into its device's scratch
    pair (only written, never read back)."""
    prepared, out_shape, out_bytes, _, stat_bytes, _, perm, restore = plan
    device = x.device
    out = results.tensor(device.allocator(device, out_bytes), out_shape, x.dtype, device)
    bound = _SCRATCH_BOUND.get(prepared)
    if bound is None:
        bound = _bind_scratch(prepared, device, stat_bytes)
    bound.call((x if perm is None else transpose(x, perm)).data, out.data)
    return out if restore is None else transpose(out, restore)


def _planned_softmax(x: Tensor, plan: tuple, keep_stats: bool = True) -> tuple[Tensor, Tensor | None, Tensor | None]:
    if not keep_stats:
        return planned_softmax_output(x, plan), None, None
    prepared, out_shape, out_bytes, rows, stat_bytes, sd, perm, restore = plan
    device = x.device
    moved = x if perm is None else transpose(x, perm)
    allocate = device.allocator
    out = results.tensor(allocate(device, out_bytes), out_shape, x.dtype, device)
    rowmax, rowsum = allocate(device, stat_bytes), allocate(device, stat_bytes)
    prepared.call(moved.data, out.data, rowmax, rowsum)
    out = out if restore is None else transpose(out, restore)
    return out, Tensor(rowmax, (rows,), sd, device), Tensor(rowsum, (rows,), sd, device)


#: device -> (bytes, two buffers of that many bytes) a planned softmax-family forward whose caller drops the
#: statistics writes them into (only written, never read: concurrent writers of unused values are harmless)
_STAT_SCRATCH: dict[Device, tuple] = {}
register_cache(_STAT_SCRATCH.clear)
#: a plan's prepared launch -> its launch with its device's scratch pair set once (emptied when a pair grows)
_SCRATCH_BOUND: dict[Any, Any] = {}
register_cache(_SCRATCH_BOUND.clear)


def _bind_scratch(prepared: Any, device: Device, stat_bytes: int) -> Any:
    """``prepared`` with ``device``'s scratch pair bound as its statistics (arguments 2 and 3), remembered in
    ``_SCRATCH_BOUND``. The pair is one per device, grown to the largest ``stat_bytes`` asked for; growing it
    forgets every bound launch, so each one found there is bound to a pair as large as its plan needs (a launch
    bound to an older pair keeps that pair alive and stays correct: the statistics are only written)."""
    scratch = _STAT_SCRATCH.get(device)
    if scratch is None or scratch[0] < stat_bytes:
        allocate = device.allocator
        scratch = _STAT_SCRATCH[device] = (stat_bytes, allocate(device, stat_bytes), allocate(device, stat_bytes))
        _SCRATCH_BOUND.clear()
    return remember(_SCRATCH_BOUND, prepared, prepared.with_bound({2: scratch[1], 3: scratch[2]}))


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that undoes ``perm``."""
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    return tuple(inverse)


def softmax_backward(g: Tensor, x: Tensor, rowmax: Tensor, rowsum: Tensor, axes: tuple[int, ...], mode: int) -> Tensor:
    """d/dx of the softmax-family output for upstream ``g`` (x's shape; ``(rows,)``-sized for logsumexp)."""
    flat, perm, rows, C = rows_layout(x, axes)
    if mode == LOGSUMEXP:
        gflat = g.reshape(rows)
    else:
        gflat, _, _, _ = rows_layout(g, axes)
    gx = softmax_rows_backward(x, flat, gflat, rowmax, rowsum, rows, C, mode)
    return restore_rows(gx, x.shape, perm)


@backend_op(_TWINS)
def softmax_rows_backward(
    x: Tensor, flat: Tensor, gflat: Tensor, rowmax: Tensor, rowsum: Tensor, rows: int, cols: int, mode: int
) -> Tensor:
    """``softmax_backward`` on ``flat`` (x as (rows, cols)) and ``gflat`` (g as (rows, cols), or (rows,) for
    logsumexp): the gradient as (rows, cols)."""
    gx = Tensor.empty((rows, cols), x.dtype, x.device)
    gflat = gflat if gflat.dtype == x.dtype else _cast(gflat, x.dtype)
    run_row_kernel(
        _SOFTMAX_BACKWARD,
        row_format(x, mode),
        x.device,
        rows,
        cols,
        [flat, gflat, rowmax, rowsum, gx],
    )
    return gx


def softmax_backward_from_output(g: Tensor, out: Tensor, axes: tuple[int, ...], mode: int) -> Tensor:
    """d/dx of softmax (``mode`` SOFTMAX) or log_softmax (LOG_SOFTMAX) over ``axes`` for upstream ``g``, from the
    forward's output ``out`` alone (x's shape)."""
    flat, perm, rows, C = rows_layout(out, axes)
    gflat, _, _, _ = rows_layout(g, axes)
    return restore_rows(softmax_rows_backward_out(flat, gflat, rows, C, mode), out.shape, perm)


@backend_op(_TWINS)
def softmax_rows_backward_out(flat: Tensor, gflat: Tensor, rows: int, cols: int, mode: int) -> Tensor:
    """``softmax_backward_from_output`` on ``flat`` (the output as (rows, cols)) and ``gflat`` (g likewise)."""
    gx = Tensor.empty((rows, cols), flat.dtype, flat.device)
    gflat = gflat if gflat.dtype == flat.dtype else _cast(gflat, flat.dtype)
    run_row_kernel(_SOFTMAX_BACKWARD_FROM_OUT, row_format(flat, mode), flat.device, rows, cols, [flat, gflat, gx])
    return gx


def _cast(t: Tensor, dtype: np.dtype) -> Tensor:
    from netcl.runtime.ops.layout import cast

    return cast(t, dtype)


def one_axis(x: Tensor, axis: int, op: str) -> tuple[int, ...]:
    _check_float(x, op)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    ndim = len(x.shape)
    if ndim == 0:
        raise ShapeError(f"{op}: x must have at least 1 dimension, got shape {x.shape}")
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(f"{op}: axis {axis} is out of range for a {ndim}-d tensor of shape {x.shape}")
    return (int(axis) % ndim,)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along ``axis``."""
    return softmax_forward(x, one_axis(x, axis, "softmax"), SOFTMAX, keep_stats=False)[0]


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """x - max - log(sum(exp(x - max))) along ``axis``."""
    return softmax_forward(x, one_axis(x, axis, "log_softmax"), LOG_SOFTMAX, keep_stats=False)[0]


def logsumexp_axes(x: Tensor, axis: Any, op: str = "logsumexp") -> tuple[int, ...]:
    _check_float(x, op)
    return normalize_axes(axis, x.ndim, op)


def logsumexp_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    return tuple((1 if i in axes else d) for i, d in enumerate(shape) if keepdims or i not in axes)


def logsumexp(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) over ``axis`` (None: all), max-subtracted."""
    axes = logsumexp_axes(x, axis)
    out = softmax_forward(x, axes, LOGSUMEXP, keep_stats=False)[0]
    return out.reshape(logsumexp_shape(x.shape, axes, keepdims))


# ---- layer_norm / rms_norm -------------------------------------------------------------------
def norm_axes(x: Tensor, normalized_shape: Any, op: str) -> tuple[int, ...]:
    """The trailing axes ``normalized_shape`` names (ShapeError unless it matches x's trailing dims)."""
    _check_float(x, op)
    integer = (int, np.integer)
    listed = isinstance(normalized_shape, (tuple, list)) and all(isinstance(d, integer) for d in normalized_shape)
    if not (isinstance(normalized_shape, integer) or listed):  # a weight passed in its place, say
        raise TypeError(
            f"{op}: normalized_shape must be an int or a tuple / list of ints (the trailing dims normalized over), "
            f"got {type(normalized_shape).__name__}"
        )
    shape = (normalized_shape,) if isinstance(normalized_shape, integer) else tuple(normalized_shape)
    if not shape or len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape) :]) != tuple(int(d) for d in shape):
        raise ShapeError(
            f"{op}: normalized_shape {tuple(shape)} must equal the trailing dimensions of x, got x of shape {x.shape}"
        )
    return tuple(range(x.ndim - len(shape), x.ndim))


def check_affine(param: Any, shape: tuple[int, ...], x: Tensor, op: str, name: str) -> None:
    if param is None:
        return
    if tuple(param.shape) != shape:
        raise ShapeError(f"{op}: {name} must have shape {shape} (normalized_shape), got {tuple(param.shape)}")
    if np.dtype(param.dtype) != x.dtype:
        raise DTypeError(f"{op}: {name} has dtype {param.dtype}, expected x's dtype {x.dtype}")


@backend_op(_TWINS)
def norm_forward(
    x: Tensor, axes: tuple[int, ...], weight: Tensor | None, bias: Tensor | None, eps: float, mode: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, mean, rstd) of layer_norm (mode LAYER) or rms_norm (mode RMS; mean is 0) over trailing ``axes``.

    A repeated signature (device, shape, dtype, axes, affine parameters given, mode) reuses its prepared
    launch and sizes: a call allocates the three outputs and launches."""
    device = x.device
    key = (device, x.shape, x.dtype, axes[0], weight is None, bias is None, mode)
    plan = _NORM_PLANS.get(key)
    if plan is not None:
        prepared, out_bytes, rows, stat_bytes, sd = plan
        allocate = device.allocator
        out = results.tensor(allocate(device, out_bytes), x.shape, x.dtype, device)
        mean = results.tensor(allocate(device, stat_bytes), (rows,), sd, device)
        rstd = results.tensor(allocate(device, stat_bytes), (rows,), sd, device)
        w, b = weight if weight is not None else x, bias if bias is not None else x
        prepared.call(x.data, w.data, b.data, out.data, mean.data, rstd.data, eps)
        return out, mean, rstd
    rows = math.prod(x.shape[: axes[0]])
    C = math.prod(x.shape[axes[0] :])
    sd = stats_dtype(x.dtype)
    out = Tensor.empty(x.shape, x.dtype, x.device)
    mean, rstd = (Tensor.empty((rows,), sd, x.device) for _ in range(2))
    fmt = row_format(x, mode, has_w=int(weight is not None), has_b=int(bias is not None))
    buffers = [x, weight if weight is not None else x, bias if bias is not None else x, out, mean, rstd]
    prepared = run_row_kernel(_NORM_FORWARD, fmt, x.device, rows, C, buffers, (sd.type(eps),))
    if prepared is not None:
        remember(_NORM_PLANS, key, (prepared, out.nbytes, rows, mean.nbytes, sd))
    return out, mean, rstd


#: (device, shape, dtype, first normalized axis, no weight, no bias, mode) -> (prepared launch, output bytes,
#: rows, statistics bytes, statistics dtype) of an OpenCL layer_norm / rms_norm forward
_NORM_PLANS: dict[tuple, tuple] = {}
register_cache(_NORM_PLANS.clear)
#: (device, shape, dtype, first normalized axis, no weight, mode) -> (prepared launch, gradient bytes) of its backward
_NORM_BACKWARD_PLANS: dict[tuple, tuple] = {}
register_cache(_NORM_BACKWARD_PLANS.clear)


@backend_op(_TWINS, device_arg="x")
def norm_backward(
    g: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor, rstd: Tensor, axes: tuple[int, ...], mode: int
) -> Tensor:
    """d/dx of layer_norm / rms_norm for upstream ``g`` (one kernel: two row sums, then the update)."""
    g = g if g.dtype == x.dtype else _cast(g, x.dtype)
    device = x.device
    key = (device, x.shape, x.dtype, axes[0], weight is None, mode)
    plan = _NORM_BACKWARD_PLANS.get(key)
    if plan is not None:
        prepared, nbytes = plan
        gx = results.tensor(device.allocator(device, nbytes), x.shape, x.dtype, device)
        w = weight if weight is not None else x
        prepared.call(x.data, g.data, w.data, mean.data, rstd.data, gx.data)
        return gx
    rows = math.prod(x.shape[: axes[0]])
    C = math.prod(x.shape[axes[0] :])
    gx = Tensor.empty(x.shape, x.dtype, x.device)
    fmt = row_format(x, mode, has_w=int(weight is not None))
    buffers = [x, g, weight if weight is not None else x, mean, rstd, gx]
    prepared = run_row_kernel(_NORM_BACKWARD, fmt, x.device, rows, C, buffers)
    if prepared is not None:
        remember(_NORM_BACKWARD_PLANS, key, (prepared, gx.nbytes))
    return gx


_PARAM_GRADS = """{pragmas}{storage_helpers}#define LD(p, i) {load}
#define WANT_W {want_w}
#define WANT_B {want_b}
__kernel void netcl_norm_param_grads(__global const {st}* x, __global const {st}* g, __global const {ct}* mean,
                                     __global const {ct}* rstd, __global {ct}* gw, __global {ct}* gb,
                                     const {idx} rows, const {idx} C, const {idx} block) {{
#if {serial}
    /* a work-item a block of rows, its partial sums a row of gw / gb, the columns in float vectors */
    const {idx} part = get_global_id(0), r0 = part * block;
    if (r0 >= rows) return;
    const {idx} r1 = r0 + block < rows ? r0 + block : rows;
    __global {ct}* pw = gw + part * C;
    __global {ct}* pb = gb + part * C;
    for ({idx} r = r0; r < r1; ++r) {{
        const {ct} mu = mean[r], rs = rstd[r];
        const int first = r == r0;
        {idx} i0 = 0;
#if {vector}
        for (; i0 + {vector} <= C; i0 += {vector}) {{
            const float{vector} gy = vload{vector}(0, g + r * C + i0);
#if WANT_B
            vstore{vector}((first ? (float{vector})0.0f : vload{vector}(0, pb + i0)) + gy, 0, pb + i0);
#endif
#if WANT_W
            const float{vector} xhat = (vload{vector}(0, x + r * C + i0) - mu) * rs;
            vstore{vector}((first ? (float{vector})0.0f : vload{vector}(0, pw + i0)) + gy * xhat, 0, pw + i0);
#endif
        }}
#endif
        for ({idx} c = i0; c < C; ++c) {{
            const {ct} gy = LD(g, r * C + c);
#if WANT_B
            pb[c] = (first ? ({ct})0 : pb[c]) + gy;
#endif
#if WANT_W
            pw[c] = (first ? ({ct})0 : pw[c]) + gy * ((LD(x, r * C + c) - mu) * rs);
#endif
        }}
    }}
#else
    /* a work-item a column of a block of rows: neighbouring work-items read neighbouring columns */
    const {idx} c = get_global_id(0), part = get_global_id(1);
    if (c >= C) return;
    const {idx} r0 = part * block, r1 = r0 + block < rows ? r0 + block : rows;
    {ct} sw = 0, sb = 0;
    for ({idx} r = r0; r < r1; ++r) {{
        const {ct} gy = LD(g, r * C + c);
#if WANT_B
        sb += gy;
#endif
#if WANT_W
        sw += gy * ((LD(x, r * C + c) - mean[r]) * rstd[r]);
#endif
    }}
#if WANT_W
    gw[part * C + c] = sw;
#endif
#if WANT_B
    gb[part * C + c] = sb;
#endif
#endif
}}
"""

#: Rows a block of the parameter gradients sums in sequence, at most (the blocks' partial sums then go through
#: ``reduce.sum``'s tree), and the work-items a GPU's blocks aim for (a column and block each).
_PARAM_GRAD_BLOCK, _PARAM_GRAD_ITEMS = 64, 65536


@backend_op(_TWINS, device_arg="x")
def norm_param_grads(
    g: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, axes: tuple[int, ...], want_w: bool, want_b: bool
) -> tuple[Tensor | None, Tensor | None]:
    """The gradients of a norm's weight (the sum over rows of ``g * (x - mean) * rstd``) and bias (of ``g``),
    each ``(C,)`` in the statistics' dtype, or None where not wanted: one kernel of per-block column sums
    (on a GPU a work-item a column of a block of rows, at most ``_PARAM_GRAD_BLOCK`` of them; on a CPU, a
    work-item a block of rows, whole rows in float vectors), then one sum over the blocks where there are
    several. The blocks are fixed by the device kind and shape, so a sum's order never changes."""
    from netcl.runtime.ops.reduce import sum as reduce_sum

    g = g if g.dtype == x.dtype else _cast(g, x.dtype)
    rows = math.prod(x.shape[: axes[0]])
    C = math.prod(x.shape[axes[0] :])
    sd = stats_dtype(x.dtype)
    serial = row_mode(x.device) == "serial"
    parts = -(-rows // _PARAM_GRAD_BLOCK)
    if not serial:  # more, shorter blocks where the columns alone leave the GPU idle
        parts = max(parts, min(-(-rows // 8), -(-_PARAM_GRAD_ITEMS // max(1, C))))
    block = max(1, -(-rows // max(1, parts)))
    parts = max(1, -(-rows // block))
    fmt = dict(row_format(x, LAYER), want_w=int(want_w), want_b=int(want_b), serial=int(serial))
    key = ("norm_param_grads", *sorted(fmt.items()))
    resolved = _common.get_kernel(
        key,
        x.device,
        lambda: _PARAM_GRADS.format(**fmt),
        "netcl_norm_param_grads",
        [None] * 6 + [ARG_DTYPES[fmt["idx"]]] * 3,
    )
    partial = [Tensor.empty((parts, C), sd, x.device) if want else None for want in (want_w, want_b)]
    if not rows:
        partial = [None if p is None else Tensor.zeros((1, C), sd, x.device) for p in partial]
    else:
        buffers = [p if p is not None else mean for p in partial]  # an unwritten placeholder
        local = min(64, resolved.max_local)
        grid = (
            ((_common.round_up(parts, local),), (local,))
            if serial
            else ((_common.round_up(C, local), parts), (local, 1))
        )
        launch_prepared(key, x.device, resolved.kernel, *grid, [x, g, mean, rstd, *buffers, rows, C, block])
    return tuple(None if p is None else p.reshape(C) if p.shape[0] == 1 else reduce_sum(p, 0) for p in partial)


def layer_norm(
    x: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape`` dims."""
    axes = norm_axes(x, normalized_shape, "layer_norm")
    shape = tuple(x.shape[axes[0] :])
    check_affine(weight, shape, x, "layer_norm", "weight")
    check_affine(bias, shape, x, "layer_norm", "bias")
    return norm_forward(x, axes, weight, bias, float(eps), LAYER)[0]


def rms_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x**2) + eps) * weight; ``eps`` None is the dtype's machine epsilon (as torch)."""
    axes = norm_axes(x, normalized_shape, "rms_norm")
    check_affine(weight, tuple(x.shape[axes[0] :]), x, "rms_norm", "weight")
    eps = float(np.finfo(x.dtype).eps) if eps is None else float(eps)
    return norm_forward(x, axes, weight, None, eps, RMS)[0]


__all__ = [
    "LAYER",
    "LOGSUMEXP",
    "LOG_SOFTMAX",
    "RMS",
    "SOFTMAX",
    "layer_norm",
    "log_softmax",
    "logsumexp",
    "norm_backward",
    "norm_forward",
    "norm_param_grads",
    "rms_norm",
    "softmax",
    "softmax_backward",
    "softmax_backward_from_output",
    "softmax_forward",
]
