"""Fused scaled-dot-product attention: forward in one launch, backward in two, never an L x S tensor.

Shapes follow torch's ``scaled_dot_product_attention``: q ``(..., L, E)``, k ``(..., S, E)``, v
``(..., S, Ev)``, output ``(..., L, Ev)``; the leading dims of q, k and v agree (with
``enable_gqa`` the head dim, third from last, of k and v may divide q's: q head h reads kv head
``h // (Hq // Hkv)``). ``check_attention`` validates everything before any launch and returns an
``AttentionSpec``; the leading dims are flattened to ``BH`` "batch-heads".

Kernels (``netcl_attention_fwd``, ``netcl_attention_bwd_kv``, ``netcl_attention_bwd_q``):

* forward: one work-group per (batch-head, block of query rows), one work-item per query row;
  key/value tiles of ``TN`` rows are staged in local memory; each row keeps a running max ``m``,
  running sum ``l`` and an ``Ev`` accumulator (online softmax, one rescale per tile). It writes
  the output and the row log-sum-exp ``lse = m + log(l)`` (float32; float64 for float64 input).
  With ``is_causal`` (top-left aligned, as torch: key j is visible to query i iff j <= i) the
  key loop stops at the last tile the block's rows can see.
* backward (FlashAttention-2's split): ``bwd_kv`` has one work-item per key row and loops over
  query tiles (and over the q heads sharing a kv head), accumulating dK and dV; ``bwd_q`` has one
  work-item per query row and loops over key tiles, accumulating dQ. Both recompute
  ``P = exp(s - lse)`` from the saved lse and ``D_i = rowsum(dO_i * O_i)`` in their prologue.
  Causal blocks skip the tiles that are fully masked.

Masks are read in place: a boolean mask (True = takes part, torch's convention) or an additive
float mask of q's dtype, broadcast to ``(..., L, S)``: the kernel gets the mask's row and column
strides (0 on broadcast axes) and a small table of ``BH`` base offsets, never a broadcast copy.

A query row whose keys are all masked gets output 0, lse ``-inf`` and zero gradients: what torch's
math backend gives since 2.5 (its ``_safe_softmax``); older torch returned NaN there.

Dropout (``dropout_p > 0``) zeroes probabilities with the Philox stream of ``ops.dropout``:
element ``(bh, i, j)`` of the ``(BH, L, S)`` probabilities is kept iff ``ops.dropout`` of a
ones tensor of that shape, same seed and counter, keeps its element ``(bh * L + i) * S + j``;
kept ones are scaled by ``1 / (1 - p)``. The backward regenerates the bits.

Kernel choice goes through ``VARIANTS`` (``select_variant``): the first variant whose
``supports`` accepts the call runs it. The portable OpenCL kernels (any OpenCL 1.2 device) are
the fallback; a tensor-core variant is inserted before them. The NumPy backend runs the twins in
``netcl.runtime.numpy_twins.attention``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import bfloat16, float16, float64
from netcl.core.errors import DTypeError
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops import random
from netcl.runtime.ops._common import (
    CLEAR_HOOKS,
    compute_ctype,
    get_kernel,
    remember,
    storage_ctype,
    storage_pragmas,
)
from netcl.runtime.ops._grid import index_ctype, index_dtype
from netcl.runtime.ops.attention_spec import (
    ADDITIVE_MASK,
    BOOL_MASK,
    NO_MASK,
    AttentionSpec,
    check_attention,
    check_packed_attention,
)
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.strided import strided_copy, strided_write

_TWINS = "netcl.runtime.numpy_twins.attention"


# ---- dispatch ------------------------------------------------------------------------------
def _as_given(x: Tensor) -> Tensor:
    return x


@dataclass(frozen=True)
class PackedKernels:
    """A variant's kernels for self-attention on one packed ``(B, L, 3 * H * E)`` q/k/v tensor (a fused
    in-projection's output; ``packed_attention_forward``), for the calls ``supports`` accepts.

    ``run(kernel, buffers, items, planes, spec)`` launches the variant's "fwd", "bwd_q" or "bwd_kv" kernel in
    the packed layout, on the per-head kernels' arguments (q, k and v all the packed tensor; the output and
    its gradient ``(B, L, H * E)``; dq, dk and dv all one dqkv) over ``items`` rows of ``planes`` heads.
    ``operand(x)``: the tensor the kernels read for the packed q/k/v or the upstream gradient (x as given, or
    a copy rounded to the products' 16-bit dtype). ``forward`` and ``backward`` allocate the results and
    launch: one kernel, and two."""

    supports: Callable[[Device, np.dtype, AttentionSpec], bool]
    run: Callable[[str, list[Tensor], int, int, AttentionSpec], None]
    operand: Callable[[Tensor], Tensor] = _as_given

    def forward(self, qkv: Tensor, spec: AttentionSpec) -> tuple[Tensor, Tensor]:
        """(output (B, L, H * E) in qkv's dtype, float32 lse (B, H, L))."""
        out = Tensor.empty((spec.lead[0], spec.L, spec.Hq * spec.E), qkv.dtype, qkv.device)
        lse = Tensor.empty((*spec.lead, spec.L), np.float32, qkv.device)
        x = self.operand(qkv)
        self.run("fwd", [x, x, x, out, lse], spec.L, spec.BH, spec)
        return out, lse

    def backward(self, g: Tensor, qkv: Tensor, out: Tensor, lse: Tensor, spec: AttentionSpec) -> Tensor:
        """dqkv in qkv's dtype: ``bwd_q`` writes dq's columns, ``bwd_kv`` dk's and dv's (together all of it)."""
        dqkv = Tensor.empty(qkv.shape, qkv.dtype, qkv.device)
        drow = Tensor.empty(lse.shape, np.float32, qkv.device)
        x, gx = self.operand(qkv), self.operand(g)
        self.run("bwd_q", [x, x, x, out, gx, lse, dqkv, drow], spec.L, spec.BH, spec)
        self.run("bwd_kv", [x, x, x, gx, lse, drow, dqkv, dqkv], spec.S, spec.BHkv, spec)
        return dqkv


@dataclass(frozen=True)
class AttentionVariant:
    """One implementation: ``supports(device, dtype, spec)`` says whether it takes a call; ``packed``, where
    given, reads q, k and v from one packed tensor in place."""

    name: str
    supports: Callable[[Device, np.dtype, AttentionSpec], bool]
    forward: Callable[..., tuple[Tensor, Tensor]]
    backward: Callable[..., tuple[Tensor, Tensor, Tensor]]
    packed: PackedKernels | None = None
    #: whether ``supports`` may take bfloat16 tensors (the others never see them)
    bfloat16: bool = False


#: Tried in order; the portable kernels (last) take every OpenCL call but bfloat16 ones.
VARIANTS: list[AttentionVariant] = []


def select_variant(device: Device, dtype: np.dtype, spec: AttentionSpec) -> AttentionVariant:
    """The first variant of ``VARIANTS`` that supports the call (the one dispatch point); a DTypeError for
    bfloat16 tensors where no variant takes them (only the tensor-core kernels do)."""
    bf16 = dtype == bfloat16
    for variant in VARIANTS:
        if (variant.bfloat16 or not bf16) and variant.supports(device, dtype, spec):
            return variant
    if bf16:
        raise DTypeError(
            f"scaled_dot_product_attention: bfloat16 tensors run on NVIDIA's tensor cores only (no mask, no "
            f"dropout, E == Ev of 64 or 128), not on {device.name!r} for this call; cast to float32 first"
        )
    raise RuntimeError(f"no attention kernel supports {dtype} on {device.name!r}")  # the portable one always does


# ---- portable OpenCL kernels ------------------------------------------------------------------
_COMMON = """{pragmas}
#define LD(p, i) {load}
#define ST(p, i, v) {store}
#define E {E}
#define EV {EV}
#define TN {TN}
#define MASK {mask}
#define CAUSAL {causal}
#define DROPOUT {dropout}
typedef {idx} idx_t;
typedef {ct} ct;
{philox}
/* scaled score of query row r and key c (q row in qv, key row at kr): -INFINITY where masked */
inline ct netcl_att_score(const ct* qv, __local const ct* kr, const ct scale, __global const {mst}* mask,
                          const idx_t mb, const idx_t mrow, const idx_t mcol, const idx_t r, const idx_t c) {{
    ct s = 0;
    for (int e = 0; e < E; ++e) s += qv[e] * kr[e];
    s *= scale;
#if MASK == 1
    if (!mask[mb + r * mrow + c * mcol]) s = -INFINITY;
#elif MASK == 2
    s += {mload};
#endif
#if CAUSAL
    if (c > r) s = -INFINITY;
#endif
    return s;
}}
/* dropout: 1/(1-p) where element (bh, r, c) of the (BH, L, S) probabilities is kept, else 0 */
inline ct netcl_att_keep(const idx_t bh, const idx_t r, const idx_t c, const idx_t L, const idx_t S,
                         const uint k0, const uint k1, const uint threshold, const ct dscale,
                         __global const int* counter) {{
#if DROPOUT
    const long flat = ((long)bh * L + r) * S + c;
    const uint4 b = philox4x32_10((uint4)((uint)flat, (uint)(flat >> 32), {stream}u, (uint)counter[0]),
                                  (uint2)(k0, k1));
    return (b.x >> 8) >= threshold ? dscale : (ct)0;
#else
    return (ct)1;
#endif
}}
/* a query-row kernel's prologue: its batch-head, row, kv head, mask base and key / value rows */
#define QUERY_BLOCK \
    const idx_t bh = get_group_id(1); \
    const int lid = get_local_id(0), BM = get_local_size(0); \
    const idx_t row0 = (idx_t)get_group_id(0) * BM, r = row0 + lid; \
    const int live = r < L; \
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group; \
    const idx_t mb = MASK ? moff[bh] : 0; \
    __global const {st}* kb = k + kvh * S * E; \
    __global const {st}* vb = v + kvh * S * EV
/* key / value rows n0 .. n0 + tn - 1 into the local tiles ks, vs (between barriers) */
#define STAGE_KV_TILE \
    barrier(CLK_LOCAL_MEM_FENCE); \
    for (int t = lid; t < tn * E; t += BM) ks[t] = LD(kb, n0 * E + t); \
    for (int t = lid; t < tn * EV; t += BM) vs[t] = LD(vb, n0 * EV + t); \
    barrier(CLK_LOCAL_MEM_FENCE)
#define ATT_ARGS __global const {mst}* mask, __global const long* moff, const idx_t L, const idx_t S, \\
    const idx_t Hq, const idx_t group, const idx_t Hkv, const idx_t mrow, const idx_t mcol, const ct scale, \\
    const uint k0, const uint k1, const uint threshold, const ct dscale, __global const int* counter
"""

_FORWARD = """
__kernel void netcl_attention_fwd(__global const {st}* q, __global const {st}* k, __global const {st}* v,
                                  __global {st}* out, __global ct* lse, ATT_ARGS) {{
    __local ct ks[TN * E];
    __local ct vs[TN * EV];
    QUERY_BLOCK;
    ct qv[E], acc[EV], sc[TN];
    for (int e = 0; e < E; ++e) qv[e] = live ? LD(q, (bh * L + r) * E + e) : (ct)0;
    for (int e = 0; e < EV; ++e) acc[e] = 0;
    ct m = -INFINITY, l = 0;
#if CAUSAL
    const idx_t nend = min(S, min(row0 + BM, L));  /* keys past the block's last row are masked */
#else
    const idx_t nend = S;
#endif
    for (idx_t n0 = 0; n0 < nend; n0 += TN) {{
        const int tn = (int)min((idx_t)TN, nend - n0);
        STAGE_KV_TILE;
        if (!live) continue;
        ct mt = m;
        for (int j = 0; j < tn; ++j) {{
            const ct s = netcl_att_score(qv, ks + j * E, scale, mask, mb, mrow, mcol, r, n0 + j);
            sc[j] = s;
            mt = s > mt ? s : mt;
        }}
        if (mt == -INFINITY) continue;  /* nothing visible to this row yet */
        const ct corr = exp(m - mt);
        l *= corr;
        for (int e = 0; e < EV; ++e) acc[e] *= corr;
        for (int j = 0; j < tn; ++j) {{
            const ct p = exp(sc[j] - mt);
            l += p;
            const ct pd = p * netcl_att_keep(bh, r, n0 + j, L, S, k0, k1, threshold, dscale, counter);
            for (int e = 0; e < EV; ++e) acc[e] += pd * vs[j * EV + e];
        }}
        m = mt;
    }}
    if (!live) return;
    const ct inv = l > 0 ? (ct)1 / l : (ct)0;
    for (int e = 0; e < EV; ++e) ST(out, (bh * L + r) * EV + e, acc[e] * inv);
    lse[bh * L + r] = l > 0 ? m + log(l) : -INFINITY;
}}
"""

_BACKWARD_KV = """
/* dK, dV: one work-item per key row c; loops over the q heads of its kv head and over query tiles */
__kernel void netcl_attention_bwd_kv(__global const {st}* q, __global const {st}* k, __global const {st}* v,
                                     __global const {st}* out, __global const {st}* g, __global const ct* lse,
                                     __global {st}* dk, __global {st}* dv, ATT_ARGS) {{
    __local ct qs[TN * E];
    __local ct gs[TN * EV];
    __local ct ls[TN];
    __local ct dd[TN];
    const idx_t kvh = get_group_id(1);
    const int lid = get_local_id(0), BN = get_local_size(0);
    const idx_t c0 = (idx_t)get_group_id(0) * BN, c = c0 + lid;
    const int live = c < S;
    ct kv[E], vv[EV], dkv[E], dvv[EV];
    for (int e = 0; e < E; ++e) {{ kv[e] = live ? LD(k, (kvh * S + c) * E + e) : (ct)0; dkv[e] = 0; }}
    for (int e = 0; e < EV; ++e) {{ vv[e] = live ? LD(v, (kvh * S + c) * EV + e) : (ct)0; dvv[e] = 0; }}
    const idx_t first = (kvh / Hkv) * Hq + (kvh % Hkv) * group;
#if CAUSAL
    const idx_t mstart = c0;  /* rows before c0 see no key of this block */
#else
    const idx_t mstart = 0;
#endif
    for (idx_t bh = first; bh < first + group; ++bh) {{
        const idx_t mb = MASK ? moff[bh] : 0;
        for (idx_t m0 = mstart; m0 < L; m0 += TN) {{
            const int tm = (int)min((idx_t)TN, L - m0);
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int t = lid; t < tm * E; t += BN) qs[t] = LD(q, (bh * L + m0) * E + t);
            for (int t = lid; t < tm * EV; t += BN) gs[t] = LD(g, (bh * L + m0) * EV + t);
            for (int t = lid; t < tm; t += BN) {{
                const idx_t row = bh * L + m0 + t;
                ct d = 0;
                for (int e = 0; e < EV; ++e) d += LD(g, row * EV + e) * LD(out, row * EV + e);
                ls[t] = lse[row];
                dd[t] = d;
            }}
            barrier(CLK_LOCAL_MEM_FENCE);
            if (!live) continue;
            for (int i = 0; i < tm; ++i) {{
                const idx_t r = m0 + i;
                ct s = 0;
                for (int e = 0; e < E; ++e) s += qs[i * E + e] * kv[e];
                s *= scale;
#if MASK == 1
                if (!mask[mb + r * mrow + c * mcol]) continue;
#elif MASK == 2
                s += {mload};
#endif
#if CAUSAL
                if (c > r) continue;
#endif
                if (s == -INFINITY || ls[i] == -INFINITY) continue;
                const ct p = exp(s - ls[i]);
                const ct z = netcl_att_keep(bh, r, c, L, S, k0, k1, threshold, dscale, counter);
                ct dp = 0;
                for (int e = 0; e < EV; ++e) dp += gs[i * EV + e] * vv[e];
                for (int e = 0; e < EV; ++e) dvv[e] += p * z * gs[i * EV + e];
                const ct ds = p * (dp * z - dd[i]);
                for (int e = 0; e < E; ++e) dkv[e] += ds * qs[i * E + e];
            }}
        }}
    }}
    if (!live) return;
    for (int e = 0; e < E; ++e) ST(dk, (kvh * S + c) * E + e, dkv[e] * scale);
    for (int e = 0; e < EV; ++e) ST(dv, (kvh * S + c) * EV + e, dvv[e]);
}}
"""

_BACKWARD_Q = """
/* dQ: one work-item per query row r; loops over key tiles (stopping at the last visible one when causal) */
__kernel void netcl_attention_bwd_q(__global const {st}* q, __global const {st}* k, __global const {st}* v,
                                    __global const {st}* out, __global const {st}* g, __global const ct* lse,
                                    __global {st}* dq, ATT_ARGS) {{
    __local ct ks[TN * E];
    __local ct vs[TN * EV];
    QUERY_BLOCK;
    ct qv[E], gv[EV], dqv[E];
    ct d = 0;
    for (int e = 0; e < E; ++e) {{ qv[e] = live ? LD(q, (bh * L + r) * E + e) : (ct)0; dqv[e] = 0; }}
    for (int e = 0; e < EV; ++e) {{
        gv[e] = live ? LD(g, (bh * L + r) * EV + e) : (ct)0;
        d += live ? gv[e] * LD(out, (bh * L + r) * EV + e) : (ct)0;
    }}
    const ct lr = live ? lse[bh * L + r] : -INFINITY;
#if CAUSAL
    const idx_t nend = min(S, min(row0 + BM, L));
#else
    const idx_t nend = S;
#endif
    for (idx_t n0 = 0; n0 < nend; n0 += TN) {{
        const int tn = (int)min((idx_t)TN, nend - n0);
        STAGE_KV_TILE;
        if (!live || lr == -INFINITY) continue;
        for (int j = 0; j < tn; ++j) {{
            const ct s = netcl_att_score(qv, ks + j * E, scale, mask, mb, mrow, mcol, r, n0 + j);
            if (s == -INFINITY) continue;
            const ct p = exp(s - lr);
            const ct z = netcl_att_keep(bh, r, n0 + j, L, S, k0, k1, threshold, dscale, counter);
            ct dp = 0;
            for (int e = 0; e < EV; ++e) dp += gv[e] * vs[j * EV + e];
            const ct ds = p * (dp * z - d);
            for (int e = 0; e < E; ++e) dqv[e] += ds * ks[j * E + e];
        }}
    }}
    if (!live) return;
    for (int e = 0; e < E; ++e) ST(dq, (bh * L + r) * E + e, dqv[e] * scale);
}}
"""

#: work-items (query or key rows) per work-group, at most
BLOCK_ROWS = 64
#: rows per local-memory tile, at most
MAX_TILE = 32


def _tile_rows(device: Device, spec: AttentionSpec, itemsize: int) -> int:
    """Rows per local tile: a power of two up to ``MAX_TILE`` whose K and V tiles fit in half the local memory."""
    local = int(device.cl_device.local_mem_size) if device.cl_device is not None else 32768
    tn = MAX_TILE
    while tn > 1 and tn * (spec.E + spec.Ev + 2) * itemsize > local // 2:
        tn //= 2
    return tn


def _source_fields(dtype: np.dtype, spec: AttentionSpec, device: Device) -> dict[str, Any]:
    sd = np.dtype(np.float64) if dtype == float64 else np.dtype(np.float32)
    st, ct = storage_ctype(dtype), compute_ctype(sd)
    half = dtype == float16
    mst = "uchar" if spec.mask_kind == BOOL_MASK else st
    if spec.mask_kind == ADDITIVE_MASK and half:
        mload = "vload_half(mb + r * mrow + c * mcol, mask)"
    else:
        mload = f"(({ct})mask[mb + r * mrow + c * mcol])"
    biggest = max(spec.BH * spec.L * max(spec.E, spec.Ev, spec.S), spec.BHkv * spec.S * max(spec.E, spec.Ev))
    return {
        "pragmas": storage_pragmas([dtype, sd]),
        "load": "vload_half((i), (p))" if half else f"(({ct})(p)[i])",
        "store": f"vstore_half_rte(({ct})(v), (i), (p))" if half else f"((p)[i] = ({st})(v))",
        "st": st,
        "ct": ct,
        "mst": mst,
        "mload": mload,
        "idx": index_ctype(biggest),
        "E": spec.E,
        "EV": spec.Ev,
        "TN": _tile_rows(device, spec, sd.itemsize),
        "mask": spec.mask_kind,
        "causal": int(spec.causal),
        "dropout": int(spec.dropout_p > 0),
        "stream": random.DROPOUT_STREAM,
        "philox": random.PHILOX_SOURCE if spec.dropout_p > 0 else "",
    }


_ZERO_COUNTERS: dict[Device, Tensor] = {}
_OFFSETS: dict[tuple, Tensor] = {}


def _zero_counter(device: Device) -> Tensor:
    counter = _ZERO_COUNTERS.get(device)
    if counter is None:
        counter = _ZERO_COUNTERS[device] = random.new_counter(device)
    return counter


def _mask_offsets(device: Device, spec: AttentionSpec) -> Tensor:
    """The BH mask base offsets on the device (memoized per lead and mask shape)."""
    key = (device, spec.lead, spec.mask_shape)
    table = _OFFSETS.get(key)
    if table is None:
        table = remember(_OFFSETS, key, Tensor.from_host(device, spec.mask_offsets(), np.int64))
    return table


def _scalar_args(spec: AttentionSpec, fmt: dict[str, Any], seed: int, mask: Tensor | None) -> list:
    it = index_dtype(fmt["idx"]).type
    ct = np.float64 if fmt["ct"] == "double" else np.float32
    strides = spec.mask_strides() if mask is not None else (0, 0)
    threshold = random.dropout_threshold(spec.dropout_p)
    dscale = 1.0 / (1.0 - spec.dropout_p) if spec.dropout_p > 0 else 1.0
    seed = int(seed) % 2**64
    return [
        it(spec.L),
        it(spec.S),
        it(spec.Hq),
        it(spec.group),
        it(spec.Hkv),
        it(strides[-2]),
        it(strides[-1]),
        ct(spec.scale),
        np.uint32(seed & 0xFFFFFFFF),
        np.uint32(seed >> 32),
        np.uint32(threshold),
        ct(np.float32(dscale)),  # rounded to float32 as ops.dropout's scale
    ]


def _arg_types(n_buffers: int, fmt: dict[str, Any]) -> list:
    it = index_dtype(fmt["idx"])
    ct = np.float64 if fmt["ct"] == "double" else np.float32
    return [None] * n_buffers + [None, None] + [it] * 7 + [ct, np.uint32, np.uint32, np.uint32, ct, None]


#: (kernel name, device, dtype, spec, buffer count, masked) -> the prepared launch of ``_run``
_LAUNCHES: dict[tuple, PreparedLaunch] = {}
CLEAR_HOOKS.append(_LAUNCHES.clear)


def _run(name: str, template: str, buffers: list, grid: tuple[int, int], spec: AttentionSpec, extra: tuple) -> None:
    """Launch kernel ``name``: ``grid`` = (rows, planes), one work-item per row; ``extra`` = (mask, seed, counter).

    Everything but the buffers and the seed follows from (name, device, dtype, spec, mask or not): prepared
    once per such signature (the sizes, scale and dropout scalars bound), a call sets the buffers and the seed.
    """
    rows, planes = grid
    if rows == 0 or planes == 0:
        return
    mask, seed, counter = extra
    device, dtype = buffers[0].device, buffers[0].dtype
    key = (name, device, dtype, spec, len(buffers), mask is not None)
    prepared = _LAUNCHES.get(key)
    if prepared is None:
        prepared = remember(_LAUNCHES, key, _prepare_run(name, template, len(buffers), grid, spec, device, dtype, mask))
    moff = _mask_offsets(device, spec) if mask is not None else _zero_counter(device)
    counter = counter if counter is not None else _zero_counter(device)
    mask_buf = mask if mask is not None else buffers[0]
    seed = int(seed) % 2**64
    prepared.call(*[b.data for b in buffers], mask_buf.data, moff.data, seed & 0xFFFFFFFF, seed >> 32, counter.data)


def _prepare_run(
    name: str,
    template: str,
    n_buffers: int,
    grid: tuple[int, int],
    spec: AttentionSpec,
    device: Device,
    dtype: np.dtype,
    mask: Tensor | None,
) -> PreparedLaunch:
    """``_run``'s launch of one signature: the scalar arguments but the seed's two words bound."""
    rows, planes = grid
    fmt = _source_fields(dtype, spec, device)
    key = ("attention", name, *sorted((k, v) for k, v in fmt.items() if k != "philox"))
    types = _arg_types(n_buffers, fmt)
    resolved = get_kernel(key, device, lambda: (_COMMON + template).format(**fmt), name, types)
    local = max(1, min(BLOCK_ROWS, resolved.max_local, 1 << (max(rows, 1) - 1).bit_length()))
    gsize = (-(-rows // local) * local, planes)
    scalars = _scalar_args(spec, fmt, 0, mask)
    first = n_buffers + 2  # the buffers, the mask and its offsets, then the scalars; the counter last
    seed_at = first + 8  # the seed's two words stay per call
    bound = {first + k: v for k, v in enumerate(scalars) if first + k not in (seed_at, seed_at + 1)}
    return PreparedLaunch.binding(resolved.kernel, gsize, (local, 1), bound, device.queue)


def _lse_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == float64 else np.dtype(np.float32)


def _portable_forward(q, k, v, mask, spec, seed, counter):
    out = Tensor.empty((*spec.lead, spec.L, spec.Ev), q.dtype, q.device)
    lse = Tensor.empty((*spec.lead, spec.L), _lse_dtype(q.dtype), q.device)
    _run("netcl_attention_fwd", _FORWARD, [q, k, v, out, lse], (spec.L, spec.BH), spec, (mask, seed, counter))
    return out, lse


def _portable_backward(g, q, k, v, out, lse, mask, spec, seed, counter):
    dq = Tensor.empty(q.shape, q.dtype, q.device)
    dk = Tensor.empty(k.shape, k.dtype, k.device)
    dv = Tensor.empty(v.shape, v.dtype, v.device)
    extra = (mask, seed, counter)
    _run("netcl_attention_bwd_kv", _BACKWARD_KV, [q, k, v, out, g, lse, dk, dv], (spec.S, spec.BHkv), spec, extra)
    _run("netcl_attention_bwd_q", _BACKWARD_Q, [q, k, v, out, g, lse, dq], (spec.L, spec.BH), spec, extra)
    return dq, dk, dv


VARIANTS.append(
    AttentionVariant(
        "portable",
        lambda device, dtype, spec: device.kind == "opencl",
        _portable_forward,
        _portable_backward,
    )
)


# ---- entry points ----------------------------------------------------------------------------
@backend_op(_TWINS)
def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    spec: AttentionSpec,
    seed: int = 0,
    counter: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(output ``lead + (L, Ev)``, row log-sum-exp ``lead + (L,)``) of a validated call (``check_attention``).

    ``seed`` and ``counter`` (a device int32 counter, or None for 0) choose the dropout mask when
    ``spec.dropout_p > 0``. One kernel launch on OpenCL; the twin on the NumPy backend.
    """
    if spec.S == 0:  # no keys: zeros, lse -inf (what the kernel computes, without a launch on empty inputs)
        out = Tensor.zeros((*spec.lead, spec.L, spec.Ev), q.dtype, q.device)
        lse = Tensor.from_host(q.device, np.full((*spec.lead, spec.L), -np.inf), _lse_dtype(q.dtype))
        return out, lse
    return select_variant(q.device, q.dtype, spec).forward(q, k, v, mask, spec, seed, counter)


def attention_backward(
    g: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    mask: Tensor | None,
    spec: AttentionSpec,
    seed: int = 0,
    counter: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) for upstream ``g`` (out's shape) from the forward's ``out`` and ``lse``: two launches.

    The same ``seed`` and ``counter`` as the forward regenerate its dropout mask.
    """
    if g.dtype != q.dtype:
        from netcl.runtime.ops.layout import cast

        g = cast(g, q.dtype)
    return attention_gradients(g, q, k, v, out, lse, mask, spec, seed, counter)


@backend_op(_TWINS, device_arg="q")
def attention_gradients(
    g: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    mask: Tensor | None,
    spec: AttentionSpec,
    seed: int,
    counter: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``attention_backward`` once ``g`` has q's dtype."""
    if spec.S == 0 or spec.L == 0:
        return tuple(Tensor.zeros(t.shape, t.dtype, t.device) for t in (q, k, v))  # type: ignore[return-value]
    return select_variant(q.device, q.dtype, spec).backward(g, q, k, v, out, lse, mask, spec, seed, counter)


# ---- packed self-attention -----------------------------------------------------------------------
def _packed_kernels(qkv: Tensor, spec: AttentionSpec) -> PackedKernels | None:
    """The packed kernels of the variant that takes this call, if it has them and they take it (None on the
    NumPy backend, which no variant takes)."""
    variant = next((v for v in VARIANTS if v.supports(qkv.device, qkv.dtype, spec)), None)
    packed = None if variant is None else variant.packed
    return packed if packed is not None and packed.supports(qkv.device, qkv.dtype, spec) else None


def _head_strides(spec: AttentionSpec, width: int) -> tuple[int, int, int, int]:
    """Element strides of (B, H, L, E) over rows of ``width`` elements, head h at columns h * E."""
    return (spec.L * width, spec.E, width, 1)


def _unpacked(qkv: Tensor, spec: AttentionSpec) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v of a packed tensor as (B, H, L, E) tensors (three strided copies)."""
    d = spec.Hq * spec.E
    shape, strides = (*spec.lead, spec.L, spec.E), _head_strides(spec, 3 * d)
    return tuple(strided_copy(qkv, shape, strides, part * d) for part in range(3))  # type: ignore[return-value]


def _heads(x: Tensor, spec: AttentionSpec) -> Tensor:
    """(B, L, H * E) as (B, H, L, E)."""
    return strided_copy(x, (*spec.lead, spec.L, spec.E), _head_strides(spec, spec.Hq * spec.E))


def _merged(x: Tensor, spec: AttentionSpec) -> Tensor:
    """(B, H, L, E) as (B, L, H * E)."""
    merged = Tensor.empty((spec.lead[0], spec.L, spec.Hq * spec.E), x.dtype, x.device)
    return strided_write(merged, x, _head_strides(spec, spec.Hq * spec.E))


def packed_attention_forward(qkv: Tensor, spec: AttentionSpec) -> tuple[Tensor, Tensor]:
    """Self-attention of the q, k and v packed in ``qkv`` (B, L, 3 * H * E) (a spec from
    ``check_packed_attention``): (output (B, L, H * E), heads merged, lse (B, H, L)). Where the variant that
    takes the call has packed kernels, one launch reads them in place; elsewhere q, k and v are copied out
    to (B, H, L, E) first and the output merged after (``attention_forward`` in between)."""
    kernels = _packed_kernels(qkv, spec)
    if kernels is not None:
        return kernels.forward(qkv, spec)
    out, lse = attention_forward(*_unpacked(qkv, spec), None, spec)
    return _merged(out, spec), lse


def packed_attention_backward(g: Tensor, qkv: Tensor, out: Tensor, lse: Tensor, spec: AttentionSpec) -> Tensor:
    """The gradient of ``packed_attention_forward``'s output ``out`` for upstream ``g`` (out's shape), as one
    packed (B, L, 3 * H * E) tensor."""
    if g.dtype != qkv.dtype:
        from netcl.runtime.ops.layout import cast

        g = cast(g, qkv.dtype)
    kernels = _packed_kernels(qkv, spec)
    if kernels is not None:
        return kernels.backward(g, qkv, out, lse, spec)
    grads = attention_gradients(_heads(g, spec), *_unpacked(qkv, spec), _heads(out, spec), lse, None, spec, 0, None)
    dqkv = Tensor.empty(qkv.shape, qkv.dtype, qkv.device)
    d = spec.Hq * spec.E
    for part, grad in enumerate(grads):  # together they cover dqkv: no fill first
        strided_write(dqkv, grad, _head_strides(spec, 3 * d), part * d)
    return dqkv


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    seed: int | None = None,
) -> Tensor:
    """torch's ``scaled_dot_product_attention`` on Tensors (no autograd): softmax(q k^T * scale + mask) v.

    ``seed`` fixes the dropout mask; None draws one from the global generator (``manual_seed``).
    """
    spec = check_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    for name, t in (("key", k), ("value", v), ("attn_mask", attn_mask)):
        if t is not None and t.device is not q.device:
            raise ValueError(f"scaled_dot_product_attention: {name} is on {t.device}, query on {q.device}")
    if seed is None:
        seed = random.next_seed() if spec.dropout_p > 0 else 0
    return attention_forward(q, k, v, attn_mask, spec, seed)[0]


__all__ = [
    "ADDITIVE_MASK",
    "BOOL_MASK",
    "NO_MASK",
    "VARIANTS",
    "AttentionSpec",
    "AttentionVariant",
    "PackedKernels",
    "attention_backward",
    "attention_forward",
    "check_attention",
    "check_packed_attention",
    "packed_attention_backward",
    "packed_attention_forward",
    "scaled_dot_product_attention",
    "select_variant",
]
