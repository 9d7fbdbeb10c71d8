"""OpenCL C source of the tensor-core attention kernels (``attention_mma``): FlashAttention-2 on ``mma.sync``.

Every product is ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`` (f16 operands, fp32 accumulation)
through inline PTX. A work-group is 4 warps (128 work-items); a warp owns ``16 * mt`` rows (queries, or keys
in ``bwd_kv``; ``Plan.mt``). Lane ``l`` of a warp has ``gid = l / 4`` and ``tig = l % 4``; in an m16n8
accumulator it holds rows ``gid`` and ``gid + 8``, columns ``2 tig`` and ``2 tig + 1`` of each 8-column tile
(PTX ISA, "Matrix Fragments for mma.m16n8k16"), so row statistics reduce over the 4 lanes of a quad
(``shfl.sync.bfly``).

The kernels read float16 operands (``attention_mma`` rounds float32 tensors to f16 first, nearest even) and
write their outputs as float16 or float32 (``OUT_HALF``). Tiles go from global to local memory by
``cp.async`` (16 bytes, zero-filled past the last row), ``Plan.nbuf`` buffers deep: with two, the next
tile's copy runs under this tile's products. The rows a work-group owns (``resident``: Q, Q and dO, or K and
V) are staged once, their A fragments read into registers (``bwd_kv`` at E 128: re-read from local memory
each tile), and their local memory reused by the tiles. Local tiles hold rows of ``E`` f16 values whose
16-byte chunks are XOR-swizzled (chunk ``c`` of row ``r`` at ``c ^ (r % 8)``), so the 8 row addresses of one
``ldmatrix`` matrix fall in distinct banks. Fragments come out with ``ldmatrix.x4`` (A operands, and B
operands whose rows are the product's columns) or ``ldmatrix.x4.trans`` (B operands whose rows run along the
contraction). Probabilities and dS go from the accumulator layout straight into A fragments
(FlashAttention-2's register reuse: the accumulator tiles ``2 kk`` and ``2 kk + 1`` are the A fragment of
k-step ``kk``). Scores are in log2 units (``scale2 = scale * log2(e)``, ``ex2.approx.ftz``: results below
2**-126 are 0); masks (causal, tails)
are applied only in the tiles that hold a hidden element.

``EMULATE`` 1 replaces the PTX primitives (``MMA``, ``LDSM``, ``LDSMT``, ``SHFL``, the ``cp.async`` copies)
and the f16 conversion with OpenCL C models (the warp-level ones exchange the warp's registers through local
memory between barriers; a copy is a plain load and store): the same kernels, all their index arithmetic
included, run (slowly) on any OpenCL device. The tests use it where no NVIDIA device is present. Every call
of a primitive is in control flow uniform over the work-group, as the models' barriers need.
"""

from __future__ import annotations

from dataclasses import dataclass

from netcl.core.dtypes import bfloat16, float16
from netcl.runtime.ops._common import storage_pragmas
from netcl.runtime.ops.storage_io import vload_c

#: the operand kinds: mma element type -> the tensors' dtype
KINDS = {"f16": float16, "bf16": bfloat16}
#: work-items per work-group (4 warps)
THREADS = 64 * 2
#: kernels of the source
KERNELS = ("fwd", "bwd_q", "bwd_kv")


@dataclass(frozen=True)
class Plan:
    """Blocking of one kernel at one feature size."""

    mt: int  #: m16 row tiles per warp: the work-group owns ``64 * mt`` rows (queries; keys in bwd_kv)
    tile: int  #: rows of the streamed tile (keys in fwd and bwd_q, queries in bwd_kv)
    nbuf: int  #: streamed-tile buffers: 2 copies the next tile while this one multiplies
    hold: bool = True  #: bwd_kv: K and V fragments in registers (else re-read from local memory each tile)

    @property
    def rows(self) -> int:
        return 64 * self.mt


#: (kernel, E) -> its plan; local memory of each within NVIDIA's 48 KB (``local_bytes``)
PLANS: dict[tuple[str, int], Plan] = {
    ("fwd", 64): Plan(2, 64, 2),
    ("fwd", 128): Plan(1, 32, 2),
    ("bwd_q", 64): Plan(1, 32, 2),
    ("bwd_q", 128): Plan(1, 32, 2),
    ("bwd_kv", 64): Plan(1, 64, 2),
    ("bwd_kv", 128): Plan(1, 16, 1, hold=False),
}


def plan(kernel: str, e: int) -> Plan:
    """The plan of ``kernel`` at feature size ``e``."""
    return PLANS[(kernel, e)]


def _resident_rows(kernel: str, p: Plan) -> int:
    return p.rows * (1 if kernel == "fwd" else 2)


def _layout(kernel: str, e: int, p: Plan) -> tuple[int, str]:
    """(row offset of the resident rows in the tile buffers, where: "early" = buffer 1, staged beside tile
    0; "first" = from row 0, tile 0 copied after them; "apart" = their own array)."""
    buffer_rows = 2 * p.tile
    res = _resident_rows(kernel, p)
    if kernel == "bwd_kv" and not p.hold:
        return 0, "apart"
    if p.nbuf == 2 and res <= buffer_rows:
        return buffer_rows, "early"
    if res <= p.nbuf * buffer_rows:
        return 0, "first"
    raise ValueError(f"attention_mma: {kernel} E{e}: {res} resident rows do not fit {p.nbuf} tile buffers")


def local_bytes(kernel: str, e: int) -> int:
    """Local memory of ``kernel`` at feature size ``e`` (bytes, the PTX build: no scratch)."""
    p = plan(kernel, e)
    words = p.nbuf * 2 * p.tile * e // 2
    if _layout(kernel, e, p)[1] == "apart":
        words += _resident_rows(kernel, p) * e // 2
    if kernel == "bwd_kv":
        words += p.nbuf * 2 * p.tile
    return words * 4


_PTX = r"""
inline uint pk2(const float lo, const float hi) {  /* two floats rounded (nearest even) into one word */
    uint r; asm("cvt.rn.__AB__x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }
inline float shfl_xor(const float v, const int m) {
    uint r; asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(as_uint(v)), "r"(m));
    return as_float(r); }
inline float exp2_ftz(const float x) {  /* one MUFU.EX2: no subnormal fix-up around it */
    float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
#define EXP2(x) exp2_ftz(x)
#define SCRATCH
#define SHFL(v, m) shfl_xor((v), (m))
#define MMA(d, a, b0, b1) asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.__AB__.__AB__.f32 " \
    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
    : "=f"((d)[0]), "=f"((d)[1]), "=f"((d)[2]), "=f"((d)[3]) \
    : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"(b0), "r"(b1), \
      "f"((d)[0]), "f"((d)[1]), "f"((d)[2]), "f"((d)[3]))
#define LDSM(d, base, off) asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" \
    : "=r"((d)[0]), "=r"((d)[1]), "=r"((d)[2]), "=r"((d)[3]) : "r"((uint)(size_t)((base) + (off))))
#define LDSMT(d, base, off) asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" \
    : "=r"((d)[0]), "=r"((d)[1]), "=r"((d)[2]), "=r"((d)[3]) : "r"((uint)(size_t)((base) + (off))))
/* 16 (4) bytes global -> local, the last 16 - bytes (4 - bytes) zero-filled; through L2 only (16) */
#define CP16(dst, src, bytes) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" \
    :: "r"((uint)(size_t)(dst)), "l"((ulong)(size_t)(src)), "r"(bytes) : "memory")
#define CP4(dst, src, bytes) asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" \
    :: "r"((uint)(size_t)(dst)), "l"((ulong)(size_t)(src)), "r"(bytes) : "memory")
#define COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define WAIT(n) asm volatile("cp.async.wait_group " #n ";" ::: "memory")
"""

_EMULATED = r"""
/* models of the warp-level primitives: each work-item publishes its registers in scr (8 words a work-item) */
#if BF16
inline float h2f(const uint bits) { return netcl_bf16_load((ushort)(bits & 0xffffu)); }
inline uint pk2(const float lo, const float hi) {
    return (uint)netcl_bf16_round(lo) | ((uint)netcl_bf16_round(hi) << 16); }
#else
inline float h2f(const uint bits) { const ushort u = (ushort)(bits & 0xffffu); return vload_half(0, (const half*)&u); }
inline uint pk2(const float lo, const float hi) {
    ushort u[2]; vstore_half_rte(lo, 0, (half*)u); vstore_half_rte(hi, 1, (half*)u);
    return (uint)u[0] | ((uint)u[1] << 16); }
#endif
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
#define EXP2(x) native_exp2(x)
#define SCRATCH __local uint scr[NT * 8];
#define SHFL(v, m) emu_shfl((v), (m), scr)
#define MMA(d, a, b0, b1) emu_mma((d), (a), (b0), (b1), scr)
#define LDSM(d, base, off) emu_ldsm((d), (base), (off), 0, scr)
#define LDSMT(d, base, off) emu_ldsm((d), (base), (off), 1, scr)
/* the copies complete at once: the barrier after WAIT orders them as it orders cp.async's */
#define CP16(dst, src, bytes) (*(dst) = (bytes) ? *(__global const uint4*)(src) : (uint4)(0u))
#define CP4(dst, src, bytes) (*(dst) = (bytes) ? *(src) : 0.0f)
#define COMMIT()
#define WAIT(n)
"""

#: the work-group's head plane and row block in ``attention_mma.launch_flash``'s grid (this module's kernels and
#: ``attention_mma_tf32_source``'s; after ``CAUSAL``)
LAUNCH_ORDER = """\
/* a work-group's head plane and row block. Causal launches put the planes along the first dimension, which NVIDIA
   dispatches fastest, so every head's longest blocks start before any head's shorter ones (the grid's tail is
   the short blocks of all heads); full ones put a head's blocks side by side, which share its keys in L2 */
#if CAUSAL
#define PLANE get_group_id(0)
#define BLOCK get_group_id(1)
#define BLOCKS get_num_groups(1)
#else
#define PLANE get_group_id(1)
#define BLOCK get_group_id(0)
#define BLOCKS get_num_groups(0)
#endif
#if CAUSAL   /* query blocks with the most keys first: the light ones fill the grid's tail */
#define ROW_BLOCK (BLOCKS - 1 - BLOCK)
#else
#define ROW_BLOCK BLOCK
#endif
"""

_PACKED_LAYOUT = """#define PACKED {packed}
/* Element offsets of row 0 of head plane bh: QB for q (and dq), KB / VB for k / v (and dk / dv), OB for the output
   and its gradient; QS / OS: the row strides. Contiguous: (B*H, L, E) planes. PACKED (self-attention, Hq == Hkv,
   L == S): q, k and v are one (B, L, 3, H, E) tensor (and dq, dk, dv one of that shape), out and g (B, L, H, E). */
#if PACKED
#define QB(bh) (((bh) / Hq * L * 3 * Hq + (bh) % Hq) * E)
#define KB(bh) (QB(bh) + Hq * E)
#define VB(bh) (QB(bh) + 2 * Hq * E)
#define OB(bh) (((bh) / Hq * L * Hq + (bh) % Hq) * E)
#define QS (3 * Hq * E)
#define OS (Hq * E)
#else
#define QB(bh) ((bh) * L * E)
#define KB(bh) ((bh) * S * E)
#define VB(bh) KB(bh)
#define OB(bh) QB(bh)
#define QS E
#define OS E
#endif
"""


def packed_layout(packed: bool) -> str:
    """The address macros of a FlashAttention kernel of this module or ``attention_mma_tf32_source`` (after
    ``idx_t``; they use the kernel's L, S and Hq): per-head planes, or (``packed``) a self-attention's q, k and v
    in one (B, L, 3 * H * E) tensor and its output in one (B, L, H * E)."""
    return _PACKED_LAYOUT.replace("{packed}", str(int(packed)))


_COMMON = """{pragmas}
#define E {E}
#define EC (E / 8)              /* 16-byte chunks of a row */
#define NT {threads}
#define MT {mt}                 /* m16 row tiles a warp owns */
#define BM (64 * MT)            /* rows a work-group owns */
#define TILE {tile}             /* rows of the streamed tile (keys, or queries in bwd_kv) */
#define NBUF {nbuf}
#define TROWS (2 * TILE)        /* rows of one buffer: two operands' tiles */
#define RES {res}               /* row of the buffers where the resident rows are staged */
#define RES_EARLY {early}       /* they sit in buffer 1: tile 0 is copied beside them */
#define CAUSAL {causal}
{launch_order}#define OUT_HALF {out_half}
#define BF16 {bf16}
typedef {idx} idx_t;
{packed_layout}typedef {st} st;                /* operands: float16 or bfloat16 words */
#define LDS8(p, i) {lds8}
#if OUT_HALF
typedef st ot;
#define LDO8(p, i) LDS8(p, i)
#else
typedef float ot;
#define LDO8(p, i) vload8(0, (p) + (i))
#endif
/* word offset of chunk c of row r in a swizzled tile */
#define WOFF(r, c) (((r) * EC + ((c) ^ ((r) & 7))) * 4)
{primitives}
/* copy rows first .. first + n - 1 of src (E wide, rs elements apart) into rows 0 .. rows - 1 of dst (zeros past n) */
inline void stage(__local uint4* dst, __global const st* src, const idx_t rs, const idx_t first, const int n,
                  const int rows) {{
    #pragma unroll
    for (int i = 0; i < rows * EC / NT; ++i) {{
        const int t = get_local_id(0) + i * NT, row = t / EC, c = t % EC, ok = row < n;
        __global const st* p = src + (first + (ok ? row : 0)) * rs + c * 8;
        CP16(dst + (row * EC + (c ^ (row & 7))), p, ok ? 16 : 0);
    }}
}}
/* values a, b at columns i, i + 1 of an output row */
inline void store2(__global ot* p, const int i, const float a, const float b) {{
#if OUT_HALF
    *(__global uint*)(p + i) = pk2(a, b);
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
    a[0] = pk2(x[2 * (kk)][0], x[2 * (kk)][1]); a[1] = pk2(x[2 * (kk)][2], x[2 * (kk)][3]); \\
    a[2] = pk2(x[2 * (kk) + 1][0], x[2 * (kk) + 1][1]); a[3] = pk2(x[2 * (kk) + 1][2], x[2 * (kk) + 1][3])
/* words of buffer b's first (second) operand tile */
#define TILE0(b) (bufw + (b) * TROWS * EC * 4)
#define TILE1(b) (bufw + ((b) * TROWS + TILE) * EC * 4)
/* the prologue's copies: the resident rows (a commit group), then tile 0 beside them or after them */
#if RES_EARLY
#define PROLOGUE(stage_res, issue0) stage_res; COMMIT(); issue0; COMMIT(); WAIT(1); barrier(CLK_LOCAL_MEM_FENCE)
#define AFTER_RES(issue0)
#else
#define PROLOGUE(stage_res, issue0) stage_res; COMMIT(); WAIT(0); barrier(CLK_LOCAL_MEM_FENCE)
#define AFTER_RES(issue0) barrier(CLK_LOCAL_MEM_FENCE); issue0; COMMIT()
#endif
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
    stage(buf4 + (b) * TROWS * EC, k + KB(kvh), QS, n0_, tn_, TILE); \\
    stage(buf4 + ((b) * TROWS + TILE) * EC, v + VB(kvh), QS, n0_, tn_, TILE); }}
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_attention_fwd_mma(__global const st* q, __global const st* k, __global const st* v, __global ot* out,
                             __global float* lse, const idx_t L, const idx_t S, const idx_t Hq, const idx_t group,
                             const idx_t Hkv, const float scale2, const float scale) {{
    __local uint4 buf4[NBUF * TROWS * EC];
    SCRATCH
    __local uint* bufw = (__local uint*)buf4;
    LANES;
    const idx_t bh = PLANE, row0 = (idx_t)ROW_BLOCK * BM;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
#if CAUSAL
    const idx_t nend = min(S, row0 + BM);
#else
    const idx_t nend = S;
#endif
    const int nt = (int)((nend + TILE - 1) / TILE);
    PROLOGUE(stage(buf4 + RES * EC, q + QB(bh), QS, row0, (int)min((idx_t)BM, L - row0), BM), ISSUE(0, 0));
    uint qf[MT][E / 16][4];
    #pragma unroll
    for (int mi = 0; mi < MT; ++mi) {{
        #pragma unroll
        for (int kk = 0; kk < E / 16; ++kk) A_FRAG(qf[mi][kk], bufw + RES * EC * 4, (warp * MT + mi) * 16, kk);
    }}
    AFTER_RES(ISSUE(0, 0));
    float o[MT][E / 8][4];
    float m[MT][2], l[MT][2];
    idx_t r[MT][2];
    #pragma unroll
    for (int mi = 0; mi < MT; ++mi) {{
        #pragma unroll
        for (int f = 0; f < E / 8; ++f) {{
            o[mi][f][0] = 0.0f; o[mi][f][1] = 0.0f; o[mi][f][2] = 0.0f; o[mi][f][3] = 0.0f;
        }}
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
            m[mi][h] = -INFINITY;
            l[mi][h] = 0.0f;
            r[mi][h] = row0 + (warp * MT + mi) * 16 + gid + 8 * h;
        }}
    }}
    for (int t = 0; t < nt; ++t) {{
        LOOP_TOP(ISSUE(t + 1, (t + 1) % NBUF));
        const idx_t n0 = (idx_t)t * TILE;
        __local const uint* ks = TILE0(t % NBUF);
        __local const uint* vs = TILE1(t % NBUF);
        float s[MT][TILE / 8][4];
        #pragma unroll
        for (int mi = 0; mi < MT; ++mi) {{
            #pragma unroll
            for (int j = 0; j < TILE / 8; ++j) {{
                s[mi][j][0] = 0.0f; s[mi][j][1] = 0.0f; s[mi][j][2] = 0.0f; s[mi][j][3] = 0.0f;
            }}
        }}
        #pragma unroll
        for (int kk = 0; kk < E / 16; ++kk) {{
            #pragma unroll
            for (int j = 0; j < TILE / 8; j += 2) {{
                uint b[4];
                B_ROWS(b, ks, j, kk);
                #pragma unroll
                for (int mi = 0; mi < MT; ++mi) {{
                    MMA(s[mi][j], qf[mi][kk], b[0], b[1]);
                    MMA(s[mi][j + 1], qf[mi][kk], b[2], b[3]);
                }}
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
        for (int kk = 0; kk < TILE / 16; ++kk) {{
            uint pa[MT][4];
            #pragma unroll
            for (int mi = 0; mi < MT; ++mi) {{ ACC_TO_A(pa[mi], s[mi], kk); }}
            #pragma unroll
            for (int f = 0; f < E / 8; f += 2) {{
                uint b[4];
                B_TRANS(b, vs, kk, f);
                #pragma unroll
                for (int mi = 0; mi < MT; ++mi) {{
                    MMA(o[mi][f], pa[mi], b[0], b[1]);
                    MMA(o[mi][f + 1], pa[mi], b[2], b[3]);
                }}
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
                __global ot* orow = out + OB(bh) + r[mi][h] * OS;
                #pragma unroll
                for (int f = 0; f < E / 8; ++f)
                    store2(orow, f * 8 + tig * 2, o[mi][f][2 * h] * inv, o[mi][f][2 * h + 1] * inv);
                if (tig == 0) lse[bh * L + r[mi][h]] = sum > 0.0f ? (m[mi][h] + log2(sum)) * M_LN2_F : -INFINITY;
            }}
        }}
    }}
}}
"""

_BACKWARD_Q = """
/* keys n0 .. of tile t into buffer b */
#define ISSUE(t, b) {{ const idx_t n0_ = (idx_t)(t) * TILE; const int tn_ = (int)min((idx_t)TILE, S - n0_); \\
    stage(buf4 + (b) * TROWS * EC, k + KB(kvh), QS, n0_, tn_, TILE); \\
    stage(buf4 + ((b) * TROWS + TILE) * EC, v + VB(kvh), QS, n0_, tn_, TILE); }}
/* dQ (and D = rowsum(dO * O) into drow for bwd_kv): a work-group owns 64 query rows, loops over key tiles */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_attention_bwd_q_mma(__global const st* q, __global const st* k, __global const st* v,
                               __global const ot* out, __global const st* g, __global const float* lse,
                               __global ot* dq, __global float* drow, const idx_t L, const idx_t S, const idx_t Hq,
                               const idx_t group, const idx_t Hkv, const float scale2, const float scale) {{
    __local uint4 buf4[NBUF * TROWS * EC];
    SCRATCH
    __local uint* bufw = (__local uint*)buf4;
    LANES;
    const idx_t bh = PLANE, row0 = (idx_t)ROW_BLOCK * 64;
    const idx_t kvh = (bh / Hq) * Hkv + (bh % Hq) / group;
    const int tm = (int)min((idx_t)64, L - row0);
#if CAUSAL
    const idx_t nend = min(S, row0 + 64);
#else
    const idx_t nend = S;
#endif
    const int nt = (int)((nend + TILE - 1) / TILE);
    PROLOGUE(stage(buf4 + RES * EC, q + QB(bh), QS, row0, tm, 64);
             stage(buf4 + (RES + 64) * EC, g + OB(bh), OS, row0, tm, 64),
             ISSUE(0, 0));
    uint qa[E / 16][4], ga[E / 16][4];
    #pragma unroll
    for (int kk = 0; kk < E / 16; ++kk) {{
        A_FRAG(qa[kk], bufw + RES * EC * 4, warp * 16, kk);
        A_FRAG(ga[kk], bufw + (RES + 64) * EC * 4, warp * 16, kk);
    }}
    AFTER_RES(ISSUE(0, 0));
    const idx_t r[2] = {{row0 + warp * 16 + gid, row0 + warp * 16 + gid + 8}};
    float dr[2], lr[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        float d = 0.0f;
        if (r[h] < L) {{
            const idx_t at = OB(bh) + r[h] * OS + tig * (E / 4);
            #pragma unroll
            for (int e = 0; e < E / 4; e += 8) {{
                const float8 x = LDS8(g, at + e) * LDO8(out, at + e);
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
        __local const uint* ks = TILE0(t % NBUF);
        __local const uint* vs = TILE1(t % NBUF);
        float s[TILE / 8][4], dp[TILE / 8][4];
        #pragma unroll
        for (int j = 0; j < TILE / 8; ++j) {{
            #pragma unroll
            for (int e = 0; e < 4; ++e) {{ s[j][e] = 0.0f; dp[j][e] = 0.0f; }}
        }}
        #pragma unroll
        for (int kk = 0; kk < E / 16; ++kk) {{
            #pragma unroll
            for (int j = 0; j < TILE / 8; j += 2) {{
                uint b[4];
                B_ROWS(b, ks, j, kk);
                MMA(s[j], qa[kk], b[0], b[1]);
                MMA(s[j + 1], qa[kk], b[2], b[3]);
                B_ROWS(b, vs, j, kk);
                MMA(dp[j], ga[kk], b[0], b[1]);
                MMA(dp[j + 1], ga[kk], b[2], b[3]);
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
        for (int kk = 0; kk < TILE / 16; ++kk) {{
            uint da[4];
            ACC_TO_A(da, s, kk);
            #pragma unroll
            for (int f = 0; f < E / 8; f += 2) {{
                uint b[4];
                B_TRANS(b, ks, kk, f);
                MMA(acc[f], da, b[0], b[1]);
                MMA(acc[f + 1], da, b[2], b[3]);
            }}
        }}
        LOOP_END(ISSUE(t + 1, 0));
    }}
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        if (r[h] < L) {{
            __global ot* row = dq + QB(bh) + r[h] * QS;
            #pragma unroll
            for (int f = 0; f < E / 8; ++f)
                store2(row, f * 8 + tig * 2, acc[f][2 * h] * scale, acc[f][2 * h + 1] * scale);
        }}
    }}
}}
"""

_BACKWARD_KV = """
/* query tile t (head first + t / nper, rows m0 ..) into buffer b: Q, dO, and their lse and D */
#define ISSUE(t, b) {{ const idx_t bh_ = first + (t) / nper, m0_ = mstart + (idx_t)((t) % nper) * TILE; \\
    const int tm_ = (int)min((idx_t)TILE, L - m0_); \\
    stage(buf4 + (b) * TROWS * EC, q + QB(bh_), QS, m0_, tm_, TILE); \\
    stage(buf4 + ((b) * TROWS + TILE) * EC, g + OB(bh_), OS, m0_, tm_, TILE); \\
    if (lid < 2 * TILE) {{ \\
        const int i_ = lid % TILE, ok_ = i_ < tm_; \\
        __global const float* src_ = lid < TILE ? lse : drow; \\
        CP4(&rowv[b][lid / TILE][i_], src_ + (ok_ ? bh_ * L + m0_ + i_ : 0), ok_ * 4); }} }}
/* dK, dV: a work-group owns 64 keys, loops over the q heads of its kv head and their query tiles */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_attention_bwd_kv_mma(__global const st* q, __global const st* k, __global const st* v,
                                __global const st* g, __global const float* lse, __global const float* drow,
                                __global ot* dk, __global ot* dv, const idx_t L, const idx_t S, const idx_t Hq,
                                const idx_t group, const idx_t Hkv, const float scale2, const float scale) {{
    __local uint4 buf4[NBUF * TROWS * EC];
    __local float rowv[NBUF][2][TILE];   /* lse, D of the tile's queries */
#if HOLD
    __local uint4* res4 = buf4;
#else
    __local uint4 res4[128 * EC];
#endif
    SCRATCH
    __local uint* bufw = (__local uint*)buf4;
    __local uint* resw = (__local uint*)res4;
    LANES;
    const idx_t kvh = PLANE, c0 = (idx_t)BLOCK * 64;
    const int tn = (int)min((idx_t)64, S - c0);
    const idx_t first = (kvh / Hkv) * Hq + (kvh % Hkv) * group;
#if CAUSAL
    const idx_t mstart = c0;   /* rows before c0 see no key of this block */
#else
    const idx_t mstart = 0;
#endif
    const int nper = L > mstart ? (int)((L - mstart + TILE - 1) / TILE) : 0;
    const int nt = nper * (int)group;
    PROLOGUE(stage(res4 + RES * EC, k + KB(kvh), QS, c0, tn, 64);
             stage(res4 + (RES + 64) * EC, v + VB(kvh), QS, c0, tn, 64),
             if (nt > 0) ISSUE(0, 0));
#if HOLD
    uint ka[E / 16][4], va[E / 16][4];
    #pragma unroll
    for (int kk = 0; kk < E / 16; ++kk) {{
        A_FRAG(ka[kk], resw + RES * EC * 4, warp * 16, kk);
        A_FRAG(va[kk], resw + (RES + 64) * EC * 4, warp * 16, kk);
    }}
#endif
    AFTER_RES(if (nt > 0) ISSUE(0, 0));
    const idx_t key[2] = {{c0 + warp * 16 + gid, c0 + warp * 16 + gid + 8}};
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
        __local const uint* qs = TILE0(b);
        __local const uint* gs = TILE1(b);
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
        for (int kk = 0; kk < E / 16; ++kk) {{
#if HOLD
#define KA ka[kk]
#define VA va[kk]
#else
            uint ka1[4], va1[4];
            A_FRAG(ka1, resw, warp * 16, kk);
            A_FRAG(va1, resw + 64 * EC * 4, warp * 16, kk);
#define KA ka1
#define VA va1
#endif
            #pragma unroll
            for (int j = 0; j < TILE / 8; j += 2) {{
                uint bb[4];
                B_ROWS(bb, qs, j, kk);
                MMA(st_[j], KA, bb[0], bb[1]);
                MMA(st_[j + 1], KA, bb[2], bb[3]);
                B_ROWS(bb, gs, j, kk);
                MMA(dpt[j], VA, bb[0], bb[1]);
                MMA(dpt[j + 1], VA, bb[2], bb[3]);
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
        for (int kk = 0; kk < TILE / 16; ++kk) {{
            uint pa[4], da[4];
            ACC_TO_A(pa, st_, kk);
            ACC_TO_A(da, dpt, kk);
            #pragma unroll
            for (int f = 0; f < E / 8; f += 2) {{
                uint bb[4];
                B_TRANS(bb, gs, kk, f);
                MMA(dva[f], pa, bb[0], bb[1]);
                MMA(dva[f + 1], pa, bb[2], bb[3]);
                B_TRANS(bb, qs, kk, f);
                MMA(dka[f], da, bb[0], bb[1]);
                MMA(dka[f + 1], da, bb[2], bb[3]);
            }}
        }}
        LOOP_END(ISSUE(t + 1, 0));
    }}
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
        if (key[h] < S) {{
            __global ot* dkr = dk + KB(kvh) + key[h] * QS;
            __global ot* dvr = dv + VB(kvh) + key[h] * QS;
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


def attention_source(
    kernel: str,
    e: int,
    causal: bool,
    half: bool,
    idx: str,
    emulate: bool = False,
    kind: str = "f16",
    packed: bool = False,
) -> str:
    """The source of ``kernel`` ("fwd", "bwd_q", "bwd_kv") for feature size ``e`` (64 or 128) at its
    ``plan``: ``kind`` "f16" (float16 operands, ``mma...f16.f16``) or "bf16" (bfloat16 operands,
    ``mma...bf16.bf16``; P and dS rounded to bf16); ``half``: outputs (and ``out`` read by bwd_q) in the
    operands' 16-bit dtype, else float32; ``emulate``: the OpenCL C models of the PTX primitives (any
    OpenCL device) instead of inline PTX (NVIDIA's OpenCL); ``packed``: q, k and v (and their gradients)
    in one (B, L, 3 * H * E) tensor, the output and its gradient (B, L, H * E) (``packed_layout``)."""
    if kind not in KINDS:
        raise ValueError(f"attention_mma: kind must be one of {sorted(KINDS)}, got {kind!r}")
    p = plan(kernel, e)
    if p.rows * e // 8 % THREADS or p.tile * e // 8 % THREADS or 2 * p.tile > THREADS:
        raise ValueError(f"attention_mma: {kernel} E{e}: a tile's 16-byte chunks must split evenly over {THREADS}")
    if kernel != "fwd" and p.mt != 1:
        raise ValueError(f"attention_mma: {kernel} owns 64 rows a work-group (mt 1)")
    res, where = _layout(kernel, e, p)
    fields = {
        "pragmas": storage_pragmas([KINDS[kind]]),
        "bf16": int(kind == "bf16"),
        "st": "half" if kind == "f16" else "ushort",
        "lds8": vload_c(KINDS[kind], 8, "(p) + (i)"),
        "E": e,
        "threads": THREADS,
        "mt": p.mt,
        "tile": p.tile,
        "nbuf": p.nbuf,
        "res": res,
        "early": int(where == "early"),
        "causal": int(causal),
        "launch_order": LAUNCH_ORDER,
        "packed_layout": packed_layout(packed),
        "out_half": int(half),
        "idx": idx,
        "primitives": (_EMULATED if emulate else _PTX).replace("__AB__", kind),
    }
    source = (_COMMON + f"#define HOLD {int(p.hold)}\n" + _BODIES[kernel]).format(**fields)
    if emulate:  # the models hold barriers: unrolling them only grows the program
        source = source.replace("#pragma unroll\n", "\n")
    return source
