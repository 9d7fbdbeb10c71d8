"""OpenCL C source of the portable GEMM kernel (plain FMA, any OpenCL device).

``C[z] = A[z] @ B[z]`` for every batch index ``z``, where A is (M, K) or, with ``trans_a``, stored
as (K, M); B is (K, N) or, with ``trans_b``, stored as (N, K). Sizes, leading dimensions, batch
strides and the split along K are KERNEL ARGUMENTS (a new batch size builds nothing); the tile
shape is compile-time (``GemmConfig``, one program per config, layout and dtype).

Scheme: a work-group of WGN x WGM threads computes a BM x BN block of C (BM = WGM*TM, BN = WGN*TN),
each thread a TM x TN register block. Per step along K, the A and B tiles (BM x BK, BK x BN) are
read from global memory with VA-/VB-wide vector loads along each operand's contiguous dimension
and stored k-major in local memory (As[k][m], Bs[k][n]), double-buffered: the next step's tile is
loaded into registers while the current one is multiplied, so each step needs one barrier.
A thread's rows are ``(i / LV) * WGM*LV + ty*LV + i % LV``: LV-wide local reads, and each row of
threads reads one contiguous span. Out-of-range elements load as zero, so any M, N, K work.
With K slices (``GemmConfig.ks``, ``_slices``) a work-group holds ks such thread sets, which take
turns along K and add their accumulators in slice order before the store.

The kernel's signature (shared with the tensor-core kernel, ``gemm_mma``)::

    (M, N, K, A, lda, B, ldb, C, ldc, nb1, nb2, sa0, sa1, sa2, sb0, sb1, sb2, sc,
     splits, kchunk, ss [, bias])

Group z of dimension 2 is ``batch * splits + s``: batch index ``(b0, b1, b2)`` with inner sizes
``nb1``, ``nb2`` (merged broadcast dims; a stride 0 broadcasts), split ``s`` covering K range
``[s*kchunk, min(K, (s+1)*kchunk))`` and writing at ``C + batch*sc + s*ss``.

An operand may be read through an ``OperandView`` instead of as a stored matrix: the tile load
then evaluates the view's C expression for element (row ``mn``, depth ``kk``) from the operand's
batch base pointer ``p`` (scalar loads). That is how convolution runs as an implicit GEMM
(``conv``): the im2col address is computed in the load, no column buffer is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from netcl.core.dtypes import C_TYPES, STORAGE_ONLY, float32, float64
from netcl.runtime.ops.storage_io import load_c, store_c, vload_c

#: What the kernel computes at the store: None, or (bias kind, activation). Bias kinds: "none",
#: "col" (one value per column n: a Linear layer's bias), "row" (one per row m).
ACTIVATIONS = {
    None: "v",
    "relu": "fmax(v, (CT)0)",
    "gelu": "GELU(v)",
    "sigmoid": "SIGMOID(v)",
    "tanh": "tanh(v)",
}


#: Kinds of a code epilogue's extra kernel arguments (see ``Epilogue.operands``).
OPERAND_KINDS = ("full", "col", "row", "scalar", "out")


@dataclass(frozen=True)
class Epilogue:
    """``act(acc + bias)`` applied in the store (``bias``: "none", "col" or "row").

    A *code* epilogue (``code`` non-empty; what ``netcl.jit`` injects for an elementwise chain that
    follows a product) then runs C statements on each element: they read ``ep_value`` (the float
    value above) and ``ep{k}`` (extra operand k), and define ``float ep_out0`` (stored in C) and
    ``float ep_out{j}`` for the j-th "out" operand. ``operands`` are the kinds of the extra kernel
    arguments that follow the bias, in order: "full" (laid out like C), "col" (one value per column),
    "row" (one per row of the flattened batch of C), "scalar" (a float argument) and "out" (a float32
    output laid out like C). ``preamble`` holds helper definitions the statements use.
    """

    bias: str = "none"
    activation: str | None = None
    code: str = ""
    operands: tuple[str, ...] = ()
    preamble: str = ""

    def __post_init__(self) -> None:
        if self.bias not in ("none", "col", "row"):
            raise ValueError(f"epilogue bias must be 'none', 'col' or 'row', got {self.bias!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"epilogue activation must be one of {sorted(map(str, ACTIVATIONS))}, got {self.activation!r}"
            )
        bad = [k for k in self.operands if k not in OPERAND_KINDS]
        if bad:
            raise ValueError(f"epilogue operand kinds must be among {OPERAND_KINDS}, got {bad}")
        if self.operands and not self.code:
            raise ValueError("epilogue operands need code that reads them")

    @property
    def is_identity(self) -> bool:
        return self.bias == "none" and self.activation is None and not self.code

    @property
    def outputs(self) -> int:
        """How many values each element stores: C, then one per "out" operand."""
        return 1 + self.operands.count("out")

    def arg_dtypes(self) -> list:
        """Kernel argument dtypes after the fixed ones (None: a buffer)."""
        extra = [np.dtype(np.float32) if kind == "scalar" else None for kind in self.operands]
        return ([None] if self.bias != "none" else []) + extra

    def params(self) -> str:
        """The kernel parameters after the fixed ones."""
        out = ", __global const float* bias" if self.bias != "none" else ""
        for k, kind in enumerate(self.operands):
            if kind == "scalar":
                out += f", const float E{k}"
            elif kind == "out":
                out += f", __global float* restrict E{k}"
            else:
                out += f", __global const float* restrict E{k}"
        return out

    def store_lines(
        self,
        value: str,
        ct: str,
        store: str,
        out_store: Callable[[int, str], str] | None = None,
        at: str = "(IDX)r * ldc + c",
    ) -> list[str]:
        """Statements storing one element of C (``r``, ``c`` in range; ``zb`` its batch index).

        ``value``: the accumulator; ``store``: a statement writing the macro ``OUT`` to C;
        ``out_store(k, value)``: the statement storing an "out" operand k (default: into ``E{k}``);
        ``at``: the element's offset in its batch entry of C (an output view's expression), where
        "full" and "out" operands hold it too.
        """
        bias_term = {"none": "", "col": " + (CT)bias[c]", "row": " + (CT)bias[r]"}[self.bias]
        lines = [f"const {ct} v = {value}{bias_term};", f"#define OUT ({ACTIVATIONS[self.activation]})"]
        if not self.code:
            return [*lines, f"{store};", "#undef OUT"]
        at = {
            "full": f"[zb * csb + {at}]",
            "out": f"[zb * csb + {at}]",
            "col": "[c]",
            "row": "[(IDX)zb * M + r]",
            "scalar": "",
        }
        lines += ["{", "const float ep_value = (float)(OUT);", "#undef OUT"]
        lines += [f"const float ep{k} = E{k}{at[kind]};" for k, kind in enumerate(self.operands) if kind != "out"]
        lines += [line for line in self.code.splitlines() if line.strip()]
        lines += ["#define OUT ep_out0", f"{store};", "#undef OUT"]
        outs = [k for k, kind in enumerate(self.operands) if kind == "out"]
        if out_store is None:
            lines += [f"E{k}{at['out']} = ep_out{j + 1};" for j, k in enumerate(outs)]
        else:
            lines += [out_store(k, f"ep_out{j + 1}") for j, k in enumerate(outs)]
        return [*lines, "}"]


IDENTITY = Epilogue()
#: ``acc + addend[element]``: a product summed into a tensor of C's layout (BLAS's beta = 1; a
#: backward's gradient added to the sum so far), its one "full" operand the addend
PLUS_ADDEND = Epilogue(code="float ep_out0 = ep_value + ep0;", operands=("full",))


@dataclass(frozen=True)
class OperandView:
    """An operand whose element (``mn``, ``kk``) is the C expression ``element``, not ``p[mn * ld + kk]``.

    ``element`` may use ``p`` (the operand's pointer after the batch offset, of the storage type),
    ``mn`` (IDX: row of A / column of B) and ``kk`` (int: depth), and is only evaluated inside
    ``[0, M or N) x [kbeg, kend)``; ``helpers`` is C placed before the kernel (macros, inline
    functions; names should be prefixed to avoid the kernel's own macros). Hashable: part of the
    program key. An output view (C's index, from ``r`` and ``c``) carries in its helpers every macro its
    expression reads: a split product's sum includes only those (guard them where A's or B's repeat them).

    ``vector4`` (optional, float32 views): a ``float4`` expression of four consecutive elements
    along the operand's contiguous dimension starting at (``mn``, ``kk``): ``mn .. mn + 3`` for B
    and a transposed A, ``kk .. kk + 3`` for A and a transposed B. It is evaluated only where all
    four are inside the operand, and lets the view share its index math over the four. The
    tensor-core kernel, which stages 4-element chunks per thread, uses it; the portable kernel
    reads views element by element (each thread one column: a warp's loads stay contiguous; four
    columns per thread were slower: see benchmarks/RESULTS.md, "Measurements moved out of source
    docstrings", gemm_source.py). ``offsets4`` (optional, with ``vector4``): an ``int4`` expression
    of the same four elements' indices into ``p``, -1 for a zero: the tensor-core kernel's cp.async
    pipeline copies those elements without registers.
    """

    helpers: str
    element: str
    vector4: str = ""
    offsets4: str = ""


@dataclass(frozen=True)
class GemmConfig:
    """Tile parameters of the portable kernel (all compile-time)."""

    wgm: int = 16  #: threads along M
    wgn: int = 16  #: threads along N
    tm: int = 4  #: rows per thread
    tn: int = 4  #: columns per thread
    bk: int = 16  #: K depth of one step
    va: int = 1  #: vector width of A's global loads (along its contiguous dim)
    vb: int = 1  #: vector width of B's global loads
    lv: int = 1  #: vector width of local-memory reads (divides tm and tn)
    split: int = 1  #: split along K to ~2*split work-groups per compute unit when the output has fewer; 0: never
    group: int = 0  #: > 0: launch blocks in groups of this many block-rows (L2 reuse); 0: row-major
    maxreg: int = 0  #: > 0: NVIDIA register cap (-cl-nv-maxrregcount), for more resident work-groups
    ks: int = 1  #: K slices per work-group: ks sets of threads take turns along K, then add up in local memory

    @property
    def bm(self) -> int:
        return self.wgm * self.tm

    @property
    def bn(self) -> int:
        return self.wgn * self.tn

    @property
    def threads(self) -> int:
        """Threads of one K slice (they share its tile loads)."""
        return self.wgm * self.wgn

    @property
    def group_size(self) -> int:
        return self.threads * self.ks

    def local_bytes(self, itemsize: int) -> int:
        tiles = 2 * self.bk * (self.bm + self.bn) * itemsize * self.ks
        return tiles + (self.ks - 1) * self.bm * self.bn * itemsize  # slices 1.. hand their sums to slice 0

    def problems(self, trans_a: bool, trans_b: bool) -> list[str]:
        """Why this config cannot be built (empty when it can)."""
        out = []
        if self.tm % self.lv or self.tn % self.lv:
            out.append(f"lv={self.lv} must divide tm={self.tm} and tn={self.tn}")
        if self.ks < 1:
            out.append(f"ks={self.ks} must be >= 1")
        a_vec_dim = self.bm if trans_a else self.bk
        b_vec_dim = self.bk if trans_b else self.bn
        if a_vec_dim % self.va or b_vec_dim % self.vb:
            out.append("vector widths must divide the tile side they load along")
        if (self.bm * self.bk) % (self.va * self.threads) or (self.bk * self.bn) % (self.vb * self.threads):
            out.append("every thread must load the same number of vectors of each tile")
        return out

    def short(self) -> str:
        slices = f" ks{self.ks}" if self.ks > 1 else ""
        return (
            f"{self.bm}x{self.bn}x{self.bk} t{self.tm}x{self.tn} wg{self.wgm}x{self.wgn} v{self.va}{self.vb}{self.lv}"
            + slices
        )


def kernel_signature(sa: str, sb: str, sc: str, bias_arg: str) -> str:
    """The ``netcl_gemm`` signature and opening brace every GEMM kernel shares (portable and tensor-core):
    A, B, C of storage types ``sa``, ``sb``, ``sc``, then ``bias_arg`` (the epilogue's parameters)."""
    return (
        "void netcl_gemm(const int M, const int N, const int K,\n"
        f"                __global const {sa}* restrict A, const int lda,\n"
        f"                __global const {sb}* restrict B, const int ldb,\n"
        f"                __global {sc}* restrict C, const int ldc,\n"
        "                const int nb1, const int nb2,\n"
        "                const long sa0, const long sa1, const long sa2,\n"
        "                const long sb0, const long sb1, const long sb2,\n"
        f"                const long csb, const int splits, const int kchunk, const long css{bias_arg}) {{"
    )


_BLOCK_INDEXING = """    int gx = get_group_id(0), gy = get_group_id(1);
#if GROUP > 0
    {  /* grouped block order: GROUP block-rows advance together, so their A and B tiles share L2 */
        const int nx = get_num_groups(0), ny = get_num_groups(1);
        const int pid = gy * nx + gx, per = GROUP * nx, first = (pid / per) * GROUP;
        const int rows = min(ny - first, GROUP);
        gy = first + (pid % per) % rows;
        gx = (pid % per) / rows;
    }
#endif
    const IDX B0 = (IDX)gx * BN;
    const IDX A0 = (IDX)gy * BM;
    const int z = get_group_id(2);
    const int s = z % splits;
    int bz = z / splits;
    const int zb = bz;
    const int b2 = bz % nb2; bz /= nb2;
    const int b1 = bz % nb1;
    const int b0 = bz / nb1;
    A += b0 * sa0 + b1 * sa1 + b2 * sa2;
    B += b0 * sb0 + b1 * sb1 + b2 * sb2;
    __global SC* Cz = C + zb * csb + s * css;
    const int kbeg = s * kchunk;
    const int kend = min(K, kbeg + kchunk);"""


def block_indexing(sc: str) -> str:
    """The block indexing every GEMM kernel starts with (portable and tensor-core; needs ``GROUP``, ``IDX``,
    ``BM``, ``BN`` defined): the block's (``gx``, ``gy``) in grouped order, its first row ``A0`` and column
    ``B0``, the split ``s`` and batch ``(b0, b1, b2)`` of dimension 2 with A and B moved to the batch, ``Cz``
    (C of storage type ``sc`` at the batch and split) and the split's K range ``[kbeg, kend)``."""
    return _BLOCK_INDEXING.replace("SC*", f"{sc}*")


def _vec(ct: str, width: int) -> str:
    return ct if width == 1 else f"{ct}{width}"


def _load_lines(
    name: str,
    storage: str,
    ct: str,
    vec: int,
    along_k: bool,
    side: int,
    bk: int,
    threads: int,
    bound: str,
    view: OperandView | None = None,
) -> tuple[list[str], list[str], list[str]]:
    """Register declarations, global -> register loads and register -> local stores of one tile.

    ``along_k``: the operand's contiguous dimension is K (A not transposed, B transposed). The tile
    is ``side`` (BM or BN) x BK; register ``{name}r{j}`` holds this thread's vector j.
    """
    per = (side * bk) // (vec * threads)
    across = (bk // vec) if along_k else (side // vec)  # vectors along the contiguous dim
    vt = _vec(ct, vec)
    # the 16-bit storage formats load through storage_io (float16: vload_half; bfloat16: widened words)
    words = next((d for d in STORAGE_ONLY if C_TYPES[d] == storage), None)
    decls = [f"{vt} {name}r{j};" for j in range(per)]
    loads, stores = [], []
    for j in range(per):
        u, w = f"((tid + {j * threads}) % {across})", f"((tid + {j * threads}) / {across})"
        if (j * threads) % across == 0:  # the same u for every j: lets the compiler share index math
            u, w = f"(tid % {across})", f"(tid / {across} + {j * threads // across})"
        if view is not None:  # scalar loads through the view's address expression
            mn, kk = (f"{name}0 + {w}", f"k0 + {u}") if along_k else (f"{name}0 + {u}", f"k0 + {w}")
            loads.append(f"{{ const IDX mn = {mn}; const int kk = {kk}; __global const {storage}* p = {name};")
            loads.append(f"  {name}r{j} = (mn < {bound} && kk < kend) ? (CT)({view.element}) : (CT)0; }}")
        elif along_k:  # u: vector index along k, w: row of the tile (m or n)
            loads.append(f"{{ const IDX mn = {name}0 + {w}; const int kk = k0 + {u} * {vec};")
            loads.append(f"  __global const {storage}* p = {name} + mn * ld{name.lower()} + kk;")
            full, elem_ok = f"mn < {bound} && kk + {vec} <= kend", f"mn < {bound} && kk + {{v}} < kend"
        else:  # u: vector index along m/n, w: k within the tile
            loads.append(f"{{ const IDX mn = {name}0 + {u} * {vec}; const int kk = k0 + {w};")
            loads.append(f"  __global const {storage}* p = {name} + (IDX)kk * ld{name.lower()} + mn;")
            full, elem_ok = f"kk < kend && mn + {vec} <= {bound}", f"kk < kend && mn + {{v}} < {bound}"
        if view is not None:
            pass
        elif vec == 1:
            value = load_c(words, "p", "0") if words is not None else "(CT)p[0]"
            loads.append(f"  {name}r{j} = ({full}) ? {value} : (CT)0; }}")
        else:
            value = vload_c(words, vec, "p") if words is not None else f"*(__global const {_vec(storage, vec)}*)p"
            loads.append(f"  if ({full}) {{ {name}r{j} = {value}; }} else {{")
            for v in range(vec):
                ev = load_c(words, "p", str(v)) if words is not None else f"(CT)p[{v}]"
                loads.append(f"    {name}r{j}.s{v:x} = ({elem_ok.format(v=v)}) ? {ev} : (CT)0;")
            loads.append("  } }")
        if along_k:
            for v in range(vec):
                comp = f"{name}r{j}" if vec == 1 else f"{name}r{j}.s{v:x}"
                stores.append(f"{name}s[nb][{u} * {vec} + {v}][{w}] = {comp};")
        elif vec == 1:
            stores.append(f"{name}s[nb][{w}][{u}] = {name}r{j};")
        else:
            stores.append(f"*(__local {vt}*)&{name}s[nb][{w}][{u} * {vec}] = {name}r{j};")
    return decls, loads, stores


def portable_source(
    cfg: GemmConfig,
    trans_a: bool,
    trans_b: bool,
    a_dtype: np.dtype,
    b_dtype: np.dtype,
    c_dtype: np.dtype,
    idx: str = "int",
    epilogue: Epilogue = IDENTITY,
    views: tuple[OperandView | None, ...] = (None, None),
) -> str:
    """The kernel ``netcl_gemm`` for one config, layout, dtype combination, epilogue and operand views.

    ``views``: (A, B) or (A, B, C); C's view gives the flat output index of row ``r``, column ``c``
    (IDX) relative to the batch's output base, instead of ``r * ldc + c``.
    """
    from netcl.runtime.ops._common import storage_ctype, storage_pragmas

    ct = "double" if float64 in (a_dtype, b_dtype, c_dtype) else "float"
    sa, sb, sc = storage_ctype(a_dtype), storage_ctype(b_dtype), storage_ctype(c_dtype)
    view_a, view_b, view_c = (*views, None)[:3]
    for view, width, side in ((view_a, cfg.va, "A"), (view_b, cfg.vb, "B")):
        if view is not None and width != 1:
            raise ValueError(f"gemm: operand {side} is read through a view, its vector width must be 1, got {width}")
    a_decls, a_loads, a_stores = _load_lines("A", sa, ct, cfg.va, not trans_a, cfg.bm, cfg.bk, cfg.threads, "M", view_a)
    b_decls, b_loads, b_stores = _load_lines("B", sb, ct, cfg.vb, trans_b, cfg.bn, cfg.bk, cfg.threads, "N", view_b)
    helpers = "\n".join(v.helpers for v in views if v is not None)
    # a view read along K stores a column of the k-major tile per thread row: pad the rows by 4 so
    # those stores spread over the banks (16-way -> 2-way conflicts); 4 keeps the LV-wide reads aligned
    pad_a = 4 if view_a is not None and not trans_a else 0
    pad_b = 4 if view_b is not None and trans_b else 0
    lv = cfg.lv
    lvt = _vec(ct, lv)
    comps = [""] if lv == 1 else [f".s{v:x}" for v in range(lv)]
    reads_a = []
    for i in range(cfg.tm // lv):
        ref = f"As[cb][k][{i * cfg.wgm * lv} + ty * {lv}]"
        reads_a.append(f"{{ const {lvt} t = *(__local {lvt}*)&{ref};")
        reads_a += [f"  a[{i * lv + v}] = t{comps[v]};" for v in range(lv)]
        reads_a.append("}")
    reads_b = []
    for j in range(cfg.tn // lv):
        ref = f"Bs[cb][k][{j * cfg.wgn * lv} + tx * {lv}]"
        reads_b.append(f"{{ const {lvt} t = *(__local {lvt}*)&{ref};")
        reads_b += [f"  b[{j * lv + v}] = t{comps[v]};" for v in range(lv)]
        reads_b.append("}")
    bias_arg = epilogue.params()
    at = "(IDX)r * ldc + c" if view_c is None else f"({view_c.element})"
    store = store_c(c_dtype, "Cz", at, "OUT") if c_dtype in STORAGE_ONLY else f"Cz[{at}] = ({sc})(OUT)"
    nl = "\n    "
    nl2 = "\n        "
    if lv > 1 and view_c is None and c_dtype == float32 and ct == "float":
        store_section = _vector_store_section(epilogue, lv)
    else:
        store_section = _scalar_store_section(epilogue, store, at)
    parts = _slices(cfg, pad_a, pad_b, store_section)
    tile_decls, slice_decls, store_section = parts["tile_decls"], parts["slice_decls"], parts["store_section"]
    k_start, k_loop, k_step, k_more = parts["k_start"], parts["k_loop"], parts["k_step"], parts["k_more"]
    return f"""{storage_pragmas([a_dtype, b_dtype, c_dtype])}
{epilogue.preamble}
#define CT {ct}
#define IDX {idx}
#define WGM {cfg.wgm}
#define WGN {cfg.wgn}
#define TM {cfg.tm}
#define TN {cfg.tn}
#define BK {cfg.bk}
#define BM (WGM * TM)
#define BN (WGN * TN)
#define LV {lv}
#define GROUP {cfg.group}
#define KS {cfg.ks}
/* the tiles' LV-wide reads become one vector load (ld.shared.v4) only where the arrays' alignment is
   known: NVIDIA's compiler split each into four scalar loads at the default alignment of 4 */
#define ALIGNED __attribute__((aligned(32)))
{helpers}
__kernel __attribute__((reqd_work_group_size(WGN, WGM, KS)))
{kernel_signature(sa, sb, sc, bias_arg)}
    {tile_decls}
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int tid = ty * WGN + tx;{slice_decls}
{block_indexing(sc)}
    CT acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i) {{
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = (CT)0;
    }}
    {k_start}
    int nb = 0;
    {nl.join(a_decls + b_decls)}
    {nl.join(a_loads)}
    {nl.join(b_loads)}
    {nl.join(a_stores)}
    {nl.join(b_stores)}
    barrier(CLK_LOCAL_MEM_FENCE);
    {k_loop}
        const int cb = nb;
        k0 += {k_step};
        nb ^= 1;
        const int more = {k_more};
        if (more) {{
        {nl2.join(a_loads)}
        {nl2.join(b_loads)}
        }}
        #pragma unroll
        for (int k = 0; k < BK; ++k) {{
            CT a[TM], b[TN];
            {nl2.join(reads_a)}
            {nl2.join(reads_b)}
            #pragma unroll
            for (int i = 0; i < TM; ++i) {{
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
            }}
        }}
        if (more) {{
        {nl2.join(a_stores)}
        {nl2.join(b_stores)}
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    {store_section}
}}
"""


def _slices(cfg: GemmConfig, pad_a: int, pad_b: int, store_section: str) -> dict[str, str]:
    """The parts of ``netcl_gemm`` that K slices change (``cfg.ks``; one slice: the plain kernel).

    Slice ``ksl`` (``get_local_id(2)``) takes K steps ksl, ksl + KS, ... of the work-group's range with
    its own tiles in local memory; every slice runs the same number of steps (past the range its
    loads are zeros), so the barriers stay uniform. Then slices 1 .. KS-1 leave their accumulators
    in local memory and slice 0 adds them in slice order (a fixed order: the result does not depend
    on timing) and stores. A small output with a long K gets KS times the threads per block without
    a split's second kernel: the MLP layers' 128 x 512 products at K = 512-784.
    """
    if cfg.ks == 1:
        return {
            "tile_decls": (
                f"__local CT As[2][BK][BM + {pad_a}] ALIGNED;\n    __local CT Bs[2][BK][BN + {pad_b}] ALIGNED;"
            ),
            "slice_decls": "",
            "k_start": "int k0 = kbeg;",
            "k_loop": "for (; k0 < kend;) {",
            "k_step": "BK",
            "k_more": "k0 < kend",
            "store_section": store_section,
        }
    hand_over = """if (ksl > 0) {
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
            #pragma unroll
            for (int j = 0; j < TN; ++j) Red[ksl - 1][i * TN + j][tid] = acc[i][j];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (ksl == 0) {
    for (int q = 0; q < KS - 1; ++q) {
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
            #pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] += Red[q][i * TN + j][tid];
        }
    }
    """
    return {
        "tile_decls": (
            f"__local CT As_sl[KS][2][BK][BM + {pad_a}] ALIGNED;\n"
            f"    __local CT Bs_sl[KS][2][BK][BN + {pad_b}] ALIGNED;\n"
            "    __local CT Red[KS - 1][TM * TN][WGM * WGN];"
        ),
        "slice_decls": "\n    const int ksl = get_local_id(2);\n#define As As_sl[ksl]\n#define Bs Bs_sl[ksl]",
        "k_start": "int k0 = kbeg + ksl * BK;\n    const int trips = ((kend - kbeg + BK - 1) / BK + KS - 1) / KS;",
        "k_loop": "for (int t = 0; t < trips; ++t) {",
        "k_step": "KS * BK",
        "k_more": "t + 1 < trips",
        "store_section": hand_over + store_section + "\n    }",
    }


def _scalar_store_section(epilogue: Epilogue, store: str, at: str) -> str:
    """Each thread stores its TM x TN accumulators one element at a time (``at``: C's offset)."""
    body = "\n                ".join(epilogue.store_lines("acc[i][j]", "CT", store, at=at))
    return f"""#pragma unroll
    for (int i = 0; i < TM; ++i) {{
        const IDX r = A0 + (i / LV) * (WGM * LV) + ty * LV + i % LV;
        #pragma unroll
        for (int j = 0; j < TN; ++j) {{
            const IDX c = B0 + (j / LV) * (WGN * LV) + tx * LV + j % LV;
            if (r < M && c < N) {{
                {body}
            }}
        }}
    }}"""


def _vector_store_section(epilogue: Epilogue, lv: int) -> str:
    """Each thread's LV adjacent columns of a row go out as one ``floatLV`` store per output.

    The scalar stores left a warp's store instruction touching every LV-th word of its span (a
    quarter of each sector at LV = 4), which made the stores, not the arithmetic, the limit of
    products with a small K (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings",
    gemm_source.py). The epilogue's values are first computed into registers, column by column (only
    for columns inside C: its operands are read there), then stored as vectors where all LV columns
    are inside C and the addresses are aligned, element by element otherwise (the right edge, odd
    leading dimensions, offset views).
    """
    outs = [k for k, kind in enumerate(epilogue.operands) if kind == "out"]
    vec = f"float{lv}"
    lanes = ", ".join(f"o{{n}}[{v}]" for v in range(lv))

    def out_store(k: int, value: str) -> str:
        return f"o{outs.index(k) + 1}[jj] = {value};"

    compute = "\n                    ".join(epilogue.store_lines("acc[i][j]", "CT", "o0[jj] = (float)(OUT)", out_store))
    targets = ["Cz"] + [f"(E{k} + zb * csb)" for k in outs]
    decls = " ".join(f"float o{n}[LV];" for n in range(len(targets)))
    aligned = " && ".join(f"((ulong)({t} + c_at) % {4 * lv} == 0)" for t in targets)
    vector_stores = " ".join(
        f"*(__global {vec}*)({t} + c_at) = ({vec})({lanes.format(n=n)});" for n, t in enumerate(targets)
    )
    scalar_stores = " ".join(f"{t}[c_at + jj] = o{n}[jj];" for n, t in enumerate(targets))
    return f"""#pragma unroll
    for (int i = 0; i < TM; ++i) {{
        const IDX r = A0 + (i / LV) * (WGM * LV) + ty * LV + i % LV;
        if (r >= M) continue;
        #pragma unroll
        for (int jg = 0; jg < TN / LV; ++jg) {{
            const IDX c0 = B0 + jg * (WGN * LV) + tx * LV;
            const IDX c_at = (IDX)r * ldc + c0;
            {decls}
            #pragma unroll
            for (int jj = 0; jj < LV; ++jj) {{
                const int j = jg * LV + jj;
                const IDX c = c0 + jj;
                if (c < N) {{
                    {compute}
                }}
            }}
            if (c0 + LV <= N && {aligned}) {{
                {vector_stores}
            }} else {{
                #pragma unroll
                for (int jj = 0; jj < LV; ++jj) {{
                    if (c0 + jj < N) {{ {scalar_stores} }}
                }}
            }}
        }}
    }}"""
