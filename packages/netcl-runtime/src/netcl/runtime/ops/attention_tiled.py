"""Attention kernels for NVIDIA GPUs: a quad of work-items per row, the row's features split four ways.

The portable kernels (``attention``) give each query or key row one work-item holding whole rows in
registers (``E + Ev`` floats and more); on a GPU that spills and leaves the SMs half idle. Here four
neighbouring work-items (a quad) share a row: each holds every fourth ``float4`` of it (columns
``4 * (quad + 4 i) .. + 3``, so a quad's loads of one local-memory row are 64 contiguous bytes), a dot
product is four partial sums added with two ``shfl.sync.bfly`` steps (inline PTX, NVIDIA's OpenCL), and
every other step (online softmax, ``P = exp(s - lse)``, the accumulations) is the portable kernels'
arithmetic on a quarter of the features. Scores of a few keys (or queries, ``CHUNKS``) are formed before
their reductions, so the shuffles and the softmax rescale are amortized.

* forward: 128 work-items = 32 query rows of one batch-head; key and value tiles of ``TN`` rows in
  local memory; writes the output and ``lse`` (log-sum-exp of the scaled scores) as the portable
  forward does, so either backward can follow either forward.
* ``bwd_q`` (first): the same layout; ``D_r = rowsum(dO_r * O_r)`` in the prologue, also written out
  (``L`` floats per batch-head) for the next kernel; dQ over key tiles.
* ``bwd_kv``: 32 key rows of one kv head; query, dO, lse and D tiles in local memory; dK and dV over the
  query tiles of every q head that reads the kv head.

Causal blocks (top-left aligned, as torch) skip the fully masked tiles. Calls with a mask or dropout, a
dtype other than float32, ``E != Ev`` or ``E`` outside 16..128 (a multiple of 16) go to the portable
kernels; ``NETCL_ATTENTION=portable`` sends every call there.
"""

from __future__ import annotations

import os

import numpy as np

from netcl.core import Device, Tensor
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import CLEAR_HOOKS, get_kernel, remember
from netcl.runtime.ops._grid import index_ctype, index_dtype
from netcl.runtime.ops.attention import VARIANTS, AttentionVariant
from netcl.runtime.ops.attention_spec import NO_MASK, AttentionSpec

#: keys (forward, bwd_q) or queries (bwd_kv) whose scores are formed before their quad reductions; more
#: spill registers (benchmarks/RESULTS.md, "attention on NVIDIA"; "Measurements moved out of source
#: docstrings", attention_tiled.py)
CHUNKS = {"fwd_chunk": 4, "q_chunk": 2, "kv_chunk": 2}
#: work-items per work-group: 32 rows of four
THREADS = 128
ROWS = THREADS // 4

_COMMON = """
#define D {D}
#define D4 (D / 4)
#define PER (D / 16)
#define TN {TN}
#define CAUSAL {causal}
#define FWD_CHUNK {fwd_chunk}
#define Q_CHUNK {q_chunk}
#define KV_CHUNK {kv_chunk}
typedef {idx} idx_t;
/* the sum of x over a quad (lanes 4k .. 4k + 3 of a warp); every lane of the warp must call it */
inline float netcl_quad_sum(float x) {{
    float y;
    asm("shfl.sync.bfly.b32 %0, %1, 1, 0x1f, 0xffffffff;" : "=f"(y) : "f"(x));
    x += y;
    asm("shfl.sync.bfly.b32 %0, %1, 2, 0x1f, 0xffffffff;" : "=f"(y) : "f"(x));
    return x + y;
}}
/* this quad member's part of the dot product of a row it holds (regs) and local row t of a tile */
inline float netcl_part_dot(const float4* regs, __local const float4* tile, const int t, const int quad) {{
    float acc = 0.0f;
    #pragma unroll
    for (int i = 0; i < PER; ++i) acc += dot(regs[i], tile[t * D4 + quad + 4 * i]);
    return acc;
}}
/* rows first .. first + n - 1 of a and b (row length D) into local tiles of TN rows, zeros past n */
inline void netcl_stage_tiles(__local float4* ta, __local float4* tb, __global const float4* a,
                              __global const float4* b, const idx_t first, const int n, const int tid) {{
    for (int t = tid; t < TN * D4; t += 128) {{
        const int row = t / D4;
        ta[t] = row < n ? a[(first + row) * D4 + t % D4] : (float4)(0.0f);
        tb[t] = row < n ? b[(first + row) * D4 + t % D4] : (float4)(0.0f);
    }}
}}
"""

_FORWARD = """
__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void netcl_attention_fwd_quad(__global const float* q, __global const float* k, __global const float* v,
                              __global float* out, __global float* lse, const idx_t L, const idx_t S,
                              const idx_t Hq, const idx_t group, const idx_t Hkv, const float scale) {{
    __local float4 ks[TN * D4];
    __local float4 vs[TN * D4];
    const int tid = get_local_id(0), quad = tid & 3;
    const idx_t bh = get_group_id(1);
    const idx_t row0 = (idx_t)get_group_id(0) * 32, r = row0 + (tid >> 2);
    const int live = r < L;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
    __global const float4* kb = (__global const float4*)(k + kvh * S * D);
    __global const float4* vb = (__global const float4*)(v + kvh * S * D);
    __global const float4* qr = (__global const float4*)(q + (bh * L + (live ? r : 0)) * D);
    float4 qv[PER], acc[PER];
    #pragma unroll
    for (int i = 0; i < PER; ++i) {{
        qv[i] = live ? qr[quad + 4 * i] * scale : (float4)(0.0f);
        acc[i] = (float4)(0.0f);
    }}
    float m = -INFINITY, l = 0.0f;
#if CAUSAL
    const idx_t nend = min(S, row0 + 32);
#else
    const idx_t nend = S;
#endif
    for (idx_t n0 = 0; n0 < nend; n0 += TN) {{
        const int tn = (int)min((idx_t)TN, S - n0);
        barrier(CLK_LOCAL_MEM_FENCE);
        netcl_stage_tiles(ks, vs, kb, vb, n0, tn, tid);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int j0 = 0; j0 < TN; j0 += FWD_CHUNK) {{
            float s[FWD_CHUNK];
            #pragma unroll
            for (int jj = 0; jj < FWD_CHUNK; ++jj) s[jj] = netcl_part_dot(qv, ks, j0 + jj, quad);
            float mt = m;
            #pragma unroll
            for (int jj = 0; jj < FWD_CHUNK; ++jj) {{
                s[jj] = netcl_quad_sum(s[jj]);
                const idx_t c = n0 + j0 + jj;
                if (j0 + jj >= tn || (CAUSAL && c > r)) s[jj] = -INFINITY;
                mt = fmax(mt, s[jj]);
            }}
            if (mt == -INFINITY) continue;  /* nothing visible to this row yet (uniform within the quad) */
            const float corr = exp(m - mt);
            l *= corr;
            #pragma unroll
            for (int i = 0; i < PER; ++i) acc[i] *= corr;
            #pragma unroll
            for (int jj = 0; jj < FWD_CHUNK; ++jj) {{
                const float p = exp(s[jj] - mt);
                l += p;
                #pragma unroll
                for (int i = 0; i < PER; ++i) acc[i] += p * vs[(j0 + jj) * D4 + quad + 4 * i];
            }}
            m = mt;
        }}
    }}
    if (!live) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    __global float4* orow = (__global float4*)(out + (bh * L + r) * D);
    #pragma unroll
    for (int i = 0; i < PER; ++i) orow[quad + 4 * i] = acc[i] * inv;
    if (quad == 0) lse[bh * L + r] = l > 0.0f ? m + log(l) : -INFINITY;
}}
"""

_BACKWARD_Q = """
__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void netcl_attention_bwd_q_quad(__global const float* q, __global const float* k, __global const float* v,
                                __global const float* out, __global const float* g, __global const float* lse,
                                __global float* dq, __global float* drow, const idx_t L, const idx_t S, const idx_t Hq,
                                const idx_t group, const idx_t Hkv, const float scale) {{
    __local float4 ks[TN * D4];
    __local float4 vs[TN * D4];
    const int tid = get_local_id(0), quad = tid & 3;
    const idx_t bh = get_group_id(1);
    const idx_t row0 = (idx_t)get_group_id(0) * 32, r = row0 + (tid >> 2);
    const int live = r < L;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
    __global const float4* kb = (__global const float4*)(k + kvh * S * D);
    __global const float4* vb = (__global const float4*)(v + kvh * S * D);
    const idx_t at = (bh * L + (live ? r : 0)) * D;
    __global const float4* qr = (__global const float4*)(q + at);
    __global const float4* gr = (__global const float4*)(g + at);
    __global const float4* orow = (__global const float4*)(out + at);
    float4 qv[PER], gv[PER], dqv[PER];
    float dpart = 0.0f;
    #pragma unroll
    for (int i = 0; i < PER; ++i) {{
        qv[i] = live ? qr[quad + 4 * i] * scale : (float4)(0.0f);
        gv[i] = live ? gr[quad + 4 * i] : (float4)(0.0f);
        dpart += live ? dot(gv[i], orow[quad + 4 * i]) : 0.0f;
        dqv[i] = (float4)(0.0f);
    }}
    const float dr = netcl_quad_sum(dpart);
    const float lr = live ? lse[bh * L + r] : -INFINITY;
    if (live && quad == 0) drow[bh * L + r] = dr;  /* for bwd_kv, which runs next */
#if CAUSAL
    const idx_t nend = min(S, row0 + 32);
#else
    const idx_t nend = S;
#endif
    for (idx_t n0 = 0; n0 < nend; n0 += TN) {{
        const int tn = (int)min((idx_t)TN, S - n0);
        barrier(CLK_LOCAL_MEM_FENCE);
        netcl_stage_tiles(ks, vs, kb, vb, n0, tn, tid);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int j0 = 0; j0 < TN; j0 += Q_CHUNK) {{
            float s[Q_CHUNK], dp[Q_CHUNK];
            #pragma unroll
            for (int jj = 0; jj < Q_CHUNK; ++jj) {{
                s[jj] = netcl_part_dot(qv, ks, j0 + jj, quad);
                dp[jj] = netcl_part_dot(gv, vs, j0 + jj, quad);
            }}
            #pragma unroll
            for (int jj = 0; jj < Q_CHUNK; ++jj) {{
                s[jj] = netcl_quad_sum(s[jj]);
                dp[jj] = netcl_quad_sum(dp[jj]);
            }}
            if (lr == -INFINITY) continue;
            #pragma unroll
            for (int jj = 0; jj < Q_CHUNK; ++jj) {{
                const idx_t c = n0 + j0 + jj;
                if (j0 + jj >= tn || (CAUSAL && c > r)) continue;
                const float ds = exp(s[jj] - lr) * (dp[jj] - dr);
                #pragma unroll
                for (int i = 0; i < PER; ++i) dqv[i] += ds * ks[(j0 + jj) * D4 + quad + 4 * i];
            }}
        }}
    }}
    if (!live) return;
    __global float4* dqr = (__global float4*)(dq + (bh * L + r) * D);
    #pragma unroll
    for (int i = 0; i < PER; ++i) dqr[quad + 4 * i] = dqv[i] * scale;
}}
"""

_BACKWARD_KV = """
__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void netcl_attention_bwd_kv_quad(__global const float* q, __global const float* k, __global const float* v,
                                 __global const float* g, __global const float* lse, __global const float* drow,
                                 __global float* dk, __global float* dv, const idx_t L, const idx_t S,
                                 const idx_t Hq, const idx_t group, const idx_t Hkv, const float scale) {{
    __local float4 qs[TN * D4];
    __local float4 gs[TN * D4];
    __local float ls[TN];
    __local float dd[TN];
    const int tid = get_local_id(0), quad = tid & 3;
    const idx_t kvh = get_group_id(1);
    const idx_t c0 = (idx_t)get_group_id(0) * 32, c = c0 + (tid >> 2);
    const int live = c < S;
    const idx_t at = (kvh * S + (live ? c : 0)) * D;
    __global const float4* kr = (__global const float4*)(k + at);
    __global const float4* vr = (__global const float4*)(v + at);
    float4 kv[PER], vv[PER], dkv[PER], dvv[PER];
    #pragma unroll
    for (int i = 0; i < PER; ++i) {{
        kv[i] = live ? kr[quad + 4 * i] * scale : (float4)(0.0f);
        vv[i] = live ? vr[quad + 4 * i] : (float4)(0.0f);
        dkv[i] = (float4)(0.0f);
        dvv[i] = (float4)(0.0f);
    }}
    const idx_t first = (kvh / Hkv) * Hq + (kvh % Hkv) * group;
#if CAUSAL
    const idx_t mstart = c0;  /* rows before c0 see no key of this block */
#else
    const idx_t mstart = 0;
#endif
    for (idx_t bh = first; bh < first + group; ++bh) {{
        __global const float4* qb = (__global const float4*)(q + bh * L * D);
        __global const float4* gb = (__global const float4*)(g + bh * L * D);
        for (idx_t m0 = mstart; m0 < L; m0 += TN) {{
            const int tm = (int)min((idx_t)TN, L - m0);
            barrier(CLK_LOCAL_MEM_FENCE);
            netcl_stage_tiles(qs, gs, qb, gb, m0, tm, tid);
            for (int i = tid; i < TN; i += 128) {{
                dd[i] = i < tm ? drow[bh * L + m0 + i] : 0.0f;
                ls[i] = i < tm ? lse[bh * L + m0 + i] : -INFINITY;
            }}
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int i0 = 0; i0 < TN; i0 += KV_CHUNK) {{
                float s[KV_CHUNK], dp[KV_CHUNK];
                #pragma unroll
                for (int ii = 0; ii < KV_CHUNK; ++ii) {{
                    s[ii] = netcl_part_dot(kv, qs, i0 + ii, quad);
                    dp[ii] = netcl_part_dot(vv, gs, i0 + ii, quad);
                }}
                #pragma unroll
                for (int ii = 0; ii < KV_CHUNK; ++ii) {{
                    s[ii] = netcl_quad_sum(s[ii]);
                    dp[ii] = netcl_quad_sum(dp[ii]);
                }}
                #pragma unroll
                for (int ii = 0; ii < KV_CHUNK; ++ii) {{
                    const idx_t row = m0 + i0 + ii;
                    const float lr = ls[i0 + ii];
                    if (i0 + ii >= tm || lr == -INFINITY || (CAUSAL && c > row)) continue;
                    const float p = exp(s[ii] - lr);
                    const float ds = p * (dp[ii] - dd[i0 + ii]);
                    #pragma unroll
                    for (int i = 0; i < PER; ++i) {{
                        dvv[i] += p * gs[(i0 + ii) * D4 + quad + 4 * i];
                        dkv[i] += ds * qs[(i0 + ii) * D4 + quad + 4 * i];
                    }}
                }}
            }}
        }}
    }}
    if (!live) return;
    __global float4* dkr = (__global float4*)(dk + (kvh * S + c) * D);
    __global float4* dvr = (__global float4*)(dv + (kvh * S + c) * D);
    #pragma unroll
    for (int i = 0; i < PER; ++i) {{
        dkr[quad + 4 * i] = dkv[i] * scale;
        dvr[quad + 4 * i] = dvv[i];
    }}
}}
"""


def _tile_rows(spec: AttentionSpec) -> int:
    """Rows per local tile: two tiles of ``TN x E`` floats in at most 32 KB."""
    return 64 if spec.E <= 64 else 32


def supports(device: Device, dtype: np.dtype, spec: AttentionSpec) -> bool:
    """An NVIDIA GPU, float32, no mask, no dropout, ``E == Ev`` in 16..128 and a multiple of 16."""
    if not device.is_gpu or os.environ.get("NETCL_ATTENTION", "").strip().lower() == "portable":
        return False
    return (
        "NVIDIA" in device.platform_name
        and np.dtype(dtype) == np.float32
        and spec.mask_kind == NO_MASK
        and spec.dropout_p == 0.0
        and spec.Ev == spec.E
        and spec.E % 16 == 0
        and 16 <= spec.E <= 128
    )


#: (kernel name, device, buffer count, rows, planes, spec) -> the prepared launch of ``_run``
_LAUNCHES: dict[tuple, PreparedLaunch] = {}
CLEAR_HOOKS.append(_LAUNCHES.clear)


def _run(name: str, template: str, buffers: list[Tensor], rows: int, planes: int, spec: AttentionSpec) -> None:
    """Launch ``name`` over ``buffers``; its kernel, sizes and scalars are prepared once per signature."""
    if rows == 0 or planes == 0:
        return
    device = buffers[0].device
    key = (name, device, len(buffers), rows, planes, spec)
    prepared = _LAUNCHES.get(key)
    if prepared is None:
        prepared = remember(_LAUNCHES, key, _prepare_run(name, template, len(buffers), rows, planes, spec, device))
    prepared.call(*[b.data for b in buffers])


def _prepare_run(
    name: str, template: str, n_buffers: int, rows: int, planes: int, spec: AttentionSpec, device: Device
) -> PreparedLaunch:
    biggest = max(spec.BH * spec.L, spec.BHkv * spec.S) * spec.E
    idx = index_ctype(biggest)
    fields = {"D": spec.E, "TN": _tile_rows(spec), "causal": int(spec.causal), "idx": idx, **CHUNKS}
    key = ("attention-quad", name, *sorted(fields.items()))
    it = index_dtype(idx)
    types = [None] * n_buffers + [it] * 5 + [np.float32]
    resolved = get_kernel(key, device, lambda: (_COMMON + template).format(**fields), name, types)
    gsize = (-(-rows // ROWS) * THREADS, planes)
    scalars = [it.type(v) for v in (spec.L, spec.S, spec.Hq, spec.group, spec.Hkv)] + [np.float32(spec.scale)]
    bound = {n_buffers + k: v for k, v in enumerate(scalars)}
    return PreparedLaunch.binding(resolved.kernel, gsize, (THREADS, 1), bound, device.queue)


def forward(q, k, v, mask, spec: AttentionSpec, seed, counter) -> tuple[Tensor, Tensor]:
    out = Tensor.empty((*spec.lead, spec.L, spec.Ev), q.dtype, q.device)
    lse = Tensor.empty((*spec.lead, spec.L), np.float32, q.device)
    _run("netcl_attention_fwd_quad", _FORWARD, [q, k, v, out, lse], spec.L, spec.BH, spec)
    return out, lse


def backward(g, q, k, v, out, lse, mask, spec: AttentionSpec, seed, counter) -> tuple[Tensor, Tensor, Tensor]:
    dq = Tensor.empty(q.shape, q.dtype, q.device)
    dk = Tensor.empty(k.shape, k.dtype, k.device)
    dv = Tensor.empty(v.shape, v.dtype, v.device)
    drow = Tensor.empty(lse.shape, np.float32, q.device)  # rowsum(dO * O): O(L) statistics
    _run("netcl_attention_bwd_q_quad", _BACKWARD_Q, [q, k, v, out, g, lse, dq, drow], spec.L, spec.BH, spec)
    _run("netcl_attention_bwd_kv_quad", _BACKWARD_KV, [q, k, v, g, lse, drow, dk, dv], spec.S, spec.BHkv, spec)
    return dq, dk, dv


VARIANTS.insert(0, AttentionVariant("nvidia-quad", supports, forward, backward))
