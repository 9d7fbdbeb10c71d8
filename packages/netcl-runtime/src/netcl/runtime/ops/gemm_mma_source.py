"""OpenCL C source of the tensor-core GEMM: NVIDIA ``mma.sync`` (and ``ldmatrix``) through inline PTX.

Same signature and batch/split scheme as the portable kernel (``gemm_source``). Modes: "f16"
(float16 operands, or float32 operands rounded to float16, ``mma.m16n8k16.f16``), "bf16"
(bfloat16 operands, or float32 operands rounded to bf16, ``m16n8k16.bf16``), "tf32" (float32 operands rounded to tf32,
``m16n8k8.tf32``), "tf32x3" (float32 operands split into two tf32 parts, hi + lo, multiplied
as lo*hi + hi*lo + hi*hi: three tf32 mma per tile for float32's accuracy; local memory keeps the
raw float32 words) and "bf16x3" (the same with bf16 parts, about 16 bits of each operand: three
``m16n8k16.bf16`` mma per 16 k, half tf32x3's tensor-core work; ``_bf16x3_compute``); all accumulate
in fp32. A work-group of WM x WN warps computes a BM x BN
block (BM = WM*FM*16, BN = WN*FN*8); each warp an (FM*16) x (FN*8) tile as FM x FN mma tiles.

Local memory keeps each operand tile in its STORED orientation (k-contiguous rows for A and for a
transposed B, m/n-contiguous rows otherwise), converted to the mma element type (16-bit pairs or
tf32 words), so the global -> local copy is 16-byte loads and 16-byte stores. Fragments come out of
local memory with ``ldmatrix`` (``.trans`` for m/n-contiguous 16-bit tiles), four 8x8 matrices per
instruction; tf32 tiles stored m/n-contiguous use word loads. Row strides are padded so that the
eight row addresses of an ``ldmatrix`` (or the 32 words of a warp's loads) fall in distinct banks;
under cp.async stages the 16-byte chunks of unpadded rows are swizzled instead (``_tile``).
Each thread loads its share of the next stage into registers before the current stage's mma work
and converts/stores it after, so global latency hides behind the tensor cores (one barrier a stage);
operands stored in the mma's format (tf32 words, float16 and bfloat16 words) can instead be copied by
``cp.async`` (through L1) ``stages`` deep.

With ``MmaConfig.wg`` the products run on Hopper's ``wgmma`` instead (tf32, f16 and bf16, through
patched PTX: ``netcl.runtime.ptx_patch``): warps stacked along M, a warpgroup of four per 64 rows
issuing one 64 x BN x k instruction a k-step from shared-memory descriptors; the tiles are kept in
wgmma's swizzled atoms (``Tile.atom``) and copied by ``cp.async`` past L1, or, for float32 operands
rounded to f16 / bf16 on the way (``stages`` 0), loaded into registers, converted and stored like
the mma.sync kernels' register staging; the fragments and ``mma.sync`` above are not used.
tf32 ``wgmma`` reads local memory K-major only (no transpose bits), so a product of untransposed
float32 operands runs swapped (``MmaConfig.swap``): the warpgroups compute C^T = B^T A^T, B^T's
fragments loaded into registers from B's k-rows tile (``wgmma``'s register form of A) and A's
K-major tile read as wgmma's B, and the store writes each element back at (row, column) of C.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from netcl.core.dtypes import C_TYPES, bfloat16, float16
from netcl.runtime.ops.gemm_source import IDENTITY, Epilogue, OperandView, block_indexing, kernel_signature
from netcl.runtime.ops.storage_io import helpers_c, store_c

MMA = {
    "f16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    "bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "tf32": "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    "tf32x3": "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    "bf16x3": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
}
#: modes with one 32-bit word per element in local memory (tf32 tiles; the split modes' raw float32 words)
WORD_MODES = ("tf32", "tf32x3", "bf16x3")
#: modes that split each raw float32 operand into hi + lo parts and sum lo*hi + hi*lo + hi*hi a k-step
SPLIT_MODES = ("tf32x3", "bf16x3")
#: The tensor dtype whose stored 16-bit words a 16-bit mode multiplies as they are.
WORD_DTYPE = {"f16": float16, "bf16": bfloat16}
#: modes whose operands are stored in the mma's element format, so cp.async copies them unconverted
ASYNC_MODES = (*WORD_MODES, "f16", "bf16")
#: modes Hopper's ``wgmma`` runs (``MmaConfig.wg``; tf32x3: TMA stages split in local memory, ``_x3_main_loop``)
WGMMA_MODES = ("tf32", "f16", "bf16", "tf32x3")
#: modes whose ``wgmma`` reads float32 words only K-major (no transpose bits), so that an operand stored M/N-major
#: may be transposed first (``MmaConfig.pre``, ``gemm_transpose``)
PRE_MODES = ("tf32", "tf32x3")


@dataclass(frozen=True)
class MmaConfig:
    """Warps per work-group (wm x wn), mma tiles per warp (fm x fn), words per stage, load options."""

    wm: int = 2
    wn: int = 2
    fm: int = 4
    fn: int = 8
    bkw: int = 16  #: 32-bit words along K per stage (16-bit modes: 2 elements a word)
    va: int = 1  #: 1: 16-byte global loads of A where aligned; 0: element loads only
    vb: int = 1
    ldsm: int = 1  #: 1: fragments through ldmatrix; 0: word loads only
    stages: int = 0  #: tf32 / f16 / bf16: >= 2 copies global -> local with cp.async, this many stages deep
    split: int = 1  #: split along K to ~2*split work-groups per compute unit when the output has fewer; 0: never
    group: int = 0  #: > 0: launch blocks in groups of this many block-rows (L2 reuse); 0: row-major
    fpre: int = 0  #: 1: load the next k-step's fragments before this step's mma (two register sets)
    #: Hopper's warpgroup ``wgmma`` (a warpgroup of 4 warps per fm x 64 rows, tiles in swizzle atoms): 1: a
    #: stage's products run on while the previous stage's buffer refills (two barriers a stage); 2: they
    #: finish before the next stage (one barrier)
    wg: int = 0
    #: 1 (tf32 ``wgmma``, untransposed operands): the products of C^T = B^T A^T, B^T's fragments from
    #: registers (tf32 ``wgmma`` reads local memory K-major only) and A's tile as wgmma's K-major B;
    #: the warpgroups' rows run along N (BN = wm * fm * 16), wgmma's columns along M (BM = fn * 8)
    swap: int = 0
    #: 1 (``wgmma``, both operands K-major): each stage's tiles copied by Hopper's Tensor Memory Accelerator
    #: (``cp.async.bulk.tensor`` from a tensor map, ``tma_maps``), issued by one thread, their arrival awaited
    #: on an mbarrier a stage, where every thread otherwise issues cp.async chunks
    tma: int = 0
    #: 1 (tf32 and tf32x3 on ``wgmma``, ``PRE_MODES``): an operand stored M/N-major (A transposed, B untransposed)
    #: is first transposed into a K-major workspace (``gemm_transpose``), and the kernel multiplies the K-major
    #: problem
    pre: int = 0

    @property
    def bm(self) -> int:
        return self.fn * 8 if self.swap else self.wm * self.fm * 16

    @property
    def bn(self) -> int:
        return self.wm * self.fm * 16 if self.swap else self.wn * self.fn * 8

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    def bk_elements(self, mode: str) -> int:
        return self.bkw * _epw(mode)

    @property
    def swizzles(self) -> bool:
        """Whether tiles may be swizzled instead of padded (cp.async stages with ldmatrix fragments)."""
        return self.stages > 0 and self.ldsm == 1 and self.fn % 2 == 0 and not self.wg

    def local_bytes(self, mode: str, trans_a: bool, trans_b: bool) -> int:
        if self.pre:  # the kernel of the K-major problem
            trans_a, trans_b = False, True
        a = _tile("A", self.bm, self, not trans_a, mode).words
        b = _tile("B", self.bn, self, trans_b, mode).words
        raw = max(2, self.stages) * (a + b)
        if self.wg and mode == "tf32x3":  # split tiles: lo of both operands, hi of those stored M/N-major
            raw += X3_LO_BUFFERS * (a + b + a * trans_a + b * (not trans_b))
        return 4 * raw

    def problems(self, mode: str, trans_a: bool, trans_b: bool) -> list[str]:
        out = []
        if self.bkw % 8:
            out.append("bkw must be a multiple of 8 words (one mma k-step)")
        if self.stages and (mode not in ASYNC_MODES or not (self.va and self.vb) or self.stages < 2):
            out.append("cp.async stages need tf32, f16 or bf16, 16-byte aligned operands and at least 2 stages")
        if self.fpre and mode in SPLIT_MODES:
            out.append(f"{mode} splits each fragment after its load: no fragment prefetch")
        if mode == "bf16x3" and self.bkw % 16:
            out.append("bf16x3 multiplies 16 words along K a step (m16n8k16): bkw a multiple of 16")
        if self.pre and not (self.wg and mode in PRE_MODES and not self.swap):
            out.append("pre (operands transposed first) serves tf32 and tf32x3 on wgmma, unswapped")
        if self.wg:
            out += _wgmma_problems(self, mode, trans_a, trans_b)
        elif self.swap:
            out.append("swap runs on wgmma (wg 2)")
        return out

    def short(self) -> str:
        tiles = f"{self.bm}x{self.bn} warps{self.wm}x{self.wn} tiles{self.fm}x{self.fn}"
        flags = f"{' swap' if self.swap else ''}{' tma' if self.tma else ''}{' pre' if self.pre else ''}"
        wgmma = f" wg{self.wg}{flags}" if self.wg else ""
        return f"{tiles} bkw{self.bkw} v{self.va}{self.vb} ldsm{self.ldsm} stages{self.stages}{wgmma}"


def _wgmma_problems(cfg: MmaConfig, mode: str, trans_a: bool, trans_b: bool) -> list[str]:
    out = []
    if mode not in WGMMA_MODES:
        out.append("wgmma multiplies tf32, tf32x3, f16 or bf16")
    if cfg.pre:  # the kernel multiplies the K-major problem
        trans_a, trans_b = False, True
    if mode == "tf32x3" and (not cfg.tma or cfg.swap or cfg.wg != 2):
        out.append("tf32x3 on wgmma: tiles copied by tma, each stage's products finished (wg 2), no swap")
    if cfg.stages == 1 or (not cfg.stages and cfg.wg != 2):
        out.append("wgmma's operands come by cp.async (stages >= 2) or through registers (stages 0, wg 2)")
    if cfg.wn != 1 or cfg.wm % 4 or cfg.fpre:
        out.append("wgmma: warps stacked along M (wn = 1, wm a multiple of 4), no fragment prefetch")
    if cfg.fn > 32:
        out.append("wgmma multiplies at most 256 columns (fn <= 32)")
    if cfg.bkw > 32:
        out.append("wgmma: at most 32 words along K a stage (a K-major row in one 128-byte swizzle atom)")
    if cfg.swap and (mode != "tf32" or trans_a or trans_b or cfg.wg != 2):
        # products in flight (wg 1) over register fragments gave wrong products on an H100, the default form among
        # them, which had been right on the H200 (RESULTS.md, "Swapped tf32 products in flight: wrong on the H100")
        out.append(
            "swap (B^T's fragments from registers) multiplies tf32 of untransposed operands, each stage's "
            "products finished before its fragments are reloaded (wg 2)"
        )
    elif mode == "tf32" and not cfg.swap and (trans_a or not trans_b):
        out.append("tf32 wgmma reads both operands K-major: A untransposed, B transposed (or swap)")
    if cfg.tma and cfg.stages < 2:
        out.append("tma copies the tiles of cp.async's stages (stages >= 2)")
    return out


def _epw(mode: str) -> int:
    return 1 if mode in WORD_MODES else 2


def _thread_shares(count: int, threads: int) -> list[tuple[int, str, str]]:
    """(j, C expression of the item, guard) for each round ``j`` in which the ``threads`` of a work-group take
    items ``tid + j * threads`` of ``count``: the guard skips the items past ``count`` in the last round."""
    shares = []
    for j in range(-(-count // threads)):
        c = f"(tid + {j * threads})"
        shares.append((j, c, f"if ({c} < {count}) " if (j + 1) * threads > count else ""))
    return shares


def _row_words(side: int, bkw: int, along_k: bool, mode: str) -> tuple[int, int]:
    """(rows, padded words per row) of a tile kept in its stored orientation."""
    if along_k:
        return side, bkw + 4
    words = side // _epw(mode)
    if mode in WORD_MODES:  # word loads at rows tig, columns gid: stride = 8 or 24 (mod 32)
        pad = next(p for p in range(0, 40) if (words + p) % 32 in (8, 24))
        return bkw, words + pad
    return bkw * 2, words + (4 if (words // 4) % 2 == 0 else 0)


@dataclass(frozen=True)
class Tile:
    """One operand's tile in local memory: ``rows`` rows of ``ld`` words, and where the tile is
    swizzled, the C expression (of the row ``r``) XORed into each 16-byte chunk's index of a row."""

    name: str
    rows: int
    ld: int
    swizzle: str = ""
    atom: int = 0  #: words per row of a ``wgmma`` swizzle atom (8 rows of 32, 64 or 128 bytes); 0: none
    #: atoms of a row of atoms one after another, each all rows deep (a TMA box an atom wide); else each
    #: group of 8 rows a row of atoms side by side
    atom_major: bool = False

    @property
    def words(self) -> int:
        return self.rows * self.ld

    @property
    def group_stride(self) -> int:
        """Bytes from one group of 8 rows of an atom tile to the next."""
        return 32 * (self.atom if self.atom_major else self.ld)

    @property
    def atom_stride(self) -> int:
        """Bytes from one atom of an atom tile to the next along its rows."""
        return 4 * self.atom * (self.rows if self.atom_major else 8)

    def at(self, row: str, word: str) -> str:
        """The word offset of (``row``, ``word``) in one buffer of the tile."""
        if self.swizzle or self.atom:
            return f"SW{self.name}({row}, {word})"
        return f"{row} * {self.ld} + {word}"

    def macro(self) -> str:
        """The ``SW<name>(r, w)`` macro ``at`` uses in a swizzled tile (else nothing).

        In ``wgmma`` atoms (``atom`` words a row): groups of 8 rows, each a row of atoms side by side,
        and in an atom the 16-byte chunk index XORed with bits 7 and up of the row's byte offset (the
        hardware's 32 / 64 / 128-byte swizzle of the address; buffers aligned to 1024 bytes).
        """
        if self.atom:
            aw, chunks = self.atom, self.atom // 4
            shift = {8: 2, 16: 1, 32: 0}[aw]
            group = f"(((r) >> 3) * {self.ld // aw} + ((w) >> {aw.bit_length() - 1})) * {8 * aw}"
            if self.atom_major:
                group = f"(((w) >> {aw.bit_length() - 1}) * {self.rows // 8} + ((r) >> 3)) * {8 * aw}"
            chunk = f"(((((w) >> 2) & {chunks - 1}) ^ ((((r) & 7) >> {shift}) & {chunks - 1})) << 2)"
            return f"#define SW{self.name}(r, w) ({group} + ((r) & 7) * {aw} + {chunk} + ((w) & 3))\n"
        if not self.swizzle:
            return ""
        chunk = f"((((w) >> 2) ^ {self.swizzle}) << 2)"
        return f"#define SW{self.name}(r, w) ((r) * {self.ld} + ({chunk} | ((w) & 3)))\n"


def _tile(name: str, side: int, cfg: MmaConfig, along_k: bool, mode: str) -> Tile:
    """The tile of an operand with ``side`` rows (m or n) kept in its stored orientation.

    Padded rows by default (``_row_words``). With cp.async stages and ldmatrix (``cfg.swizzles``)
    a row of a power-of-two number of words is unpadded and its 16-byte chunks swizzled instead, so
    three 128 x 16-word stages fit 48 KB: ldmatrix reads one chunk of 8 consecutive rows, which
    land in distinct banks when the chunk index is XORed with (row / rows-per-128-bytes) modulo the
    chunks of a row (at most 8); tf32 word loads of rows k read rows tig (4) x 8 consecutive words,
    distinct with (row % 4) * 2. The swapped tf32 kernel (``cfg.swap``) keeps A in wgmma atoms and
    B's k-rows swizzled that way (its fragment loads are those tf32 word loads), or, copied by TMA
    (``cfg.tma``), in atoms too: one copy an atom wide, at most 2 of a warp's words in one bank.
    """
    rows, ld = _row_words(side, cfg.bkw, along_k, mode)
    width = cfg.bkw if along_k else side // _epw(mode)
    if cfg.wg and (cfg.tma or not (cfg.swap and not along_k)):  # rows of up to 128 bytes in one atom
        return Tile(name, rows, width, atom=min(width, 32), atom_major=bool(cfg.tma))
    if cfg.swap and width >= 32 and not width & (width - 1):  # B's k-rows: swizzled like mma.sync's
        return Tile(name, rows, width, "(((r) & 3) << 1)")
    if not cfg.swizzles or width < 8 or width & (width - 1):
        return Tile(name, rows, ld)
    if along_k or mode not in WORD_MODES:
        shift = max(1, 32 // width).bit_length() - 1
        return Tile(name, rows, width, f"(((r) >> {shift}) & {min(width // 4, 8) - 1})")
    if width < 32:
        return Tile(name, rows, ld)
    return Tile(name, rows, width, "(((r) & 3) << 1)")


def _view_chunk_lines(
    view: OperandView, regs: list[str], along_k: bool, bound: str, first_mn: str, first_kk: str, pointer: str
) -> list[str]:
    """Statements loading ``4 * len(regs)`` consecutive elements of ``view`` (along its contiguous
    dimension, from (``first_mn``, ``first_kk``)) into the float4 registers ``regs``.

    Each group of four uses ``view.vector4`` where all four are inside the operand (``mn <
    bound``, ``kk < kend``), else one element at a time, zero outside. ``pointer`` declares ``p``.
    """
    lines = [f"{{ const IDX mn0 = {first_mn}; const int kk0 = {first_kk};", f"  {pointer}"]
    for q, reg in enumerate(regs):
        first = ("mn0", f"kk0 + {4 * q}") if along_k else (f"mn0 + {4 * q}", "kk0")
        full = f"mq < {bound} && kq + 4 <= kend" if along_k else f"kq < kend && mq + 4 <= {bound}"
        lines.append(f"  {{ const IDX mq = {first[0]}; const int kq = {first[1]};")
        if view.vector4:
            lines.append(f"    if ({full}) {{ const IDX mn = mq; const int kk = kq; {reg} = {view.vector4}; }} else {{")
        else:
            lines.append("    {")
        for e in range(4):
            at = ("mq", f"kq + {e}") if along_k else (f"mq + {e}", "kq")
            lines.append(
                f"      {{ const IDX mn = {at[0]}; const int kk = {at[1]}; "
                f"{reg}.s{e} = (mn < {bound} && kk < kend) ? (float)({view.element}) : 0.0f; }}"
            )
        lines.append("  } }")
    lines.append("}")
    return lines


def _row_loads(
    name: str,
    regs: list[str],
    along_k: bool,
    half: bool,
    vec: int,
    chunk: int,
    guard: str,
    row: str,
    col: str,
    ld: str,
    src_t: str,
    bound: str,
) -> list[str]:
    """Global loads of one chunk of a stored operand into ``regs`` (16-byte vectors where ``vec``
    and the chunk is inside the operand, element by element with zeros past its edges otherwise)."""
    if along_k:  # row: m/n within the tile, col: k offset
        lines = [f"{guard}{{ const IDX mn = {name}0 + {row}; const int kk = k0 + {col};"]
        lines.append(f"  __global const {src_t}* p = {name} + mn * {ld} + kk;")
        full = f"mn < {bound} && kk + {chunk} <= kend"
        ok = [f"mn < {bound} && kk + {e} < kend" for e in range(chunk)]
    else:  # row: k offset, col: m/n within the tile
        lines = [f"{guard}{{ const int kk = k0 + {row}; const IDX mn = {name}0 + {col};"]
        lines.append(f"  __global const {src_t}* p = {name} + (IDX)kk * {ld} + mn;")
        full = f"kk < kend && mn + {chunk} <= {bound}"
        ok = [f"kk < kend && mn + {e} < {bound}" for e in range(chunk)]
    if half:
        vector = [f"{regs[0]} = *(__global const uint4*)p;"]
        scalar = ["{ uint h[8];"]
        scalar += [f"  h[{e}] = ({ok[e]}) ? (uint)p[{e}] : 0u;" for e in range(8)]
        pairs = ", ".join(f"h[{2 * q}] | (h[{2 * q + 1}] << 16)" for q in range(4))
        scalar.append(f"  {regs[0]} = (uint4)({pairs}); }}")
    else:
        vector = [f"{r} = *(__global const float4*)(p + {4 * q});" for q, r in enumerate(regs)]
        scalar = [f"{regs[e // 4]}.s{e % 4} = ({ok[e]}) ? p[{e}] : 0.0f;" for e in range(chunk)]
    if vec:
        lines.append(f"  if ({full}) {{ {' '.join(vector)} }} else {{")
        lines += ["    " + line for line in scalar]
        lines.append("  } }")
    else:
        lines += ["  " + line for line in scalar]
        lines.append("}")
    return lines


def _copy(
    name: str,
    side: int,
    cfg: MmaConfig,
    along_k: bool,
    half: bool,
    mode: str,
    vec: int,
    bound: str,
    view: OperandView | None = None,
):
    """(declarations, global loads into registers, conversions + local stores) of one operand's tile.

    A chunk is the 16 bytes of local memory one thread fills: 8 elements of a 16-bit mode or 4
    tf32 words, consecutive along the operand's contiguous dimension. An operand read through a
    ``view`` (float32 only) evaluates the view's expression per element instead of loading rows.
    """
    epw = _epw(mode)
    chunk = 4 * epw  # elements per chunk
    tile = _tile(name, side, cfg, along_k, mode)
    rows = tile.rows
    row_elems = cfg.bkw * epw if along_k else side
    per_row = row_elems // chunk
    count = rows * per_row
    ld = f"ld{name.lower()}"
    src_t = "ushort" if half else "float"
    decls, loads, stores = [], [], []
    nregs = 1 if (half or mode in WORD_MODES) else 2  # float sources of 16-bit modes: two float4
    reg_t = "uint4" if half else "float4"
    for j, c, guard in _thread_shares(count, cfg.threads):
        row, col = f"({c} / {per_row})", f"(({c} % {per_row}) * {chunk})"
        regs = [f"{name}r{j}_{q}" for q in range(nregs)]
        decls += [f"{reg_t} {r};" for r in regs]
        if view is not None:  # chunk elements through the view, four at a time
            first_mn, first_kk = (f"{name}0 + {row}", f"k0 + {col}") if along_k else (f"{name}0 + {col}", f"k0 + {row}")
            chunk_lines = _view_chunk_lines(
                view, regs, along_k, bound, first_mn, first_kk, f"__global const float* p = {name};"
            )
            loads += [guard + chunk_lines[0], *chunk_lines[1:]]
        else:
            loads += _row_loads(name, regs, along_k, half, vec, chunk, guard, row, col, ld, src_t, bound)
        if half:
            value = regs[0]
        elif mode == "tf32":
            r = regs[0]
            value = f"(uint4)(TF32({r}.s0), TF32({r}.s1), TF32({r}.s2), TF32({r}.s3))"
        elif mode in SPLIT_MODES:  # raw words: the fragments are split after their loads
            value = f"as_uint4({regs[0]})"
        else:
            cvt = "BF16X2" if mode == "bf16" else "F16X2"
            r0, r1 = regs
            value = (
                f"(uint4)({cvt}({r0}.s0, {r0}.s1), {cvt}({r0}.s2, {r0}.s3), "
                f"{cvt}({r1}.s0, {r1}.s1), {cvt}({r1}.s2, {r1}.s3))"
            )
        stores.append(f"{guard}*(__local uint4*)&{name}s[nb][{tile.at(row, f'{col} / {epw}')}] = {value};")
    return decls, loads, stores, tile


def _async_copy(
    name: str,
    side: int,
    cfg: MmaConfig,
    along_k: bool,
    bound: str,
    mode: str,
    src_t: str = "float",
    view: OperandView | None = None,
) -> list[str]:
    """cp.async of one tile stored in the mma's element format (tf32: raw fp32 words, the mma ignores
    their low 13 bits; f16: float16 storage) into buffer ``buf`` for the K range starting at ``kt``;
    chunks past the edges are zero-filled. An operand read through a ``view`` (tf32) copies its
    elements one word at a time from the indices of ``view.offsets4`` (a zero, -1, copies nothing)."""
    epw = _epw(mode)
    chunk = 4 * epw  # elements in 16 bytes
    tile = _tile(name, side, cfg, along_k, mode)
    rows = tile.rows
    per_row = (cfg.bkw * epw if along_k else side) // chunk
    count = rows * per_row
    ld = f"ld{name.lower()}"
    size = 4 // epw  # bytes an element
    word = "" if epw == 1 else f" / {epw}"
    out = []
    for _, c, guard in _thread_shares(count, cfg.threads):
        row, col = f"({c} / {per_row})", f"(({c} % {per_row}) * {chunk})"
        if view is not None:
            first = (f"{name}0 + {row}", f"kt + {col}") if along_k else (f"{name}0 + {col}", f"kt + {row}")
            out.append(f"{guard}{{ const IDX mn = {first[0]}; const int kk = {first[1]}; const int k0 = kt;")
            out.append(f"  __global const float* p = {name}; const int4 o = {view.offsets4};")
            for e in range(4):
                mn, kk = ("mn", f"kk + {e}") if along_k else (f"mn + {e}", "kk")
                out.append(
                    f"  {{ const int ok = {mn} < {bound} && {kk} < kend && o.s{e} >= 0; "
                    f"CP_ASYNC4({name}s[buf] + {tile.at(row, f'{col} + {e}')}, ok ? p + o.s{e} : p, ok * 4); }}"
                )
            out.append("}")
            continue
        if along_k:
            out.append(f"{guard}{{ const IDX mn = {name}0 + {row}; const int kk = kt + {col};")
            out.append(f"  const int valid = mn < {bound} ? clamp(kend - kk, 0, {chunk}) : 0;")
            out.append(f"  __global const {src_t}* p = valid ? {name} + mn * {ld} + kk : {name};")
        else:
            out.append(f"{guard}{{ const int kk = kt + {row}; const IDX mn = {name}0 + {col};")
            out.append(f"  const int valid = kk < kend ? (int)clamp(({bound} - mn), (IDX)0, (IDX){chunk}) : 0;")
            out.append(f"  __global const {src_t}* p = valid ? {name} + (IDX)kk * {ld} + mn : {name};")
        out.append(f"  CP_ASYNC({name}s[buf] + {tile.at(row, f'{col}{word}')}, p, valid * {size}); }}")
    return out


def _fragments(cfg: MmaConfig, mode: str, a_along_k: bool, b_along_k: bool, ta: Tile, tb: Tile) -> list[str]:
    """Fragment loads of one k-step (``ks``: the step's first word within the stage)."""
    lda_w, ldb_w = ta.ld, tb.ld  # (the 16-bit gathers without ldmatrix: never swizzled)
    out = []
    sixteen = mode not in WORD_MODES
    for fm in range(cfg.fm):
        base = f"wr + {fm * 16}"
        if cfg.ldsm and (a_along_k or sixteen):
            if a_along_k:  # rows m: lanes 0-15 rows, lanes 16-31 the words 4-7
                addr = f"As[cb] + {ta.at(f'({base} + (lane & 15))', 'ks + (lane >> 4) * 4')}"
                op = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
            else:  # rows k (16-bit pairs along m): .trans
                row = "(ks * 2 + ((lane >> 4) & 1) * 8 + (lane & 7))"
                addr = f"As[cb] + {ta.at(row, f'({base} + ((lane >> 3) & 1) * 8) / 2')}"
                op = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
            out.append(f'LDSM4("{op}", af[{fm}], {addr});')
        elif a_along_k:
            r0, r8 = f"({base} + gid)", f"({base} + gid + 8)"
            out.append(
                f"af[{fm}][0] = As[cb][{ta.at(r0, 'ks + tig')}]; af[{fm}][1] = As[cb][{ta.at(r8, 'ks + tig')}]; "
                f"af[{fm}][2] = As[cb][{ta.at(r0, 'ks + tig + 4')}]; af[{fm}][3] = As[cb][{ta.at(r8, 'ks + tig + 4')}];"
            )
        elif not sixteen:  # tf32, rows k: a0 = (m gid, k tig)
            r0, r4, c0, c8 = "(ks + tig)", "(ks + tig + 4)", f"{base} + gid", f"{base} + gid + 8"
            out.append(
                f"af[{fm}][0] = As[cb][{ta.at(r0, c0)}]; af[{fm}][1] = As[cb][{ta.at(r0, c8)}]; "
                f"af[{fm}][2] = As[cb][{ta.at(r4, c0)}]; af[{fm}][3] = As[cb][{ta.at(r4, c8)}];"
            )
        else:  # 16-bit, rows k, no ldmatrix: gather the two halves of each word
            h = "((__local const ushort*)As[cb])"
            row = "(ks * 2 + tig * 2)"
            col = f"({base} + gid)"
            words = []
            for q, (dk, dm) in enumerate(((0, 0), (0, 8), (8, 0), (8, 8))):
                lo = f"{h}[({row} + {dk}) * {2 * lda_w} + {col} + {dm}]"
                hi = f"{h}[({row} + {dk} + 1) * {2 * lda_w} + {col} + {dm}]"
                words.append(f"af[{fm}][{q}] = (uint){lo} | ((uint){hi} << 16);")
            out.append(" ".join(words))
    fn = 0
    while fn < cfg.fn:
        pair = cfg.ldsm and (b_along_k or sixteen) and fn + 1 < cfg.fn
        base = f"wc + {fn * 8}"
        if pair:
            if b_along_k:  # rows n: lanes 0-7 / 16-23 rows of tile fn / fn+1, lanes 8-15 / 24-31 words 4-7
                row = f"({base} + (lane & 7) + (lane >> 4) * 8)"
                addr = f"Bs[cb] + {tb.at(row, 'ks + ((lane >> 3) & 1) * 4')}"
                op = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
            else:  # rows k: matrices (k 0-7, fn), (k 8-15, fn), (k 0-7, fn+1), (k 8-15, fn+1)
                row = "(ks * 2 + ((lane >> 3) & 1) * 8 + (lane & 7))"
                addr = f"Bs[cb] + {tb.at(row, f'({base} + (lane >> 4) * 8) / 2')}"
                op = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
            out.append(
                f'{{ uint t[4]; LDSM4("{op}", t, {addr}); '
                f"bf[{fn}][0] = t[0]; bf[{fn}][1] = t[1]; bf[{fn + 1}][0] = t[2]; bf[{fn + 1}][1] = t[3]; }}"
            )
            fn += 2
            continue
        if b_along_k:
            r = f"({base} + gid)"
            out.append(
                f"bf[{fn}][0] = Bs[cb][{tb.at(r, 'ks + tig')}]; bf[{fn}][1] = Bs[cb][{tb.at(r, 'ks + tig + 4')}];"
            )
        elif not sixteen:
            c = f"{base} + gid"
            out.append(
                f"bf[{fn}][0] = Bs[cb][{tb.at('(ks + tig)', c)}]; bf[{fn}][1] = Bs[cb][{tb.at('(ks + tig + 4)', c)}];"
            )
        else:
            h = "((__local const ushort*)Bs[cb])"
            row = "(ks * 2 + tig * 2)"
            col = f"({base} + gid)"
            words = []
            for q, dk in enumerate((0, 8)):
                lo = f"{h}[({row} + {dk}) * {2 * ldb_w} + {col}]"
                hi = f"{h}[({row} + {dk} + 1) * {2 * ldb_w} + {col}]"
                words.append(f"bf[{fn}][{q}] = (uint){lo} | ((uint){hi} << 16);")
            out.append(" ".join(words))
        fn += 1
    return out


def _descriptor_bits(along_k: bool, tile: Tile) -> int:
    """The constant bits of a ``wgmma`` shared-memory descriptor of a swizzled ``tile``: leading
    byte offset (bits 16-29: atom to atom along M/N of an M/N-major tile; unused K-major), stride
    byte offset (bits 32-45: one group of 8 rows to the next), in 16-byte units, and the swizzle
    (bits 62-63: 1, 2, 3 for 128, 64, 32 bytes)."""
    lead = 0 if along_k else tile.atom_stride
    stride = tile.group_stride
    mode = {32: 1, 16: 2, 8: 3}[tile.atom]
    return ((lead >> 4) << 16) | ((stride >> 4) << 32) | (mode << 62)


def _wgmma_step_lines(cfg: MmaConfig, mode: str, along: tuple[bool, bool], tiles: tuple[Tile, Tile]) -> list[str]:
    """The ``wgmma`` of one stage (``cb``): per k-step one instruction per warpgroup and 64-row block
    ``f`` of its ``fm``, 64 x BN x k.

    A k-step is 8 words along K: 32 bytes on in a K-major tile (within its atoms' rows), two groups
    of 8 rows on in an M/N-major one; warpgroup ``wgi`` reads A's rows from 64 * fm * wgi.
    """
    n = 4 * cfg.fn
    shape = f"m64n{cfg.bn}k8.f32.tf32.tf32" if mode in WORD_MODES else f"m64n{cfg.bn}k16.f32.{mode}.{mode}"
    tail = "1, 1, 1" + ("" if mode in WORD_MODES else f", {int(not along[0])}, {int(not along[1])}")
    listed = ", ".join("%" + str(i) for i in range(n))
    group_bytes = [t.group_stride for t in tiles]  # 8 rows
    step_bytes = [32 if k else 2 * g for k, g in zip(along, group_bytes, strict=True)]
    rows64 = 8 * group_bytes[0] if along[0] else 128 // (4 * tiles[0].atom) * tiles[0].atom_stride  # 64 rows of A
    lines = [
        "const int wgi = warp >> 2;",
        f"const ulong da0 = {_descriptor_bits(along[0], tiles[0])}UL | "
        f"((((uint)(size_t)As[cb]) + wgi * {cfg.fm * rows64}) >> 4);",
        f"const ulong db0 = {_descriptor_bits(along[1], tiles[1])}UL | (((uint)(size_t)Bs[cb]) >> 4);",
        'asm volatile("// NETCL_PTX wgmma.fence.sync.aligned;" ::: "memory");',
    ]
    for step in range(cfg.bkw // 8):
        for f in range(cfg.fm):
            outs = ", ".join(f'"+f"({r})' for r in _wgmma_accumulators(cfg, f))
            da, db = f"da0 + {(step * step_bytes[0] + f * rows64) >> 4}", f"db0 + {step * step_bytes[1] >> 4}"
            lines.append(
                f'asm volatile("// NETCL_PTX wgmma.mma_async.sync.aligned.{shape} {{{listed}}}, %{n}, %{n + 1}, '
                f'{tail};" : {outs} : "l"({da}), "l"({db}));'
            )
    lines.append('asm volatile("// NETCL_PTX wgmma.commit_group.sync.aligned;" ::: "memory");')
    if cfg.wg == 2:
        lines.append(_wgmma_wait(cfg, 0))
    return lines


def _wgmma_swap_lines(cfg: MmaConfig, tiles: tuple[Tile, Tile]) -> list[str]:
    """The ``wgmma`` of one stage (``cb``) under ``cfg.swap``: C^T's 64 x BM x 8 products, B^T's
    fragments loaded from B's k-rows tile (swizzled: the 32 words of a warp's load in distinct banks)
    in mma.sync's tf32 A layout into a local array ``af``, wgmma's B the K-major tile of A; one
    ``wgmma.fence`` after the loads. The products finish within the stage: the wait names the fragments
    as its operands too, so the compiler keeps their registers until the products that read them are done."""
    tile_a, tile_b = tiles
    n, steps = 4 * cfg.fn, cfg.bkw // 8
    listed = ", ".join("%" + str(i) for i in range(n))
    lines = [f"uint af[{steps}][{cfg.fm}][4];"]
    for step in range(steps):
        r0, r4 = f"({step * 8} + tig)", f"({step * 8 + 4} + tig)"
        for f in range(cfg.fm):
            c0, c8 = f"(wr + {f * 64} + gid)", f"(wr + {f * 64 + 8} + gid)"
            at = [tile_b.at(r, c) for r, c in ((r0, c0), (r0, c8), (r4, c0), (r4, c8))]
            lines.append(" ".join(f"af[{step}][{f}][{i}] = Bs[cb][{a}];" for i, a in enumerate(at)))
    lines += [
        f"const ulong db0 = {_descriptor_bits(True, tile_a)}UL | (((uint)(size_t)As[cb]) >> 4);",
        'asm volatile("// NETCL_PTX wgmma.fence.sync.aligned;" ::: "memory");',
    ]
    for step in range(steps):
        for f in range(cfg.fm):
            outs = ", ".join(f'"+f"({r})' for r in _wgmma_accumulators(cfg, f))
            regs = ", ".join(f'"r"(af[{step}][{f}][{i}])' for i in range(4))
            frag = ",".join(f"%{n + i}" for i in range(4))
            lines.append(
                f'asm volatile("// NETCL_PTX wgmma.mma_async.sync.aligned.m64n{cfg.bm}k8.f32.tf32.tf32 '
                f'{{{listed}}}, {{{frag}}}, %{n + 4}, 1, 1, 1;" : {outs} : {regs}, "l"(db0 + {step * 2}));'
            )
    held = [f"af[{step}][{f}][{i}]" for step in range(steps) for f in range(cfg.fm) for i in range(4)]
    lines += ['asm volatile("// NETCL_PTX wgmma.commit_group.sync.aligned;" ::: "memory");', _wgmma_wait(cfg, 0, held)]
    return lines


#: The tensor-map parameter of a kernel that copies by TMA (``MmaConfig.tma``): the two template maps (A's,
#: B's; ``gemm_mma.tma_maps``), then two slots a work-group where it writes them with its operands' addresses.
TMA_PARAM = ",\n                __global ulong16* restrict tmaps"
TMA_BARRIERS = "\n    __local ulong bars[NBUF] __attribute__((aligned(8)));"
#: Hopper's copy instructions (through patched PTX): a tensor map's address replaced, the proxy fences that make
#: the written map visible to the copy engine, an mbarrier's set-up, the expected bytes, a 2-D tiled copy
#: completing on an mbarrier, and a wait for an mbarrier's phase (all threads poll ``try_wait``)
TMA_MACROS = r"""#define MAP_ADDRESS(map, ptr) asm volatile("// NETCL_PTX tensormap.replace.tile.global_address" \
    ".global.b1024.b64 [%0], %1;" \
    :: "l"((ulong)(size_t)(map)), "l"((ulong)(size_t)(ptr)) : "memory")
#define MAP_RELEASE() asm volatile("// NETCL_PTX fence.proxy.tensormap::generic.release.gpu;" ::: "memory")
#define MAP_ACQUIRE(map) asm volatile("// NETCL_PTX fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" \
    :: "l"((ulong)(size_t)(map)) : "memory")
#define BAR_INIT(bar) asm volatile("// NETCL_PTX mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar) : "memory")
#define BAR_INIT_FENCE() asm volatile("// NETCL_PTX fence.mbarrier_init.release.cluster;" ::: "memory")
#define BAR_EXPECT(bar, bytes) asm volatile("// NETCL_PTX mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" \
    :: "r"(bar), "r"(bytes) : "memory")
#define TMA_2D(dst, map, c0, c1, bar) asm volatile("// NETCL_PTX cp.async.bulk.tensor.2d.shared::cluster.global" \
    ".mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" \
    :: "r"((uint)(size_t)(dst)), "l"((ulong)(size_t)(map)), "r"(c0), "r"(c1), "r"(bar) : "memory")
#define BAR_WAIT(bar, phase) { uint done_ = 0; do { asm volatile("// NETCL_PTX { .reg .pred p; " \
    "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" \
    : "=r"(done_) : "r"(bar), "r"(phase) : "memory"); } while (!done_); }
"""


def tma_box(cfg: MmaConfig, mode: str, name: str, along_k: bool) -> tuple[tuple[int, int], int]:
    """(box in elements, innermost first; swizzle span in bytes) of operand ``name``'s tiled copies in a
    ``cfg.tma`` kernel (``_tma_copies``): BK x BM / BN K-major, an atom x BK M/N-major."""
    tile = _tile(name, cfg.bm if name == "A" else cfg.bn, cfg, along_k, mode)
    bk = cfg.bk_elements(mode)
    box = (bk, tile.rows) if along_k else (tile.atom * _epw(mode), bk)
    return box, 4 * tile.atom


def _tma_copies(name: str, tile: Tile, along_k: bool, mode: str) -> list[str]:
    """The tiled copies of one operand's stage into buffer ``buf`` at K offset ``kt`` (map ``maps`` for A,
    ``maps + 1`` for B): a K-major tile is one box (BK elements of BM / BN rows), an M/N-major one a box an
    atom wide and BK rows deep at each atom of its rows (``Tile.atom_major``)."""
    where = "maps" if name == "A" else "maps + 1"
    if along_k:
        return [f"TMA_2D({name}s[buf], {where}, kt, (int){name}0, bar);"]
    wide = tile.atom * _epw(mode)  # elements an atom
    return [
        f"TMA_2D({name}s[buf] + {j * tile.atom_stride // 4}, {where}, (int){name}0 + {j * wide}, kt, bar);"
        for j in range(tile.ld // tile.atom)
    ]


def _tma_issue(cfg: MmaConfig, mode: str, along: tuple[bool, bool], tile_a: Tile, tile_b: Tile) -> str:
    """Thread 0's copies of stage ``tn`` into buffer ``buf`` (``_tma_copies``), announced on its mbarrier."""
    nl4 = "\n                "
    copies = _tma_copies("A", tile_a, along[0], mode) + _tma_copies("B", tile_b, along[1], mode)
    return f"""{{
                const uint bar = (uint)(size_t)&bars[buf]; const int kt = kbeg + tn * BK;
                BAR_EXPECT(bar, {4 * (tile_a.words + tile_b.words)});
                {nl4.join(copies)}
            }}"""


#: Thread 0 writes this work-group's two tensor maps (the templates with A's and B's addresses) and sets up one
#: mbarrier a stage.
_TMA_SETUP = """const int ntiles = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0;
    __global ulong16* maps = tmaps + 2 + 2 * ((get_group_id(2) * get_num_groups(1) + get_group_id(1))
                                              * get_num_groups(0) + get_group_id(0));
    if (tid == 0) {
        maps[0] = tmaps[0]; maps[1] = tmaps[1];
        MAP_ADDRESS(maps, A); MAP_ADDRESS(maps + 1, B);
        MAP_RELEASE(); MAP_ACQUIRE(maps); MAP_ACQUIRE(maps + 1);
        for (int i = 0; i < NBUF; ++i) BAR_INIT((uint)(size_t)&bars[i]);
        BAR_INIT_FENCE();
    }
    barrier(CLK_LOCAL_MEM_FENCE);"""


def _tma_main_loop(
    cfg: MmaConfig, mode: str, along: tuple[bool, bool], compute: str, tile_a: Tile, tile_b: Tile
) -> str:
    """The K loop of a kernel whose tiles come by TMA (``cfg.tma``): thread 0 writes this work-group's two
    maps (the templates with A's and B's addresses, A and B already moved to the batch) and sets up one
    mbarrier a stage; it issues each stage's tiled copies (``_tma_copies``, swizzled as the tiles' wgmma
    atoms, ``Tile.macro``; elements past the operand zero) ``stages - 1`` ahead, a buffer once every
    warpgroup's products of its previous tile are done; every thread waits for a stage's bytes on its
    mbarrier (phase: the buffer's use count, modulo 2)."""
    ahead = cfg.stages - 1
    nl2 = "\n        "
    issue = _tma_issue(cfg, mode, along, tile_a, tile_b)
    refill = f"""if (tid == 0) {{
            const int tn = t + {ahead};
            if (tn < ntiles) {{ const int buf = tn % NBUF; {issue} }}
        }}"""
    wait = "BAR_WAIT((uint)(size_t)&bars[cb], (t / NBUF) & 1);"
    if cfg.wg == 1:  # refill the previous tile's buffer once every warpgroup's products of it are done
        body = [wait, compute, _wgmma_wait(cfg, 1), "barrier(CLK_LOCAL_MEM_FENCE);", refill]
    else:  # products finish within their stage: the barrier frees the previous tile's buffer
        body = ["barrier(CLK_LOCAL_MEM_FENCE);", refill, wait, compute]
    drain = "\n    " + _wgmma_wait(cfg, 0) if cfg.wg == 1 else ""
    return f"""{_TMA_SETUP}
    if (tid == 0) {{
        for (int tn = 0; tn < {ahead} && tn < ntiles; ++tn) {{ const int buf = tn; {issue} }}
    }}
    for (int t = 0; t < ntiles; ++t) {{
        const int cb = t % NBUF;
        {nl2.join(body)}
    }}{drain}"""


#: tf32x3 on ``wgmma``: buffers of the lo tiles (stage t's in buffer t % 2: the next stage's split runs while
#: the products of this one read theirs)
X3_LO_BUFFERS = 2


def x3_split_tile(name: str, side: int, cfg: MmaConfig, mode: str) -> Tile:
    """The K-major tile (wgmma's atoms) a tf32x3 stage of operand ``name`` is split into: its lo parts, and the hi
    parts of an operand stored M/N-major (a K-major raw tile keeps its hi parts in place). Named ``name`` + "T"."""
    return _tile(f"{name}T", side, cfg, True, mode)


def _x3_split_lines(cfg: MmaConfig, mode: str, along: tuple[bool, bool], raw: tuple[Tile, Tile]) -> list[str]:
    """Stage ``sb``'s split (raw float32 words in buffer ``sb`` of ``As`` / ``Bs``; split tiles ``sl``) into
    hi = tf32(x) and lo = tf32(x - hi).

    A K-major raw tile is split word by word, 16 bytes a thread at a time: hi in place, lo at the same offset
    of the lo tile, which has the raw tile's layout (wgmma's swizzled atoms), so no address arithmetic. An
    M/N-major one (rows k) is split 4 x 4 words a thread: four 16-byte rows k read, and the four columns m
    written as 16-byte rows m of the K-major hi and lo tiles (``x3_split_tile``); a warp's eight K chunks of
    four rows m land in distinct banks of the swizzled atoms.
    """
    lines = []
    for name, side, k_major, tile in zip(("A", "B"), (cfg.bm, cfg.bn), along, raw, strict=True):
        if k_major:
            for _, c, guard in _thread_shares(tile.words // 4, cfg.threads):
                lines.append(f"{guard}X3_SPLIT(&{name}s[sb][{c} * 4], &{name}lo[sl][{c} * 4]);")
            continue
        split = x3_split_tile(name, side, cfg, mode)
        k_chunks = cfg.bkw // 4
        for _, c, guard in _thread_shares(side // 4 * k_chunks, cfg.threads):
            lines.append(f"{guard}{{ const int k0 = ({c} & {k_chunks - 1}) * 4, m0 = ({c} / {k_chunks}) * 4;")
            for i in range(4):
                at = tile.at(f"(k0 + {i})", "m0")
                lines.append(f"  const uint4 r{i} = *(__local const uint4*)&{name}s[sb][{at}];")
            for q in range(4):
                at = split.at(f"(m0 + {q})", "k0")
                column = f"(uint4)(r0.s{q}, r1.s{q}, r2.s{q}, r3.s{q})"
                lines.append(f"  X3_SPLIT4({column}, &{name}hi[sl][{at}], &{name}lo[sl][{at}]);")
            lines.append("}")
    return lines


#: The splits of ``_x3_split_lines``: of one 16-byte chunk, hi = tf32(x) written in place and lo = tf32(x - hi)
#: into ``lo``; of four ``words``, hi into ``hi`` and lo into ``lo`` (X3_SPLIT4's body reads members .x to .w,
#: so none of its parameters may have those names)
X3_SPLIT_MACRO = r"""#define X3_PART(x, h, l) { const float v_ = as_float(x); h = TF32(v_); \
    l = TF32(v_ - as_float(h)); }
#define X3_SPLIT4(words, hi, lo) { const uint4 x_ = (words); uint4 h_, l_; \
    X3_PART(x_.x, h_.x, l_.x); X3_PART(x_.y, h_.y, l_.y); X3_PART(x_.z, h_.z, l_.z); X3_PART(x_.w, h_.w, l_.w); \
    *(__local uint4*)(hi) = h_; *(__local uint4*)(lo) = l_; }
#define X3_SPLIT(raw, lo) X3_SPLIT4(*(__local const uint4*)(raw), raw, lo)
"""


def _wgmma_x3_lines(cfg: MmaConfig, mode: str, along: tuple[bool, bool]) -> list[str]:
    """The ``wgmma`` of stage ``cb`` under tf32x3: per k-step and 64-row block, lo*hi, hi*lo and hi*hi
    (hi: ``As`` / ``Bs`` buffer ``cb`` split in place, or for an operand stored M/N-major ``Ahi`` / ``Bhi``
    buffer ``lb``; lo: ``Alo`` / ``Blo`` buffer ``lb``: all K-major) into the stage's own accumulators ``tacc``,
    which the stage's first product overwrites (scale-d 0); the caller adds ``tacc`` into ``acc`` with IEEE
    adds once the products are done (the tensor cores' accumulation truncates: over a stage's 32 words that is
    relative to the stage's sum, not to the whole row's)."""
    tile_a, tile_b = x3_split_tile("A", cfg.bm, cfg, mode), x3_split_tile("B", cfg.bn, cfg, mode)
    hi_a, hi_b = ("As[cb]" if along[0] else "Ahi[lb]"), ("Bs[cb]" if along[1] else "Bhi[lb]")
    n = 4 * cfg.fn
    listed = ", ".join("%" + str(i) for i in range(n))
    rows64 = 8 * tile_a.group_stride  # 64 rows of a K-major atom tile
    bits_a, bits_b = _descriptor_bits(True, tile_a), _descriptor_bits(True, tile_b)
    lines = [
        "const int wgi = warp >> 2;",
        f"const ulong dah = {bits_a}UL | ((((uint)(size_t){hi_a}) + wgi * {cfg.fm * rows64}) >> 4);",
        f"const ulong dal = {bits_a}UL | ((((uint)(size_t)Alo[lb]) + wgi * {cfg.fm * rows64}) >> 4);",
        f"const ulong dbh = {bits_b}UL | (((uint)(size_t){hi_b}) >> 4);",
        f"const ulong dbl = {bits_b}UL | (((uint)(size_t)Blo[lb]) >> 4);",
        'asm volatile("// NETCL_PTX wgmma.fence.sync.aligned;" ::: "memory");',
    ]
    for step in range(cfg.bkw // 8):
        for f in range(cfg.fm):
            outs = ", ".join(f'"+f"({r})' for r in _wgmma_accumulators(cfg, f, "tacc"))
            at = f" + {(step * 32 + f * rows64) >> 4}"
            bt = f" + {step * 2}"
            for i, (da, db) in enumerate((("dal", "dbh"), ("dah", "dbl"), ("dah", "dbh"))):
                scale = int(step > 0 or i > 0)  # the stage's first product of a block overwrites its tacc
                lines.append(
                    f'asm volatile("// NETCL_PTX {{ .reg .pred p; setp.ne.b32 p, %{n + 2}, 0; '
                    f"wgmma.mma_async.sync.aligned.m64n{cfg.bn}k8.f32.tf32.tf32 {{{listed}}}, %{n}, %{n + 1}, "
                    f'p, 1, 1; }}" : {outs} : "l"({da}{at}), "l"({db}{bt}), "r"({scale}));'
                )
    lines.append('asm volatile("// NETCL_PTX wgmma.commit_group.sync.aligned;" ::: "memory");')
    return lines


def _x3_main_loop(cfg: MmaConfig, mode: str, along: tuple[bool, bool], products: list[str], tiles) -> str:
    """The K loop of tf32x3 on ``wgmma`` (``cfg.tma``): stage t's products run while
    the threads split stage t + 1 (``_x3_split_lines``; its raw tiles came by TMA ``stages - 1`` ahead); then
    the products' wait, the IEEE join of ``tacc`` into ``acc``, one barrier, and the refill of stage t's
    buffer with stage t + stages."""
    tile_a, tile_b = tiles
    nl2, nl3 = "\n        ", "\n            "
    issue = _tma_issue(cfg, mode, along, tile_a, tile_b)
    split = _x3_split_lines(cfg, mode, along, tiles)
    fence = 'asm volatile("// NETCL_PTX fence.proxy.async.shared::cta;" ::: "memory");'
    join = "acc[i][j][q] += tacc[i][j][q];"
    return f"""{_TMA_SETUP}
    if (tid == 0) {{
        for (int tn = 0; tn < NBUF && tn < ntiles; ++tn) {{ const int buf = tn; {issue} }}
    }}
    float tacc[{cfg.fm}][{cfg.fn}][4];
    #pragma unroll
    for (int i = 0; i < {cfg.fm}; ++i) {{
        #pragma unroll
        for (int j = 0; j < {cfg.fn}; ++j) {{
            tacc[i][j][0] = 0.0f; tacc[i][j][1] = 0.0f; tacc[i][j][2] = 0.0f; tacc[i][j][3] = 0.0f;
        }}
    }}
    if (ntiles > 0) {{
        const int sb = 0, sl = 0;
        BAR_WAIT((uint)(size_t)&bars[0], 0);
        {nl2.join(split)}
    }}
    {fence}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int t = 0; t < ntiles; ++t) {{
        const int cb = t % NBUF, lb = t & 1;
        {{
            {nl3.join(products)}
        }}
        if (t + 1 < ntiles) {{
            const int sb = (t + 1) % NBUF, sl = (t + 1) & 1;
            BAR_WAIT((uint)(size_t)&bars[sb], ((t + 1) / NBUF) & 1);
            {nl3.join(split)}
        }}
        {_wgmma_wait(cfg, 0, name="tacc")}
        #pragma unroll
        for (int i = 0; i < {cfg.fm}; ++i) {{
            #pragma unroll
            for (int j = 0; j < {cfg.fn}; ++j) {{
                #pragma unroll
                for (int q = 0; q < 4; ++q) {join}
            }}
        }}
        {fence}
        barrier(CLK_LOCAL_MEM_FENCE);
        if (tid == 0 && t + NBUF < ntiles) {{ const int tn = t + NBUF; const int buf = cb; {issue} }}
    }}"""


def _wgmma_accumulators(cfg: MmaConfig, block: int | None = None, name: str = "acc") -> list[str]:
    """The accumulator registers (array ``name``) of a thread in ``wgmma``'s order (n8 block j, then its
    four values), of 64-row ``block`` or of all of them."""
    blocks = range(cfg.fm) if block is None else (block,)
    return [f"{name}[{f}][{j}][{i}]" for f in blocks for j in range(cfg.fn) for i in range(4)]


def _wgmma_wait(cfg: MmaConfig, pending: int, held: Sequence[str] = (), name: str = "acc") -> str:
    """Wait until at most ``pending`` groups of ``wgmma`` are in flight; the accumulators (array ``name``;
    and the words ``held``: register fragments in-flight products read) are its operands, so the compiler
    neither reads nor moves them before the wait."""
    accumulators = _wgmma_accumulators(cfg, name=name)
    outs = ", ".join([*(f'"+f"({r})' for r in accumulators), *(f'"+r"({w})' for w in held)])
    return f'asm volatile("// NETCL_PTX wgmma.wait_group.sync.aligned {pending};" : {outs} :: "memory");'


def _split_lines(raw: str, hi: str, count: int, words: int) -> list[str]:
    """Split each raw float32 word of ``raw`` into ``hi`` = tf32(x) and, in place, lo = tf32(x - hi)."""
    return [
        f"{{ const float x = as_float({raw}[{i}][{q}]); {hi}[{i}][{q}] = TF32(x); "
        f"{raw}[{i}][{q}] = TF32(x - as_float({hi}[{i}][{q}])); }}"
        for i in range(count)
        for q in range(words)
    ]


def _mma_line(mode: str, a: str, b: str, fm: int, fn: int, out: list[str], into: list[str]) -> str:
    """One ``mma.sync`` of fragments ``a[fm]`` x ``b[fn]`` adding ``into`` (registers or constants) into ``out``."""
    outs = ", ".join('"=f"(' + x + ")" for x in out)
    ins = ", ".join('"f"(' + x + ")" for x in into)
    regs = ", ".join(f'"r"({a}[{fm}][{i}])' for i in range(4)) + f', "r"({b}[{fn}][0]), "r"({b}[{fn}][1])'
    operands = "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13}"
    return f'asm volatile("{MMA[mode]} {operands};" : {outs} : {regs}, {ins});'


def _tile_mma(mode: str, fm: int, fn: int) -> str:
    """The mma work of tile (``fm``, ``fn``) for one k-step.

    The split modes (``af`` / ``bf`` the lo parts, ``ah`` / ``bh`` the hi parts) sum lo*hi + hi*lo + hi*hi
    of the step into a zero-started ``t`` and add ``t`` to the accumulator with IEEE float adds:
    the tensor cores' own accumulation truncates, which over K / 8 steps into a large accumulator
    is a bias growing with K; into ``t`` it is relative to one step's sum.
    """
    acc = [f"acc[{fm}][{fn}][{i}]" for i in range(4)]
    if mode not in SPLIT_MODES:
        return _mma_line(mode, "af", "bf", fm, fn, acc, acc)
    t = [f"t{i}" for i in range(4)]
    lines = ["{ float t0, t1, t2, t3;", _mma_line(mode, "af", "bh", fm, fn, t, ["0.0f"] * 4)]
    lines += [_mma_line(mode, a, b, fm, fn, t, t) for a, b in (("ah", "bf"), ("ah", "bh"))]
    lines.append(" ".join(f"{x} += {y};" for x, y in zip(acc, t, strict=True)) + " }")
    return "\n        ".join(lines)


def _renamed_fragments(lines: list[str], a: str, b: str, ks: str) -> list[str]:
    """``lines`` (``_fragments``' loads, or mma lines) with the fragment arrays ``af`` / ``bf`` renamed ``a`` / ``b``,
    each line that reads the k-step's first word in a block defining ``ks`` as the C expression ``ks``."""
    out = [line.replace("af[", f"{a}[").replace("bf[", f"{b}[") for line in lines]
    return [f"{{ const int ks = {ks}; {line} }}" if "ks" in line else line for line in out]


def _bf16x3_compute(cfg: MmaConfig, frag: list[str], mma: list[str]) -> str:
    """bf16x3's products of one stage: per 16 words along K, the tf32 fragments of two 8-word steps (``frag``
    with ``ks`` the step's first word; raw float32 words), packed into the bf16 hi and lo fragments of one
    ``m16n8k16`` step, then ``mma`` (``_tile_mma``'s lines).

    A thread's tf32 fragments hold words k = tig and tig + 4 of its rows (A) or columns (B) in each 8-word
    step; m16n8k16 takes k = 2 tig and 2 tig + 1 in one 32-bit register, 2 tig + 8 and 2 tig + 9 in the next.
    Packing (tig, tig + 4) of the first step and (8 + tig, 12 + tig) of the second into those registers
    permutes the 16 k alike in A and B, which a dot product over them does not see. Each pair is split
    by ``BF16_SPLIT``: hi = bf16(x) rounded to nearest, lo = bf16(x - hi).
    """
    steps = [
        " ".join(_renamed_fragments(frag, f"a{half}", f"b{half}", f"pair * 16 + {offset}"))
        for half, offset in (("p", 0), ("q", 8))
    ]
    packs = []
    for i in range(cfg.fm):
        words = (("p", 0, 2), ("p", 1, 3), ("q", 0, 2), ("q", 1, 3))
        packs.append(
            " ".join(
                f"BF16_SPLIT(a{h}[{i}][{x}], a{h}[{i}][{y}], ah[{i}][{q}], af[{i}][{q}]);"
                for q, (h, x, y) in enumerate(words)
            )
        )
    for j in range(cfg.fn):
        words = (f"BF16_SPLIT(b{h}[{j}][0], b{h}[{j}][1], bh[{j}][{q}], bf[{j}][{q}]);" for q, h in enumerate("pq"))
        packs.append(" ".join(words))
    nl2 = "\n            "
    return f"""#pragma unroll
        for (int pair = 0; pair < {cfg.bkw // 16}; ++pair) {{
            uint ap[{cfg.fm}][4], bp[{cfg.fn}][2], aq[{cfg.fm}][4], bq[{cfg.fn}][2];
            {nl2.join(steps)}
            uint af[{cfg.fm}][4], bf[{cfg.fn}][2], ah[{cfg.fm}][4], bh[{cfg.fn}][2];
            {nl2.join(packs)}
            {nl2.join(mma)}
        }}"""


#: bf16x3's split of two raw float32 words ``x0``, ``x1`` into bf16x2 words: ``hi`` = (bf16(x0), bf16(x1)) and
#: ``lo`` = the bf16 of what each misses (``bf16x2_bits`` puts its first value in the low half)
BF16_SPLIT_MACRO = r"""#define BF16_SPLIT(x0, x1, hi, lo) { const float u_ = as_float(x0), v_ = as_float(x1); \
    hi = bf16x2_bits(u_, v_); lo = bf16x2_bits(u_ - as_float((hi) << 16), v_ - as_float((hi) & 0xffff0000u)); }
"""


def _paired_half_store() -> str:
    """After the odd value of a pair: columns c - 1 and c of row r (values ``hv``) to float16 C."""
    return """
                if ((q & 1) && r < M) {
                    __global half* p = Cz + (IDX)r * ldc + c - 1;
                    if (c < N && !((size_t)p & 3)) {
                        *(__global uint*)p = f16x2_bits(hv[0], hv[1]);
                    } else {
                        if (c - 1 < N) vstore_half_rte(hv[0], 0, p);
                        if (c < N) vstore_half_rte(hv[1], 0, p + 1);
                    }
                }"""


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
    views: tuple[OperandView | None, ...] = (None, None),
) -> str:
    """The kernel ``netcl_gemm`` on tensor cores for one config, mode, layout and epilogue.

    ``views`` as in ``gemm_source.portable_source``: (A, B) or (A, B, C); an operand view reads
    float32 elements through its expression (register staging), or, in cp.async stages, copies them
    from its ``offsets4``; C's view gives the flat output index of (``r``, ``c``).
    """
    # 16-bit operands (float16, bfloat16 in their modes) are copied as words; float32 ones converted
    a_half, b_half = a_dtype in (float16, bfloat16), b_dtype in (float16, bfloat16)
    for dtype in (a_dtype, b_dtype):
        if dtype in (float16, bfloat16) and dtype != WORD_DTYPE.get(mode):
            raise ValueError(f"gemm_mma: {dtype} operands multiply in their own mode, not {mode}")
    view_a, view_b, view_c = (*views, None)[:3]
    if (view_a is not None and a_half) or (view_b is not None and b_half):
        raise ValueError("gemm_mma: an operand view reads float32 storage; 16-bit operands cannot be views")
    if cfg.stages and mode not in WORD_MODES and not (a_half and b_half):
        raise ValueError("gemm_mma: cp.async stages copy stored operands; f16 of float32 operands converts them")
    if cfg.stages and any(v is not None and not v.offsets4 for v in (view_a, view_b)):
        raise ValueError("gemm_mma: cp.async stages copy a view's elements from its offsets4 (tf32 only)")
    a_along_k, b_along_k = not trans_a, trans_b
    a_decl, a_load, a_store, tile_a = _copy("A", cfg.bm, cfg, a_along_k, a_half, mode, cfg.va, "M", view_a)
    b_decl, b_load, b_store, tile_b = _copy("B", cfg.bn, cfg, b_along_k, b_half, mode, cfg.vb, "N", view_b)
    helpers = "".join(v.helpers + "\n" for v in views if v is not None and v.helpers)
    frag = [] if cfg.wg else _fragments(cfg, mode, a_along_k, b_along_k, tile_a, tile_b)
    a_words, b_words = tile_a.words, tile_b.words
    mma = [_tile_mma(mode, fm, fn) for fm in range(cfg.fm) for fn in range(cfg.fn)]
    if mode == "tf32x3" and not cfg.wg:  # (wgmma splits its stages: ``_x3_split_lines``)
        frag = [
            *frag,
            f"uint ah[{cfg.fm}][4], bh[{cfg.fn}][2];",
            *_split_lines("af", "ah", cfg.fm, 4),
            *_split_lines("bf", "bh", cfg.fn, 2),
        ]
    bias_arg = epilogue.params()
    sa = "ushort" if a_half else "float"
    sb = "ushort" if b_half else "float"
    out_half = c_dtype == float16
    sc = {float16: "half", bfloat16: C_TYPES[bfloat16]}.get(c_dtype, "float")
    at = "(IDX)r * ldc + c" if view_c is None else f"({view_c.element})"
    store = store_c(c_dtype, "Cz", at, "OUT") if c_dtype in (float16, bfloat16) else f"Cz[{at}] = OUT"
    nl, nl2 = "\n    ", "\n        "
    align = 1024 if cfg.wg else 16  # wgmma's swizzle is of the address: atoms start at its period
    # a warp's first row: wgmma's warpgroups take fm blocks of 64 rows, each warp 16 rows of a block
    warp_rows = f"(warp >> 2) * {cfg.fm * 64} + (warp & 3) * 16" if cfg.wg else f"(warp % {cfg.wm}) * {cfg.fm * 16}"
    # 16-byte copies through L1 (.ca) for mma.sync, past it (.cg) for wgmma: each the faster way on the H200
    # (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", gemm_mma_source.py)
    copy_cache = "cg" if cfg.wg else "ca"
    copy_note = f"cp.async.{copy_cache}: {'past' if cfg.wg else 'through'} L1, the faster for this kernel on the H200"
    nl5 = "\n                    "
    # the element of acc[fm][fn][q]: fragment rows (gid) along M, or along N under swap (C^T's products)
    frag_rows = f"wr + fm * {16 * (4 if cfg.wg else 1)} + gid + (q >> 1) * 8"
    frag_cols = "wc + fn * 8 + tig * 2 + (q & 1)"
    if cfg.swap:
        frag_rows, frag_cols = frag_cols, frag_rows
    row_col = f"const IDX r = A0 + {frag_rows};\n                const IDX c = B0 + {frag_cols};"
    # float16 C: values q and q + 1 are columns c and c + 1 of one row, stored as one 32-bit word of both
    # halves (rounded to nearest even, as vstore_half_rte) where the word is aligned
    paired = out_half and view_c is None and not cfg.swap
    elements = epilogue.store_lines("acc[fm][fn][q]", "float", "hv[q & 1] = OUT" if paired else store, at=at)
    store_loop = f"""#pragma unroll
            for (int q = 0; q < 4; ++q) {{
                {row_col}
                if (r < M && c < N) {{
                    {nl5.join(elements)}
                }}{_paired_half_store() if paired else ""}
            }}"""
    if paired:
        store_loop = "float hv[2] = {0.0f, 0.0f};\n            " + store_loop
    compute = f"""#pragma unroll
        for (int step = 0; step < {cfg.bkw // 8}; ++step) {{
            const int ks = step * 8;
            uint af[{cfg.fm}][4], bf[{cfg.fn}][2];
            {nl2.join(frag)}
            {nl2.join(mma)}
        }}"""
    if mode == "bf16x3":  # two k-steps' fragments a product
        compute = _bf16x3_compute(cfg, frag, mma)
    if cfg.fpre:  # fragments of step s + 1 load while the mma of step s run (two register sets)
        steps = cfg.bkw // 8

        def renamed(lines: list[str], p: int, step: int) -> list[str]:
            return _renamed_fragments(lines, f"af{p}", f"bf{p}", str(step * 8))

        body = [f"uint af{p}[{cfg.fm}][4], bf{p}[{cfg.fn}][2];" for p in (0, 1)]
        body += renamed(frag, 0, 0)
        for step in range(steps):
            if step + 1 < steps:
                body += renamed(frag, (step + 1) % 2, step + 1)
            body += renamed(mma, step % 2, step)
        compute = "{\n            " + "\n            ".join(body) + "\n        }"
    x3_wgmma = bool(cfg.wg) and mode == "tf32x3"
    if x3_wgmma:
        products = _wgmma_x3_lines(cfg, mode, (a_along_k, b_along_k))
    elif cfg.wg:  # the stage's products run asynchronously on the warpgroups
        products = (
            _wgmma_swap_lines(cfg, (tile_a, tile_b))
            if cfg.swap
            else _wgmma_step_lines(cfg, mode, (a_along_k, b_along_k), (tile_a, tile_b))
        )
        compute = "{\n            " + nl2.join(products) + "\n        }"
    # wgmma reads local memory through the async proxy: the copies' writes are fenced into it
    proxy_fence = nl + 'asm volatile("// NETCL_PTX fence.proxy.async.shared::cta;" ::: "memory");' if cfg.wg else ""
    if cfg.tma:
        if view_a is not None or view_b is not None:
            raise ValueError("gemm_mma: the Tensor Memory Accelerator copies stored operands, not views")
        nbuf = cfg.stages
        if x3_wgmma:
            main_loop = _x3_main_loop(cfg, mode, (a_along_k, b_along_k), products, (tile_a, tile_b))
        else:
            main_loop = _tma_main_loop(cfg, mode, (a_along_k, b_along_k), compute, tile_a, tile_b)
    elif cfg.stages:
        nbuf = cfg.stages
        issue = _async_copy("A", cfg.bm, cfg, a_along_k, "M", mode, sa, view_a) + _async_copy(
            "B", cfg.bn, cfg, b_along_k, "N", mode, sb, view_b
        )
        ahead = nbuf - 1  # tiles copied ahead of the one multiplied
        drain = nl + _wgmma_wait(cfg, 0) if cfg.wg else ""
        refill = f"""{{
            const int tn = t + {ahead};
            if (tn < ntiles) {{
                const int buf = tn % {nbuf}; const int kt = kbeg + tn * BK;
                {nl2.join(issue)}
            }}
            asm volatile("cp.async.commit_group;");
        }}"""
        body = f"{refill}\n        const int cb = t % {nbuf};\n        {compute}"
        if cfg.wg == 1:  # refill the previous stage's buffer once every warpgroup's products of it are done
            parts = [
                f"const int cb = t % {nbuf};",
                compute,
                _wgmma_wait(cfg, 1),
                "barrier(CLK_LOCAL_MEM_FENCE);",
                refill,
            ]
            body = nl2.join(parts)
        main_loop = f"""const int ntiles = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0;
    #pragma unroll
    for (int st = 0; st < {ahead}; ++st) {{
        if (st < ntiles) {{
            const int buf = st; const int kt = kbeg + st * BK;
            {nl2.join(issue)}
        }}
        asm volatile("cp.async.commit_group;");
    }}
    for (int t = 0; t < ntiles; ++t) {{
        asm volatile("cp.async.wait_group {ahead - 1};");{proxy_fence}
        barrier(CLK_LOCAL_MEM_FENCE);
        {body}
    }}{drain}"""
    else:
        nbuf = 2
        main_loop = f"""int k0 = kbeg;
    int nb = 0;
    {nl.join(a_decl + b_decl)}
    {nl.join(a_load)}
    {nl.join(b_load)}
    {nl.join(a_store)}
    {nl.join(b_store)}{proxy_fence}
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
        {compute}
        if (more) {{
        {nl2.join(a_store)}
        {nl2.join(b_store)}
        }}{proxy_fence}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}"""
    stage_count = f"\n#define NBUF {nbuf}" if cfg.tma else ""  # (the TMA kernel's mbarriers)
    lo_tiles, split_macro = "", X3_SPLIT_MACRO if x3_wgmma else BF16_SPLIT_MACRO if mode == "bf16x3" else ""
    if x3_wgmma:  # the split stages' lo parts, and hi parts of operands stored M/N-major (``_x3_split_lines``)
        split_tiles = [("A", "lo", a_words), ("B", "lo", b_words)]
        split_tiles += [
            (name, "hi", words) for name, words, k in (("A", a_words, a_along_k), ("B", b_words, b_along_k)) if not k
        ]
        lo_tiles = "".join(
            f"\n    __local uint {name}{part}[{X3_LO_BUFFERS}][{words}] __attribute__((aligned({align})));"
            for name, part, words in split_tiles
        )
        split_macro += "".join(
            x3_split_tile(n, side, cfg, mode).macro()
            for n, side, k in (("A", cfg.bm, a_along_k), ("B", cfg.bn, b_along_k))
            if not k
        )
    return f"""{helpers_c([c_dtype])}{epilogue.preamble}
#define CT float
#define IDX {idx}
#define BM {cfg.bm}
#define BN {cfg.bn}
#define BK {cfg.bk_elements(mode)}
#define NT {cfg.threads}
#define GROUP {cfg.group}{stage_count}
#define TF32(x) tf32_bits(x)
#define BF16X2(lo, hi) bf16x2_bits(lo, hi)
#define F16X2(lo, hi) f16x2_bits(lo, hi)
/* {copy_note} */
#define CP_ASYNC(dst, src, bytes) asm volatile("cp.async.{copy_cache}.shared.global [%0], [%1], 16, %2;" \\
    :: "r"((uint)(size_t)(dst)), "l"((ulong)(size_t)(src)), "r"(bytes))
#define CP_ASYNC4(dst, src, bytes) asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" \\
    :: "r"((uint)(size_t)(dst)), "l"((ulong)(size_t)(src)), "r"(bytes))
#define LDSM4(op, d, p) asm volatile(op " {{%0,%1,%2,%3}}, [%4];" \\
    : "=r"((d)[0]), "=r"((d)[1]), "=r"((d)[2]), "=r"((d)[3]) : "r"((uint)(size_t)(p)))
{TMA_MACROS if cfg.tma else ""}{split_macro}{helpers}{tile_a.macro()}{tile_b.macro()}inline uint tf32_bits(float x) {{
    uint r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r; }}
inline uint bf16x2_bits(float lo, float hi) {{
    uint r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }}
inline uint f16x2_bits(float lo, float hi) {{
    uint r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }}
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
{kernel_signature(sa, sb, sc, (TMA_PARAM if cfg.tma else "") + bias_arg)}
    __local uint As[{nbuf}][{a_words}] __attribute__((aligned({align})));
    __local uint Bs[{nbuf}][{b_words}] __attribute__((aligned({align})));{lo_tiles}{TMA_BARRIERS if cfg.tma else ""}
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wr = {warp_rows};
    const int wc = (warp / {cfg.wm}) * {cfg.fn * 8};
{block_indexing(sc)}
    float acc[{cfg.fm}][{cfg.fn}][4];
    #pragma unroll
    for (int i = 0; i < {cfg.fm}; ++i) {{
        #pragma unroll
        for (int j = 0; j < {cfg.fn}; ++j) {{
            acc[i][j][0] = 0.0f; acc[i][j][1] = 0.0f; acc[i][j][2] = 0.0f; acc[i][j][3] = 0.0f;
        }}
    }}
    {main_loop}
    #pragma unroll
    for (int fm = 0; fm < {cfg.fm}; ++fm) {{
        #pragma unroll
        for (int fn = 0; fn < {cfg.fn}; ++fn) {{
            {store_loop}
        }}
    }}
}}
"""
