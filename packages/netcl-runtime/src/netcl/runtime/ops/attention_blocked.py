"""Attention kernels blocked over registers like an SGEMM: each work-item owns a 4 x 4 tile of scores.

The quad kernels (``attention_tiled``) form each score as a dot product of a register row with a local row:
one local load per four FMAs. Here a work-group computes a ``BM x BN`` block of scores (query rows x keys)
from local tiles, each work-item a 4 x 4 micro-tile (4 rows x 4 keys): per four features it loads 4 + 4
``float4`` and does 64 FMAs, one local load per eight. The products that contract over keys or rows
(``O += P V``, ``dQ += dS K``, ``dV += P^T dO``, ``dK += dS^T Q``) read the probabilities from a local
tile and have the same ratio: each work-item owns 4 rows x ``NCH`` float4 columns of the result.

Portable OpenCL C (no extensions): row statistics pass through local memory, not through shuffles.

Local tiles: feature rows (``E`` floats) are stored row-major with their float4 chunks XOR-swizzled by
the row (chunk ``c`` of row ``r`` at ``c ^ (r & SWM)``), so work-items reading different rows at one
feature hit different banks; the probability tiles (``BM x BN``) are plain. A work-item owns rows
``ty + RG * i`` and keys ``tx + G * j`` (strided, ``i, j < 4``); the ``G`` work-items sharing rows are
consecutive, so their reads of a row tile are broadcasts.

* forward (``netcl_attention_fwd_blk``): one work-group per (batch-head, ``BM`` query rows); Q resident
  (pre-scaled), the K tile, then the V tile in one buffer; each key tile: scores, row maxima (partial
  maxima of the ``G`` work-items of a row through the probability tile), one online-softmax rescale,
  ``P`` into local memory, ``O += P V``. Writes the output and ``lse`` (log-sum-exp of the scaled
  scores) as the other variants do, so any backward can follow any forward.
* ``bwd_q`` (first): Q and dO resident; ``D = rowsum(dO * O)`` in the prologue, also written out for
  ``bwd_kv``; each key tile: ``S`` and ``dP = dO V^T`` micro-tiles, ``dS = P (dP - D)`` into the V buffer,
  ``dQ += dS K``.
* ``bwd_kv``: one work-group per (kv head, ``BN`` keys), K and V resident; each query tile of each q head
  of the group: ``S^T``, ``dP^T``, ``P^T`` and ``dS^T`` into local memory, ``dV += P^T dO``,
  ``dK += dS^T Q``.

Causal calls (top-left aligned, as torch) skip the tiles that are wholly masked. ``E == Ev`` must be 16,
32, 64 or 128 (the swizzle needs a power-of-two number of chunks), float32, no mask, no dropout; other
calls go to the next variant. The block sizes (``configs``) are the largest that fit the device's local
memory, at most 48 KB (NVIDIA's limit without an opt-in).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from netcl.core import Device, Tensor
from netcl.runtime.ops import attention_tiled  # noqa: F401  registers the quad variant first: ours goes before it
from netcl.runtime.ops._common import get_kernel, remember
from netcl.runtime.ops._grid import index_ctype, index_dtype, launch_prepared
from netcl.runtime.ops.attention import VARIANTS, AttentionVariant, PackedKernels
from netcl.runtime.ops.attention_spec import NO_MASK, AttentionSpec

#: local memory the block sizes may use, at most (bytes)
LOCAL_BUDGET = 48 * 1024
#: feature sizes the kernels take (at 128 bwd_kv has no blocks within 48 KB: the backward is the next variant's)
FEATURES = (16, 32, 64, 128)

_COMMON = """
#define LANE(f, u) ((u) == 0 ? (f).x : (u) == 1 ? (f).y : (u) == 2 ? (f).z : (f).w)
#define E {E}
#define E4 (E / 4)
#define BM {BM}
#define BN {BN}
#define CAUSAL {causal}
#define SWM (E4 < 8 ? E4 - 1 : 7)
#define CH(row, c) ((row) * E4 + ((c) ^ ((row) & SWM)))   /* float4 index of chunk c of a swizzled row */
#define PACKED {packed}
typedef {idx} idx_t;

/* Float offsets of row r of head plane bh: QROW for q (and dq), KROW / VROW for k / v (and dk / dv), OROW for
   the output and its gradient; RS4 / ORS4: the row strides in float4. Contiguous: (B*H, L, E) planes. PACKED
   (self-attention, Hq == Hkv, L == S): q, k and v are one (B, L, 3, H, E) tensor, out and g (B, L, H, E). */
#if PACKED
#define QROW(bh, r) ((((bh) / Hq * L + (r)) * 3 * Hq + (bh) % Hq) * E)
#define KROW(bh, r) (QROW(bh, r) + Hq * E)
#define VROW(bh, r) (QROW(bh, r) + 2 * Hq * E)
#define OROW(bh, r) ((((bh) / Hq * L + (r)) * Hq + (bh) % Hq) * E)
#define RS4 (3 * Hq * E4)
#define ORS4 (Hq * E4)
#else
#define QROW(bh, r) (((bh) * L + (r)) * E)
#define KROW(bh, r) (((bh) * S + (r)) * E)
#define VROW(bh, r) KROW(bh, r)
#define OROW(bh, r) QROW(bh, r)
#define RS4 E4
#define ORS4 E4
#endif

/* rows first .. first + n - 1 of src (rs4 float4 apart) times mul into rows 0 .. rows - 1 of a swizzled tile
   (zeros past n) */
inline void blk_stage(__local float4* dst, __global const float4* src, const idx_t rs4, const idx_t first,
                      const int n, const int rows, const float mul, const int lid, const int nthreads) {{
    for (int t = lid; t < rows * E4; t += nthreads) {{
        const int row = t / E4, c = t % E4;
        dst[CH(row, c)] = row < n ? src[(first + row) * rs4 + c] * mul : (float4)(0.0f);
    }}
}}

/* acc[4 i + j] += a_i . b_j over E: a_i = row ra + sa * i of swizzled tile a, b_j = row rb + sb * j of b */
inline void blk_dots(float* acc, __local const float4* a, const int ra, const int sa, __local const float4* b,
                     const int rb, const int sb) {{
    #pragma unroll
    for (int c = 0; c < E4; ++c) {{
        float4 x[4], y[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
            x[i] = a[CH(ra + sa * i, c)];
            y[i] = b[CH(rb + sb * i, c)];
        }}
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
            #pragma unroll
            for (int j = 0; j < 4; ++j) {{
                float s = acc[4 * i + j];
                s += x[i].x * y[j].x;
                s += x[i].y * y[j].y;
                s += x[i].z * y[j].z;
                s += x[i].w * y[j].w;
                acc[4 * i + j] = s;
            }}
        }}
    }}
}}

/* acc[NCH * i + n] += sum_t p[ra + sa * i][t] * b[t][chunk c0 + cs * n] for t < K: p plain rows of K floats
   (K / 4 float4), b a swizzled tile of E-wide rows */
inline void blk_acc(float4* acc, __local const float4* p, const int ra, const int sa, const int K,
                    __local const float4* b, const int c0, const int cs) {{
    for (int t4 = 0; t4 < K / 4; ++t4) {{
        float4 x[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) x[i] = p[(ra + sa * i) * (K / 4) + t4];
        #pragma unroll
        for (int u = 0; u < 4; ++u) {{
            const int row = 4 * t4 + u;
            #pragma unroll
            for (int n = 0; n < NCH; ++n) {{
                const float4 y = b[CH(row, c0 + cs * n)];
                #pragma unroll
                for (int i = 0; i < 4; ++i) acc[i * NCH + n] += LANE(x[i], u) * y;
            }}
        }}
    }}
}}
"""

#: fwd and bwd_q: a work-item owns rows ty + RG i and keys tx + G j, output chunks tx + G n
_ROW_OWNERS = """
#define G (BN / 4)
#define RG (BM / 4)
#define NCH (E4 / G)
"""
#: bwd_kv: a work-item owns keys tk + KG i and rows tr + GR j, dK / dV chunks tr + GR n
_KEY_OWNERS = """
#define GR (BM / 4)
#define KG (BN / 4)
#define NCH (E4 / GR)
"""

_FORWARD = """
__kernel __attribute__((reqd_work_group_size(RG * G, 1, 1)))
void netcl_attention_fwd_blk(__global const float* q, __global const float* k, __global const float* v,
                             __global float* out, __global float* lse, const idx_t L, const idx_t S,
                             const idx_t Hq, const idx_t group, const idx_t Hkv, const float scale) {{
    __local float4 qs[BM * E4];
    __local float4 kvs[BN * E4];      /* K tile, then V tile */
    __local float4 ps4[BM * BN / 4];  /* partial row maxima, then P */
    __local float* ps = (__local float*)ps4;
    const int lid = get_local_id(0), tx = lid % G, ty = lid / G;
    const idx_t bh = get_group_id(1), row0 = (idx_t)get_group_id(0) * BM;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
    __global const float4* kb = (__global const float4*)(k + KROW(kvh, 0));
    __global const float4* vb = (__global const float4*)(v + VROW(kvh, 0));
    blk_stage(qs, (__global const float4*)(q + QROW(bh, 0)), RS4, row0, (int)min((idx_t)BM, L - row0), BM, scale,
              lid, RG * G);
    float4 acc[4 * NCH];
    float m[4], l[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {{
        m[i] = -INFINITY;
        l[i] = 0.0f;
        #pragma unroll
        for (int n = 0; n < NCH; ++n) acc[i * NCH + n] = (float4)(0.0f);
    }}
#if CAUSAL
    const idx_t nend = min(S, row0 + BM);
#else
    const idx_t nend = S;
#endif
    for (idx_t n0 = 0; n0 < nend; n0 += BN) {{
        const int tn = (int)min((idx_t)BN, S - n0);
        barrier(CLK_LOCAL_MEM_FENCE);
        blk_stage(kvs, kb, RS4, n0, tn, BN, 1.0f, lid, RG * G);
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[16];
        #pragma unroll
        for (int t = 0; t < 16; ++t) s[t] = 0.0f;
        blk_dots(s, qs, ty, RG, kvs, tx, G);
        float pm[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
            pm[i] = -INFINITY;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {{
                const int c = tx + G * j;
                if (c >= tn || (CAUSAL && n0 + c > row0 + ty + RG * i)) s[4 * i + j] = -INFINITY;
                pm[i] = fmax(pm[i], s[4 * i + j]);
            }}
            ps[(ty + RG * i) * BN + tx] = pm[i];
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        float corr[4], mu[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
            float mt = m[i];
            for (int g4 = 0; g4 < G / 4; ++g4) {{
                const float4 x = ps4[(ty + RG * i) * (BN / 4) + g4];
                mt = fmax(mt, fmax(fmax(x.x, x.y), fmax(x.z, x.w)));
            }}
            mu[i] = mt == -INFINITY ? 0.0f : mt;   /* a row with nothing visible yet keeps p = 0 */
            corr[i] = exp(m[i] - mu[i]);
            m[i] = mt;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
            float sum = 0.0f;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {{
                const float p = exp(s[4 * i + j] - mu[i]);
                sum += p;
                ps[(ty + RG * i) * BN + tx + G * j] = p;
            }}
            l[i] = l[i] * corr[i] + sum;
            #pragma unroll
            for (int n = 0; n < NCH; ++n) acc[i * NCH + n] *= corr[i];
        }}
        blk_stage(kvs, vb, RS4, n0, tn, BN, 1.0f, lid, RG * G);
        barrier(CLK_LOCAL_MEM_FENCE);
        blk_acc(acc, ps4, ty, RG, BN, kvs, tx, G);
    }}
    /* the row sums: each work-item holds the part over its keys */
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (int i = 0; i < 4; ++i) ps[(ty + RG * i) * BN + tx] = l[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (int i = 0; i < 4; ++i) {{
        const idx_t r = row0 + ty + RG * i;
        if (r >= L) continue;
        float sum = 0.0f;
        for (int g = 0; g < G; ++g) sum += ps[(ty + RG * i) * BN + g];
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        __global float4* orow = (__global float4*)(out + OROW(bh, r));
        #pragma unroll
        for (int n = 0; n < NCH; ++n) orow[tx + G * n] = acc[i * NCH + n] * inv;
        if (tx == 0) lse[bh * L + r] = sum > 0.0f ? m[i] + log(sum) : -INFINITY;
    }}
}}
"""

_BACKWARD_Q = """
__kernel __attribute__((reqd_work_group_size(RG * G, 1, 1)))
void netcl_attention_bwd_q_blk(__global const float* q, __global const float* k, __global const float* v,
                               __global const float* out, __global const float* g, __global const float* lse,
                               __global float* dq, __global float* drow, const idx_t L, const idx_t S,
                               const idx_t Hq, const idx_t group, const idx_t Hkv, const float scale) {{
    __local float4 qs[BM * E4];
    __local float4 gs[BM * E4];
    __local float4 ks[BN * E4];
    __local float4 vs[BN * E4 > BM * BN / 4 ? BN * E4 : BM * BN / 4];   /* V tile, then dS */
    __local float* ds = (__local float*)vs;
    const int lid = get_local_id(0), tx = lid % G, ty = lid / G;
    const idx_t bh = get_group_id(1), row0 = (idx_t)get_group_id(0) * BM;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
    __global const float4* kb = (__global const float4*)(k + KROW(kvh, 0));
    __global const float4* vb = (__global const float4*)(v + VROW(kvh, 0));
    const int tm = (int)min((idx_t)BM, L - row0);
    blk_stage(qs, (__global const float4*)(q + QROW(bh, 0)), RS4, row0, tm, BM, scale, lid, RG * G);
    blk_stage(gs, (__global const float4*)(g + OROW(bh, 0)), ORS4, row0, tm, BM, 1.0f, lid, RG * G);
    barrier(CLK_LOCAL_MEM_FENCE);
    /* D = rowsum(dO * O), one work-item per row, into ds for the others and into drow for bwd_kv */
    for (int t = lid; t < BM; t += RG * G) {{
        float d = 0.0f;
        if (t < tm) {{
            __global const float4* orow = (__global const float4*)(out + OROW(bh, row0 + t));
            for (int c = 0; c < E4; ++c) d += dot(gs[CH(t, c)], orow[c]);
            drow[bh * L + row0 + t] = d;
        }}
        ds[t] = d;
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
    float dr[4], lr[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {{
        const idx_t r = row0 + ty + RG * i;
        dr[i] = ds[ty + RG * i];
        const float x = r < L ? lse[bh * L + r] : INFINITY;
        lr[i] = x == -INFINITY ? INFINITY : x;   /* rows with no visible key (or padding): P = 0 */
    }}
    float4 acc[4 * NCH];
    #pragma unroll
    for (int t = 0; t < 4 * NCH; ++t) acc[t] = (float4)(0.0f);
#if CAUSAL
    const idx_t nend = min(S, row0 + BM);
#else
    const idx_t nend = S;
#endif
    for (idx_t n0 = 0; n0 < nend; n0 += BN) {{
        const int tn = (int)min((idx_t)BN, S - n0);
        barrier(CLK_LOCAL_MEM_FENCE);
        blk_stage(ks, kb, RS4, n0, tn, BN, 1.0f, lid, RG * G);
        blk_stage(vs, vb, RS4, n0, tn, BN, 1.0f, lid, RG * G);
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[16], dp[16];
        #pragma unroll
        for (int t = 0; t < 16; ++t) {{
            s[t] = 0.0f;
            dp[t] = 0.0f;
        }}
        blk_dots(s, qs, ty, RG, ks, tx, G);
        blk_dots(dp, gs, ty, RG, vs, tx, G);
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
            #pragma unroll
            for (int j = 0; j < 4; ++j) {{
                const int c = tx + G * j;
                const int hidden = c >= tn || (CAUSAL && n0 + c > row0 + ty + RG * i);
                const float p = hidden ? 0.0f : exp(s[4 * i + j] - lr[i]);
                ds[(ty + RG * i) * BN + c] = p * (dp[4 * i + j] - dr[i]);
            }}
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        blk_acc(acc, vs, ty, RG, BN, ks, tx, G);
    }}
    #pragma unroll
    for (int i = 0; i < 4; ++i) {{
        const idx_t r = row0 + ty + RG * i;
        if (r >= L) continue;
        __global float4* dqr = (__global float4*)(dq + QROW(bh, r));
        #pragma unroll
        for (int n = 0; n < NCH; ++n) dqr[tx + G * n] = acc[i * NCH + n] * scale;
    }}
}}
"""

_BACKWARD_KV = """
__kernel __attribute__((reqd_work_group_size(GR * KG, 1, 1)))
void netcl_attention_bwd_kv_blk(__global const float* q, __global const float* k, __global const float* v,
                                __global const float* g, __global const float* lse, __global const float* drow,
                                __global float* dk, __global float* dv, const idx_t L, const idx_t S,
                                const idx_t Hq, const idx_t group, const idx_t Hkv, const float scale) {{
    __local float4 ks[BN * E4];
    __local float4 vs[BN * E4];
    __local float4 qs[BM * E4];
    __local float4 gs[BM * E4];
    __local float4 pt4[BN * BM / 4];  /* P^T */
    __local float4 ds4[BN * BM / 4];  /* dS^T */
    __local float* pt = (__local float*)pt4;
    __local float* dst = (__local float*)ds4;
    const int lid = get_local_id(0), tr = lid % GR, tk = lid / GR;
    const idx_t kvh = get_group_id(1), c0 = (idx_t)get_group_id(0) * BN;
    const int tn = (int)min((idx_t)BN, S - c0);
    blk_stage(ks, (__global const float4*)(k + KROW(kvh, 0)), RS4, c0, tn, BN, 1.0f, lid, GR * KG);
    blk_stage(vs, (__global const float4*)(v + VROW(kvh, 0)), RS4, c0, tn, BN, 1.0f, lid, GR * KG);
    float4 dka[4 * NCH], dva[4 * NCH];
    #pragma unroll
    for (int t = 0; t < 4 * NCH; ++t) {{
        dka[t] = (float4)(0.0f);
        dva[t] = (float4)(0.0f);
    }}
    const idx_t first = (kvh / Hkv) * Hq + (kvh % Hkv) * group;
#if CAUSAL
    const idx_t mstart = c0;   /* rows before c0 see no key of this block */
#else
    const idx_t mstart = 0;
#endif
    for (idx_t bh = first; bh < first + group; ++bh) {{
        __global const float4* qb = (__global const float4*)(q + QROW(bh, 0));
        __global const float4* gb = (__global const float4*)(g + OROW(bh, 0));
        for (idx_t m0 = mstart; m0 < L; m0 += BM) {{
            const int tm = (int)min((idx_t)BM, L - m0);
            barrier(CLK_LOCAL_MEM_FENCE);
            blk_stage(qs, qb, RS4, m0, tm, BM, scale, lid, GR * KG);
            blk_stage(gs, gb, ORS4, m0, tm, BM, 1.0f, lid, GR * KG);
            float lr[4], dr[4];
            #pragma unroll
            for (int j = 0; j < 4; ++j) {{
                const int t = tr + GR * j;
                const float x = t < tm ? lse[bh * L + m0 + t] : INFINITY;
                lr[j] = x == -INFINITY ? INFINITY : x;   /* P = 0 for padding rows and rows seeing nothing */
                dr[j] = t < tm ? drow[bh * L + m0 + t] : 0.0f;
            }}
            barrier(CLK_LOCAL_MEM_FENCE);
            float s[16], dp[16];
            #pragma unroll
            for (int t = 0; t < 16; ++t) {{
                s[t] = 0.0f;
                dp[t] = 0.0f;
            }}
            blk_dots(s, ks, tk, KG, qs, tr, GR);    /* s[4 i + j]: key tk + KG i, row tr + GR j */
            blk_dots(dp, vs, tk, KG, gs, tr, GR);
            #pragma unroll
            for (int i = 0; i < 4; ++i) {{
                #pragma unroll
                for (int j = 0; j < 4; ++j) {{
                    const int c = tk + KG * i, t = tr + GR * j;
                    const int hidden = CAUSAL && c0 + c > m0 + t;
                    const float p = hidden ? 0.0f : exp(s[4 * i + j] - lr[j]);
                    pt[c * BM + t] = p;
                    dst[c * BM + t] = p * (dp[4 * i + j] - dr[j]);
                }}
            }}
            barrier(CLK_LOCAL_MEM_FENCE);
            blk_acc(dva, pt4, tk, KG, BM, gs, tr, GR);
            blk_acc(dka, ds4, tk, KG, BM, qs, tr, GR);
        }}
    }}
    #pragma unroll
    for (int i = 0; i < 4; ++i) {{
        const int c = tk + KG * i;
        if (c >= tn) continue;
        __global float4* dkr = (__global float4*)(dk + KROW(kvh, c0 + c));
        __global float4* dvr = (__global float4*)(dv + VROW(kvh, c0 + c));
        #pragma unroll
        for (int n = 0; n < NCH; ++n) {{
            dkr[tr + GR * n] = dka[i * NCH + n];
            dvr[tr + GR * n] = dva[i * NCH + n];
        }}
    }}
}}
"""


@dataclass(frozen=True)
class Blocks:
    """Block sizes of one kernel: ``BM`` query rows by ``BN`` keys per work-group step."""

    BM: int
    BN: int

    @property
    def threads(self) -> int:
        """Work-items per work-group: one per 4 x 4 micro-tile."""
        return self.BM * self.BN // 16


#: candidate (BM, BN), best first; ``configs`` takes the first that fits
_CANDIDATES = ((64, 64), (64, 32), (32, 64), (32, 32), (64, 16), (16, 32), (32, 16), (16, 16))


def _local_floats(kernel: str, e: int, b: Blocks) -> int:
    if kernel == "fwd":
        return b.BM * e + b.BN * e + b.BM * b.BN
    if kernel == "bwd_q":
        return 2 * b.BM * e + b.BN * e + max(b.BN * e, b.BM * b.BN)
    return 2 * b.BN * e + 2 * b.BM * e + 2 * b.BM * b.BN  # bwd_kv


def _fits(kernel: str, e: int, b: Blocks, budget: int) -> bool:
    if kernel == "bwd_kv":
        owners = b.BM // 4  # dK, dV chunks are split over the row groups
    else:
        owners = b.BN // 4
    chunks = e // 4
    return chunks % owners == 0 and chunks // owners <= 4 and 4 * _local_floats(kernel, e, b) <= budget


def configs(e: int, local_bytes: int) -> dict[str, Blocks | None]:
    """Block sizes of the three kernels for feature size ``e`` within ``local_bytes`` (None: a kernel has none)."""
    budget = min(local_bytes, LOCAL_BUDGET)
    return {
        kernel: next((Blocks(*c) for c in _CANDIDATES if _fits(kernel, e, Blocks(*c), budget)), None)
        for kernel in ("fwd", "bwd_q", "bwd_kv")
    }


def _device_configs(device: Device, e: int) -> dict[str, Blocks | None]:
    """``configs`` within the device's local memory, without blocks of more work-items than a group may hold
    (once per device and feature size: every call's dispatch asks, and the search over ``_CANDIDATES`` costs
    microseconds)."""
    known = _DEVICE_CONFIGS.get((device, e))
    if known is not None:
        return known
    if device.cl_device is None:
        return dict.fromkeys(("fwd", "bwd_q", "bwd_kv"))
    chosen = configs(e, int(device.cl_device.local_mem_size))
    most = int(device.cl_device.max_work_group_size)
    fitting = {kernel: b if b is not None and b.threads <= most else None for kernel, b in chosen.items()}
    return remember(_DEVICE_CONFIGS, (device, e), fitting)


#: (device, E) -> ``_device_configs``
_DEVICE_CONFIGS: dict[tuple[Device, int], dict[str, Blocks | None]] = {}


def is_default(device: Device) -> bool:
    """Whether the blocked kernels take calls on ``device`` without ``NETCL_ATTENTION=blocked``: OpenCL CPU
    devices and NVIDIA GPUs, where they were measured faster than the portable and quad kernels
    (benchmarks/RESULTS.md, "attention: blocked kernels", "blocked attention on the H100"); other GPUs keep
    the portable kernels until measured there."""
    return not device.is_gpu or "NVIDIA" in device.platform_name


def supports(device: Device, dtype: np.dtype, spec: AttentionSpec) -> bool:
    """An OpenCL device, float32, no mask, no dropout, ``E == Ev`` in ``FEATURES`` with forward blocks that fit
    (a backward without blocks that fit runs the next variant's kernels, which read the same ``lse``).

    ``NETCL_ATTENTION`` chooses: ``blocked`` on any OpenCL device, ``quad`` or ``portable`` never; unset,
    where ``is_default``.
    """
    choice = os.environ.get("NETCL_ATTENTION", "").strip().lower()
    if choice in ("quad", "portable") or (choice != "blocked" and not is_default(device)):
        return False
    return (
        device.kind == "opencl"
        and np.dtype(dtype) == np.float32
        and spec.mask_kind == NO_MASK
        and spec.dropout_p == 0.0
        and spec.Ev == spec.E
        and spec.E in FEATURES
        and _device_configs(device, spec.E)["fwd"] is not None
    )


_SOURCES = {"fwd": (_ROW_OWNERS, _FORWARD), "bwd_q": (_ROW_OWNERS, _BACKWARD_Q), "bwd_kv": (_KEY_OWNERS, _BACKWARD_KV)}


def _run(
    kernel: str, buffers: list[Tensor], items: int, planes: int, spec: AttentionSpec, packed: bool = False
) -> None:
    """Launch ``kernel`` over ``items`` rows (queries, or keys for bwd_kv) of ``planes`` heads; ``packed``: q, k
    and v (and dq, dk, dv) are one (B, L, 3, H, E) tensor, out and g (B, L, H, E)."""
    if items == 0 or planes == 0:
        return
    device = buffers[0].device
    blocks = _device_configs(device, spec.E)[kernel]
    biggest = max(spec.BH * spec.L, spec.BHkv * spec.S) * spec.E * (3 if packed else 1)
    idx = index_ctype(biggest)
    fields = {"E": spec.E, "BM": blocks.BM, "BN": blocks.BN, "causal": int(spec.causal), "idx": idx}
    fields["packed"] = int(packed)
    name = f"netcl_attention_{kernel}_blk"
    key = ("attention-blocked", name, *sorted(fields.items()))
    it = index_dtype(idx)
    types = [None] * len(buffers) + [it] * 5 + [np.float32]
    owners, body = _SOURCES[kernel]
    resolved = get_kernel(key, device, lambda: (owners + _COMMON + body).format(**fields), name, types)
    threads = blocks.threads
    per_group = blocks.BN if kernel == "bwd_kv" else blocks.BM
    gsize = (-(-items // per_group) * threads, planes)
    scalars = [it.type(x) for x in (spec.L, spec.S, spec.Hq, spec.group, spec.Hkv)]
    launch_prepared(key, device, resolved.kernel, gsize, (threads, 1), [*buffers, *scalars, np.float32(spec.scale)])


def forward(q, k, v, mask, spec: AttentionSpec, seed, counter) -> tuple[Tensor, Tensor]:
    """(output, lse) in one launch."""
    out = Tensor.empty((*spec.lead, spec.L, spec.Ev), q.dtype, q.device)
    lse = Tensor.empty((*spec.lead, spec.L), np.float32, q.device)
    _run("fwd", [q, k, v, out, lse], spec.L, spec.BH, spec)
    return out, lse


def backward(g, q, k, v, out, lse, mask, spec: AttentionSpec, seed, counter) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) in two launches: ``bwd_q`` (also writes ``D = rowsum(dO * O)``), then ``bwd_kv``."""
    blocks = _device_configs(q.device, spec.E)
    if blocks["bwd_q"] is None or blocks["bwd_kv"] is None:
        later = VARIANTS[VARIANTS.index(VARIANT) + 1 :]
        fallback = next(x for x in later if x.supports(q.device, q.dtype, spec))  # the portable one takes all
        return fallback.backward(g, q, k, v, out, lse, mask, spec, seed, counter)
    dq = Tensor.empty(q.shape, q.dtype, q.device)
    dk = Tensor.empty(k.shape, k.dtype, k.device)
    dv = Tensor.empty(v.shape, v.dtype, v.device)
    drow = Tensor.empty(lse.shape, np.float32, q.device)
    _run("bwd_q", [q, k, v, out, g, lse, dq, drow], spec.L, spec.BH, spec)
    _run("bwd_kv", [q, k, v, g, lse, drow, dk, dv], spec.S, spec.BHkv, spec)
    return dq, dk, dv


def supports_packed(device: Device, dtype: np.dtype, spec: AttentionSpec) -> bool:
    """What ``supports`` asks, with backward blocks that fit too (the packed backward has no fallback kernels);
    ``spec`` is a self-attention's (``check_packed_attention``)."""
    if not supports(device, dtype, spec):
        return False
    blocks = _device_configs(device, spec.E)
    return blocks["bwd_q"] is not None and blocks["bwd_kv"] is not None


def run_packed(kernel: str, buffers: list[Tensor], items: int, planes: int, spec: AttentionSpec) -> None:
    """``_run`` in the packed layout (``PackedKernels.run``)."""
    _run(kernel, buffers, items, planes, spec, packed=True)


VARIANT = AttentionVariant("blocked", supports, forward, backward, PackedKernels(supports_packed, run_packed))
VARIANTS.insert(0, VARIANT)
