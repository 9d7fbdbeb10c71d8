"""Key/value-cache kernels: rows written and read at a bound position, attention over a cache prefix.

A cache is a preallocated tensor ``(..., T, R)`` (``T`` positions of ``R`` elements, e.g. keys
``(B, H, T, E)``); positions are ``int``s or ``netcl.runtime.Variable``s, so one captured decode
step replays for every position (the kernels take the position as an ``int`` argument):

* ``write_rows(cache, new, pos)``: ``cache[..., pos:pos+S, :] = new`` for ``new`` ``(..., S, R)``.
* ``read_rows(source, pos, count)``: a new ``(..., count, R)`` tensor of ``source[..., pos:pos+count, :]``.
* ``cache_attention(q, k_cache, v_cache, pos, scale)``: q ``(..., L, E)`` holds the queries at
  positions ``pos .. pos+L-1``; query ``i`` attends to keys ``0 .. pos+i`` of the caches
  ``(..., T, E)`` / ``(..., T, Ev)`` (causal attention of a sequence whose first ``pos`` keys are
  already cached); output ``(..., L, Ev)``.

Validation happens before any launch: shapes and dtypes must agree, and the largest position a
call can reach (``pos`` itself, or a Variable's ``max_value``) plus the rows it touches must fit
in ``T``, else a ``ValueError`` naming ``pos``. ``write_rows`` / ``read_rows`` copy bytes, so any
dtype works; attention computes in float32 (float64 for float64 input, float16 stored as half).

``cache_attention`` runs one work-group of ``W`` work-items per (query row, leading index): each
work-item walks keys ``w, w + W, ...`` with an online softmax (running max, sum and ``Ev``
accumulator), then the work-group merges the ``W`` partial results in local memory. The NumPy
backend runs the twins in this module.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float16, float64, refuse_bfloat16
from netcl.runtime.launch import launch
from netcl.runtime.ops._common import compute_ctype, get_kernel, storage_ctype, storage_pragmas
from netcl.runtime.ops._grid import index_ctype, index_dtype
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.variable import Variable

_TWINS = "netcl.runtime.numpy_twins.kv_cache"

_UINT = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}

_ROWS = """
typedef {idx} idx_t;
/* rows of n-th (T, R) block: dst/src rows pos..pos+S-1 of the T-row side, all S rows of the other */
__kernel void {name}(__global {u}* dst, __global const {u}* src, const int pos, const idx_t S,
                     const idx_t T, const idx_t R, const idx_t total) {{
    const idx_t gid = get_global_id(0);
    if (gid >= total) return;
    const idx_t n = gid / (S * R);
    const idx_t rem = gid - n * S * R;
    const idx_t big = (n * T + pos) * R + rem;
#if WRITE
    dst[big] = src[gid];
#else
    dst[gid] = src[big];
#endif
}}
"""

_ATTENTION = """{pragmas}
#define LD(p, i) {load}
#define ST(p, i, v) {store}
#define E {E}
#define EV {EV}
#define W {W}
typedef {idx} idx_t;
typedef {ct} ct;
__kernel void netcl_cache_attention(__global const {st}* q, __global const {st}* k, __global const {st}* v,
                                    __global {st}* out, const int pos, const ct scale, const int L, const int T) {{
    __local ct lm[W];
    __local ct ll[W];
    __local ct lacc[W * EV];
    const int w = get_local_id(0);
    const idx_t r = get_global_id(1);
    const idx_t n = get_global_id(2);
    ct qv[E];
    const idx_t qb = (n * L + r) * E;
    for (int e = 0; e < E; ++e) qv[e] = LD(q, qb + e) * scale;
    const int last = pos + (int)r; /* keys 0..last are visible to this query */
    ct m = -INFINITY, l = 0, acc[EV];
    for (int e = 0; e < EV; ++e) acc[e] = 0;
    for (int j = w; j <= last; j += W) {{
        const idx_t kb = (n * T + j) * E;
        ct s = 0;
        for (int e = 0; e < E; ++e) s += qv[e] * LD(k, kb + e);
        const ct mn = fmax(m, s);
        const ct c = exp(m - mn);
        const ct p = exp(s - mn);
        l = l * c + p;
        const idx_t vb = (n * T + j) * EV;
        for (int e = 0; e < EV; ++e) acc[e] = acc[e] * c + p * LD(v, vb + e);
        m = mn;
    }}
    lm[w] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    ct big = -INFINITY;
    for (int t = 0; t < W; ++t) big = fmax(big, lm[t]);
    const ct f = (m == -INFINITY) ? (ct)0 : exp(m - big);
    ll[w] = l * f;
    for (int e = 0; e < EV; ++e) lacc[w * EV + e] = acc[e] * f;
    barrier(CLK_LOCAL_MEM_FENCE);
    ct total = 0;
    for (int t = 0; t < W; ++t) total += ll[t];
    const idx_t ob = (n * L + r) * EV;
    for (int e = w; e < EV; e += W) {{
        ct a = 0;
        for (int t = 0; t < W; ++t) a += lacc[t * EV + e];
        ST(out, ob + e, a / total);
    }}
}}
"""

#: work-items per query row in ``cache_attention``, at most
MAX_WIDTH = 32


# ---- validation ------------------------------------------------------------------------------
def _check_pos(pos: Any, rows: int, positions: int, op: str) -> int:
    """The largest start ``pos`` can take; ValueError (naming ``pos``) if ``rows`` rows from it pass ``positions``."""
    if isinstance(pos, Variable):
        highest, what = pos.max_value, f"pos (Variable {pos.name!r} with max_value {pos.max_value})"
    elif isinstance(pos, (int, np.integer)) and not isinstance(pos, bool):
        highest, what = int(pos), f"pos={int(pos)}"
        if highest < 0:
            raise ValueError(f"{op}: pos must be >= 0, got {highest}")
    else:
        raise TypeError(f"{op}: pos must be an int or a netcl.runtime.Variable, got {type(pos).__name__}")
    if highest + rows > positions:
        raise ValueError(
            f"{op}: {what} plus the {rows} row(s) it covers reaches position {highest + rows - 1}, "
            f"beyond the cache's {positions} positions (0..{positions - 1}); size the cache for the maximum"
        )
    return highest


def _check_pair(big: Tensor, small: Tensor, big_name: str, small_name: str, op: str) -> None:
    for name, t in ((big_name, big), (small_name, small)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a netcl Tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{op}: {name} must have at least 2 dims (..., positions, row), got shape {t.shape}")
    if big.shape[:-2] != small.shape[:-2] or big.shape[-1] != small.shape[-1]:
        raise ValueError(
            f"{op}: {big_name} {big.shape} and {small_name} {small.shape} must agree in every dim "
            "but the positions (second to last)"
        )
    if big.dtype != small.dtype:
        raise ValueError(f"{op}: {big_name} is {big.dtype}, {small_name} is {small.dtype}; they must match")
    if big.device is not small.device:
        raise ValueError(f"{op}: {big_name} is on {big.device}, {small_name} on {small.device}")


# ---- row copies ------------------------------------------------------------------------------
def _rows_kernel(write: bool, big: Tensor, small: Tensor, pos: int | Variable) -> None:
    T, S, R = big.shape[-2], small.shape[-2], big.shape[-1]
    total = small.size
    if total == 0:
        return
    idx = index_ctype(big.size)
    it = index_dtype(idx).type
    u = _UINT[big.dtype.itemsize]
    name = "netcl_cache_write_rows" if write else "netcl_cache_read_rows"
    key = ("kv_cache_rows", write, u, idx)
    types = [None, None, np.int32, index_dtype(idx), index_dtype(idx), index_dtype(idx), index_dtype(idx)]
    source = f"#define WRITE {int(write)}\n" + _ROWS.format(name=name, u=u, idx=idx)
    resolved = get_kernel(key, big.device, lambda: source, name, types)
    local = resolved.max_local
    gsize = -(-total // local) * local
    dst, src = (big, small.contiguous()) if write else (small, big)  # a strided view is read as its copy
    arg = pos if isinstance(pos, Variable) else np.int32(pos)
    launch(resolved.kernel, gsize, local, dst, src, arg, it(S), it(T), it(R), it(total), queue=big.device.queue)


def write_rows(cache: Tensor, new: Tensor, pos: int | Variable) -> None:
    """``cache[..., pos:pos+S, :] = new`` in place, ``new`` ``(..., S, R)``; ``pos`` is read at launch (or replay)."""
    op = "write_rows"
    _check_pair(cache, new, "cache", "new", op)
    _check_pos(pos, new.shape[-2], cache.shape[-2], op)
    store_rows(cache, new, pos)


@backend_op(_TWINS)
def store_rows(cache: Tensor, new: Tensor, pos: int | Variable) -> None:
    """``write_rows`` of a checked call."""
    _rows_kernel(True, cache, new, pos)


def read_rows(source: Tensor, pos: int | Variable, count: int = 1) -> Tensor:
    """A new ``(..., count, R)`` tensor holding ``source[..., pos:pos+count, :]``; ``pos`` is read at launch."""
    op = "read_rows"
    if not isinstance(source, Tensor) or source.ndim < 2:
        raise ValueError(f"{op}: source must be a Tensor of at least 2 dims (..., positions, row)")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"{op}: count must be a positive int, got {count!r}")
    _check_pos(pos, int(count), source.shape[-2], op)
    return load_rows(source, pos, count, (*source.shape[:-2], int(count), source.shape[-1]))


@backend_op(_TWINS)
def load_rows(source: Tensor, pos: int | Variable, count: int, shape: tuple[int, ...]) -> Tensor:
    """``read_rows`` of a checked call, ``shape`` its result's."""
    out = Tensor.empty(shape, source.dtype, source.device)
    _rows_kernel(False, source, out, pos)
    return out


# ---- attention over a cache prefix -------------------------------------------------------------
def _width(device: Device, ev: int, itemsize: int) -> int:
    """Work-items per query row: a power of two up to ``MAX_WIDTH`` whose partial results fit half the local memory."""
    local_mem = int(device.cl_device.local_mem_size) if device.cl_device is not None else 32768
    w = MAX_WIDTH
    while w > 1 and w * (ev + 2) * itemsize > local_mem // 2:
        w //= 2
    return w


def check_cache_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: int | Variable) -> None:
    """Validate a ``cache_attention`` call (ValueError / TypeError naming the argument)."""
    op = "cache_attention"
    _check_pair(k_cache, q, "k_cache", "q", op)
    for name, t in (("v_cache", v_cache),):
        if not isinstance(t, Tensor) or t.shape[:-1] != k_cache.shape[:-1]:
            raise ValueError(
                f"{op}: {name} must be a Tensor of shape {k_cache.shape[:-1]} + (Ev,) like k_cache, "
                f"got {getattr(t, 'shape', type(t).__name__)}"
            )
        if t.dtype != q.dtype or t.device is not q.device:
            raise ValueError(f"{op}: {name} must have q's dtype and device ({q.dtype} on {q.device})")
    refuse_bfloat16(op, q.dtype)
    if q.dtype.kind != "f":
        raise ValueError(f"{op}: q must be a float tensor, got {q.dtype}")
    _check_pos(pos, q.shape[-2], k_cache.shape[-2], op)


def cache_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: int | Variable, scale: float | None = None
) -> Tensor:
    """Causal attention of queries at positions ``pos..pos+L-1`` over the cached keys ``0..pos+i``.

    q ``(..., L, E)``, caches ``(..., T, E)`` and ``(..., T, Ev)`` (leading dims equal); ``scale``
    defaults to ``1/sqrt(E)``. Returns ``(..., L, Ev)``. One launch on OpenCL.
    """
    check_cache_attention(q, k_cache, v_cache, pos)
    return attend_cache(q, k_cache, v_cache, pos, 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale))


@backend_op(_TWINS)
def attend_cache(q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: int | Variable, scale: float) -> Tensor:
    """``cache_attention`` of a checked call (``scale`` given)."""
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()  # strided views: their copies
    lead, L, E = q.shape[:-2], q.shape[-2], q.shape[-1]
    T, Ev = k_cache.shape[-2], v_cache.shape[-1]
    n = math.prod(lead)
    out = Tensor.empty((*lead, L, Ev), q.dtype, q.device)
    if n == 0 or L == 0:
        return out
    sd = np.dtype(np.float64) if q.dtype == float64 else np.dtype(np.float32)
    ct = compute_ctype(sd)
    half = q.dtype == float16
    width = _width(q.device, Ev, sd.itemsize)
    idx = index_ctype(max(k_cache.size, v_cache.size, q.size, n * L * Ev))
    fmt = {
        "pragmas": storage_pragmas([q.dtype, sd]),
        "load": "vload_half((i), (p))" if half else f"(({ct})(p)[i])",
        "store": f"vstore_half_rte(({ct})(v), (i), (p))" if half else f"((p)[i] = ({storage_ctype(q.dtype)})(v))",
        "st": storage_ctype(q.dtype),
        "ct": ct,
        "idx": idx,
        "E": E,
        "EV": Ev,
        "W": width,
    }
    key = ("kv_cache_attention", *sorted(fmt.items()))
    types = [None, None, None, None, np.int32, sd, np.int32, np.int32]
    resolved = get_kernel(key, q.device, lambda: _ATTENTION.format(**fmt), "netcl_cache_attention", types)
    if resolved.max_local < width:
        raise RuntimeError(
            f"cache_attention: the device allows {resolved.max_local} work-items per group for this kernel, "
            f"it needs {width}"
        )
    arg = pos if isinstance(pos, Variable) else np.int32(pos)
    launch(
        resolved.kernel,
        (width, L, n),
        (width, 1, 1),
        q,
        k_cache,
        v_cache,
        out,
        arg,
        sd.type(scale),
        np.int32(L),
        np.int32(T),
        queue=q.device.queue,
    )
    return out


__all__ = ["cache_attention", "check_cache_attention", "read_rows", "write_rows"]
