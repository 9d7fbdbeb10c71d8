"""OpenCL C source of the tf32 tensor-core attention kernels (``attention_mma_tf32``): FlashAttention-2 on
``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` for float32 tensors.

Two kinds: "tf32" (matmul precision "high": every operand, q, k, v, dO, P and dS, rounded to tf32, nearest
with ties away, ``cvt.rna.tf32.f32``; one mma a product, fp32 accumulation in the mma) and "tf32x3" (each
operand split x = hi + lo, hi = tf32(x), lo = tf32(x - hi); a product is lo*hi + hi*lo + hi*hi, the three
mma summed into a zero-started fp32 ``t`` that is added to the accumulator with an IEEE add: the GEMM's
tf32x3, fp32's accuracy).

A work-group is 4 warps (128 work-items); a warp owns ``16 * mt`` rows (queries, or keys in ``bwd_kv``;
``Plan.mt``, 1 but in the forward), a work-group ``64 * mt``. Lane ``l`` of a warp has ``gid = l / 4`` and
``tig = l % 4``. m16n8k8 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32): A (16 x 8)
a0 = (gid, tig), a1 = (gid + 8, tig), a2 = (gid, tig + 4), a3 = (gid + 8, tig + 4); B (8 x 8) b0 = (k tig,
n gid), b1 = (k tig + 4, n gid); the accumulator c0..c3 = (gid, 2 tig), (gid, 2 tig + 1), (gid + 8, 2 tig),
(gid + 8, 2 tig + 1).

The rows a work-group owns (Q; Q and dO; K and V) go from global memory straight into A fragments in
registers (``Plan.hold``; else re-read from global memory, L1-cached, each tile: E 128's backward, whose
accumulators fill the registers). Streamed tiles (K and V, or Q and dO) go global -> local by ``cp.async``
(16 bytes, zero-filled past the last row), ``Plan.nbuf`` buffers deep; a local row is ``E + 4`` words, so
the 8 x 4 words of a fragment load (rows gid or 2 tig, columns tig or gid) fall in 32 distinct banks.

Probabilities and dS go from the accumulator layout straight into A fragments without shuffles: the
accumulator holds keys 2 tig, 2 tig + 1 of each 8-key slice, the A fragment columns tig, tig + 4, so
column tig stands for key 2 tig and column tig + 4 for key 2 tig + 1 (a0..a3 = c0, c2, c1, c3), and the B
operand's rows (V, K, dO or Q rows along the contraction) are read in the same permuted order: b0 = row
2 tig, b1 = row 2 tig + 1. The sum over a slice's 8 keys is unchanged.

Scores are in log2 units (``scale2 = scale * log2(e)``, ``ex2.approx.ftz``); masks (causal, tails) are
applied only in the tiles that hold a hidden element; causal calls skip wholly masked tiles. No atomics.

``EMULATE`` 1 replaces the PTX primitives (the mma, ``cvt.rna.tf32.f32``, ``shfl.sync``, ``cp.async``) by
OpenCL C models (``attention_mma_source``'s, and an m16n8k8 tf32 model that reads only the operands' tf32
bits, as the tensor cores do): the same kernels and index arithmetic on any OpenCL device.
"""

from __future__ import annotations

from dataclasses import dataclass

from netcl.runtime.ops._common import storage_pragmas
from netcl.runtime.ops.attention_mma_source import _EMULATED, _PTX, LAUNCH_ORDER, packed_layout

#: work-items per work-group (4 warps)
THREADS = 128
#: kernels of the source
KERNELS = ("fwd", "bwd_q", "bwd_kv")
#: the kinds: operands rounded to tf32, or split in two tf32 parts
KINDS = ("tf32", "tf32x3")


@dataclass(frozen=True)
class Plan:
    """Blocking of one kernel at one feature size."""

    tile: int  #: rows of the streamed tile (keys in fwd and bwd_q, queries in bwd_kv)
    nbuf: int  #: streamed-tile buffers: 2 copies the next tile while this one multiplies
    hold: bool = True  #: the owned rows' A fragments in registers (else re-read from global memory each tile)
    mt: int = 1  #: m16 row tiles a warp owns (fwd only): each B fragment feeds ``mt`` products

    @property
    def rows(self) -> int:
        """Rows a work-group owns (queries; keys in bwd_kv)."""
        return 64 * self.mt


#: (kernel, E) -> its plan; local memory within NVIDIA's 48 KB (``local_bytes``). The forward at E 64 owns 128
#: query rows (mt 2: each B fragment split once for two products): the sweep is in benchmarks/RESULTS.md,
#: "NVIDIA H100 and H200, 2026-11-27 (twelfth session)"
PLANS: dict[tuple[str, int], Plan] = {
    ("fwd", 64): Plan(32, 2, mt=2),
    ("fwd", 128): Plan(16, 2),
    ("bwd_q", 64): Plan(32, 2),
    ("bwd_q", 128): Plan(16, 2, hold=False),
    ("bwd_kv", 64): Plan(32, 2),
    ("bwd_kv", 128): Plan(16, 1, hold=False),  # two buffers with hold=False: wrong on PoCL's emulation
}
#: tf32x3's plans where they differ: half the tile (its split fragments take the registers; ptxas of sm_90
#: otherwise spills; the forward's mt 2 spills some 100-190 bytes and is still the fastest)
X3_PLANS: dict[tuple[str, int], Plan] = {
    ("fwd", 64): Plan(16, 2, mt=2),
    ("bwd_q", 64): Plan(16, 2),
    ("bwd_kv", 64): Plan(16, 2),
    ("bwd_kv", 128): Plan(8, 1, hold=False),
}


def plan(kernel: str, e: int, kind: str = "tf32") -> Plan:
    """The plan of ``kernel`` at feature size ``e`` for ``kind``."""
    if kind == "tf32x3" and (kernel, e) in X3_PLANS:
        return X3_PLANS[(kernel, e)]
    return PLANS[(kernel, e)]


def local_bytes(kernel: str, e: int, kind: str = "tf32") -> int:
    """Local memory of ``kernel`` at feature size ``e`` for ``kind`` (bytes, the PTX build: no scratch)."""
    p = plan(kernel, e, kind)
    words = p.nbuf * 2 * p.tile * (e + 4)
    if kernel == "bwd_kv":
        words += p.nbuf * 2 * p.tile
    return words * 4


_TF32_PTX = r"""
inline uint tf32(const float x) { uint r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r; }
#define MMA8(d, a, b0, b1) asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 " \
    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
    : "=f"((d)[0]), "=f"((d)[1]), "=f"((d)[2]), "=f"((d)[3]) \
    : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"(b0), "r"(b1), \
      "f"((d)[0]), "f"((d)[1]), "f"((d)[2]), "f"((d)[3]))
"""

_TF32_EMULATED = r"""
/* cvt.rna.tf32.f32: nearest, ties away from zero (the low 13 bits cleared); inf and nan as they are */
inline uint tf32(const float x) { const uint u = as_uint(x); return isfinite(x) ? (u + 0x1000u) & 0xffffe000u : u; }
/* d += A B: A 16 x 8 (a: rows gid / gid + 8, k tig / tig + 4), B 8 x 8 (b0, b1: k tig / tig + 4, column gid);
   only the operands' tf32 bits count */
inline void emu_mma8(float* d, const uint* a, const uint b0, const uint b1, __local uint* scr) {
    const int lid = get_local_id(0), lane = lid & 31, w0 = lid - lane, gid = lane >> 2, tig = lane & 3;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; ++i) scr[lid * 8 + i] = a[i];
    scr[lid * 8 + 4] = b0;
    scr[lid * 8 + 5] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = 0; e < 4; ++e) {
        const int row = gid + (e >> 1) * 8, col = tig * 2 + (e & 1);
        float acc = d[e];
        for (int kk = 0; kk < 8; ++kk) {
            const uint aw = scr[(w0 + (row & 7) * 4 + (kk & 3)) * 8 + (row >> 3) + 2 * (kk >> 2)];
            const uint bw = scr[(w0 + col * 4 + (kk & 3)) * 8 + 4 + (kk >> 2)];
            acc += as_float(aw & 0xffffe000u) * as_float(bw & 0xffffe000u);
        }
        d[e] = acc;
    }
}
#define MMA8(d, a, b0, b1) emu_mma8((d), (a), (b0), (b1), scr)
"""

_COMMON = """{pragmas}
#define E {E}
#define LD (E + 4)              /* words of a local row */
#define EC (E / 4)              /* 16-byte chunks of a row */
#define NT {threads}
#define TILE {tile}             /* rows of the streamed tile (keys, or queries in bwd_kv) */
#define MT {mt}                 /* m16 row tiles a warp owns */
#define BM (64 * MT)            /* rows a work-group owns */
#define NBUF {nbuf}
#define TROWS (2 * TILE)        /* rows of one buffer: two operands' tiles */
#define HOLD {hold}
#define X3 {x3}
#define CAUSAL {causal}
{launch_order}typedef {idx} idx_t;
{packed_layout}{primitives}
{tf32_primitives}
#if X3
#define PARTS 2
/* word i of an n-word fragment from value x: hi at [i], lo at [i + n] */
#define SPLIT1(w, i, n, x) {{ const float x_ = (x); (w)[i] = tf32(x_); (w)[(i) + (n)] = tf32(x_ - as_float((w)[i])); }}
/* d += A B as lo*hi + hi*lo + hi*hi into a zero-started t, then one IEEE add per element */
#define PROD(d, a, b) {{ float t_[4] = {{0.0f, 0.0f, 0.0f, 0.0f}}; \\
    MMA8(t_, (a) + 4, (b)[0], (b)[1]); MMA8(t_, (a), (b)[2], (b)[3]); MMA8(t_, (a), (b)[0], (b)[1]); \\
    (d)[0] += t_[0]; (d)[1] += t_[1]; (d)[2] += t_[2]; (d)[3] += t_[3]; }}
#define HELD(x) as_uint(x)      /* held fragments keep fp32 words: split at each use */
#define A_USE(a, h) {{ SPLIT1(a, 0, 4, as_float((h)[0])); SPLIT1(a, 1, 4, as_float((h)[1])); \\
    SPLIT1(a, 2, 4, as_float((h)[2])); SPLIT1(a, 3, 4, as_float((h)[3])); }}
#else
#define PARTS 1
#define SPLIT1(w, i, n, x) (w)[i] = tf32(x)
#define PROD(d, a, b) MMA8(d, (a), (b)[0], (b)[1])
#define HELD(x) tf32(x)         /* held fragments rounded once */
#define A_USE(a, h) {{ (a)[0] = (h)[0]; (a)[1] = (h)[1]; (a)[2] = (h)[2]; (a)[3] = (h)[3]; }}
#endif
#define AW (4 * PARTS)          /* words of an A fragment */
#define BW (2 * PARTS)          /* words of a B fragment */
/* copy rows first .. first + n - 1 of src (E wide, rs floats apart) into rows 0 .. rows - 1 of dst (zeros past n) */
inline void stage(__local uint4* dst, __global const float* src, const idx_t rs, const idx_t first, const int n,
                  const int rows) {{
    #pragma unroll
    for (int i = 0; i < rows * EC / NT; ++i) {{
        const int t = get_local_id(0) + i * NT, row = t / EC, c = t % EC, ok = row < n;
        __global const float* p = src + (first + (ok ? row : 0)) * rs + c * 4;
        CP16(dst + row * (LD / 4) + c, p, ok ? 16 : 0);
    }}
}}
#define LANES \\
    const int lid = get_local_id(0), lane = lid & 31, warp = lid >> 5, gid = lane >> 2, tig = lane & 3
/* element (row w0 + gid + 8 h, column col) of a plane src (rows rs floats apart), 0 past row n */
#define AT(src, rs, w0, h, n, col) ((w0) + gid + 8 * (h) < (n) ? (src)[((w0) + gid + 8 * (h)) * (rs) + (col)] : 0.0f)
/* the held words (4) of k-step kk of rows w0 + gid, w0 + gid + 8 */
#define HOLD_A(h, src, rs, w0, n, kk) {{ \\
    (h)[0] = HELD(AT(src, rs, w0, 0, n, (kk) * 8 + tig)); (h)[1] = HELD(AT(src, rs, w0, 1, n, (kk) * 8 + tig)); \\
    (h)[2] = HELD(AT(src, rs, w0, 0, n, (kk) * 8 + tig + 4)); \\
    (h)[3] = HELD(AT(src, rs, w0, 1, n, (kk) * 8 + tig + 4)); }}
/* the A fragment of k-step kk of rows w0 + gid, w0 + gid + 8 of src, from global memory */
#define LOAD_A(a, src, rs, w0, n, kk) {{ \\
    SPLIT1(a, 0, 4, AT(src, rs, w0, 0, n, (kk) * 8 + tig)); SPLIT1(a, 1, 4, AT(src, rs, w0, 1, n, (kk) * 8 + tig)); \\
    SPLIT1(a, 2, 4, AT(src, rs, w0, 0, n, (kk) * 8 + tig + 4)); \\
    SPLIT1(a, 3, 4, AT(src, rs, w0, 1, n, (kk) * 8 + tig + 4)); }}
/* B fragment of column tile j (tile rows j * 8 .. are the product's columns), k-step kk (features) */
#define B_ROWS(b, tile, j, kk) {{ __local const float* p_ = (tile) + ((j) * 8 + gid) * LD + (kk) * 8 + tig; \\
    SPLIT1(b, 0, 2, p_[0]); SPLIT1(b, 1, 2, p_[4]); }}
/* B fragment of column tile f (features), k-step kk along the tile's rows, rows permuted: b0 = row 2 tig,
   b1 = row 2 tig + 1 of the slice (ACC_A's order) */
#define B_COLS(b, tile, kk, f) {{ __local const float* p_ = (tile) + ((kk) * 8 + 2 * tig) * LD + (f) * 8 + gid; \\
    SPLIT1(b, 0, 2, p_[0]); SPLIT1(b, 1, 2, p_[LD]); }}
/* the A fragment of a k-step from accumulator tile x (keys 2 tig, 2 tig + 1 as columns tig, tig + 4) */
#define ACC_A(a, x) {{ SPLIT1(a, 0, 4, (x)[0]); SPLIT1(a, 1, 4, (x)[2]); SPLIT1(a, 2, 4, (x)[1]); \\
    SPLIT1(a, 3, 4, (x)[3]); }}
/* buffer b's first (second) operand tile */
#define TILE0(b) (buff + (b) * TROWS * LD)
#define TILE1(b) (buff + ((b) * TROWS + TILE) * LD)
#define BUF4(b, second) (buf4 + ((b) * TROWS + (second) * TILE) * (LD / 4))
/* top and bottom of the main loop over tiles t < nt: tile t is in buffer t % NBUF */
#if NBUF == 2
#define LOOP_TOP(issue_next) WAIT(0); barrier(CLK_LOCAL_MEM_FENCE); if (t + 1 < nt) {{ issue_next; }} COMMIT()
#define LOOP_END(issue_next)
#else
#define LOOP_TOP(issue_next) WAIT(0); barrier(CLK_LOCAL_MEM_FENCE)
#define LOOP_END(issue_next) barrier(CLK_LOCAL_MEM_FENCE); if (t + 1 < nt) {{ issue_next; }} COMMIT()
#endif
"""

_FORWARD = """
/* keys n0 .. of tile t into buffer b */
#define ISSUE(t, b) {{ const idx_t n0_ = (idx_t)(t) * TILE; const int tn_ = (int)min((idx_t)TILE, S - n0_); \\
    stage(BUF4(b, 0), k + KB(kvh), QS, n0_, tn_, TILE); stage(BUF4(b, 1), v + VB(kvh), QS, n0_, tn_, TILE); }}
/* a work-group owns BM query rows (MT m16 tiles a warp), loops over key tiles: online softmax in registers */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_attention_fwd_tf32(__global const float* q, __global const float* k, __global const float* v,
                              __global float* out, __global float* lse, const idx_t L, const idx_t S,
                              const idx_t Hq, const idx_t group, const idx_t Hkv, const float scale2,
                              const float scale) {{
    __local uint4 buf4[NBUF * TROWS * LD / 4];
    SCRATCH
    __local const float* buff = (__local const float*)buf4;
    LANES;
    const idx_t bh = PLANE, row0 = (idx_t)ROW_BLOCK * BM;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
#if CAUSAL
    const idx_t nend = min(S, row0 + BM);
#else
    const idx_t nend = S;
#endif
    const int nt = (int)((nend + TILE - 1) / TILE);
    ISSUE(0, 0);
    COMMIT();
    __global const float* qp = q + QB(bh);
    idx_t w0[MT], r[MT][2];
#if HOLD
    uint qh[MT][E / 8][4];
#endif
    float o[MT][E / 8][4], m[MT][2], l[MT][2];
    #pragma unroll
    for (int mi = 0; mi < MT; ++mi) {{
        w0[mi] = row0 + (warp * MT + mi) * 16;
        r[mi][0] = w0[mi] + gid;
        r[mi][1] = w0[mi] + gid + 8;
#if HOLD
        #pragma unroll
        for (int kk = 0; kk < E / 8; ++kk) HOLD_A(qh[mi][kk], qp, QS, w0[mi], L, kk);
#endif
        #pragma unroll
        for (int f = 0; f < E / 8; ++f) {{
            o[mi][f][0] = 0.0f; o[mi][f][1] = 0.0f; o[mi][f][2] = 0.0f; o[mi][f][3] = 0.0f;
        }}
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{ m[mi][h] = -INFINITY; l[mi][h] = 0.0f; }}
    }}
    for (int t = 0; t < nt; ++t) {{
        LOOP_TOP(ISSUE(t + 1, (t + 1) % NBUF));
        const idx_t n0 = (idx_t)t * TILE;
        __local const float* ks = TILE0(t % NBUF);
        __local const float* vs = TILE1(t % NBUF);
        float s[MT][TILE / 8][4];
        #pragma unroll
        for (int mi = 0; mi < MT; ++mi) {{
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                s[mi][j][0] = 0.0f; s[mi][j][1] = 0.0f; s[mi][j][2] = 0.0f; s[mi][j][3] = 0.0f;
            }}
        }}
        #pragma unroll
        for (int kk = 0; kk < E / 8; ++kk) {{
            uint a[MT][AW];
            #pragma unroll
            for (int mi = 0; mi < MT; ++mi) {{
#if HOLD
                A_USE(a[mi], qh[mi][kk]);
#else
                LOAD_A(a[mi], qp, QS, w0[mi], L, kk);
#endif
            }}
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                uint b[BW];
                B_ROWS(b, ks, j, kk);
                #pragma unroll
                for (int mi = 0; mi < MT; ++mi) PROD(s[mi][j], a[mi], b);
            }}
        }}
        #pragma unroll
        for (int mi = 0; mi < MT; ++mi) {{
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                #pragma unroll
                for (int e = 0; e < 4; ++e) s[mi][j][e] *= scale2;
            }}
        }}
        if (n0 + TILE > S || (CAUSAL && n0 + TILE - 1 > row0)) {{   /* a tile with hidden keys */
            #pragma unroll
            for (int mi = 0; mi < MT; ++mi) {{
                #pragma unroll
                for (int j = 0; j < TILE / 8; ++j) {{
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) {{
                        const idx_t c = n0 + j * 8 + tig * 2 + (e & 1);
                        if (c >= S || (CAUSAL && c > r[mi][e >> 1])) s[mi][j][e] = -INFINITY;
                    }}
                }}
            }}
        }}
        #pragma unroll
        for (int mi = 0; mi < MT; ++mi) {{
            float mx[2] = {{m[mi][0], m[mi][1]}};
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                #pragma unroll
                for (int e = 0; e < 4; ++e) mx[e >> 1] = fmax(mx[e >> 1], s[mi][j][e]);
            }}
            float mu[2];
            #pragma unroll
            for (int h = 0; h < 2; ++h) {{
                mx[h] = fmax(mx[h], SHFL(mx[h], 1));
                mx[h] = fmax(mx[h], SHFL(mx[h], 2));
                mu[h] = mx[h] == -INFINITY ? 0.0f : mx[h];   /* nothing visible yet: p = 0, no rescale needed */
                const float corr = EXP2(m[mi][h] - mu[h]);
                m[mi][h] = mx[h];
                l[mi][h] *= corr;
                #pragma unroll
                for (int f = 0; f < E / 8; ++f) {{ o[mi][f][2 * h] *= corr; o[mi][f][2 * h + 1] *= corr; }}
            }}
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                #pragma unroll
                for (int e = 0; e < 4; ++e) {{
                    const float p = EXP2(s[mi][j][e] - mu[e >> 1]);
                    s[mi][j][e] = p;
                    l[mi][e >> 1] += p;
                }}
            }}
        }}
        #pragma unroll
        for (int kk = 0; kk < TILE / 8; ++kk) {{
            uint pa[MT][AW];
            #pragma unroll
            for (int mi = 0; mi < MT; ++mi) ACC_A(pa[mi], s[mi][kk]);
            #pragma unroll
            for (int f = 0; f < E / 8; ++f) {{
                uint b[BW];
                B_COLS(b, vs, kk, f);
                #pragma unroll
                for (int mi = 0; mi < MT; ++mi) PROD(o[mi][f], pa[mi], b);
            }}
        }}
        LOOP_END(ISSUE(t + 1, 0));
    }}
    #pragma unroll
    for (int mi = 0; mi < MT; ++mi) {{
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            float sum = l[mi][h];
            sum += SHFL(sum, 1);
            sum += SHFL(sum, 2);
            if (r[mi][h] < L) {{
                const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
                __global float* orow = out + OB(bh) + r[mi][h] * OS;
                #pragma unroll
                for (int f = 0; f < E / 8; ++f)
                    vstore2((float2)(o[mi][f][2 * h] * inv, o[mi][f][2 * h + 1] * inv), 0, orow + f * 8 + tig * 2);
                if (tig == 0) lse[bh * L + r[mi][h]] = sum > 0.0f ? (m[mi][h] + log2(sum)) * M_LN2_F : -INFINITY;
            }}
        }}
    }}
}}
"""

_BACKWARD_Q = """
/* keys n0 .. of tile t into buffer b */
#define ISSUE(t, b) {{ const idx_t n0_ = (idx_t)(t) * TILE; const int tn_ = (int)min((idx_t)TILE, S - n0_); \\
    stage(BUF4(b, 0), k + KB(kvh), QS, n0_, tn_, TILE); stage(BUF4(b, 1), v + VB(kvh), QS, n0_, tn_, TILE); }}
/* dQ (and D = rowsum(dO * O) into drow for bwd_kv): a work-group owns 64 query rows, loops over key tiles */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_attention_bwd_q_tf32(__global const float* q, __global const float* k, __global const float* v,
                                __global const float* out, __global const float* g, __global const float* lse,
                                __global float* dq, __global float* drow, const idx_t L, const idx_t S,
                                const idx_t Hq, const idx_t group, const idx_t Hkv, const float scale2,
                                const float scale) {{
    __local uint4 buf4[NBUF * TROWS * LD / 4];
    SCRATCH
    __local const float* buff = (__local const float*)buf4;
    LANES;
    const idx_t bh = PLANE, row0 = (idx_t)ROW_BLOCK * 64;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
#if CAUSAL
    const idx_t nend = min(S, row0 + 64);
#else
    const idx_t nend = S;
#endif
    const int nt = (int)((nend + TILE - 1) / TILE);
    ISSUE(0, 0);
    COMMIT();
    const idx_t w0 = row0 + warp * 16, r[2] = {{w0 + gid, w0 + gid + 8}};
    __global const float* qp = q + QB(bh);
    __global const float* gp = g + OB(bh);
#if HOLD
    uint qh[E / 8][4], gh[E / 8][4];
    #pragma unroll
    for (int kk = 0; kk < E / 8; ++kk) {{
        HOLD_A(qh[kk], qp, QS, w0, L, kk);
        HOLD_A(gh[kk], gp, OS, w0, L, kk);
    }}
#endif
    float dr[2], lr[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        float d = 0.0f;
        if (r[h] < L) {{
            const idx_t at = OB(bh) + r[h] * OS + tig * (E / 4);
            #pragma unroll
            for (int e = 0; e < E / 4; e += 8) {{
                const float8 x = vload8(0, g + at + e) * vload8(0, out + at + e);
                d += ((x.s0 + x.s1) + (x.s2 + x.s3)) + ((x.s4 + x.s5) + (x.s6 + x.s7));
            }}
        }}
        d += SHFL(d, 1);
        d += SHFL(d, 2);
        dr[h] = d;
        if (r[h] < L && tig == 0) drow[bh * L + r[h]] = d;
        const float x = r[h] < L ? lse[bh * L + r[h]] : -INFINITY;
        lr[h] = x == -INFINITY ? INFINITY : x * M_LOG2E_F;   /* no visible key (or padding): P = 0 */
    }}
    float acc[E / 8][4];
    #pragma unroll
    for (int f = 0; f < E / 8; ++f) {{ acc[f][0] = 0.0f; acc[f][1] = 0.0f; acc[f][2] = 0.0f; acc[f][3] = 0.0f; }}
    for (int t = 0; t < nt; ++t) {{
        LOOP_TOP(ISSUE(t + 1, (t + 1) % NBUF));
        const idx_t n0 = (idx_t)t * TILE;
        __local const float* ks = TILE0(t % NBUF);
        __local const float* vs = TILE1(t % NBUF);
        float s[TILE / 8][4], dp[TILE / 8][4];
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) {{ s[j][e] = 0.0f; dp[j][e] = 0.0f; }}
        }}
        #pragma unroll
        for (int kk = 0; kk < E / 8; ++kk) {{
            uint qa[AW], ga[AW];
#if HOLD
            A_USE(qa, qh[kk]);
            A_USE(ga, gh[kk]);
#else
            LOAD_A(qa, qp, QS, w0, L, kk);
            LOAD_A(ga, gp, OS, w0, L, kk);
#endif
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                uint b[BW];
                B_ROWS(b, ks, j, kk);
                PROD(s[j], qa, b);
                B_ROWS(b, vs, j, kk);
                PROD(dp[j], ga, b);
            }}
        }}
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = EXP2(s[j][e] * scale2 - lr[e >> 1]);   /* P */
        }}
        if (n0 + TILE > S || (CAUSAL && n0 + TILE - 1 > row0)) {{   /* a tile with hidden keys */
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                #pragma unroll
                for (int e = 0; e < 4; ++e) {{
                    const idx_t c = n0 + j * 8 + tig * 2 + (e & 1);
                    if (c >= S || (CAUSAL && c > r[e >> 1])) s[j][e] = 0.0f;
                }}
            }}
        }}
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] *= dp[j][e] - dr[e >> 1];   /* dS */
        }}
        #pragma unroll
        for (int kk = 0; kk < TILE / 8; ++kk) {{
            uint da[AW];
            ACC_A(da, s[kk]);
            #pragma unroll
            for (int f = 0; f < E / 8; ++f) {{
                uint b[BW];
                B_COLS(b, ks, kk, f);
                PROD(acc[f], da, b);
            }}
        }}
        LOOP_END(ISSUE(t + 1, 0));
    }}
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        if (r[h] < L) {{
            __global float* row = dq + QB(bh) + r[h] * QS;
            #pragma unroll
            for (int f = 0; f < E / 8; ++f)
                vstore2((float2)(acc[f][2 * h] * scale, acc[f][2 * h + 1] * scale), 0, row + f * 8 + tig * 2);
        }}
    }}
}}
"""

_BACKWARD_KV = """
/* query tile t (head first + t / nper, rows m0 ..) into buffer b: Q, dO, and their lse and D */
#define ISSUE(t, b) {{ const idx_t bh_ = first + (t) / nper, m0_ = mstart + (idx_t)((t) % nper) * TILE; \\
    const int tm_ = (int)min((idx_t)TILE, L - m0_); \\
    stage(BUF4(b, 0), q + QB(bh_), QS, m0_, tm_, TILE); stage(BUF4(b, 1), g + OB(bh_), OS, m0_, tm_, TILE); \\
    if (lid < 2 * TILE) {{ \\
        const int i_ = lid % TILE, ok_ = i_ < tm_; \\
        __global const float* src_ = lid < TILE ? lse : drow; \\
        CP4(&rowv[b][lid / TILE][i_], src_ + (ok_ ? bh_ * L + m0_ + i_ : 0), ok_ * 4); }} }}
/* dK, dV: a work-group owns 64 keys, loops over the q heads of its kv head and their query tiles */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_attention_bwd_kv_tf32(__global const float* q, __global const float* k, __global const float* v,
                                 __global const float* g, __global const float* lse, __global const float* drow,
                                 __global float* dk, __global float* dv, const idx_t L, const idx_t S,
                                 const idx_t Hq, const idx_t group, const idx_t Hkv, const float scale2,
                                 const float scale) {{
    __local uint4 buf4[NBUF * TROWS * LD / 4];
    __local float rowv[NBUF][2][TILE];   /* lse, D of the tile's queries */
    SCRATCH
    __local const float* buff = (__local const float*)buf4;
    LANES;
    const idx_t kvh = PLANE, c0 = (idx_t)BLOCK * 64;
    const idx_t first = (kvh / Hkv) * Hq + (kvh % Hkv) * group;
#if CAUSAL
    const idx_t mstart = c0;   /* rows before c0 see no key of this block */
#else
    const idx_t mstart = 0;
#endif
    const int nper = L > mstart ? (int)((L - mstart + TILE - 1) / TILE) : 0;
    const int nt = nper * (int)group;
    if (nt > 0) ISSUE(0, 0);
    COMMIT();
    const idx_t w0 = c0 + warp * 16, key[2] = {{w0 + gid, w0 + gid + 8}};
    __global const float* kp = k + KB(kvh);
    __global const float* vp = v + VB(kvh);
#if HOLD
    uint kh[E / 8][4], vh[E / 8][4];
    #pragma unroll
    for (int kk = 0; kk < E / 8; ++kk) {{
        HOLD_A(kh[kk], kp, QS, w0, S, kk);
        HOLD_A(vh[kk], vp, QS, w0, S, kk);
    }}
#endif
    float dka[E / 8][4], dva[E / 8][4];
    #pragma unroll
    for (int f = 0; f < E / 8; ++f) {{
        #pragma unroll
        for (int e = 0; e < 4; ++e) {{ dka[f][e] = 0.0f; dva[f][e] = 0.0f; }}
    }}
    for (int t = 0; t < nt; ++t) {{
        LOOP_TOP(ISSUE(t + 1, (t + 1) % NBUF));
        const int b = t % NBUF;
        const idx_t m0 = mstart + (idx_t)(t % nper) * TILE;
        __local const float* qs = TILE0(b);
        __local const float* gs = TILE1(b);
        float lc[TILE / 8][2], dc[TILE / 8][2];
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int c = 0; c < 2; ++c) {{
                const float x = rowv[b][0][j * 8 + tig * 2 + c];
                lc[j][c] = x == -INFINITY ? INFINITY : x * M_LOG2E_F;   /* P = 0 */
                dc[j][c] = rowv[b][1][j * 8 + tig * 2 + c];
            }}
        }}
        float st_[TILE / 8][4], dpt[TILE / 8][4];   /* S^T, dP^T: keys x queries */
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) {{ st_[j][e] = 0.0f; dpt[j][e] = 0.0f; }}
        }}
        #pragma unroll
        for (int kk = 0; kk < E / 8; ++kk) {{
            uint ka[AW], va[AW];
#if HOLD
            A_USE(ka, kh[kk]);
            A_USE(va, vh[kk]);
#else
            LOAD_A(ka, kp, QS, w0, S, kk);
            LOAD_A(va, vp, QS, w0, S, kk);
#endif
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                uint bb[BW];
                B_ROWS(bb, qs, j, kk);
                PROD(st_[j], ka, bb);
                B_ROWS(bb, gs, j, kk);
                PROD(dpt[j], va, bb);
            }}
        }}
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) st_[j][e] = EXP2(st_[j][e] * scale2 - lc[j][e & 1]);   /* P^T */
        }}
        if (m0 + TILE > L || (CAUSAL && c0 + 63 > m0)) {{   /* a tile with hidden pairs */
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                #pragma unroll
                for (int e = 0; e < 4; ++e) {{
                    const idx_t col = m0 + j * 8 + tig * 2 + (e & 1);
                    if (col >= L || (CAUSAL && key[e >> 1] > col)) st_[j][e] = 0.0f;
                }}
            }}
        }}
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) dpt[j][e] = st_[j][e] * (dpt[j][e] - dc[j][e & 1]);   /* dS^T */
        }}
        #pragma unroll
        for (int kk = 0; kk < TILE / 8; ++kk) {{
            uint pa[AW], da[AW];
            ACC_A(pa, st_[kk]);
            ACC_A(da, dpt[kk]);
            #pragma unroll
            for (int f = 0; f < E / 8; ++f) {{
                uint bb[BW];
                B_COLS(bb, gs, kk, f);
                PROD(dva[f], pa, bb);
                B_COLS(bb, qs, kk, f);
                PROD(dka[f], da, bb);
            }}
        }}
        LOOP_END(ISSUE(t + 1, 0));
    }}
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        if (key[h] < S) {{
            __global float* dkr = dk + KB(kvh) + key[h] * QS;
            __global float* dvr = dv + VB(kvh) + key[h] * QS;
            #pragma unroll
            for (int f = 0; f < E / 8; ++f) {{
                vstore2((float2)(dka[f][2 * h] * scale, dka[f][2 * h + 1] * scale), 0, dkr + f * 8 + tig * 2);
                vstore2((float2)(dva[f][2 * h], dva[f][2 * h + 1]), 0, dvr + f * 8 + tig * 2);
            }}
        }}
    }}
}}
"""

_BODIES = {"fwd": _FORWARD, "bwd_q": _BACKWARD_Q, "bwd_kv": _BACKWARD_KV}
#: kernel -> its name in the source
NAMES = {kernel: f"netcl_attention_{kernel}_tf32" for kernel in _BODIES}


def attention_source(
    kernel: str, e: int, causal: bool, kind: str, idx: str, emulate: bool = False, packed: bool = False
) -> str:
    """The source of ``kernel`` ("fwd", "bwd_q", "bwd_kv") for feature size ``e`` (64 or 128) at its
    ``plan``, float32 operands and outputs, products of ``kind`` ("tf32" or "tf32x3"); ``emulate``: the
    OpenCL C models of the PTX primitives (any OpenCL device) instead of inline PTX (NVIDIA's OpenCL);
    ``packed``: q, k and v (and their gradients) read from (written to) one (B, L, 3 * H * E) tensor, the
    output and its gradient (B, L, H * E) (self-attention: ``attention.packed_attention_forward``)."""
    if kind not in KINDS:
        raise ValueError(f"attention_mma_tf32: kind must be one of {KINDS}, got {kind!r}")
    p = plan(kernel, e, kind)
    if p.tile * e // 4 % THREADS or 2 * p.tile > THREADS or p.tile % 8:
        raise ValueError(f"attention_mma_tf32: {kernel} E{e}: a tile's 16-byte chunks must split evenly over {THREADS}")
    if kernel != "fwd" and p.mt != 1:
        raise ValueError(f"attention_mma_tf32: {kernel} owns 64 rows a work-group (mt 1)")
    fields = {
        "pragmas": storage_pragmas([]),
        "E": e,
        "threads": THREADS,
        "tile": p.tile,
        "mt": p.mt,
        "nbuf": p.nbuf,
        "hold": int(p.hold),
        "x3": int(kind == "tf32x3"),
        "causal": int(causal),
        "launch_order": LAUNCH_ORDER,
        "packed_layout": packed_layout(packed),
        "idx": idx,
        "primitives": _EMULATED if emulate else _PTX,
        "tf32_primitives": _TF32_EMULATED if emulate else _TF32_PTX,
    }
    source = (_COMMON + _BODIES[kernel]).format(**fields)
    if emulate:  # the models hold barriers: unrolling them only grows the program
        source = source.replace("#pragma unroll\n", "\n")
    return source
