"""3x3 stride-1 convolution by Winograd's minimal filtering F(2x2, 3x3) (Lavin & Gray, 2015).

Each 2x2 block of outputs comes from a 4x4 input patch with 16 multiplications per channel pair
instead of 36: the patch d and the filter g move into a 4x4 transform domain, V = B^T d B and
U = G g G^T, where the convolution is an elementwise product summed over the input channels, and
``A^T M A`` brings each 4x4 sum M back to the 2x2 outputs. Over a layer the sum is 16 independent
matrix products, ``M[e] = U[e] (R, S) @ V[e] (S, P)`` for the 16 transform positions e, R output
channels, S input channels and P = N * tiles: the runtime's batched GEMM computes them (2.25x fewer
multiply-adds than the implicit GEMM), three small memory-bound kernels the transforms.

The same kernels give the input gradient: for stride 1 it is the correlation of the upstream
gradient with the weights flipped and transposed, ``w'[c, o] = w[o, c, ::-1, ::-1]``, at padding
``2 - P`` (so ``P <= 2``), which the weight transform reads in place (``FLIP``).

Rounding: the transforms add up to four values, the 0.5 factors of G are exact, and the products
sum over S channels on transformed values at most 9x a direct term's magnitude, so the float32
error is a few times the direct convolution's (tests bound it by float64 and by the implicit GEMM).
All sizes are kernel arguments; the programs depend only on the index type and FLIP / BIAS /
ADDEND, so every layer shape shares them.
"""

from __future__ import annotations

import os
from fractions import Fraction

from netcl.core import Tensor
from netcl.core.dtypes import float32
from netcl.runtime.ops._grid import index_ctype, index_dtype, params, run_rows, scalars
from netcl.runtime.ops.linalg import matmul

#: ``NETCL_WINOGRAD``: "2" (the default) F(2x2, 3x3), "4" F(4x4, 3x3), "0" off (every 3x3
#: convolution runs as an implicit GEMM), for the layers ``conv.conv2d`` picks on its own.
ENV_VAR = "NETCL_WINOGRAD"
HALF, SIXTH = Fraction(1, 2), Fraction(1, 6)
#: Fewest input and output channels for which ``conv.conv2d`` picks Winograd on its own: below them
#: the 16 products are too thin to win back the transforms' memory traffic.
MIN_CHANNELS = 16

#: (B^T, G, A^T) of F(m x m, 3 x 3) for output tiles m = 2 (points 0, 1, -1) and m = 4 (0, +-1, +-2), Lavin & Gray.
_MATRICES = {
    2: (
        [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [HALF, HALF, HALF], [HALF, -HALF, HALF], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]],
    ),
    4: (
        [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[Fraction(1, 4), 0, 0], [-SIXTH, -SIXTH, -SIXTH], [-SIXTH, SIXTH, -SIXTH],
         [Fraction(1, 24), Fraction(1, 12), SIXTH], [Fraction(1, 24), Fraction(-1, 12), SIXTH], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    ),
}  # fmt: skip


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


def _sandwich(left: list, values: list[list[str]], right: list, store) -> list[str]:
    """Statements computing ``left @ values @ right^T`` in straight-line code: ``left`` times the
    value grid into temporaries ``t<i>_<j>``, then each result element handed to ``store(i, j, expr)``."""
    lines = []
    for i, row in enumerate(left):
        for j in range(len(values[0])):
            lines.append(f"const float t{i}_{j} = {_sum([(row[k], values[k][j]) for k in range(len(values))])};")
    for i in range(len(left)):
        for j, row in enumerate(right):
            lines.append(store(i, j, _sum([(row[k], f"t{i}_{k}") for k in range(len(row))])))
    return lines


def _source(part: str, m: int, idx: str, flags: dict[str, int]) -> str:
    """The OpenCL C of one transform kernel of F(m x m, 3 x 3)."""
    bt, g, at = _MATRICES[m]
    a = m + 2
    sizes = params(idx, _SIZES[part])
    nl = "\n    "
    if part == "weight":
        if flags["FLIP"]:  # input gradient: w (S, R, 3, 3) read as w'[r, s, i, j] = w[s, r, 2 - i, 2 - j]
            base, tap = "(s * R + r) * 9", "p[{0}]"
            grid = [[tap.format((2 - i) * 3 + 2 - j) for j in range(3)] for i in range(3)]
        else:  # forward: w (R, S, 3, 3)
            base = "(r * S + s) * 9"
            grid = [[f"p[{i * 3 + j}]" for j in range(3)] for i in range(3)]
        body = _sandwich(g, grid, g, lambda i, j, e: f"out[{i * a + j} * plane] = {e};")
        return f"""
__kernel void netcl_wino_weight(__global const float* w, __global float* u, {sizes}) {{
    const {idx} s = get_global_id(0);  /* input channel of the transformed conv */
    if (s >= S) return;
    const {idx} r = get_global_id(1);  /* its output channel */
    __global const float* p = w + {base};
    const {idx} plane = R * S;
    __global float* out = u + r * S + s;
    {nl.join(body)}
}}
"""
    if part == "input":
        loads = [
            f"const float d{i}_{j} = (h0 + {i} >= 0 && h0 + {i} < H && w0 + {j} >= 0 && w0 + {j} < W) "
            f"? src[(h0 + {i}) * W + w0 + {j}] : 0.0f;"
            for i in range(a)
            for j in range(a)
        ]
        grid = [[f"d{i}_{j}" for j in range(a)] for i in range(a)]
        body = _sandwich(bt, grid, bt, lambda i, j, e: f"out[{i * a + j} * plane] = {e};")
        return f"""
__kernel void netcl_wino_input(__global const float* x, __global float* v, {sizes}) {{
    const {idx} p = get_global_id(0);  /* tile (n, th, tw) */
    if (p >= P) return;
    const {idx} c = get_global_id(1);
    const {idx} tw = p % TW, th = (p / TW) % TH, n = p / (TW * TH);
    const {idx} h0 = {m} * th - PH, w0 = {m} * tw - PW;
    __global const float* src = x + (n * S + c) * H * W;
    {nl.join(loads)}
    const {idx} plane = S * P;
    __global float* out = v + c * P + p;
    {nl.join(body)}
}}
"""
    grid = [[f"src[{i * a + j} * plane]" for j in range(a)] for i in range(a)]
    extra = " + extra[r]" if flags["BIAS"] else ""
    first = "extra[at] + " if flags["ADDEND"] else ""

    def store(i: int, j: int, e: str) -> str:
        at = f"((n * R + r) * OH + h0 + {i}) * OW + w0 + {j}"
        return f"if (h0 + {i} < OH && w0 + {j} < OW) {{ const {idx} at = {at}; y[at] = {first}({e}){extra}; }}"

    body = _sandwich(at, grid, at, store)
    return f"""
__kernel void netcl_wino_output(__global const float* m, __global float* y, __global const float* extra, {sizes}) {{
    const {idx} p = get_global_id(0);
    if (p >= P) return;
    const {idx} r = get_global_id(1);
    const {idx} tw = p % TW, th = (p / TW) % TH, n = p / (TW * TH);
    const {idx} h0 = {m} * th, w0 = {m} * tw;
    const {idx} plane = R * P;
    __global const float* src = m + r * P + p;
    {nl.join(body)}
}}
"""


_SIZES = {
    "weight": ["R", "S"],
    "input": ["S", "H", "W", "PH", "PW", "TH", "TW", "P"],
    "output": ["R", "OH", "OW", "TH", "TW", "P"],
}


def default_tile() -> int:
    """The tile ``NETCL_WINOGRAD`` asks for: 2 (unset), 4, or 0 (off)."""
    value = os.environ.get(ENV_VAR, "2").strip()
    if value not in ("0", "2", "4"):
        raise ValueError(f"{ENV_VAR} must be 0 (off), 2 (F(2x2, 3x3)) or 4 (F(4x4, 3x3)), got {value!r}")
    return int(value)


def applies(x: Tensor, w: Tensor, groups: int, geo) -> bool:
    """Whether these operands can run here: an OpenCL device, float32, groups 1, a 3x3 window
    at stride 1 and dilation 1, padding <= 2 (the input gradient's padding is 2 - P)."""
    return (
        x.device.kind == "opencl"
        and x.dtype == float32
        and w.dtype == float32
        and int(groups) == 1
        and (geo.KH, geo.KW, geo.SH, geo.SW, geo.DH, geo.DW) == (3, 3, 1, 1, 1, 1)
        and geo.PH <= 2
        and geo.PW <= 2
        and x.size > 0
        and w.size > 0
    )


def _launch(
    part: str, m: int, grid: tuple[int, int], args: list, sizes: list[int], flags: dict[str, int], idx: str
) -> None:
    """Build (once per tile, index type and flags) and launch transform ``part`` on (columns, rows)."""
    names = _SIZES[part]
    types = [None] * len(args) + [index_dtype(idx)] * len(names)
    key = ("winograd", part, m, idx, tuple(sorted(flags.items())))
    run_rows(
        key, args[0].device, lambda: _source(part, m, idx, flags), f"netcl_wino_{part}", types, (*grid, 1),
        *args, *scalars(idx, sizes),
    )  # fmt: skip


def _convolve(
    src: Tensor,
    w: Tensor,
    flip: bool,
    r: int,
    s: int,
    pads: tuple[int, int],
    out_hw: tuple[int, int],
    extra: Tensor | None,
    kind: str,
    m: int,
) -> Tensor:
    """The stride-1 3x3 correlation of ``src`` (N, S, H, W) at ``pads`` with the R x S filters of
    ``w`` (flipped and transposed when ``flip``) by F(m x m, 3 x 3): (N, R, OH, OW), plus ``extra``
    as ``kind`` says ("bias": per output channel, "addend": of the output's shape, "": none)."""
    if m not in _MATRICES:
        raise ValueError(f"conv_winograd: tile must be one of {sorted(_MATRICES)}, got {m}")
    n, _, h, width = src.shape
    oh, ow = out_hw
    th, tw = -(-oh // m), -(-ow // m)
    tiles, a2 = n * th * tw, (m + 2) ** 2
    device = src.device
    idx = index_ctype(a2 * s * tiles, a2 * r * tiles, src.size, n * r * oh * ow)
    u = Tensor.empty((a2, r, s), float32, device)
    _launch("weight", m, (s, r), [w, u], [r, s], {"FLIP": int(flip)}, index_ctype(a2 * r * s))
    v = Tensor.empty((a2, s, tiles), float32, device)
    _launch("input", m, (tiles, s), [src, v], [s, h, width, *pads, th, tw, tiles], {}, idx)
    prod = matmul(u, v)  # (a2, R, P)
    y = Tensor.empty((n, r, oh, ow), float32, device)
    flags = {"BIAS": int(kind == "bias"), "ADDEND": int(kind == "addend")}
    args = [prod, y, extra if extra is not None else prod]
    _launch("output", m, (tiles, r), args, [r, oh, ow, th, tw, tiles], flags, idx)
    return y


def forward(x: Tensor, w: Tensor, b: Tensor | None, geo, tile: int = 2) -> Tensor:
    """conv2d of x (N, C, H, W) with w (O, C, 3, 3) plus a float32 ``b`` (O,): (N, O, OH, OW);
    ``tile``: the output tile m of F(m x m, 3 x 3), 2 or 4."""
    out_ch = int(w.shape[0])
    kind = "bias" if b is not None else ""
    return _convolve(x, w, False, out_ch, geo.C, (geo.PH, geo.PW), (geo.OH, geo.OW), b, kind, tile)


def backward_input(grad: Tensor, w: Tensor, geo, addend: Tensor | None = None, tile: int = 2) -> Tensor:
    """d conv2d / d x for upstream ``grad`` (N, O, OH, OW): (N, C, H, W), plus ``addend`` (of that
    shape, float32) added in the output transform's store when given; ``tile`` as in ``forward``."""
    out_ch = int(w.shape[0])
    pads = (2 - geo.PH, 2 - geo.PW)
    kind = "addend" if addend is not None else ""
    return _convolve(grad, w, True, geo.C, out_ch, pads, (geo.H, geo.W), addend, kind, tile)
