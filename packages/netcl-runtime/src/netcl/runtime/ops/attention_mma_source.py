"""OpenCL C source of the tensor-core attention kernels (``attention_mma``): FlashAttention-2 on ``mma.sync``.

Every product is ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`` (f16 operands, fp32 accumulation)
through inline PTX. A work-group is 4 warps (128 work-items); a warp owns 16 rows (queries, or keys in
``bwd_kv``). Lane ``l`` of a warp has ``gid = l / 4`` and ``tig = l % 4``; in an m16n8 accumulator it holds
rows ``gid`` and ``gid + 8``, columns ``2 tig`` and ``2 tig + 1`` of each 8-column tile (PTX ISA, "Matrix
Fragments for mma.m16n8k16"), so row statistics reduce over the 4 lanes of a quad (``shfl.sync.bfly``).

Local tiles hold rows of ``E`` f16 values (operands rounded to nearest even as they are staged: float32
storage through ``cvt.rn.f16x2.f32``, float16 storage copied); a row's 16-byte chunks are XOR-swizzled
(chunk ``c`` of row ``r`` at ``c ^ (r % 8)``), so the 8 row addresses of one ``ldmatrix`` matrix fall in
distinct banks. Fragments come out with ``ldmatrix.x4`` (A operands, and B operands whose rows are the
product's columns) or ``ldmatrix.x4.trans`` (B operands whose rows run along the contraction). Probabilities
and dS go from the accumulator layout straight into A fragments (FlashAttention-2's register reuse: the
accumulator tiles ``2 kk`` and ``2 kk + 1`` are the A fragment of k-step ``kk``).

``EMULATE`` 1 replaces the four PTX primitives (``MMA``, ``LDSM``, ``LDSMT``, ``SHFL``) and the f16
conversion with OpenCL C models that exchange the warp's registers through local memory between barriers:
the same kernels, all their index arithmetic included, run (slowly) on any OpenCL device. The tests use it
where no NVIDIA device is present. Every call of a primitive is in control flow uniform over the
work-group, as the models' barriers need.
"""

from __future__ import annotations

from netcl.runtime.ops._common import storage_pragmas

#: work-items per work-group (4 warps) and rows a work-group owns
THREADS = 64 * 2
ROWS = 64

_PTX = r"""
inline uint f16x2(const float lo, const float hi) {
    uint r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }
inline float shfl_xor(const float v, const int m) {
    uint r; asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(as_uint(v)), "r"(m));
    return as_float(r); }
#define SCRATCH
#define SHFL(v, m) shfl_xor((v), (m))
#define MMA(d, a, b0, b1) asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 " \
    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
    : "=f"((d)[0]), "=f"((d)[1]), "=f"((d)[2]), "=f"((d)[3]) \
    : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"(b0), "r"(b1), \
      "f"((d)[0]), "f"((d)[1]), "f"((d)[2]), "f"((d)[3]))
#define LDSM(d, base, off) asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" \
    : "=r"((d)[0]), "=r"((d)[1]), "=r"((d)[2]), "=r"((d)[3]) : "r"((uint)(size_t)((base) + (off))))
#define LDSMT(d, base, off) asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" \
    : "=r"((d)[0]), "=r"((d)[1]), "=r"((d)[2]), "=r"((d)[3]) : "r"((uint)(size_t)((base) + (off))))
"""

_EMULATED = r"""
/* models of the warp-level primitives: each work-item publishes its registers in scr (8 words a work-item) */
inline float h2f(const uint bits) { const ushort u = (ushort)(bits & 0xffffu); return vload_half(0, (const half*)&u); }
inline uint f16x2(const float lo, const float hi) {
    ushort u[2]; vstore_half_rte(lo, 0, (half*)u); vstore_half_rte(hi, 1, (half*)u);
    return (uint)u[0] | ((uint)u[1] << 16); }
inline float emu_shfl(const float v, const int m, __local uint* scr) {
    const int lid = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    scr[lid * 8 + 6] = as_uint(v);
    barrier(CLK_LOCAL_MEM_FENCE);
    return as_float(scr[(lid ^ m) * 8 + 6]);
}
/* d += A B: A 16 x 16 (a: rows gid / gid + 8, k 2 tig.. / 2 tig + 8..), B 16 x 8 (b0, b1: k 2 tig.., column gid) */
inline void emu_mma(float* d, const uint* a, const uint b0, const uint b1, __local uint* scr) {
    const int lid = get_local_id(0), lane = lid & 31, w0 = lid - lane, gid = lane >> 2, tig = lane & 3;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; ++i) scr[lid * 8 + i] = a[i];
    scr[lid * 8 + 4] = b0;
    scr[lid * 8 + 5] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = 0; e < 4; ++e) {
        const int row = gid + (e >> 1) * 8, col = tig * 2 + (e & 1);
        float acc = d[e];
        for (int kk = 0; kk < 16; ++kk) {
            const uint aw = scr[(w0 + (row & 7) * 4 + ((kk & 7) >> 1)) * 8 + (row >> 3) + 2 * (kk >> 3)];
            const uint bw = scr[(w0 + col * 4 + ((kk & 7) >> 1)) * 8 + 4 + (kk >> 3)];
            acc += h2f(aw >> (16 * (kk & 1))) * h2f(bw >> (16 * (kk & 1)));
        }
        d[e] = acc;
    }
}
/* ldmatrix.x4: lane 8 i + j gives the address (word offset) of row j of matrix i */
inline void emu_ldsm(uint* d, __local const uint* base, const int off, const int trans, __local uint* scr) {
    const int lid = get_local_id(0), lane = lid & 31, w0 = lid - lane, gid = lane >> 2, tig = lane & 3;
    barrier(CLK_LOCAL_MEM_FENCE);
    scr[lid * 8 + 7] = (uint)off;
    barrier(CLK_LOCAL_MEM_FENCE);
    __local const ushort* h = (__local const ushort*)base;
    for (int i = 0; i < 4; ++i) {
        if (trans) {
            const int r0 = (int)scr[(w0 + i * 8 + 2 * tig) * 8 + 7], r1 = (int)scr[(w0 + i * 8 + 2 * tig + 1) * 8 + 7];
            d[i] = (uint)h[2 * r0 + gid] | ((uint)h[2 * r1 + gid] << 16);
        } else {
            d[i] = base[(int)scr[(w0 + i * 8 + gid) * 8 + 7] + tig];
        }
    }
}
#define SCRATCH __local uint scr[NT * 8];
#define SHFL(v, m) emu_shfl((v), (m), scr)
#define MMA(d, a, b0, b1) emu_mma((d), (a), (b0), (b1), scr)
#define LDSM(d, base, off) emu_ldsm((d), (base), (off), 0, scr)
#define LDSMT(d, base, off) emu_ldsm((d), (base), (off), 1, scr)
"""

_COMMON = """{pragmas}
#define E {E}
#define EC (E / 8)              /* 16-byte chunks of a row */
#define NT {threads}
#define TILE {tile}             /* rows of the tile the main loop stages (keys, or queries in bwd_kv) */
#define CAUSAL {causal}
#define HALF {half}
typedef {idx} idx_t;
#if HALF
typedef half st;
#define LDF(p, i) vload_half((i), (p))
#else
typedef float st;
#define LDF(p, i) ((p)[i])
#endif
/* word offset of chunk c of row r in a swizzled tile */
#define WOFF(r, c) (((r) * EC + ((c) ^ ((r) & 7))) * 4)
{primitives}
/* rows first .. first + n - 1 of src (E wide) as f16 into rows 0 .. rows - 1 of dst (zeros past n) */
inline void stage(__local uint4* dst, __global const st* src, const idx_t first, const int n, const int rows) {{
    for (int t = get_local_id(0); t < rows * EC; t += NT) {{
        const int row = t / EC, c = t % EC;
        uint4 w = (uint4)(0u);
        if (row < n) {{
            __global const st* p = src + (first + row) * E + c * 8;
#if HALF
            w = *(__global const uint4*)p;
#else
            const float4 x = vload4(0, p), y = vload4(1, p);
            w = (uint4)(f16x2(x.x, x.y), f16x2(x.z, x.w), f16x2(y.x, y.y), f16x2(y.z, y.w));
#endif
        }}
        dst[(row * EC + (c ^ (row & 7)))] = w;
    }}
}}
/* values a, b at columns i, i + 1 of an output row */
inline void store2(__global st* p, const int i, const float a, const float b) {{
#if HALF
    *(__global uint*)(p + i) = f16x2(a, b);
#else
    vstore2((float2)(a, b), 0, p + i);
#endif
}}
#define LANES \\
    const int lid = get_local_id(0), lane = lid & 31, warp = lid >> 5, gid = lane >> 2, tig = lane & 3
/* A fragment (16 rows from row r0, k-step kk) of a swizzled tile */
#define A_FRAG(d, tile, r0, kk) LDSM(d, tile, WOFF((r0) + (lane & 15), (kk) * 2 + (lane >> 4)))
/* B fragments of column tiles j, j + 1 (rows j * 8 .. of the tile are the product's columns), k-step kk */
#define B_ROWS(d, tile, j, kk) LDSM(d, tile, WOFF((j) * 8 + (lane & 7) + (lane >> 4) * 8, (kk) * 2 + ((lane >> 3) & 1)))
/* B fragments of column tiles f, f + 1 (features) for k-step kk along the tile's rows */
#define B_TRANS(d, tile, kk, f) LDSMT(d, tile, WOFF((kk) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), (f) + (lane >> 4)))
/* the A fragment of k-step kk from accumulator tiles x[2 kk], x[2 kk + 1] */
#define ACC_TO_A(a, x, kk) \\
    a[0] = f16x2(x[2 * (kk)][0], x[2 * (kk)][1]); a[1] = f16x2(x[2 * (kk)][2], x[2 * (kk)][3]); \\
    a[2] = f16x2(x[2 * (kk) + 1][0], x[2 * (kk) + 1][1]); a[3] = f16x2(x[2 * (kk) + 1][2], x[2 * (kk) + 1][3])
"""

_FORWARD = """
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_attention_fwd_mma(__global const st* q, __global const st* k, __global const st* v, __global st* out,
                             __global float* lse, const idx_t L, const idx_t S, const idx_t Hq, const idx_t group,
                             const idx_t Hkv, const float scale2, const float scale) {{
    __local uint4 qs4[64 * EC];
    __local uint4 ks4[TILE * EC];
    __local uint4 vs4[TILE * EC];
    SCRATCH
    __local uint* qs = (__local uint*)qs4;
    __local uint* ks = (__local uint*)ks4;
    __local uint* vs = (__local uint*)vs4;
    LANES;
    const idx_t bh = get_group_id(1), row0 = (idx_t)get_group_id(0) * 64;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
    stage(qs4, q + bh * L * E, row0, (int)min((idx_t)64, L - row0), 64);
    barrier(CLK_LOCAL_MEM_FENCE);
    uint qf[E / 16][4];
    #pragma unroll
    for (int kk = 0; kk < E / 16; ++kk) A_FRAG(qf[kk], qs, warp * 16, kk);
    float o[E / 8][4];
    #pragma unroll
    for (int f = 0; f < E / 8; ++f) {{ o[f][0] = 0.0f; o[f][1] = 0.0f; o[f][2] = 0.0f; o[f][3] = 0.0f; }}
    float m[2] = {{-INFINITY, -INFINITY}}, l[2] = {{0.0f, 0.0f}};
    const idx_t r[2] = {{row0 + warp * 16 + gid, row0 + warp * 16 + gid + 8}};
#if CAUSAL
    const idx_t nend = min(S, row0 + 64);
#else
    const idx_t nend = S;
#endif
    for (idx_t n0 = 0; n0 < nend; n0 += TILE) {{
        const int tn = (int)min((idx_t)TILE, S - n0);
        barrier(CLK_LOCAL_MEM_FENCE);
        stage(ks4, k + kvh * S * E, n0, tn, TILE);
        stage(vs4, v + kvh * S * E, n0, tn, TILE);
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[TILE / 8][4];
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{ s[j][0] = 0.0f; s[j][1] = 0.0f; s[j][2] = 0.0f; s[j][3] = 0.0f; }}
        #pragma unroll
        for (int kk = 0; kk < E / 16; ++kk) {{
            #pragma unroll
            for (int j = 0; j < TILE / 8; j += 2) {{
                uint t[4];
                B_ROWS(t, ks, j, kk);
                MMA(s[j], qf[kk], t[0], t[1]);
                MMA(s[j + 1], qf[kk], t[2], t[3]);
            }}
        }}
        float mx[2] = {{m[0], m[1]}};
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) {{
                const idx_t c = n0 + j * 8 + tig * 2 + (e & 1);
                const float x = (c >= S || (CAUSAL && c > r[e >> 1])) ? -INFINITY : s[j][e] * scale2;
                s[j][e] = x;
                mx[e >> 1] = fmax(mx[e >> 1], x);
            }}
        }}
        float mu[2];
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            mx[h] = fmax(mx[h], SHFL(mx[h], 1));
            mx[h] = fmax(mx[h], SHFL(mx[h], 2));
            mu[h] = mx[h] == -INFINITY ? 0.0f : mx[h];   /* nothing visible yet: p = 0, no rescale needed */
            const float corr = native_exp2(m[h] - mu[h]);
            m[h] = mx[h];
            l[h] *= corr;
            #pragma unroll
            for (int f = 0; f < E / 8; ++f) {{ o[f][2 * h] *= corr; o[f][2 * h + 1] *= corr; }}
        }}
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) {{
                const float p = native_exp2(s[j][e] - mu[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }}
        }}
        #pragma unroll
        for (int kk = 0; kk < TILE / 16; ++kk) {{
            uint pa[4];
            ACC_TO_A(pa, s, kk);
            #pragma unroll
            for (int f = 0; f < E / 8; f += 2) {{
                uint t[4];
                B_TRANS(t, vs, kk, f);
                MMA(o[f], pa, t[0], t[1]);
                MMA(o[f + 1], pa, t[2], t[3]);
            }}
        }}
    }}
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        l[h] += SHFL(l[h], 1);
        l[h] += SHFL(l[h], 2);
    }}
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        if (r[h] < L) {{
            const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
            __global st* orow = out + (bh * L + r[h]) * E;
            #pragma unroll
            for (int f = 0; f < E / 8; ++f) store2(orow, f * 8 + tig * 2, o[f][2 * h] * inv, o[f][2 * h + 1] * inv);
            if (tig == 0) lse[bh * L + r[h]] = l[h] > 0.0f ? (m[h] + log2(l[h])) * M_LN2_F : -INFINITY;
        }}
    }}
}}
"""

_BACKWARD_Q = """
/* dQ (and D = rowsum(dO * O) into drow for bwd_kv): a work-group owns 64 query rows, loops over key tiles */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_attention_bwd_q_mma(__global const st* q, __global const st* k, __global const st* v,
                               __global const st* out, __global const st* g, __global const float* lse,
                               __global st* dq, __global float* drow, const idx_t L, const idx_t S, const idx_t Hq,
                               const idx_t group, const idx_t Hkv, const float scale2, const float scale) {{
    __local uint4 qs4[64 * EC];
    __local uint4 gs4[64 * EC];
    __local uint4 ks4[TILE * EC];
    __local uint4 vs4[TILE * EC];
    SCRATCH
    __local uint* qs = (__local uint*)qs4;
    __local uint* gs = (__local uint*)gs4;
    __local uint* ks = (__local uint*)ks4;
    __local uint* vs = (__local uint*)vs4;
    LANES;
    const idx_t bh = get_group_id(1), row0 = (idx_t)get_group_id(0) * 64;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
    const int tm = (int)min((idx_t)64, L - row0);
    stage(qs4, q + bh * L * E, row0, tm, 64);
    stage(gs4, g + bh * L * E, row0, tm, 64);
    const idx_t r[2] = {{row0 + warp * 16 + gid, row0 + warp * 16 + gid + 8}};
    float dr[2], lr[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        float d = 0.0f;
        if (r[h] < L) {{
            const idx_t at = (bh * L + r[h]) * E;
            for (int e = tig * (E / 4); e < (tig + 1) * (E / 4); ++e) d += LDF(g, at + e) * LDF(out, at + e);
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
#if CAUSAL
    const idx_t nend = min(S, row0 + 64);
#else
    const idx_t nend = S;
#endif
    for (idx_t n0 = 0; n0 < nend; n0 += TILE) {{
        const int tn = (int)min((idx_t)TILE, S - n0);
        barrier(CLK_LOCAL_MEM_FENCE);
        stage(ks4, k + kvh * S * E, n0, tn, TILE);
        stage(vs4, v + kvh * S * E, n0, tn, TILE);
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[TILE / 8][4], dp[TILE / 8][4];
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) {{ s[j][e] = 0.0f; dp[j][e] = 0.0f; }}
        }}
        #pragma unroll
        for (int kk = 0; kk < E / 16; ++kk) {{
            uint qa[4], ga[4];
            A_FRAG(qa, qs, warp * 16, kk);
            A_FRAG(ga, gs, warp * 16, kk);
            #pragma unroll
            for (int j = 0; j < TILE / 8; j += 2) {{
                uint t[4];
                B_ROWS(t, ks, j, kk);
                MMA(s[j], qa, t[0], t[1]);
                MMA(s[j + 1], qa, t[2], t[3]);
                B_ROWS(t, vs, j, kk);
                MMA(dp[j], ga, t[0], t[1]);
                MMA(dp[j + 1], ga, t[2], t[3]);
            }}
        }}
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) {{
                const idx_t c = n0 + j * 8 + tig * 2 + (e & 1);
                const int hidden = c >= S || (CAUSAL && c > r[e >> 1]);
                const float p = hidden ? 0.0f : native_exp2(s[j][e] * scale2 - lr[e >> 1]);
                s[j][e] = p * (dp[j][e] - dr[e >> 1]);   /* dS */
            }}
        }}
        #pragma unroll
        for (int kk = 0; kk < TILE / 16; ++kk) {{
            uint da[4];
            ACC_TO_A(da, s, kk);
            #pragma unroll
            for (int f = 0; f < E / 8; f += 2) {{
                uint t[4];
                B_TRANS(t, ks, kk, f);
                MMA(acc[f], da, t[0], t[1]);
                MMA(acc[f + 1], da, t[2], t[3]);
            }}
        }}
    }}
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        if (r[h] < L) {{
            __global st* row = dq + (bh * L + r[h]) * E;
            #pragma unroll
            for (int f = 0; f < E / 8; ++f)
                store2(row, f * 8 + tig * 2, acc[f][2 * h] * scale, acc[f][2 * h + 1] * scale);
        }}
    }}
}}
"""

_BACKWARD_KV = """
/* dK, dV: a work-group owns 64 keys (K, V resident), loops over the q heads of its kv head and query tiles */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_attention_bwd_kv_mma(__global const st* q, __global const st* k, __global const st* v,
                                __global const st* g, __global const float* lse, __global const float* drow,
                                __global st* dk, __global st* dv, const idx_t L, const idx_t S, const idx_t Hq,
                                const idx_t group, const idx_t Hkv, const float scale2, const float scale) {{
    __local uint4 ks4[64 * EC];
    __local uint4 vs4[64 * EC];
    __local uint4 qs4[TILE * EC];
    __local uint4 gs4[TILE * EC];
    SCRATCH
    __local uint* ks = (__local uint*)ks4;
    __local uint* vs = (__local uint*)vs4;
    __local uint* qs = (__local uint*)qs4;
    __local uint* gs = (__local uint*)gs4;
    LANES;
    const idx_t kvh = get_group_id(1), c0 = (idx_t)get_group_id(0) * 64;
    const int tn = (int)min((idx_t)64, S - c0);
    stage(ks4, k + kvh * S * E, c0, tn, 64);
    stage(vs4, v + kvh * S * E, c0, tn, 64);
    const idx_t key[2] = {{c0 + warp * 16 + gid, c0 + warp * 16 + gid + 8}};
    float dka[E / 8][4], dva[E / 8][4];
    #pragma unroll
    for (int f = 0; f < E / 8; ++f) {{
        #pragma unroll
        for (int e = 0; e < 4; ++e) {{ dka[f][e] = 0.0f; dva[f][e] = 0.0f; }}
    }}
    const idx_t first = (kvh / Hkv) * Hq + (kvh % Hkv) * group;
#if CAUSAL
    const idx_t mstart = c0;   /* rows before c0 see no key of this block */
#else
    const idx_t mstart = 0;
#endif
    for (idx_t bh = first; bh < first + group; ++bh) {{
        for (idx_t m0 = mstart; m0 < L; m0 += TILE) {{
            const int tm = (int)min((idx_t)TILE, L - m0);
            barrier(CLK_LOCAL_MEM_FENCE);
            stage(qs4, q + bh * L * E, m0, tm, TILE);
            stage(gs4, g + bh * L * E, m0, tm, TILE);
            barrier(CLK_LOCAL_MEM_FENCE);
            float lc[TILE / 8][2], dc[TILE / 8][2];
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                #pragma unroll
                for (int b = 0; b < 2; ++b) {{
                    const idx_t col = m0 + j * 8 + tig * 2 + b;
                    const float x = col < L ? lse[bh * L + col] : -INFINITY;
                    lc[j][b] = x == -INFINITY ? INFINITY : x * M_LOG2E_F;   /* P = 0 */
                    dc[j][b] = col < L ? drow[bh * L + col] : 0.0f;
                }}
            }}
            float st_[TILE / 8][4], dpt[TILE / 8][4];   /* S^T, dP^T: keys x queries */
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                #pragma unroll
                for (int e = 0; e < 4; ++e) {{ st_[j][e] = 0.0f; dpt[j][e] = 0.0f; }}
            }}
            #pragma unroll
            for (int kk = 0; kk < E / 16; ++kk) {{
                uint ka[4], va[4];
                A_FRAG(ka, ks, warp * 16, kk);
                A_FRAG(va, vs, warp * 16, kk);
                #pragma unroll
                for (int j = 0; j < TILE / 8; j += 2) {{
                    uint t[4];
                    B_ROWS(t, qs, j, kk);
                    MMA(st_[j], ka, t[0], t[1]);
                    MMA(st_[j + 1], ka, t[2], t[3]);
                    B_ROWS(t, gs, j, kk);
                    MMA(dpt[j], va, t[0], t[1]);
                    MMA(dpt[j + 1], va, t[2], t[3]);
                }}
            }}
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                #pragma unroll
                for (int e = 0; e < 4; ++e) {{
                    const idx_t col = m0 + j * 8 + tig * 2 + (e & 1), kr = key[e >> 1];
                    const int hidden = kr >= S || (CAUSAL && kr > col);
                    const float p = hidden ? 0.0f : native_exp2(st_[j][e] * scale2 - lc[j][e & 1]);
                    st_[j][e] = p;
                    dpt[j][e] = p * (dpt[j][e] - dc[j][e & 1]);   /* dS^T */
                }}
            }}
            #pragma unroll
            for (int kk = 0; kk < TILE / 16; ++kk) {{
                uint pa[4], da[4];
                ACC_TO_A(pa, st_, kk);
                ACC_TO_A(da, dpt, kk);
                #pragma unroll
                for (int f = 0; f < E / 8; f += 2) {{
                    uint t[4];
                    B_TRANS(t, gs, kk, f);
                    MMA(dva[f], pa, t[0], t[1]);
                    MMA(dva[f + 1], pa, t[2], t[3]);
                    B_TRANS(t, qs, kk, f);
                    MMA(dka[f], da, t[0], t[1]);
                    MMA(dka[f + 1], da, t[2], t[3]);
                }}
            }}
        }}
    }}
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        if (key[h] < S) {{
            __global st* dkr = dk + (kvh * S + key[h]) * E;
            __global st* dvr = dv + (kvh * S + key[h]) * E;
            #pragma unroll
            for (int f = 0; f < E / 8; ++f) {{
                store2(dkr, f * 8 + tig * 2, dka[f][2 * h] * scale, dka[f][2 * h + 1] * scale);
                store2(dvr, f * 8 + tig * 2, dva[f][2 * h], dva[f][2 * h + 1]);
            }}
        }}
    }}
}}
"""

_BODIES = {"fwd": _FORWARD, "bwd_q": _BACKWARD_Q, "bwd_kv": _BACKWARD_KV}
#: kernel -> its name in the source
NAMES = {kernel: f"netcl_attention_{kernel}_mma" for kernel in _BODIES}


def tile_rows(kernel: str, e: int) -> int:
    """Rows of the tile ``kernel``'s main loop stages: keys (fwd, bwd_q) or queries (bwd_kv). Local memory
    ``2 * 64 * e * 2 + 2 * tile * e * 2`` bytes (fwd: one 64-row tile fewer), at most 40 KB (NVIDIA's 48 KB)."""
    if e == 64:
        return 64
    return 32 if kernel == "fwd" else 16


def local_bytes(kernel: str, e: int) -> int:
    """Local memory of ``kernel`` at feature size ``e`` (bytes, the PTX build: no scratch)."""
    resident = 1 if kernel == "fwd" else 2
    return (resident * 64 + 2 * tile_rows(kernel, e)) * e * 2


def attention_source(kernel: str, e: int, causal: bool, half: bool, idx: str, emulate: bool = False) -> str:
    """The source of ``kernel`` ("fwd", "bwd_q", "bwd_kv") for feature size ``e`` (64 or 128); ``half``:
    float16 storage (else float32, rounded to f16 as staged); ``emulate``: the OpenCL C models of the PTX
    primitives (any OpenCL device) instead of inline PTX (NVIDIA's OpenCL)."""
    fields = {
        "pragmas": storage_pragmas([]),
        "E": e,
        "threads": THREADS,
        "tile": tile_rows(kernel, e),
        "causal": int(causal),
        "half": int(half),
        "idx": idx,
        "primitives": _EMULATED if emulate else _PTX,
    }
    source = (_COMMON + _BODIES[kernel]).format(**fields)
    if emulate:  # the models hold barriers: unrolling them only grows the program
        source = source.replace("#pragma unroll\n", "\n")
    return source
