"""OpenCL C source of the tensor-core GEMM: NVIDIA ``mma.sync`` through inline PTX.

Same signature and batch/split scheme as the portable kernel (``gemm_source``). Modes:
"f16" (float16 operands, ``mma.m16n8k16.f16``), "bf16" (float32 operands rounded to bf16,
``m16n8k16.bf16``) and "tf32" (float32 operands rounded to tf32, ``m16n8k8.tf32``); all
accumulate in fp32. A work-group of WM x WN warps computes a BM x BN block (BM = WM*FM*16,
BN = WN*FN*8); each warp an (FM*16) x (FN*8) tile as FM x FN mma tiles.

Local memory holds 32-bit words (two 16-bit or one tf32 element), both operands k-contiguous:
``As[m][kw]``, ``Bs[n][kw]`` with rows padded to BKW + 4 words, so the fragment loads of a warp
(rows gid, words tig) hit 32 distinct banks. Each thread loads its share of the next stage's
tiles into registers (raw, 16-byte vectors where aligned) before the current stage's mma work
and converts/stores them after it, so global latency hides behind the tensor cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from netcl.core.dtypes import float16
from netcl.runtime.ops.gemm_source import ACTIVATIONS, IDENTITY, Epilogue

MMA = {
    "f16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    "bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "tf32": "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
}
PAD = 4


@dataclass(frozen=True)
class MmaConfig:
    """Warps per work-group (wm x wn), mma tiles per warp (fm x fn), words per stage, vector loads."""

    wm: int = 2
    wn: int = 2
    fm: int = 4
    fn: int = 8
    bkw: int = 16
    va: int = 1  #: 1: 16-byte global loads of A where aligned; 0: element loads only
    vb: int = 1

    @property
    def bm(self) -> int:
        return self.wm * self.fm * 16

    @property
    def bn(self) -> int:
        return self.wn * self.fn * 8

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    @property
    def bk(self) -> int:  # in elements of the widest mode (16-bit: two per word)
        return self.bkw * 2

    def local_bytes(self) -> int:
        return 2 * 4 * (self.bm + self.bn) * (self.bkw + PAD)

    def patches(self, side: int, along_k: bool, half: bool, mode: str) -> int:
        return _patches(side, self.bkw, along_k, half, mode)

    def problems(self, mode: str, trans_a: bool, trans_b: bool, a_half: bool, b_half: bool) -> list[str]:
        out = []
        if self.bkw % 8:
            out.append("bkw must be a multiple of 8 words (one mma k-step)")
        for side, along_k, half in ((self.bm, not trans_a, a_half), (self.bn, trans_b, b_half)):
            count = _patches(side, self.bkw, along_k, half, mode)
            if count == 0:
                out.append(f"the tile of {side} rows x {self.bkw} words cannot be cut into load patches")
        return out

    def short(self) -> str:
        return (
            f"{self.bm}x{self.bn} warps{self.wm}x{self.wn} tiles{self.fm}x{self.fn} bkw{self.bkw} v{self.va}{self.vb}"
        )


def _epw(mode: str) -> int:
    return 1 if mode == "tf32" else 2


def _patch_shape(along_k: bool, half: bool, mode: str) -> tuple[int, int]:
    """(elements along k, elements along m/n) one thread loads per patch."""
    if along_k:
        return (8 if half else 4), 1
    return _epw(mode), (8 if half else 4)


def _patches(side: int, bkw: int, along_k: bool, half: bool, mode: str) -> int:
    pk, pm = _patch_shape(along_k, half, mode)
    bk = bkw * _epw(mode)
    if bk % pk or side % pm:
        return 0
    return (bk // pk) * (side // pm)


def _operand(name: str, side: int, cfg: MmaConfig, along_k: bool, half: bool, mode: str, vec: int, bound: str):
    """(declarations, global loads into registers, conversions + local stores) of one operand's tile."""
    pk, pm = _patch_shape(along_k, half, mode)
    epw = _epw(mode)
    bk = cfg.bkw * epw
    count = _patches(side, cfg.bkw, along_k, half, mode)
    per = -(-count // cfg.threads)
    across = bk // pk if along_k else side // pm  # patches along the contiguous dim
    ld = f"ld{name.lower()}"
    decls, loads, stores = [], [], []
    rows = 1 if along_k else pk  # global rows (along k) one patch reads
    raw_t = "uint4" if half else "float4"
    for j in range(per):
        u, w = f"((tid + {j * cfg.threads}) % {across})", f"((tid + {j * cfg.threads}) / {across})"
        guard = f"if (tid + {j * cfg.threads} < {count}) " if (j + 1) * cfg.threads > count else ""
        first_store = len(stores)
        for r in range(rows):
            decls.append(f"{raw_t} {name}r{j}_{r};")
        if along_k:
            loads.append(f"{guard}{{ const IDX mn = {name}0 + {w}; const int kk = k0 + {u} * {pk};")
            loads.append(f"  __global const {'ushort' if half else 'float'}* p = {name} + mn * {ld} + kk;")
            full = f"mn < {bound} && kk + {pk} <= kend"
            elem_ok = [f"mn < {bound} && kk + {e} < kend" for e in range(pk)]
            offsets = [str(e) for e in range(pk)]
            targets = [(0, e) for e in range(pk)]
        else:
            loads.append(f"{guard}{{ const IDX mn = {name}0 + {u} * {pm}; const int kk = k0 + {w} * {pk};")
            loads.append(f"  __global const {'ushort' if half else 'float'}* p = {name} + (IDX)kk * {ld} + mn;")
            full = f"kk + {pk - 1} < kend && mn + {pm} <= {bound}"
            elem_ok = [f"kk + {r} < kend && mn + {e} < {bound}" for r in range(pk) for e in range(pm)]
            offsets = [f"{r} * {ld} + {e}" for r in range(pk) for e in range(pm)]
            targets = [(r, e) for r in range(pk) for e in range(pm)]
        vec_rows = [f"{name}r{j}_{r} = *(__global const {raw_t}*)(p + {r} * {ld});" for r in range(rows)]
        if along_k:
            vec_rows = [f"{name}r{j}_0 = *(__global const {raw_t}*)p;"]
        scalar = []
        if half:  # assemble the uint4 of 8 halves from 16-bit loads
            for r in range(rows):
                scalar.append("{ uint h[8];")
                for e in range(8):
                    idx = targets.index((r, e))
                    scalar.append(f"  h[{e}] = ({elem_ok[idx]}) ? (uint)p[{offsets[idx]}] : 0u;")
                scalar.append(
                    f"  {name}r{j}_{r} = (uint4)(h[0] | (h[1] << 16), h[2] | (h[3] << 16), "
                    "h[4] | (h[5] << 16), h[6] | (h[7] << 16)); }"
                )
        else:
            for idx, (r, e) in enumerate(targets):
                scalar.append(f"{name}r{j}_{r}.s{e} = ({elem_ok[idx]}) ? p[{offsets[idx]}] : 0.0f;")
        if vec:
            loads.append(f"  if ({full}) {{ {' '.join(vec_rows)} }} else {{")
            loads += ["    " + s for s in scalar]
            loads.append("  } }")
        else:
            loads += ["  " + s for s in scalar]
            loads.append("}")
        # conversions and local stores (word coordinates: row mn_local, word column kw)
        base = f"{name}s[nb]"
        if along_k:
            row, kw = w, f"{u} * {pk // epw}"
            if half:
                stores.append(f"*(__local uint4*)&{base}[{row} * LDW + {kw}] = {name}r{j}_0;")
            elif mode == "tf32":
                stores.append(
                    f"*(__local uint4*)&{base}[{row} * LDW + {kw}] = (uint4)(TF32({name}r{j}_0.s0), "
                    f"TF32({name}r{j}_0.s1), TF32({name}r{j}_0.s2), TF32({name}r{j}_0.s3));"
                )
            else:  # bf16: two words from four floats
                stores.append(
                    f"*(__local uint2*)&{base}[{row} * LDW + {kw}] = (uint2)(BF16X2({name}r{j}_0.s0, "
                    f"{name}r{j}_0.s1), BF16X2({name}r{j}_0.s2, {name}r{j}_0.s3));"
                )
        else:
            row0, kw = f"{u} * {pm}", w
            for e in range(pm):
                if half:
                    comp, shift = f"s{e // 2}", e % 2
                    lo = f"{name}r{j}_0.{comp}"
                    hi = f"{name}r{j}_1.{comp}"
                    word = (
                        f"(({lo} & 0xFFFFu) | ({hi} << 16))" if shift == 0 else f"(({lo} >> 16) | ({hi} & 0xFFFF0000u))"
                    )
                elif mode == "tf32":
                    word = f"TF32({name}r{j}_0.s{e})"
                elif mode == "bf16":
                    word = f"BF16X2({name}r{j}_0.s{e}, {name}r{j}_1.s{e})"
                else:  # f16 from float32 operands
                    word = f"F16X2({name}r{j}_0.s{e}, {name}r{j}_1.s{e})"
                stores.append(f"{base}[({row0} + {e}) * LDW + {kw}] = {word};")
        if guard:
            stores[first_store:] = [f"{guard}{{", *stores[first_store:], "}"]
    return decls, loads, stores


def mma_source(
    cfg: MmaConfig,
    mode: str,
    trans_a: bool,
    trans_b: bool,
    a_dtype: np.dtype,
    b_dtype: np.dtype,
    c_dtype: np.dtype,
    idx: str = "int",
    epilogue: Epilogue = IDENTITY,
) -> str:
    """The kernel ``netcl_gemm`` on tensor cores for one config, mode, layout and epilogue."""
    a_half, b_half = a_dtype == float16, b_dtype == float16
    a_decl, a_load, a_store = _operand("A", cfg.bm, cfg, not trans_a, a_half, mode, cfg.va, "M")
    b_decl, b_load, b_store = _operand("B", cfg.bn, cfg, trans_b, b_half, mode, cfg.vb, "N")
    steps = cfg.bkw // 8
    frag = []
    for fm in range(cfg.fm):
        r = f"(wr + {fm * 16} + gid) * LDW + kw"
        frag.append(
            f"af[{fm}][0] = As[cb][{r}]; af[{fm}][1] = As[cb][{r} + 8 * LDW]; "
            f"af[{fm}][2] = As[cb][{r} + 4]; af[{fm}][3] = As[cb][{r} + 8 * LDW + 4];"
        )
    for fn in range(cfg.fn):
        c = f"(wc + {fn * 8} + gid) * LDW + kw"
        frag.append(f"bf[{fn}][0] = Bs[cb][{c}]; bf[{fn}][1] = Bs[cb][{c} + 4];")
    mma = []
    for fm in range(cfg.fm):
        for fn in range(cfg.fn):
            acc = [f"acc[{fm}][{fn}][{i}]" for i in range(4)]
            outs = ", ".join('"=f"(' + x + ")" for x in acc)
            ins = ", ".join('"f"(' + x + ")" for x in acc)
            regs = ", ".join(f'"r"(af[{fm}][{i}])' for i in range(4)) + f', "r"(bf[{fn}][0]), "r"(bf[{fn}][1])'
            operands = "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13}"
            mma.append(f'asm volatile("{MMA[mode]} {operands};" : {outs} : {regs}, {ins});')
    bias_arg = ", __global const float* bias" if epilogue.bias != "none" else ""
    bias_term = {"none": "", "col": " + bias[c]", "row": " + bias[r]"}[epilogue.bias]
    act = ACTIVATIONS[epilogue.activation]
    sa = "ushort" if a_half else "float"
    sb = "ushort" if b_half else "float"
    out_half = c_dtype == float16
    sc = "half" if out_half else "float"
    store = "vstore_half_rte(OUT, 0, Cz + (IDX)r * ldc + c)" if out_half else "Cz[(IDX)r * ldc + c] = OUT"
    nl, nl2 = "\n    ", "\n        "
    return f"""#define CT float
#define IDX {idx}
#define BM {cfg.bm}
#define BN {cfg.bn}
#define BKW {cfg.bkw}
#define BK {cfg.bkw * _epw(mode)}
#define LDW (BKW + {PAD})
#define NT {cfg.threads}
#define TF32(x) tf32_bits(x)
#define BF16X2(lo, hi) bf16x2_bits(lo, hi)
#define F16X2(lo, hi) f16x2_bits(lo, hi)
inline uint tf32_bits(float x) {{
    uint r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r; }}
inline uint bf16x2_bits(float lo, float hi) {{
    uint r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }}
inline uint f16x2_bits(float lo, float hi) {{
    uint r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }}
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void netcl_gemm(const int M, const int N, const int K,
                __global const {sa}* restrict A, const int lda,
                __global const {sb}* restrict B, const int ldb,
                __global {sc}* restrict C, const int ldc,
                const int nb1, const int nb2,
                const long sa0, const long sa1, const long sa2,
                const long sb0, const long sb1, const long sb2,
                const long csb, const int splits, const int kchunk, const long css{bias_arg}) {{
    __local uint As[2][BM * LDW];
    __local uint Bs[2][BN * LDW];
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wr = (warp % {cfg.wm}) * {cfg.fm * 16};
    const int wc = (warp / {cfg.wm}) * {cfg.fn * 8};
    const IDX B0 = (IDX)get_group_id(0) * BN;
    const IDX A0 = (IDX)get_group_id(1) * BM;
    const int z = get_group_id(2);
    const int s = z % splits;
    int bz = z / splits;
    const int zb = bz;
    const int b2 = bz % nb2; bz /= nb2;
    const int b1 = bz % nb1;
    const int b0 = bz / nb1;
    A += b0 * sa0 + b1 * sa1 + b2 * sa2;
    B += b0 * sb0 + b1 * sb1 + b2 * sb2;
    __global {sc}* Cz = C + zb * csb + s * css;
    const int kbeg = s * kchunk;
    const int kend = min(K, kbeg + kchunk);
    float acc[{cfg.fm}][{cfg.fn}][4];
    #pragma unroll
    for (int i = 0; i < {cfg.fm}; ++i) {{
        #pragma unroll
        for (int j = 0; j < {cfg.fn}; ++j) {{
            acc[i][j][0] = 0.0f; acc[i][j][1] = 0.0f; acc[i][j][2] = 0.0f; acc[i][j][3] = 0.0f;
        }}
    }}
    int k0 = kbeg;
    int nb = 0;
    {nl.join(a_decl + b_decl)}
    {nl.join(a_load)}
    {nl.join(b_load)}
    {nl.join(a_store)}
    {nl.join(b_store)}
    barrier(CLK_LOCAL_MEM_FENCE);
    while (k0 < kend) {{
        const int cb = nb;
        k0 += BK;
        nb ^= 1;
        const int more = k0 < kend;
        if (more) {{
        {nl2.join(a_load)}
        {nl2.join(b_load)}
        }}
        #pragma unroll
        for (int step = 0; step < {steps}; ++step) {{
            const int kw = step * 8 + tig;
            uint af[{cfg.fm}][4], bf[{cfg.fn}][2];
            {nl2.join(frag)}
            {nl2.join(mma)}
        }}
        if (more) {{
        {nl2.join(a_store)}
        {nl2.join(b_store)}
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    #pragma unroll
    for (int fm = 0; fm < {cfg.fm}; ++fm) {{
        #pragma unroll
        for (int fn = 0; fn < {cfg.fn}; ++fn) {{
            #pragma unroll
            for (int q = 0; q < 4; ++q) {{
                const IDX r = A0 + wr + fm * 16 + gid + (q >> 1) * 8;
                const IDX c = B0 + wc + fn * 8 + tig * 2 + (q & 1);
                if (r < M && c < N) {{
                    const float v = acc[fm][fn][q]{bias_term};
                    #define OUT ({act})
                    {store};
                    #undef OUT
                }}
            }}
        }}
    }}
}}
"""
