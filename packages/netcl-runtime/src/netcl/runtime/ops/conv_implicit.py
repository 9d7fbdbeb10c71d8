"""Convolution as an implicit GEMM: the portable GEMM kernel reads im2col addresses on the fly.

No column buffer is written: the GEMM's tile loads of the image operand go through an
``OperandView`` (``gemm_source``) whose C expression turns (row, depth) into an address in x or
in the upstream gradient, zero in the padding. With ``KK = KH * KW`` and ``L = OH * OW``:

- forward ``y = wR (O, KK*C) @ cols(x) (KK*C, N*L)``: A is w as (O, KH, KW, C) (a view read in place by the
  FMA kernel, a small transposed copy for the tensor-core one), B a view of x whose rows run over (ki, kj, c)
  and columns over (image, output pixel), so the batch fills the tiles (no per-image tail); C's view stores
  column (n, l) of row o at NCHW ``y[n, o, l]``; the bias is the GEMM's row epilogue. With the channel
  innermost along K, a K tile of BK rows shares one (ki, kj) when BK divides C: the view computes it once per
  tile, per element only the channel offset.
- input gradient ``dx = wT (C, KK*O) @ V(dy) (KK*O, N*H*W)``, stored NCHW the same way, where
  ``wT[c, (ki, kj, o)] = w[o, c, ki, kj]`` (likewise a view or a small transpose) and ``V[(ki, kj, o), (n, h, w)] =
  dy[n, o, (h + PH - ki*DH) / SH, (w + PW - kj*DW) / SW]`` where that is an exact, in-range output
  pixel, else 0. At stride > 1 most of those are zeros (three in four for a 3x3 window at stride 2): the FMA
  kernel runs one product per stride class instead (``stride_classes``: the input pixels of one remainder
  modulo the stride and the taps that reach them), each storing its pixels into the one output.
- weight gradient ``dw (O, C*KK) = dy (O, N*L) @ cols(x)^T (N*L, C*KK)``: both operands are views
  (the batch is part of the reduction), split along K when the output is small.

The geometry is compile-time (``#define``: divisions by constants), so each layer shape builds its
own programs; the batch size only enters the GEMM's N (forward, input gradient) or K (weight
gradient), kernel arguments, so a new batch size builds nothing. Tile configs come from
``netcl.runtime.tune`` (searched per device, layer and batch size rounded up to a power of two at
first use where tuning is on), else a default by output size. ``supports`` says which calls this path
takes; ``conv`` keeps im2col + matmul for the rest (groups > 1, float16, the NumPy backend).

Under a tensor-core matmul precision (``set_float32_matmul_precision("high")``, ``"tf32x3"`` or
``"medium"``; "high" like torch's TF32 convolutions) on a device with tensor cores, the same views
feed the ``mma.sync`` kernel (``gemm_mma``): a view's elements are staged through registers
(rounded to tf32 / bf16 there, raw for tf32x3) or, in the tf32 modes, copied word by word by its
cp.async pipeline from the view's offsets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float32, float64
from netcl.runtime import tune
from netcl.runtime.ops import gemm_mma
from netcl.runtime.ops._common import remember, storage_ctype
from netcl.runtime.ops.gemm_configs import fits
from netcl.runtime.ops.gemm_mma_source import MmaConfig
from netcl.runtime.ops.gemm_plan import Plan, Problem, make_plan, trial_run
from netcl.runtime.ops.gemm_source import IDENTITY, PLUS_ADDEND, Epilogue, GemmConfig, OperandView
from netcl.runtime.ops.layout import transpose
from netcl.runtime.ops.precision import resolve_precision

#: (threads M x N, per-thread M x N, K depth): the tiles a search tries (vector widths follow).
_CANDIDATES = [
    (16, 16, 8, 8, 8),
    (16, 16, 8, 8, 16),
    (8, 16, 8, 8, 16),
    (16, 8, 8, 8, 16),
    (16, 16, 4, 8, 16),
    (16, 16, 8, 4, 16),
    (16, 16, 4, 4, 16),
    (16, 16, 4, 4, 32),
]
_PLANS: dict = {}
#: The tile config each layer's plan uses, by its tuning key (what benchmarks report).
CHOSEN: dict[str, GemmConfig | MmaConfig] = {}


def supports(x: Tensor, w: Tensor, b: Tensor | None, groups: int) -> bool:
    """Whether conv2d of these operands runs here (else: im2col + matmul)."""
    device = x.device
    if device.kind != "opencl" or int(groups) != 1:
        return False
    dtype = x.dtype
    if dtype not in (float32, float64) or w.dtype != dtype or (b is not None and b.dtype != dtype):
        return False
    return x.size > 0 and w.size > 0


def mma_mode(device: Device, dtype: np.dtype) -> str | None:
    """The tensor-core mode the current matmul precision asks for on ``device`` (None: FMA kernel)."""
    return gemm_mma.mode_for(device, dtype, dtype, resolve_precision(None)) if dtype == float32 else None


def _defines(geo, out_ch: int, idx: str, st: str) -> str:
    """The layer's geometry as macros, and the loads every view shares (once per program)."""
    values = {
        "C": geo.C, "H": geo.H, "W": geo.W, "O": out_ch, "KH": geo.KH, "KW": geo.KW, "OH": geo.OH, "OW": geo.OW,
        "SH": geo.SH, "SW": geo.SW, "PH": geo.PH, "PW": geo.PW, "DH": geo.DH, "DW": geo.DW,
    }  # fmt: skip
    derived = ["#define CV_KK (CV_KH * CV_KW)", "#define CV_L (CV_OH * CV_OW)", f"#define CV_I {idx}"]
    loads = [f"#define CV_I4 {idx}4", _LOADS.replace("{st}", st), *([_LOAD4] if st == "float" else [])]
    return "\n".join(_macros(values, *derived, *loads))


def _macros(values: dict[str, int], *more: str) -> list[str]:
    """Lines defining ``CV_<name>`` as each of ``values``, then ``more``: once in a program that includes them from
    several views (guarded by the first name)."""
    return [f"#ifndef CV_{next(iter(values))}", *(f"#define CV_{k} {v}" for k, v in values.items()), *more, "#endif"]


#: Each view is an offset function ``cv_<view>_at(row, [k0,] column)``: the element's index into the
#: operand, -1 where it is zero padding; its value is ``cv_load`` of that. The ``_at4`` twins give
#: four consecutive columns (``OperandView.vector4``, ``offsets4``): where the four share an output
#: row, the index math runs once and the taps differ only in their column.
_LOADS = """
inline CT cv_load(__global const {st}* p, CV_I at) { return at >= 0 ? (CT)p[at] : (CT)0; }
#define CV_TAP(row, w, width) (((w) >= 0 && (w) < (width)) ? (row) + (w) : (CV_I)-1)
#define CV_TAPS(row, w, step, width) (CV_I4)(CV_TAP(row, w, width), CV_TAP(row, (w) + (step), width), \\
    CV_TAP(row, (w) + 2 * (step), width), CV_TAP(row, (w) + 3 * (step), width))
#define CV_EACH4(f, ...) (CV_I4)(f(__VA_ARGS__, 0), f(__VA_ARGS__, 1), f(__VA_ARGS__, 2), f(__VA_ARGS__, 3))
"""

_LOAD4 = """
inline float4 cv_load4(__global const float* p, CV_I4 at) {
    return (float4)(cv_load(p, at.s0), cv_load(p, at.s1), cv_load(p, at.s2), cv_load(p, at.s3));
}
"""

#: x read as im2col columns: row r = (c, ki, kj), column l = (oh, ow), within one image.
_X_COLS = """
inline CV_I cv_x_cols_at(uint r, uint l) {
    const uint c = r / CV_KK, rk = r % CV_KK, ki = rk / CV_KW, kj = rk % CV_KW;
    const int h = (int)(l / CV_OW) * CV_SH - CV_PH + (int)ki * CV_DH;
    const int w = (int)(l % CV_OW) * CV_SW - CV_PW + (int)kj * CV_DW;
    return (h >= 0 && h < CV_H && w >= 0 && w < CV_W) ? ((CV_I)c * CV_H + h) * CV_W + w : -1;
}
"""

#: x read as the forward's columns over the batch, rows ordered (ki, kj, c): row r, column q = (n, oh, ow).
#: ``k0`` is the K tile's first row: when BK divides C a tile shares one (ki, kj), computed once per tile.
_X_FWD = """
#if CV_C % BK == 0
#define CV_X_FWD_RK(r, k0) ((k0) / CV_C)
#else
#define CV_X_FWD_RK(r, k0) ((r) / CV_C)
#endif
inline CV_I cv_x_fwd_at(uint r, uint k0, uint q) {
    const uint rk = CV_X_FWD_RK(r, k0);
    const uint c = r - rk * CV_C, ki = rk / CV_KW, kj = rk % CV_KW, l = q % CV_L;
    const int h = (int)(l / CV_OW) * CV_SH - CV_PH + (int)ki * CV_DH;
    const int w = (int)(l % CV_OW) * CV_SW - CV_PW + (int)kj * CV_DW;
    return (h >= 0 && h < CV_H && w >= 0 && w < CV_W) ? (((CV_I)(q / CV_L) * CV_C + c) * CV_H + h) * CV_W + w : -1;
}
inline CT cv_x_fwd(__global const {st}* p, uint r, uint k0, uint q) { return cv_load(p, cv_x_fwd_at(r, k0, q)); }
#define CV_X_FWD_AT_E(r, k0, q, e) cv_x_fwd_at(r, k0, (q) + (e))
inline CV_I4 cv_x_fwd_at4(uint r, uint k0, uint q) {
    const uint rk = CV_X_FWD_RK(r, k0);
    const uint c = r - rk * CV_C, ki = rk / CV_KW, kj = rk % CV_KW, l = q % CV_L, ow = l % CV_OW;
    if (ow + 3 >= CV_OW) return CV_EACH4(CV_X_FWD_AT_E, r, k0, q);
    const int h = (int)(l / CV_OW) * CV_SH - CV_PH + (int)ki * CV_DH;
    if (h < 0 || h >= CV_H) return (CV_I4)(-1);
    const int w = (int)ow * CV_SW - CV_PW + (int)kj * CV_DW;
    return CV_TAPS((((CV_I)(q / CV_L) * CV_C + c) * CV_H + h) * CV_W, w, CV_SW, CV_W);
}
"""

#: dy read as the input gradient's columns over the batch, rows ordered (ki, kj, o): row r, column
#: q = (n, h, w); ``k0`` as in ``cv_x_fwd`` (BK dividing O).
_DY_DX = """
#if CV_O % BK == 0
#define CV_DY_DX_RK(r, k0) ((k0) / CV_O)
#else
#define CV_DY_DX_RK(r, k0) ((r) / CV_O)
#endif
inline CV_I cv_dy_dx_at(uint r, uint k0, uint q) {
    const uint rk = CV_DY_DX_RK(r, k0);
    const uint o = r - rk * CV_O, ki = rk / CV_KW, kj = rk % CV_KW, hw = q % (CV_H * CV_W);
    const int hh = (int)(hw / CV_W) + CV_PH - (int)ki * CV_DH;
    const int ww = (int)(hw % CV_W) + CV_PW - (int)kj * CV_DW;
    const int oh = max(hh, 0) / CV_SH, ow = max(ww, 0) / CV_SW;
    const bool ok = hh >= 0 && ww >= 0 && oh < CV_OH && ow < CV_OW && oh * CV_SH == hh && ow * CV_SW == ww;
    return ok ? (((CV_I)(q / (CV_H * CV_W)) * CV_O + o) * CV_OH + oh) * CV_OW + ow : -1;
}
inline CT cv_dy_dx(__global const {st}* p, uint r, uint k0, uint q) { return cv_load(p, cv_dy_dx_at(r, k0, q)); }
#define CV_DY_DX_AT_E(r, k0, q, e) cv_dy_dx_at(r, k0, (q) + (e))
inline CV_I4 cv_dy_dx_at4(uint r, uint k0, uint q) {
#if CV_SH == 1 && CV_SW == 1
    const uint rk = CV_DY_DX_RK(r, k0);
    const uint o = r - rk * CV_O, ki = rk / CV_KW, kj = rk % CV_KW, hw = q % (CV_H * CV_W), ww = hw % CV_W;
    if (ww + 3 < CV_W) {
        const int oh = (int)(hw / CV_W) + CV_PH - (int)ki * CV_DH;
        if (oh < 0 || oh >= CV_OH) return (CV_I4)(-1);
        const int ow = (int)ww + CV_PW - (int)kj * CV_DW;
        return CV_TAPS((((CV_I)(q / (CV_H * CV_W)) * CV_O + o) * CV_OH + oh) * CV_OW, ow, 1, CV_OW);
    }
#endif
    return CV_EACH4(CV_DY_DX_AT_E, r, k0, q);
}
"""

#: dy read as one stride class's input-gradient columns (``stride_classes``): the input pixels (i * SH + CV_QH,
#: j * SW + CV_QW), column q = (n, i, j), and only the taps that reach them: row r = (tap t, o) with t = (a, b),
#: (ki, kj) = (CV_KI0 + a * SH, CV_KJ0 + b * SW), which read output pixel (i + CV_OFFH - a, j + CV_OFFW - b)
#: (no division: the class fixes the remainder); ``k0`` as in ``cv_x_fwd`` (BK dividing O).
_DY_DXC = """
#if CV_O % BK == 0
#define CV_DY_DXC_T(r, k0) ((k0) / CV_O)
#else
#define CV_DY_DXC_T(r, k0) ((r) / CV_O)
#endif
inline CV_I cv_dy_dxc_at(uint r, uint k0, uint q) {
    const uint t = CV_DY_DXC_T(r, k0);
    const uint o = r - t * CV_O, ij = q % (CV_HC * CV_WC);
    const int oh = (int)(ij / CV_WC) + CV_OFFH - (int)(t / CV_NJ);
    const int ow = (int)(ij % CV_WC) + CV_OFFW - (int)(t % CV_NJ);
    const bool ok = oh >= 0 && oh < CV_OH && ow >= 0 && ow < CV_OW;
    return ok ? (((CV_I)(q / (CV_HC * CV_WC)) * CV_O + o) * CV_OH + oh) * CV_OW + ow : -1;
}
inline CT cv_dy_dxc(__global const {st}* p, uint r, uint k0, uint q) { return cv_load(p, cv_dy_dxc_at(r, k0, q)); }
"""

#: w (O, C, KH, KW) read as the forward's A (O, KK*C): row o, depth r = (ki, kj, c), the channel innermost as
#: in B's rows; and as the input gradient's A (C, KK*O): row c, depth r = (ki, kj, o). Views of the stored
#: weight, not transposed copies; ``_at4``: four consecutive depths.
_W_FWD = """
inline CV_I cv_w_fwd_at(uint o, uint r) { return ((CV_I)o * CV_C + r % CV_C) * CV_KK + r / CV_C; }
inline CT cv_w_fwd(__global const {st}* p, uint o, uint r) { return cv_load(p, cv_w_fwd_at(o, r)); }
#define CV_W_FWD_AT_E(o, r, e) cv_w_fwd_at(o, (r) + (e))
inline CV_I4 cv_w_fwd_at4(uint o, uint r) { return CV_EACH4(CV_W_FWD_AT_E, o, r); }
"""
_W_DX = """
inline CV_I cv_w_dx_at(uint c, uint r) { return ((CV_I)(r % CV_O) * CV_C + c) * CV_KK + r / CV_O; }
inline CT cv_w_dx(__global const {st}* p, uint c, uint r) { return cv_load(p, cv_w_dx_at(c, r)); }
#define CV_W_DX_AT_E(c, r, e) cv_w_dx_at(c, (r) + (e))
inline CV_I4 cv_w_dx_at4(uint c, uint r) { return CV_EACH4(CV_W_DX_AT_E, c, r); }
"""

#: w read as one stride class's A (C, T*O): row c, depth r = (tap t, o), the class's taps only (``_DY_DXC``).
_W_DXC = """
inline CV_I cv_w_dxc_at(uint c, uint r) {
    const uint t = r / CV_O, ki = CV_KI0 + (t / CV_NJ) * CV_SH, kj = CV_KJ0 + (t % CV_NJ) * CV_SW;
    return ((CV_I)(r % CV_O) * CV_C + c) * CV_KK + ki * CV_KW + kj;
}
inline CT cv_w_dxc(__global const {st}* p, uint c, uint r) { return cv_load(p, cv_w_dxc_at(c, r)); }
"""

#: dy as (O, N*L): row o, column q = (n, l).
_DY_ROWS = """
inline CV_I cv_dy_rows_at(uint o, uint q) { return ((CV_I)(q / CV_L) * CV_O + o) * CV_L + q % CV_L; }
inline CT cv_dy_rows(__global const {st}* p, uint o, uint q) { return cv_load(p, cv_dy_rows_at(o, q)); }
#define CV_DY_ROWS_AT_E(o, q, e) cv_dy_rows_at(o, (q) + (e))
inline CV_I4 cv_dy_rows_at4(uint o, uint q) {
    if (q % CV_L + 3 < CV_L) return (CV_I4)(cv_dy_rows_at(o, q)) + (CV_I4)(0, 1, 2, 3);
    return CV_EACH4(CV_DY_ROWS_AT_E, o, q);
}
"""

#: x as the weight gradient's (C*KK, N*L) columns, transposed: row r = (c, ki, kj), column q = (n, l).
_X_ROWS = """
inline CV_I cv_x_rows_at(uint r, uint q) {
    const CV_I at = cv_x_cols_at(r, q % CV_L);
    return at >= 0 ? (CV_I)(q / CV_L) * (CV_C * CV_H * CV_W) + at : -1;
}
inline CT cv_x_rows(__global const {st}* p, uint r, uint q) { return cv_load(p, cv_x_rows_at(r, q)); }
#define CV_X_ROWS_AT_E(r, q, e) cv_x_rows_at(r, (q) + (e))
inline CV_I4 cv_x_rows_at4(uint r, uint q) {
    const uint l = q % CV_L, ow = l % CV_OW;
    if (ow + 3 >= CV_OW) return CV_EACH4(CV_X_ROWS_AT_E, r, q);
    const uint c = r / CV_KK, rk = r % CV_KK, ki = rk / CV_KW, kj = rk % CV_KW;
    const int h = (int)(l / CV_OW) * CV_SH - CV_PH + (int)ki * CV_DH;
    if (h < 0 || h >= CV_H) return (CV_I4)(-1);
    const int w = (int)ow * CV_SW - CV_PW + (int)kj * CV_DW;
    return CV_TAPS((((CV_I)(q / CV_L) * CV_C + c) * CV_H + h) * CV_W, w, CV_SW, CV_W);
}
"""


@dataclasses.dataclass(frozen=True)
class StrideClass:
    """The input pixels (i * SH + qh, j * SW + qw) of a strided layer, ``rows`` x ``cols`` per image, and the
    window taps that reach them: ki = ki0 + a * SH for a < taps_h (kj likewise), reading output pixel
    (i + off_h - a, j + off_w - b)."""

    qh: int
    qw: int
    rows: int
    cols: int
    ki0: int
    kj0: int
    taps_h: int
    taps_w: int
    off_h: int
    off_w: int


def stride_classes(geo) -> list[StrideClass] | None:
    """The input gradient of a strided layer as one product per remainder of the input pixel modulo the stride,
    each over only the taps that reach its pixels (a 3x3 window at stride 2: 1, 2, 2 and 4 taps of 9, where one
    product over every tap multiplies three zeros in four); None where it does not split so: stride 1, a
    dilation, or a window narrower than its stride (a remainder no tap reaches). Classes without pixels are left
    out."""
    if (geo.SH, geo.SW) == (1, 1) or (geo.DH, geo.DW) != (1, 1) or geo.KH < geo.SH or geo.KW < geo.SW:
        return None
    classes = []
    for qh in range(geo.SH):
        ki0, rows = (qh + geo.PH) % geo.SH, -(-(geo.H - qh) // geo.SH)
        for qw in range(geo.SW):
            kj0, cols = (qw + geo.PW) % geo.SW, -(-(geo.W - qw) // geo.SW)
            if rows > 0 and cols > 0:
                taps_h, taps_w = len(range(ki0, geo.KH, geo.SH)), len(range(kj0, geo.KW, geo.SW))
                off_h, off_w = (qh + geo.PH - ki0) // geo.SH, (qw + geo.PW - kj0) // geo.SW
                classes.append(StrideClass(qh, qw, rows, cols, ki0, kj0, taps_h, taps_w, off_h, off_w))
    return classes


def _class_defines(cls: StrideClass) -> str:
    """A stride class's numbers as the ``CV_`` macros ``_DY_DXC`` and ``_W_DXC`` read."""
    values = {
        "QH": cls.qh, "QW": cls.qw, "HC": cls.rows, "WC": cls.cols, "KI0": cls.ki0, "KJ0": cls.kj0,
        "NI": cls.taps_h, "NJ": cls.taps_w, "OFFH": cls.off_h, "OFFW": cls.off_w,
    }  # fmt: skip
    return "\n".join(["", *_macros(values), ""])


def _view(geo, out_ch: int, idx: str, st: str, bodies: list[str], element: str, four_wide: bool) -> OperandView:
    """The view whose element is ``element`` (``cv_<name>(p, ...)``); with ``four_wide`` (the tensor-core kernel's
    views: the FMA kernel reads element by element) and float32, its four-wide twins: ``vector4`` (values) and,
    with int offsets, ``offsets4`` (for cp.async copies), from the body's ``cv_<name>_at4``."""
    helpers = _defines(geo, out_ch, idx, st) + "".join(b.replace("{st}", st) for b in bodies)
    if st != "float" or not four_wide:
        return OperandView(helpers, element)
    function, args = element.split("(", 1)
    offsets = f"{function}_at4({args.split(', ', 1)[1]}"  # the same arguments after p
    vector4 = f"cv_load4(p, {offsets})"
    return OperandView(helpers, element, vector4, offsets if idx == "int" else "")


def _idx(*sizes: int) -> str:
    return "long" if max(sizes) >= 2**31 else "int"


def _default(device: Device, kind: str, problem: Problem) -> GemmConfig:
    """Without a search, the H100 sweep's winners (benchmarks/RESULTS.md, "Convolution"): on GPUs
    64 x 128 tiles for fewer than 128 output rows, else 128 x 64 (fwd, dx) or 128 x 128 with BK 8 (dw), split
    along K where a layer has few tiles; on a CPU device (a few compute units) the forward and the input
    gradient, which store through an output view, do not split (their split sum would be one more pass)."""
    if not device.is_gpu:
        return GemmConfig(16, 16, 4, 4, 16, 4, 1, 4, split=int(kind == "dw"))
    if problem.m < 128:
        return GemmConfig(8, 16, 8, 8, 16, 4, 1, 4)
    if kind == "dw":
        return GemmConfig(16, 16, 8, 8, 8, 4, 1, 4)
    return GemmConfig(16, 8, 8, 8, 16, 4, 1, 4)


def candidates(layer: _Layer) -> list[GemmConfig]:
    """The tile configs a search of ``layer`` tries (those the device can run)."""
    problem, itemsize = layer.problem, layer.dtype.itemsize
    va, vb = _widths(layer)
    out = []
    for wgm, wgn, tm, tn, bk in _CANDIDATES:
        cfg = GemmConfig(wgm, wgn, tm, tn, bk, va, vb, min(4, tm, tn))
        if fits(layer.device, cfg, itemsize, problem):
            out.append(cfg)
    return out


def _widths(layer: _Layer) -> tuple[int, int]:
    """Load widths of A and B for the FMA kernel: both operands are views (``OperandView``), read element by
    element."""
    return 1, 1


def _config(layer: _Layer) -> GemmConfig:
    problem = layer.problem
    fallback = _default(layer.device, layer.kind, problem)
    va, vb = _widths(layer)
    fallback = dataclasses.replace(fallback, va=va, vb=vb)
    if not fits(layer.device, fallback, layer.dtype.itemsize, problem):
        fallback = GemmConfig(8, 8, 1, 1, 8, 1, 1, 1)
    return tune.select(
        layer.device,
        layer.key,
        candidates(layer),
        fallback,
        layer,
        encode=dataclasses.asdict,
        decode=lambda d: GemmConfig(**d),
    )


def _mma_config(layer: _Layer) -> MmaConfig:
    """The searched (or default) tensor-core config of ``layer``."""
    device, problem, views = layer.device, layer.problem, layer.views
    return tune.select(
        device,
        layer.key,
        gemm_mma.view_candidates(device, layer.mode, problem, views),
        gemm_mma.view_default(device, layer.mode, problem, views),
        layer,
        encode=dataclasses.asdict,
        decode=lambda d: MmaConfig(**d),
    )


class _Layer:
    """One (kind, shapes, geometry, dtype) on a device: its Problem, views and, once made, its Plan."""

    def __init__(
        self,
        kind: str,
        device: Device,
        geo,
        out_ch: int,
        dtype: np.dtype,
        bias: bool,
        mode: str | None = None,
        addend: bool = False,
        stride_class: StrideClass | None = None,
    ) -> None:
        n, c, h, w, kk, length = geo.N, geo.C, geo.H, geo.W, geo.KH * geo.KW, geo.OH * geo.OW
        idx = _idx(n * c * h * w, n * out_ch * length, out_ch * c * kk)
        st = storage_ctype(dtype)
        self.kind, self.device, self.dtype, self.mode = kind, device, np.dtype(dtype), mode
        self.epilogue: Epilogue = IDENTITY
        wide = mode is not None  # the tensor-core kernel reads four-wide view twins (``_view``)
        if kind == "fwd":  # columns (n, oh, ow): the batch folded into N, stored NCHW by the C view
            self.problem = Problem(out_ch, n * length, c * kk, False, False, ())
            view_a = None if mode else _view(geo, out_ch, idx, st, [_W_FWD], "cv_w_fwd(p, mn, kk)", wide)
            view_b = _view(geo, out_ch, idx, st, [_X_FWD], "cv_x_fwd(p, kk, k0, mn)", wide)
            out = OperandView(_defines(geo, out_ch, idx, st), "((IDX)(c / CV_L) * CV_O + r) * CV_L + c % CV_L")
            self.views = (view_a, view_b, out)
            self.out_shape = (n, out_ch, geo.OH, geo.OW)
            self.sizes = (out_ch * c * kk, n * c * h * w)
            if bias:
                self.epilogue = Epilogue(bias="row")
        elif kind == "dx" and stride_class is not None:  # one stride class: columns (n, i, j), its taps only
            cls, taps = stride_class, stride_class.taps_h * stride_class.taps_w
            self.problem = Problem(c, n * cls.rows * cls.cols, out_ch * taps, False, False, ())
            body = _class_defines(cls)
            # the FMA kernel only (``backward_input``): these bodies have no four-wide twins
            view_a = _view(geo, out_ch, idx, st, [body, _W_DXC], "cv_w_dxc(p, mn, kk)", False)
            view_b = _view(geo, out_ch, idx, st, [body, _DY_DXC], "cv_dy_dxc(p, kk, k0, mn)", False)
            pixel = "(c % (CV_HC * CV_WC) / CV_WC * CV_SH + CV_QH) * CV_W + c % CV_WC * CV_SW + CV_QW"
            out = OperandView(
                _defines(geo, out_ch, idx, st) + body,
                f"((IDX)(c / (CV_HC * CV_WC)) * CV_C + r) * (CV_H * CV_W) + {pixel}",
            )
            self.views = (view_a, view_b, out)
            self.out_shape = (n, c, h, w)
            self.sizes = (out_ch * c * kk, n * out_ch * length)
        elif kind == "dx":  # columns (n, h, w)
            self.problem = Problem(c, n * h * w, out_ch * kk, False, False, ())
            view_a = None if mode else _view(geo, out_ch, idx, st, [_W_DX], "cv_w_dx(p, mn, kk)", wide)
            view_b = _view(geo, out_ch, idx, st, [_DY_DX], "cv_dy_dx(p, kk, k0, mn)", wide)
            out = OperandView(
                _defines(geo, out_ch, idx, st),
                "((IDX)(c / (CV_H * CV_W)) * CV_C + r) * (CV_H * CV_W) + c % (CV_H * CV_W)",
            )
            self.views = (view_a, view_b, out)
            self.out_shape = (n, c, h, w)
            self.sizes = (out_ch * c * kk, n * out_ch * length)
        else:
            self.problem = Problem(out_ch, c * kk, n * length, False, True, ())
            view_a = _view(geo, out_ch, idx, st, [_DY_ROWS], "cv_dy_rows(p, mn, kk)", wide)
            self.views = (view_a, _view(geo, out_ch, idx, st, [_X_COLS, _X_ROWS], "cv_x_rows(p, mn, kk)", wide))
            self.out_shape = (out_ch, c, geo.KH, geo.KW)
            self.sizes = (n * out_ch * length, n * c * h * w)
        if addend:  # a gradient plus the sum so far: the addend, laid out like the output, read at C's offset
            if kind == "fwd":
                raise ValueError("conv_implicit: an addend is for the gradients (dx, dw), not the forward")
            self.epilogue = PLUS_ADDEND
        kernel = f"mma-{mode}-" if mode else ""
        self.key = f"conv-{kernel}{kind}|{np.dtype(dtype).str}|{tune.pow2_class(n)}|{out_ch}|{geo.values}"
        if stride_class is not None:
            self.key += f"|class {stride_class.qh},{stride_class.qw}"
        #: a trial's two operands, then its bias (or None) and epilogue operands (``__call__`` makes them once)
        self.scratch: tuple[Tensor, Tensor] | None = None
        self.epilogue_scratch: tuple[Tensor | None, list[Tensor]] = (None, [])

    def plan(self, cfg: GemmConfig | MmaConfig | None = None) -> Plan:
        if cfg is None:
            cfg = _mma_config(self) if self.mode else _config(self)
            CHOSEN[self.key] = cfg
        if self.mode:
            return gemm_mma.make_plan(
                self.device, self.mode, self.dtype, self.dtype, self.dtype, self.out_shape, self.problem,
                self.epilogue, cfg, self.views,
            )  # fmt: skip
        return make_plan(
            self.device, self.dtype, self.dtype, self.out_shape, self.problem, self.epilogue, cfg=cfg, views=self.views
        )

    def build(self, cfg: GemmConfig | MmaConfig) -> None:
        """A candidate's programs only (``tune.build_ahead``): its plan (operand views: no tensor maps, nothing
        allocated)."""
        self.plan(cfg)

    def __call__(self, cfg: GemmConfig | MmaConfig) -> Callable[[], Tensor]:  # a tuning trial on scratch operands
        from netcl.runtime.ops.layout import full

        if self.scratch is None:  # made once per search: every candidate's trial reads the same operands
            self.scratch = (
                tune.trial_operand(self.sizes[0], self.dtype, self.device, 1),
                tune.trial_operand(self.sizes[1], self.dtype, self.device, 2),
            )
            self.epilogue_scratch = (
                full((self.problem.m,), 0.0, self.dtype, self.device) if self.epilogue.bias != "none" else None,
                [full(self.out_shape, 0.0, self.dtype, self.device) for _ in self.epilogue.operands],
            )
        bias, extras = self.epilogue_scratch
        return trial_run(self.plan(cfg), *self.scratch, bias, extras=extras)


def _layer(
    kind: str,
    device: Device,
    geo,
    out_ch: int,
    dtype: np.dtype,
    bias: bool = False,
    addend: bool = False,
    stride_class: StrideClass | None = None,
) -> Plan:
    mode = mma_mode(device, np.dtype(dtype))
    key = (kind, device, tuple(geo.values), geo.N, out_ch, np.dtype(dtype).str, bias, mode, addend, stride_class)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _Layer(kind, device, geo, out_ch, dtype, bias, mode, addend, stride_class).plan()
        remember(_PLANS, key, plan)
    return plan


def forward(x: Tensor, w: Tensor, b: Tensor | None, geo) -> Tensor:
    """conv2d of x (N, C, H, W) and w (O, C, KH, KW) plus b (O,): (N, O, OH, OW)."""
    fused = b is not None and b.dtype == float32  # the GEMM epilogue's bias is float32
    out_ch = w.shape[0]
    a = _weight(w, geo, (0, 2, 1), x)  # (O, KK, C)
    out = _layer("fwd", x.device, geo, out_ch, x.dtype, fused).run(a, x, b if fused else None)
    if b is not None and not fused:
        from netcl.runtime.ops.pointwise import add

        out = add(out, b.reshape(1, w.shape[0], 1, 1))
    return out


def backward_input(grad: Tensor, w: Tensor, geo, addend: Tensor | None = None) -> Tensor:
    """d conv2d / d x for upstream ``grad`` (N, O, OH, OW); plus a float32 ``addend`` of x's shape,
    summed in the product's store, when given. On the FMA kernel a strided layer runs one product per stride
    class (``stride_classes``), each storing its own pixels of one output; the tensor-core kernel keeps one
    product over every tap (split by class it measured no faster on ResNet-8's layers under "high", and each
    class would be a product of its own to search tiles for: see benchmarks/RESULTS.md, "Thirty-second
    session")."""
    classes = stride_classes(geo) if mma_mode(grad.device, grad.dtype) is None else None
    if classes is None:
        return _run("dx", _weight(w, geo, (1, 2, 0), grad), grad, w.shape[0], geo, addend)  # (C, KK, O)
    out_ch = int(w.shape[0])
    dx = Tensor.empty((geo.N, geo.C, geo.H, geo.W), grad.dtype, grad.device)
    extras = () if addend is None else (addend,)
    for cls in classes:
        plan = _layer("dx", grad.device, geo, out_ch, grad.dtype, addend=addend is not None, stride_class=cls)
        plan.run(w, grad, out=dx, extras=extras)
    return dx


def _weight(w: Tensor, geo, order: tuple[int, int, int], b: Tensor) -> Tensor:
    """The A operand of a product whose B is ``b``: ``w`` itself where the FMA kernel runs (it reads w through
    the ``_W_FWD`` / ``_W_DX`` views), else a copy of w (O, C, KK) transposed to ``order``: the tensor-core
    kernel's cp.async copies move a stored operand 16 bytes at a time, a view's element by element (measured:
    benchmarks/RESULTS.md, "NVIDIA H200, 2026-11-26 (ninth session): weight views in the implicit GEMM")."""
    if mma_mode(b.device, b.dtype) is None:  # the layer's own choice (``_layer``: B's device and dtype)
        return w
    return transpose(w.reshape(w.shape[0], geo.C, geo.KH * geo.KW), order)


def backward_weight(grad: Tensor, x: Tensor, out_ch: int, geo, addend: Tensor | None = None) -> Tensor:
    """d conv2d / d w for upstream ``grad`` (N, O, OH, OW): (O, C, KH, KW); plus a float32 ``addend``
    of that shape, summed in the product's store, when given."""
    return _run("dw", grad, x, out_ch, geo, addend)


def _run(kind: str, a: Tensor, b: Tensor, out_ch: int, geo, addend: Tensor | None) -> Tensor:
    if addend is None:
        return _layer(kind, a.device, geo, out_ch, b.dtype).run(a, b)
    return _layer(kind, a.device, geo, out_ch, b.dtype, addend=True).run(a, b, extras=(addend,))
