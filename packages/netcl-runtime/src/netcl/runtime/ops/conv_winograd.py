"""3x3 stride-1 convolution by Winograd's minimal filtering F(m x m, 3 x 3), m = 2 or 4 (Lavin & Gray, 2015).

Each m x m block of outputs comes from an a x a input patch (a = m + 2) with a^2 multiplications
per channel pair instead of 9 m^2 (16 for 36 at m = 2, 36 for 144 at m = 4): the patch d and the
filter g move into the transform domain, V = B^T d B and U = G g G^T, where the convolution is an
elementwise product summed over the input channels, and ``A^T M A`` brings each sum M back to the
outputs. Over a layer the sum is a^2 independent matrix products, ``M[e] = U[e] (R, S) @ V[e]
(S, P)`` for the transform positions e, R output channels, S input channels and P = N * tiles: the
runtime's batched GEMM computes them (2.25x / 4x fewer multiply-adds than the implicit GEMM), small
memory-bound kernels the transforms, generated as straight-line code from the (B^T, G, A^T) matrices.

The input gradient is the same computation: for stride 1 it is the correlation of the upstream
gradient with the weights flipped and transposed, ``w'[c, o] = w[o, c, ::-1, ::-1]``, at padding
``2 - P`` (so ``P <= 2``), which the weight transform reads in place (``FLIP``). The weight
gradient is the forward's adjoint: dU[e] = dM[e] @ V[e]^T with dM = A dY A^T, then dw = G^T dU G.

Rounding: F(2x2)'s transforms add up to four values, the 0.5 factors of G are exact, and the
products sum over S channels on transformed values at most 9x a direct term's magnitude, a shorter
sum than the implicit GEMM's (its error against that one's: see benchmarks/RESULTS.md, "Measurements
moved out of source docstrings", conv_winograd.py). F(4x4)'s coefficients (up to 8 in A,
5 in B) grow the intermediates: several times the direct error, which is why 2 is the default.
All sizes are kernel arguments; the programs depend only on the tile, the index type and FLIP /
BIAS / ADDEND, so every layer shape shares them. The NumPy backend runs the same algorithm in
its twin, ``netcl.runtime.numpy_twins.conv_winograd``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from netcl.core import Device, Tensor
from netcl.core.dtypes import float32
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops import magic_div, moments
from netcl.runtime.ops._common import MAX_LOCAL, get_kernel, pow2_ceil, round_up
from netcl.runtime.ops._grid import index_ctype, index_dtype, params
from netcl.runtime.ops._rows import tree_loop_c
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.call_plans import PlanCache
from netcl.runtime.ops.conv_winograd_tiling import MATRICES, TileGrid
from netcl.runtime.ops.linalg import matmul

_TWINS = "netcl.runtime.numpy_twins.conv_winograd"

#: ``NETCL_WINOGRAD``: "2" F(2x2, 3x3), "4" F(4x4, 3x3), "0" off (every 3x3 convolution runs as an
#: implicit GEMM), for the layers ``conv.conv2d`` picks on its own; unset, ``default_tile`` decides.
ENV_VAR = "NETCL_WINOGRAD"
#: Fewest input and output channels for which ``conv.conv2d`` picks Winograd on its own: below them
#: the 16 products are too thin to win back the transforms' memory traffic.
MIN_CHANNELS = 16


@dataclass(frozen=True, eq=False)
class InputTransform:
    """A forward's input transform ``v`` (a2, C, P) of ``source`` padded by ``pads`` at F(``tile`` x ``tile``)
    (``forward(..., keep=)``): the weight gradient of the same tensor at the same tile and padding reads it
    instead of transforming x again (``backward_weight(..., kept=)``), the same bits, one launch and a read of x
    fewer, for the memory of ``v`` (2.25x x at F(4x4), 4x at F(2x2)) held from the forward to the backward."""

    tile: int
    pads: tuple[int, int]
    source: Tensor
    v: Tensor


def _sum(terms: list[tuple[Fraction | int, str]]) -> str:
    """A C expression for sum(coefficient * value), zero coefficients left out."""
    out = ""
    for coef, value in terms:
        if coef == 0:
            continue
        sign = "-" if coef < 0 else "+"
        factor = "" if abs(coef) == 1 else f"{float(abs(coef))!r}f * "
        out += f" {sign} {factor}{value}" if out else f"{'-' if coef < 0 else ''}{factor}{value}"
    return out or "0.0f"


def _sandwich_rows(left: list, values: list[list[str]], right: list) -> tuple[list[str], list[list[str]]]:
    """``left @ values @ right^T`` in straight-line code: the statements computing ``left`` times the value grid
    into temporaries ``t<i>_<j>``, and the result's rows of C expressions over them."""
    lines = []
    for i, row in enumerate(left):
        for j in range(len(values[0])):
            lines.append(f"const float t{i}_{j} = {_sum([(row[k], values[k][j]) for k in range(len(values))])};")
    rows = [[_sum([(row[k], f"t{i}_{k}") for k in range(len(row))]) for row in right] for i in range(len(left))]
    return lines, rows


def _sandwich(left: list, values: list[list[str]], right: list, store) -> list[str]:
    """``_sandwich_rows``' statements, then each result element handed to ``store(i, j, expr)``."""
    lines, rows = _sandwich_rows(left, values, right)
    return lines + [store(i, j, e) for i, row in enumerate(rows) for j, e in enumerate(row)]


def _transposed(matrix: list) -> list:
    return [list(row) for row in zip(*matrix, strict=True)]


def _kernel(
    name: str, buffers: str, idx: str, head: list[str], body: list[str], magic: bool = False, function: bool = False
) -> str:
    """``netcl_wino_<name>`` over (column p or s, row r or c): ``head`` then ``body`` statements; ``magic``:
    the ``magic_div`` pairs of ``_DIVISORS`` follow the sizes (and ``NETCL_DIV`` is defined). ``function``: the
    device function ``netcl_wino_<name>_at`` instead, its column and row the last two arguments g0, g1 (for a
    kernel that runs two transforms, ``_input_weight_source``)."""
    nl = "\n    "
    extra = f", {magic_div.params(_DIVISORS)}" if magic else ""
    define = magic_div.macro(idx) if magic else ""
    signature = f"__kernel void netcl_wino_{name}("
    if function:
        head = [line.replace("get_global_id(0)", "g0").replace("get_global_id(1)", "g1") for line in head]
        signature, extra = f"void netcl_wino_{name}_at(", f"{extra}, const {idx} g0, const {idx} g1"
    return f"""{define}
{signature}{buffers}, {params(idx, _SIZES[name])}{extra}) {{
    {nl.join(head)}
    {nl.join(body)}
}}
"""


def _tile_head(
    idx: str, channel: str, channels: str, m: int, padded: bool, magic: bool = False, leaves: bool = True
) -> list[str]:
    """The first statements of a kernel over (tile column p, ``channel`` row): p = (n, th, tw), the
    first row and column ``h0``, ``w0`` of its block (of its input patch when ``padded``), and the
    stride ``plane`` between two transform positions of a (positions, ``channels``, P) tensor;
    ``magic``: p split by ``NETCL_DIV`` (CPU devices: a vector has no integer division); ``leaves``: a
    work-item past the tiles (p >= P) returns (else the kernel guards its body itself)."""
    shift = (" - PH", " - PW") if padded else ("", "")
    split = (
        f"const {idx} rows = NETCL_DIV(p, TW), n = NETCL_DIV(rows, TH), tw = p - rows * TW, th = rows - n * TH;"
        if magic
        else f"const {idx} tw = p % TW, th = (p / TW) % TH, n = p / (TW * TH);"
    )
    return [
        f"const {idx} p = get_global_id(0), {channel} = get_global_id(1), plane = {channels} * P;",
        *(["if (p >= P) return;"] if leaves else []),
        split,
        f"const {idx} h0 = {m} * th{shift[0]}, w0 = {m} * tw{shift[1]};",
    ]


def _block_loads(
    name: str, size: int, m: int, rows: str, cols: str, padded: bool, by_rows: bool
) -> tuple[list[str], list[list[str]]]:
    """Statements loading the ``size`` x ``size`` block at (h0, w0) of the ``rows`` x ``cols`` plane
    ``src`` into registers ``<name><i>_<j>`` (zero outside it), and the grid of their names; ``by_rows``: as
    ``_block_loads_by_rows`` loads them (the same values)."""
    grid = [[f"{name}{i}_{j}" for j in range(size)] for i in range(size)]
    if by_rows:
        return _block_loads_by_rows(name, size, m, rows, cols, padded), grid
    lines = []
    for i in range(size):
        for j in range(size):
            inside = f"h0 + {i} < {rows} && w0 + {j} < {cols}"
            if padded:
                inside = f"h0 + {i} >= 0 && w0 + {j} >= 0 && " + inside
            lines.append(f"const float {name}{i}_{j} = ({inside}) ? src[(h0 + {i}) * {cols} + w0 + {j}] : 0.0f;")
    return lines, grid


def _block_loads_by_rows(name: str, size: int, m: int, rows: str, cols: str, padded: bool) -> list[str]:
    """The loads of ``_block_loads`` where each row's columns m * tw .. m * tw + m - 1 lie inside the plane and
    start aligned to an m-wide vector (``_row_flags``): those m columns as one vector load, a padded block's first
    and last column (w0 = m * tw - 1) as scalars."""
    lead = 1 if padded else 0
    lines = []
    for i in range(size):
        row = f"h0 + {i} >= 0 && h0 + {i} < {rows}" if padded else f"h0 + {i} < {rows}"
        at = f"(h0 + {i}) * {cols} + w0"
        lines.append(f"const int row{i} = {row};")
        lines.append(
            f"const float{m} {name}{i}v = row{i} ? *(__global const float{m}*)(src + {at} + {lead}) : (float{m})(0.0f);"
        )
        lines += [f"const float {name}{i}_{j + lead} = {name}{i}v.s{j};" for j in range(m)]
        if padded:
            lines.append(f"const float {name}{i}_0 = (row{i} && w0 >= 0) ? src[{at}] : 0.0f;")
            edge = size - 1
            last = f"(row{i} && w0 + {edge} < {cols}) ? src[{at} + {edge}] : 0.0f"
            lines.append(f"const float {name}{i}_{edge} = {last};")
    return lines


def _to_planes(a: int):
    """A ``_sandwich`` store writing result (i, j) to transform position i * a + j of ``out``."""
    return lambda i, j, e: f"out[{i * a + j} * plane] = {e};"


def _from_planes(a: int) -> list[list[str]]:
    """The a x a grid of ``src``'s transform positions (``_to_planes``' reverse), for a ``_sandwich``."""
    return [[f"src[{i * a + j} * plane]" for j in range(a)] for i in range(a)]


def _weight_source(m: int, idx: str, flags: dict[str, int]) -> str:
    """U[e, r, s] = (G g G^T)[e] for the R x S filters g (flipped and transposed under FLIP)."""
    _, g, _ = MATRICES[m]
    a = m + 2
    if flags["FLIP"]:  # input gradient: w (S, R, 3, 3) read as w'[r, s, i, j] = w[s, r, 2 - i, 2 - j]
        base, taps = "(s * R + r) * 9", [[f"p[{(2 - i) * 3 + 2 - j}]" for j in range(3)] for i in range(3)]
    else:  # forward: w (R, S, 3, 3)
        base, taps = "(r * S + s) * 9", [[f"p[{i * 3 + j}]" for j in range(3)] for i in range(3)]
    head = [
        f"const {idx} s = get_global_id(0), r = get_global_id(1), plane = R * S;",
        "if (s >= S) return;",
        f"__global const float* p = w + {base};",
        "__global float* out = u + r * S + s;",
    ]
    body = _sandwich(g, taps, g, _to_planes(a))
    buffers = "__global const float* w, __global float* u"
    return _kernel("weight", buffers, idx, head, body, function=bool(flags.get("FUNCTION")))


def _block_source(
    name: str, left: list, size: int, m: int, idx: str, channel: tuple[str, str], plane: tuple[str, str], padded: bool,
    magic: bool = False, rows_as_vectors: bool = False, function: bool = False,
) -> str:  # fmt: skip
    """A kernel over (tile column p, ``channel`` row) storing ``left @ D @ left^T`` of each tile's
    ``size`` x ``size`` block D of its ``plane`` (rows, columns) image, zero outside it, at the
    transform positions of a (positions, channels, P) tensor. Buffers: the images, then the output.
    ``rows_as_vectors``: the block's rows loaded by ``_block_loads_by_rows`` (the same values); ``function``: as a
    device function (``_kernel``)."""
    (c, channels), (rows, cols) = channel, plane
    src, dst = {"input": ("x", "v"), "grad_output": ("dy", "dm")}[name]
    loads, grid = _block_loads("d", size, m, rows, cols, padded, rows_as_vectors)
    head = [
        *_tile_head(idx, c, channels, m, padded, magic),
        f"__global const float* src = {src} + (n * {channels} + {c}) * {rows} * {cols};",
        f"__global float* out = {dst} + {c} * P + p;",
        *loads,
    ]
    body = _sandwich(left, grid, left, _to_planes(len(left)))
    buffers = f"__global const float* {src}, __global float* {dst}"
    return _kernel(name, buffers, idx, head, body, magic, function)


def _input_source(m: int, idx: str, flags: dict[str, int]) -> str:
    """V[e, c, p] = (B^T d B)[e] for the (m + 2)^2 patch d of tile p in channel c (zero outside); under
    ``FUNCTION`` the device function of ``_kernel(function=True)``."""
    magic, by_rows = bool(flags.get("MAGIC")), bool(flags.get("ROWS"))
    args = ("input", MATRICES[m][0], m + 2, m, idx, ("c", "S"), ("H", "W"), True, magic, by_rows)
    return _block_source(*args, function=bool(flags.get("FUNCTION")))


def _input_weight_source(m: int, idx: str, flags: dict[str, int]) -> str:
    """The input transform (``ROWS`` as ``_input_source`` takes it) and the weight transform (``FLIP`` as
    ``_weight_source``) as one kernel over (columns, rows): columns below ``COLS`` are the input transform's
    (tile p, channel c < S), the others the weight transform's (filter column s = column - COLS, row r < R). The
    same statements as the two kernels, so the same values."""
    if flags.get("MAGIC"):
        raise ValueError("conv_winograd: the joint input and weight transform splits its columns by division")
    inputs = _input_source(m, idx, {"ROWS": flags.get("ROWS", 0), "FUNCTION": 1})
    weights = _weight_source(m, idx, {"FLIP": flags["FLIP"], "FUNCTION": 1})
    sizes = ", ".join(_SIZES["input"])
    return f"""{inputs}
{weights}
__kernel void netcl_wino_input_weight(__global const float* x, __global float* v, __global const float* w,
                                      __global float* u, {params(idx, [*_SIZES["input"], "R", "COLS"])}) {{
    const {idx} g0 = get_global_id(0), g1 = get_global_id(1);
    if (g0 < COLS) {{
        if (g1 < S) netcl_wino_input_at(x, v, {sizes}, g0, g1);
    }} else if (g1 < R) {{
        netcl_wino_weight_at(w, u, R, S, g0 - COLS, g1);
    }}
}}
"""


def _output_source(m: int, idx: str, flags: dict[str, int]) -> str:
    """y's m x m block of tile p in channel r: (A^T M A) of M[:, r, p], plus the bias or the addend. ``MOMENTS``:
    each work-group also writes its channel's moments over the group's blocks (``moments``) to ``mo``."""
    _, _, at = MATRICES[m]
    a = m + 2
    magic, gathers = bool(flags.get("MAGIC")), bool(flags.get("MOMENTS"))
    head = [*_tile_head(idx, "r", "R", m, False, magic, not gathers), "__global const float* src = m + r * P + p;"]
    extra = " + extra[r]" if flags["BIAS"] else ""
    first = "extra[at] + " if flags["ADDEND"] else ""

    def store(i: int, j: int, e: str) -> str:
        at_ = f"((n * R + r) * OH + h0 + {i}) * OW + w0 + {j}"
        shift = "mo_k = o; " if (i, j) == (0, 0) else ""  # a tile's first output is always inside the plane
        value = (
            f"const float o = {first}({e}){extra}; y[at] = o; {shift}MOMENT(o);"
            if gathers
            else f"y[at] = {first}({e}){extra};"
        )
        return f"if (h0 + {i} < OH && w0 + {j} < OW) {{ const {idx} at = {at_}; {value} }}"

    if flags.get("ROWS"):  # each row's m outputs inside the plane, aligned to the vector: one store (same values)
        lines, rows = _sandwich_rows(at, _from_planes(a), at)
        body = lines + [_row_store(i, row, m, idx, extra, bool(flags["ADDEND"]), gathers) for i, row in enumerate(rows)]
    else:
        body = _sandwich(at, _from_planes(a), at, store)
    buffers = "__global const float* m, __global float* y, __global const float* extra"
    if not gathers:
        return _kernel("output", buffers, idx, head, body, magic)
    # every lane reaches the tree: a lane past the tiles (p >= P) computes nothing and holds no moments
    head.append("float mo_n = 0.0f, mo_k = 0.0f, mo_s = 0.0f, mo_q = 0.0f;")
    body = ["if (p < P) {", *body, "}", *_GROUP_MOMENTS]
    kernel = _kernel("output", buffers + ", __global float* mo", idx, head, body, magic)
    return moments.MERGE_C + _MOMENT_MACRO + kernel


#: ``_output_source``'s lane moments: each stored value o summed shifted by the lane's first one, ``mo_k`` (set
#: by the store of output (0, 0), which every lane with a tile makes first).
_MOMENT_MACRO = """#define MOMENT(o) { const float mo_d = (o) - mo_k; mo_s += mo_d; mo_q += mo_d * mo_d; mo_n += 1.0f; }
"""
#: Then the work-group's: each lane's (count, mean, M2) merged by the tree, lane 0 storing them as group
#: ``get_group_id(0)`` of channel r in ``mo`` (R, groups, 3).
_GROUP_MOMENTS = [
    f"__local float s0[{MAX_LOCAL}], s1[{MAX_LOCAL}], s2[{MAX_LOCAL}];",  # _launch's groups: at most MAX_LOCAL
    "const int lid = get_local_id(0);",
    "s0[lid] = mo_n;",
    "s1[lid] = mo_n > 0.0f ? mo_k + mo_s / mo_n : 0.0f;",
    "s2[lid] = mo_n > 0.0f ? max(mo_q - mo_s * mo_s / mo_n, 0.0f) : 0.0f;",
    *tree_loop_c(moments.TREE_COMBINE).strip("\n").split("\n"),
    "if (lid == 0) {",
    "    __global float* at = mo + (r * get_num_groups(0) + get_group_id(0)) * 3;",
    "    at[0] = s0[0]; at[1] = s1[0]; at[2] = s2[0];",
    "}",
]


def _row_store(i: int, row: list[str], m: int, idx: str, bias: str, addend: bool, gathers: bool = False) -> str:
    """``_output_source``'s store of output row i as one vector: each element ``(e) + bias``, or under ``addend``
    the addend's element + (e), as the per-element stores compute them; ``gathers``: each element's ``MOMENT``."""
    at = f"((n * R + r) * OH + h0 + {i}) * OW + w0"
    if addend:
        load = f"const float{m} add = *(__global const float{m}*)(extra + at); "
        values = ", ".join(f"add.s{j} + ({e})" for j, e in enumerate(row))
    else:
        load, values = "", ", ".join(f"({e}){bias}" for e in row)
    store = f"*(__global float{m}*)(y + at) = (float{m})({values});"
    if gathers:
        moment = (" mo_k = o.s0;" if i == 0 else "") + "".join(f" MOMENT(o.s{j});" for j in range(m))
        store = f"const float{m} o = (float{m})({values}); *(__global float{m}*)(y + at) = o;{moment}"
    return f"if (h0 + {i} < OH) {{ const {idx} at = {at}; {load}{store} }}"


def _grad_output_source(m: int, idx: str, flags: dict[str, int]) -> str:
    """dM[e, r, p] = (A dY A^T)[e] for the m x m block dY of the upstream gradient at tile p (the
    adjoint of the output transform; zero past the output's edges)."""
    left, magic, by_rows = _transposed(MATRICES[m][2]), bool(flags.get("MAGIC")), bool(flags.get("ROWS"))
    return _block_source("grad_output", left, m, m, idx, ("r", "R"), ("OH", "OW"), False, magic, by_rows)


def _weight_grad_source(m: int, idx: str, flags: dict[str, int]) -> str:
    """dw[r, s] = G^T dU[:, r, s] G (the adjoint of the weight transform), plus the addend."""
    _, g, _ = MATRICES[m]
    a, left = m + 2, _transposed(g)
    head = [
        f"const {idx} s = get_global_id(0), r = get_global_id(1), plane = R * S;",
        "if (s >= S) return;",
        "__global const float* src = du + r * S + s;",
        f"const {idx} base = (r * S + s) * 9;",
    ]
    first = "extra[base + {0}] + " if flags["ADDEND"] else ""
    body = _sandwich(
        left, _from_planes(a), left, lambda i, j, e: f"dw[base + {i * 3 + j}] = {first.format(i * 3 + j)}({e});"
    )
    buffers = "__global const float* du, __global float* dw, __global const float* extra"
    return _kernel("weight_grad", buffers, idx, head, body)


_SOURCES = {
    "weight": _weight_source,
    "input": _input_source,
    "input_weight": _input_weight_source,
    "output": _output_source,
    "grad_output": _grad_output_source,
    "weight_grad": _weight_grad_source,
}
#: The sizes the tile kernels divide by (their ``magic_div`` pairs are arguments on CPU devices).
_DIVISORS = ("TW", "TH")
_SIZES = {
    "weight": ["R", "S"],
    "input": ["S", "H", "W", "PH", "PW", "TH", "TW", "P"],
    "output": ["R", "OH", "OW", "TH", "TW", "P"],
    "grad_output": ["R", "OH", "OW", "TH", "TW", "P"],
    "weight_grad": ["R", "S"],
}


def default_tile(three_tf32: bool = False) -> int:
    """The tile ``NETCL_WINOGRAD`` asks for (2, 4, or 0: off); unset, 4 where the products run as
    tf32x3 on tensor cores (``three_tf32``), else 2.

    F(4x4)'s transforms carry larger coefficients, so its rounding error is several times F(2x2)'s. With FMA
    products that puts it above the implicit GEMM's, so "highest" keeps F(2x2). With tf32x3 products it is at the
    fp32 FMA implicit GEMM's level and faster than F(2x2): the precision that asks for fp32-class accuracy at
    tensor-core speed gets it (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings",
    conv_winograd.py).
    """
    value = os.environ.get(ENV_VAR, "").strip()
    if value not in ("", "0", "2", "4"):
        raise ValueError(f"{ENV_VAR} must be 0 (off), 2 (F(2x2, 3x3)) or 4 (F(4x4, 3x3)), got {value!r}")
    if not value:
        return 4 if three_tf32 else 2
    return int(value)


def applies(a: Tensor, b: Tensor, groups: int, geo) -> bool:
    """Whether a pass with operands ``a`` and ``b`` (x and w, or the upstream gradient and w or x)
    can run here: float32, groups 1, a 3x3 window at stride 1 and dilation 1, padding <= 2 (the input
    gradient's padding is 2 - P); on an OpenCL device or the NumPy backend (its twin, ``numpy_twins.conv_winograd``)."""
    return (
        a.device.kind in ("opencl", "cpu")
        and a.dtype == float32
        and b.dtype == float32
        and int(groups) == 1
        and (geo.KH, geo.KW, geo.SH, geo.SW, geo.DH, geo.DW) == (3, 3, 1, 1, 1, 1)
        and geo.PH <= 2
        and geo.PW <= 2
        and a.size > 0
        and b.size > 0
    )


_PASSES = PlanCache("conv2d-winograd")


def split_by_magic(device: Device) -> bool:
    """Whether the tile kernels split their column index by ``magic_div`` (CPU devices) rather than ``/``."""
    return not device.is_gpu


def rows_by_vectors(device: Device) -> bool:
    """Whether the tile kernels move a tile's rows as vectors where the layer allows it (``_row_flags``): on GPUs
    (fewer, wider memory transactions); a CPU compiler vectorizes across work-items instead, which vector
    values inside a work-item stop."""
    return device.is_gpu


def fuses_weight_transform(device: Device) -> bool:
    """Whether a forward or input-gradient pass runs its input and weight transforms as one launch
    (``_input_weight_source``): on GPUs, where the weight transform's own launch has few work-groups at a
    ResNet's channel counts and runs alone (see benchmarks/RESULTS.md, "Thirty-sixth session"); CPU devices keep
    two launches (their tile kernels split columns by ``magic_div``, which the joint kernel does not)."""
    return device.is_gpu


def gathers_moments(device: Device) -> bool:
    """Whether ``conv.conv2d`` has the output transform gather its output's moments when asked (``gather=``): on
    GPUs, where the store's tree costs less than the batch norm's pass it saves; on a CPU device (PoCL) the
    tree's barriers more than double the output transform's time, more than that pass (see
    benchmarks/RESULTS.md, "Thirty-eighth session"). ``forward(..., gather=)`` itself gathers on any device."""
    return device.is_gpu


def _row_flags(device: Device, m: int, cols: int, tiles_across: int, pad: int | None = None) -> dict[str, int]:
    """``{"ROWS": 1}`` when a tile kernel reading or writing a plane ``cols`` wide may move each block row's m
    columns m * tw .. m * tw + m - 1 as one vector: every such column inside the plane (``tiles_across`` * m <=
    cols), rows starting aligned to the vector (cols % m == 0; a buffer's start is), and the block starting at
    column m * tw (an output block: ``pad`` None) or at m * tw - 1 (an input block at padding ``pad`` = 1); else
    no flag."""
    ok = rows_by_vectors(device) and cols % m == 0 and tiles_across * m <= cols and pad in (None, 1)
    return {"ROWS": 1} if ok else {}


def _prepared(
    device: Device, part: str, m: int, grid: tuple[int, int], buffers: int, sizes: list[int], flags: dict[str, int],
    idx: str,
) -> Callable[..., None]:  # fmt: skip
    """The launch of transform ``part`` (built once per tile, index type and flags) on (columns, rows) =
    ``grid`` with its ``sizes`` bound: a call takes the ``buffers`` raw buffers. Work-groups are one row of
    up to 256 columns (``_grid.run_rows``' grid)."""
    return _launch(device, part, m, grid, buffers, sizes, flags, idx).call


def _launch(
    device: Device, part: str, m: int, grid: tuple[int, int], buffers: int, sizes: list[int], flags: dict[str, int],
    idx: str,
) -> PreparedLaunch:  # fmt: skip
    """``_prepared``'s launch itself (its work-groups a power of two of columns, at most ``MAX_LOCAL``)."""
    names = _SIZES[part]
    types = [None] * buffers + [index_dtype(idx)] * len(names)
    if "TW" in names and split_by_magic(device):  # a tile kernel on a CPU device: p split by magic_div
        flags = {**flags, "MAGIC": 1}
        values = dict(zip(names, sizes, strict=True))
        sizes = [*sizes, *magic_div.values([values[d] for d in _DIVISORS])]
        types += magic_div.arg_types(_DIVISORS)
    key = ("layers", "winograd", part, m, idx, tuple(sorted(flags.items())))
    resolved = get_kernel(key, device, lambda: _SOURCES[part](m, idx, flags), f"netcl_wino_{part}", types)
    local = min(resolved.max_local, pow2_ceil(grid[0]))
    gsize = (round_up(grid[0], local), grid[1], 1)
    bound = {buffers + i: int(v) for i, v in enumerate(sizes)}
    return PreparedLaunch.binding(resolved.kernel, gsize, (local, 1, 1), bound, device.queue)


def _prepared_input_weight(
    device: Device, m: int, count: int, r: int, s: int, sizes_in: list[int], flags: dict[str, int], idx: str
) -> Callable[..., None]:
    """The launch of ``_input_weight_source`` (built once per tile, index type and flags) for ``count`` tile
    columns of ``s`` channels and R x S filters, the input transform's ``sizes_in`` bound: a call takes the raw
    buffers (src, v, w, u). Work-groups are one row of up to 256 columns, the input transform's first."""
    types = [None] * 4 + [index_dtype(idx)] * (len(_SIZES["input"]) + 2)
    key = ("layers", "winograd", "input_weight", m, idx, tuple(sorted(flags.items())))
    source = lambda: _SOURCES["input_weight"](m, idx, flags)  # noqa: E731
    resolved = get_kernel(key, device, source, "netcl_wino_input_weight", types)
    local = min(resolved.max_local, pow2_ceil(count))
    cols = round_up(count, local)
    gsize = (cols + round_up(s, local), max(s, r), 1)
    bound = {4 + i: int(v) for i, v in enumerate([*sizes_in, r, cols])}
    return PreparedLaunch.binding(resolved.kernel, gsize, (local, 1, 1), bound, device.queue).call


def _prepared_convolve(
    device: Device, src_shape: tuple[int, ...], r: int, s: int, flip: bool, pads: tuple[int, int], kind: str,
    tiling: TileGrid,
) -> Callable[..., Tensor]:  # fmt: skip
    """``convolve`` on an OpenCL ``device`` for operands of these sizes as ``run(src, w, extra, keep, gather) -> y``
    (``keep``, ``gather`` as in ``_convolve``): the input
    and weight transforms as one launch where ``fuses_weight_transform``, else the input transform first, so that
    the small weight transform's enqueue overlaps its run (see benchmarks/RESULTS.md, "Measurements moved out of
    source docstrings", conv_winograd.py); the batched product, the output transform."""
    n, h, width = int(src_shape[0]), int(src_shape[2]), int(src_shape[3])
    m, count, a2, idx = tiling.m, tiling.count, tiling.a2, tiling.idx
    sizes_in = [s, h, width, *pads, tiling.th, tiling.tw, count]
    rows_in = _row_flags(device, m, width, tiling.tw, pads[1])
    if fuses_weight_transform(device):
        both_idx = "long" if "long" in (idx, index_ctype(a2 * r * s)) else idx
        transforms = _prepared_input_weight(device, m, count, r, s, sizes_in, {**rows_in, "FLIP": int(flip)}, both_idx)
    else:
        transform = _prepared(device, "input", m, (count, s), 2, sizes_in, rows_in, idx)
        weight = _prepared(device, "weight", m, (s, r), 2, [r, s], {"FLIP": int(flip)}, index_ctype(a2 * r * s))

        def transforms(src, v, w, u) -> None:
            transform(src, v)
            weight(w, u)

    flags = {"BIAS": int(kind == "bias"), "ADDEND": int(kind == "addend")}
    flags |= _row_flags(device, m, tiling.ow, tiling.tw)
    sizes_out = [r, tiling.oh, tiling.ow, tiling.th, tiling.tw, count]
    output = _prepared(device, "output", m, (count, r), 3, sizes_out, flags, idx)
    gathering: list[PreparedLaunch] = []  # the output transform that gathers y's moments too, made at its first use
    v_shape, u_shape, y_shape = (a2, s, count), (a2, r, s), (n, r, tiling.oh, tiling.ow)
    empty = Tensor.empty

    def run(
        src: Tensor, w: Tensor, extra: Tensor | None, keep: list | None = None, gather: list | None = None
    ) -> Tensor:
        v = empty(v_shape, float32, device)
        u = empty(u_shape, float32, device)
        transforms(src.data, v.data, w.data, u.data)
        if keep is not None:
            keep.append(InputTransform(m, pads, src, v))
        prod = matmul(u, v)  # (a2, R, P)
        y = empty(y_shape, float32, device)
        added = prod.data if extra is None else extra.data  # (a kernel without bias or addend reads no extra)
        if gather is None:
            output(prod.data, y.data, added)
            return y
        if not gathering:
            gathering.append(_launch(device, "output", m, (count, r), 4, sizes_out, {**flags, "MOMENTS": 1}, idx))
        launch = gathering[0]
        parts = empty((r, launch.global_size[0] // launch.local_size[0], 3), float32, device)
        launch.call(prod.data, y.data, added, parts.data)
        gather.append(moments.ChannelMoments(y, parts))
        return y

    return run


def _prepared_weight_grad(device: Device, out_ch: int, geo, addend: bool, tiling: TileGrid) -> Callable[..., Tensor]:
    """``weight_grad`` on an OpenCL ``device`` for a layer of ``geo`` and ``out_ch`` outputs as
    ``run(grad, x, addend, v) -> dw``: x's input transform (unless ``v``, the forward's), the upstream
    gradient's, their product along the tiles, the weight-gradient transform (plus the addend when
    ``addend``)."""
    m, count, a2, idx = tiling.m, tiling.count, tiling.a2, tiling.idx
    sizes_in = [geo.C, geo.H, geo.W, geo.PH, geo.PW, tiling.th, tiling.tw, count]
    rows_in = _row_flags(device, m, geo.W, tiling.tw, geo.PW)
    transform = _prepared(device, "input", m, (count, geo.C), 2, sizes_in, rows_in, idx)
    sizes_out = [out_ch, geo.OH, geo.OW, tiling.th, tiling.tw, count]
    rows_out = _row_flags(device, m, geo.OW, tiling.tw)
    grad_output = _prepared(device, "grad_output", m, (count, out_ch), 2, sizes_out, rows_out, idx)
    back_idx = index_ctype(a2 * out_ch * geo.C)
    back = _prepared(device, "weight_grad", m, (geo.C, out_ch), 3, [out_ch, geo.C], {"ADDEND": int(addend)}, back_idx)
    v_shape, dm_shape, dw_shape = (a2, geo.C, count), (a2, out_ch, count), (out_ch, geo.C, 3, 3)
    empty = Tensor.empty

    def run(grad: Tensor, x: Tensor, extra: Tensor | None, v: Tensor | None = None) -> Tensor:
        if v is None:
            v = empty(v_shape, float32, device)
            transform(x.data, v.data)
        dm = empty(dm_shape, float32, device)
        grad_output(grad.data, dm.data)
        du = matmul(dm, v, transpose_b=True)  # (a2, O, C): a product along the P tiles
        dw = empty(dw_shape, float32, device)
        back(du.data, dw.data, du.data if extra is None else extra.data)
        return dw

    return run


def _convolve(
    src: Tensor,
    w: Tensor,
    flip: bool,
    pads: tuple[int, int],
    out_hw: tuple[int, int],
    extra: Tensor | None,
    kind: str,
    m: int,
    keep: list | None = None,
    gather: list | None = None,
) -> Tensor:
    """The stride-1 3x3 correlation of ``src`` (N, S, H, W) at ``pads`` with the R x S filters of
    ``w`` (flipped and transposed when ``flip``) by F(m x m, 3 x 3): (N, R, OH, OW), plus ``extra``
    as ``kind`` says ("bias": per output channel, "addend": of the output's shape, "": none); on an
    OpenCL device the input transform appended to ``keep`` (``InputTransform``) and the output's
    moments to ``gather`` (``moments.ChannelMoments``) when given. Its tiling and launches are made
    once per signature (``call_plans``)."""
    key = ("convolve", src.device, src.shape, w.shape, flip, pads, out_hw, kind, m)
    run = _PASSES.plans.get(key)
    if run is None:
        device, n = src.device, src.shape[0]
        r, s = (int(w.shape[1]), int(w.shape[0])) if flip else (int(w.shape[0]), int(w.shape[1]))
        tiling = TileGrid(m, n, out_hw, (r, s), (src.size, n * r * out_hw[0] * out_hw[1]))
        if device.kind == "opencl":
            made = _prepared_convolve(device, src.shape, r, s, flip, pads, kind, tiling)
        else:
            made = functools.partial(_convolve_with, flip, pads, kind, tiling)
        run = _PASSES.keep(key, made)
    return run(src, w, extra, keep, gather)


def _convolve_with(
    flip: bool, pads: tuple[int, int], kind: str, tiling: TileGrid, src: Tensor, w: Tensor, extra: Tensor | None,
    keep: list | None = None, gather: list | None = None,
) -> Tensor:  # fmt: skip
    """``convolve`` (the NumPy backend's twin, which keeps no transform and gathers no moments)."""
    return convolve(src, w, flip, pads, extra, kind, tiling)


@backend_op(_TWINS)
def convolve(
    src: Tensor, w: Tensor, flip: bool, pads: tuple[int, int], extra: Tensor | None, kind: str, tiling: TileGrid
) -> Tensor:
    """``_convolve`` on its ``tiling`` (whose output is ``tiling.oh`` x ``tiling.ow``): R x S filters of w
    (R, S, 3, 3), or of w (S, R, 3, 3) flipped and transposed when ``flip`` (prepared for this call alone:
    ``_convolve`` keeps them)."""
    r, s = (int(w.shape[1]), int(w.shape[0])) if flip else (int(w.shape[0]), int(w.shape[1]))
    return _prepared_convolve(src.device, src.shape, r, s, flip, pads, kind, tiling)(src, w, extra)


def forward(
    x: Tensor, w: Tensor, b: Tensor | None, geo, tile: int = 2, keep: list | None = None, gather: list | None = None
) -> Tensor:
    """conv2d of x (N, C, H, W) with w (O, C, 3, 3) plus a float32 ``b`` (O,): (N, O, OH, OW);
    ``tile``: the output tile m of F(m x m, 3 x 3), 2 or 4. ``keep``: a list to which the input transform
    of x is appended (``InputTransform``; OpenCL devices) for ``backward_weight``; ``gather``: one to which
    the output's per-channel moments are appended (``moments.ChannelMoments``, gathered in the output
    transform's store; OpenCL devices) for ``batchnorm.batch_norm_forward(..., moments=)``."""
    kind = "bias" if b is not None else ""
    return _convolve(x, w, False, (geo.PH, geo.PW), (geo.OH, geo.OW), b, kind, tile, keep, gather)


def backward_input(grad: Tensor, w: Tensor, geo, addend: Tensor | None = None, tile: int = 2) -> Tensor:
    """d conv2d / d x for upstream ``grad`` (N, O, OH, OW): (N, C, H, W), plus ``addend`` (of that
    shape, float32) added in the output transform's store when given; ``tile`` as in ``forward``."""
    pads = (2 - geo.PH, 2 - geo.PW)
    kind = "addend" if addend is not None else ""
    return _convolve(grad, w, True, pads, (geo.H, geo.W), addend, kind, tile)


def backward_weight(
    grad: Tensor, x: Tensor, geo, addend: Tensor | None = None, tile: int = 2, kept: InputTransform | None = None
) -> Tensor:
    """d conv2d / d w for upstream ``grad`` (N, O, OH, OW) and input x: (O, C, 3, 3), plus ``addend``
    (of that shape, float32) added in the last transform's store when given.

    The adjoint of the forward: dU[e] = dM[e] (O, P) @ V[e]^T (P, C), with dM = A dY A^T the
    transposed output transform of each upstream block and V the forward's input transform of x,
    then dw = G^T dU G; ``tile`` as in ``forward``. V is ``kept``'s where it is the forward's of this
    very x at this tile (``forward(..., keep=)``), else computed here. Its tiling and launches are made
    once per signature."""
    geometry = (geo.N, geo.C, geo.H, geo.W, geo.PH, geo.PW, geo.OH, geo.OW)
    key = ("weight_grad", grad.device, grad.shape, x.shape, geometry, addend is not None, tile)
    run = _PASSES.plans.get(key)
    if run is None:
        out_ch, device = int(grad.shape[1]), grad.device
        tiling = TileGrid(tile, geo.N, (geo.OH, geo.OW), (out_ch, geo.C), (x.size, grad.size))
        if device.kind == "opencl":
            made = _prepared_weight_grad(device, out_ch, geo, addend is not None, tiling)
        else:
            made = functools.partial(_weight_grad_with, geo, tiling)
        run = _PASSES.keep(key, made)
    reads = kept is not None and kept.tile == tile and kept.source is x and kept.pads == (geo.PH, geo.PW)
    return run(grad, x, addend, kept.v if reads else None)


def _weight_grad_with(
    geo, tiling: TileGrid, grad: Tensor, x: Tensor, addend: Tensor | None, v: Tensor | None = None
) -> Tensor:
    """``weight_grad`` (the NumPy backend's twin, which is given no transform)."""
    return weight_grad(grad, x, geo, addend, tiling)


@backend_op(_TWINS)
def weight_grad(grad: Tensor, x: Tensor, geo, addend: Tensor | None, tiling: TileGrid) -> Tensor:
    """``backward_weight`` on its ``tiling`` (prepared for this call alone: ``backward_weight`` keeps them)."""
    run = _prepared_weight_grad(x.device, int(grad.shape[1]), geo, addend is not None, tiling)
    return run(grad, x, addend)
