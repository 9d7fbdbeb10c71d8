"""2-D convolution on NCHW: Winograd, implicit GEMM on OpenCL devices, else im2col + matmul and col2im.

float32 3x3 stride-1 layers of >= 16 channels each way run all three passes as Winograd's
F(2x2, 3x3) (``conv_winograd``, on OpenCL devices and, as its NumPy twin, on the NumPy backend:
transforms around 16 batched products; ``NETCL_WINOGRAD`` picks F(4x4, 3x3) or turns it off;
``_winograd_tile``) at the "highest" and "tf32x3" matmul precisions, and at "high" as F(4x4) on
tf32x3 products where tensor cores take them (``_winograd_precision``) or, where a layer's search finds it
faster, as F(2x2) on tf32 products (``WINOGRAD_TF32``) or F(4x4) on bf16x3 ones (``WINOGRAD_BF16X3``). A Winograd
forward can keep x's input transform for the weight gradient (``conv2d(..., keep=)``,
``conv2d_backward_weight(..., transformed=)``), as autograd's ``conv2d`` does.

A 1x1 window at stride 1 without padding (groups 1, ``_pointwise``) is a plain batched product, ``y[n] = w (O, C) @
x[n] (C, H*W)`` on the stored tensors, and so is its input gradient: both run as ``matmul`` on every backend
(4-wide loads of both operands, where the implicit GEMM loads the view element by element; see
benchmarks/RESULTS.md, "Measurements moved out of source docstrings", conv.py); the weight gradient, a sum over the
batch too, stays on the paths below.

Otherwise, on OpenCL devices, ``conv2d`` and both backwards of float32/float64 convolutions with
``groups == 1`` run as implicit GEMMs (``conv_implicit``: the GEMM kernel computes the im2col
addresses in its tile loads, no column buffer), except on a CPU device with the host BLAS on (``NETCL_HOST_BLAS``)
where the reduction is short (``C*KH*KW < 256``: im2col + a product, ``gemm_cpu``'s kernel or the host BLAS, is
faster there) or where a measurement at the layer's first use says im2col + a product is (``_use_implicit``).

On a GPU the forward and the input gradient of each layer these paths take are measured at the layer's first use
(``_gpu_algorithm``, stored like a tile search) against a product of stored operands beside a layout kernel: the
forward as ``w @`` x's receptive fields laid out as one product's rows (``gemm_forward``), the input gradient as a
product, then a gather (``gemm_backward_input``); where the column buffer fits. Winograd is a candidate there where
it applies (and the choice without a measurement). Where a layer's images are small and its channels many, the
product of stored operands can win: its GEMM loads 16 bytes at a time where the implicit GEMM loads through the im2col
addresses, and Winograd's transforms cost more than they save (benchmarks/RESULTS.md, "Thirty-fourth session").

The path below serves everything else: groups > 1, float16 (amp) and the NumPy backend; ``implicit=False`` forces
it (benchmarks compare the two).

``im2col`` lays the receptive fields of x (N, C, H, W) out as ``cols`` (N, C*KH*KW, OH*OW): row
``(c, ki, kj)``, column ``(oh, ow)`` holds ``x[n, c, oh*sh - ph + ki*dh, ow*sw - pw + kj*dw]`` (0 in
the padding). With ``groups`` g the rows split into g contiguous blocks, so the forward is one
batched matmul ``w (g, O/g, K) @ cols (N, g, K, L)`` -> (N, g, O/g, L), which is NCHW already.
``col2im`` is the adjoint: each input pixel gathers (no atomics) the column entries that read it.
Both kernels are shape-generic: every size, stride, padding and dilation is a kernel argument.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.core.dtypes import float32, refuse_bfloat16
from netcl.core.errors import ShapeError
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops import conv_implicit, conv_winograd, host_blas, magic_div
from netcl.runtime.ops._common import compute_ctype, device_of, get_kernel, pow2_ceil, pragmas, round_up, storage_ctype
from netcl.runtime.ops._grid import index_ctype, index_dtype, params
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.call_plans import UNKEYED, PlanCache, complete, context, exact, tensor_sig, window
from netcl.runtime.ops.layout import transpose
from netcl.runtime.ops.linalg import matmul, product_plus_rows
from netcl.runtime.ops.pointwise import add
from netcl.runtime.ops.precision import at_matmul_precision
from netcl.runtime.ops.reduce import sum as reduce_sum

_TWINS = "netcl.runtime.numpy_twins.conv"

Pair = tuple[int, int]
_GEOMETRY = ["C", "H", "W", "KH", "KW", "OH", "OW", "SH", "SW", "PH", "PW", "DH", "DW"]


def pair(value: Any, name: str, op: str, minimum: int) -> Pair:
    """An int or a pair of ints as a pair, each at least ``minimum`` (ValueError naming ``name``)."""
    items = (
        (value, value)
        if isinstance(value, (int, np.integer))
        else tuple(value)
        if isinstance(value, (tuple, list))
        else None
    )
    if (
        items is None
        or len(items) != 2
        or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items)
    ):
        raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {value!r}")
    if any(int(v) < minimum for v in items):
        raise ValueError(f"{op}: {name} must be >= {minimum}, got {value!r}")
    return int(items[0]), int(items[1])


def out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """Output length along one spatial axis (floor mode); <= 0 when the kernel does not fit."""
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


class ConvGeometry:
    """The sizes of one 2-D convolution or pooling window walk."""

    def __init__(self, x_shape: Sequence[int], kernel: Pair, stride: Pair, padding: Pair, dilation: Pair, op: str):
        self.N, self.C, self.H, self.W = (int(d) for d in x_shape)
        self.KH, self.KW = kernel
        self.SH, self.SW = stride
        self.PH, self.PW = padding
        self.DH, self.DW = dilation
        self.OH = out_size(self.H, self.KH, self.SH, self.PH, self.DH)
        self.OW = out_size(self.W, self.KW, self.SW, self.PW, self.DW)
        if self.OH <= 0 or self.OW <= 0:
            eff = (self.DH * (self.KH - 1) + 1, self.DW * (self.KW - 1) + 1)
            raise ShapeError(
                f"{op}: kernel of effective size {eff} is larger than the padded input "
                f"({self.H + 2 * self.PH}, {self.W + 2 * self.PW}) of x shape {tuple(x_shape)} with padding {padding}"
            )
        self.key = (self.N, *(getattr(self, name) for name in _GEOMETRY))
        self._hash = hash(self.key)

    def __eq__(self, other: object) -> bool:
        return type(other) is ConvGeometry and other.key == self.key

    def __hash__(self) -> int:
        return self._hash

    @property
    def values(self) -> list[int]:
        return list(self.key[1:])

    def with_output(self, out_h: int, out_w: int) -> ConvGeometry:
        """This walk with ``out_h`` x ``out_w`` windows (a pooling's ceil mode adds a partial last window)."""
        twin = copy.copy(self)
        twin.OH, twin.OW = int(out_h), int(out_w)
        twin.key = (twin.N, *(getattr(twin, name) for name in _GEOMETRY))
        twin._hash = hash(twin.key)
        return twin


#: The gather of ``im2col`` and ``im2col_rows``: each work-item copies one window tap of one output pixel. ``{column}``:
#: the row of ``cols`` holding tap ``row`` of image ``b``; the sizes are kernel arguments in ``{params}``
#: (``_IM2COL``: shape-generic) or ``#define``d by ``{sizes}`` (``_IM2COL_ROWS``: one program per layer, its divisions
#: by constants).
_IM2COL_LAYOUT = """{pragmas}{sizes}
__kernel void netcl_{name}(__global const {st}* x, __global {st}* cols{params}) {{
    const {idx} l = ({idx})get_global_id(0);  /* output pixel oh * OW + ow */
    const {idx} L = ({idx})OH * OW;
    const {idx} row = ({idx})get_global_id(1);  /* (c, ki, kj) */
    if (l >= L || row >= ({idx})C * KH * KW) return;
    const {idx} b = ({idx})get_global_id(2);
    const {idx} kj = row % KW;
    const {idx} ki = (row / KW) % KH;
    const {idx} c = row / (KH * KW);
    const {idx} ow = l % OW;
    const {idx} oh = l / OW;
    const {idx} h = oh * SH - PH + ki * DH;
    const {idx} w = ow * SW - PW + kj * DW;
    const bool inside = h >= 0 && h < H && w >= 0 && w < W;
    cols[{column} * L + l] = inside ? x[((b * C + c) * H + h) * W + w] : ({st})0;
}}
"""

#: ``_IM2COL`` for CPU OpenCL devices: the same gather, its divisions by KW, KH and OW done by their
#: ``magic_div`` pairs (a vector has no integer division; these divisions were 7x the copy's cost on PoCL).
_IM2COL_CPU = """{pragmas}{div}
__kernel void netcl_im2col_cpu(__global const {st}* x, __global {st}* cols, const {idx} n, {geometry},
                               {magic}) {{
    const {idx} l = ({idx})get_global_id(0);  /* output pixel oh * OW + ow */
    const {idx} L = ({idx})OH * OW;
    if (l >= L) return;
    const {idx} row = ({idx})get_global_id(1);  /* (c, ki, kj) */
    const {idx} b = ({idx})get_global_id(2);
    const {idx} rows = NETCL_DIV(row, KW), c = NETCL_DIV(rows, KH);
    const {idx} kj = row - rows * KW, ki = rows - c * KH;
    const {idx} oh = NETCL_DIV(l, OW), ow = l - oh * OW;
    const {idx} h = oh * SH - PH + ki * DH;
    const {idx} w = ow * SW - PW + kj * DW;
    const bool inside = h >= 0 && h < H && w >= 0 && w < W;
    cols[(b * C * KH * KW + row) * L + l] = inside ? x[((b * C + c) * H + h) * W + w] : ({st})0;
}}
"""
_IM2COL_CPU_DIVISORS = ("KW", "KH", "OW")

#: ``im2col``'s kernel: cols (N, C*KH*KW, OH*OW), the receptive fields of each image, every size an argument.
_IM2COL = (
    _IM2COL_LAYOUT.replace("{sizes}", "")
    .replace("{name}", "im2col")
    .replace("{params}", ", const {idx} n, {geometry}")
    .replace("{column}", "(b * C * KH * KW + row)")
)

#: ``im2col_rows``'s kernel: cols (C*KH*KW, N*OH*OW), one product's rows (every image's pixels of a tap in one row),
#: the layer's sizes constants (as arguments, its divisions by them per element held it to a fifth of an H200's copy
#: bandwidth: benchmarks/RESULTS.md, "Thirty-fourth session").
_IM2COL_ROWS = (
    _IM2COL_LAYOUT.replace("{name}", "im2col_rows").replace("{params}", "").replace("{column}", "(row * N + b)")
)

#: The gather of ``col2im`` and ``gemm_backward_input``: each input pixel sums the column entries of the taps that
#: reach it. ``{column}``: the row of ``cols`` holding tap ``row`` of image ``b``; the sizes (n, C, H, W, KH, ...) are
#: kernel arguments in ``{params}`` (``_COL2IM``: shape-generic) or ``#define``d by ``{sizes}`` (``_COL2IM_ROWS``:
#: one program per layer, its divisions by constants); ``{finish}`` may add to the sum before its store.
_COL2IM_GATHER = """{pragmas}{sizes}
__kernel void netcl_{name}(__global const {st}* cols, __global {st}* x{params}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} w = gid % W;
    const {idx} h = (gid / W) % H;
    const {idx} c = (gid / (({idx})W * H)) % C;
    const {idx} b = gid / (({idx})W * H * C);
    const {idx} L = ({idx})OH * OW;
    {ct} acc = 0;
    {unroll}for ({idx} ki = 0; ki < KH; ++ki) {{
        const {idx} hh = h + PH - ki * DH;
        if (hh < 0 || hh % SH != 0 || hh / SH >= OH) continue;
        const {idx} oh = hh / SH;
        {unroll}for ({idx} kj = 0; kj < KW; ++kj) {{
            const {idx} ww = w + PW - kj * DW;
            if (ww < 0 || ww % SW != 0 || ww / SW >= OW) continue;
            const {idx} row = (c * KH + ki) * KW + kj;
            acc += ({ct})cols[{column} * L + oh * OW + ww / SW];
        }}
    }}
    {finish}x[gid] = ({st})acc;
}}
"""

#: ``col2im``'s kernel: cols (N, C*KH*KW, OH*OW), every size an argument (``_prepare_layout`` formats the rest).
_COL2IM = (
    _COL2IM_GATHER.replace("{sizes}", "")
    .replace("{name}", "col2im")
    .replace("{params}", ", const {idx} n, {geometry}")
    .replace("{column}", "(b * C * KH * KW + row)")
    .replace("{unroll}", "")
    .replace("{finish}", "")
)

#: ``_COL2IM`` for CPU OpenCL devices: the window (KH, KW, strides, padding, dilation) ``#define``d and its two loops
#: unrolled, a tap outside the columns read at a valid address and not added (selects, no ``continue``), the
#: divisions by W, H and C done by their ``magic_div`` pairs: straight-line code the work-item loop vectorizes (the
#: generic kernel's loops and divisions keep it scalar there). One program per window, as pooling's; the same sum in
#: the same order, so the same bits.
_COL2IM_CPU = """{pragmas}{div}{window}
__kernel void netcl_col2im_cpu(__global const {st}* cols, __global {st}* x, const {idx} n, const {idx} C,
                               const {idx} H, const {idx} W, const {idx} OH, const {idx} OW, {magic}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} rows = NETCL_DIV(gid, W), planes = NETCL_DIV(rows, H), b = NETCL_DIV(planes, C);
    const {idx} w = gid - rows * W, h = rows - planes * H, c = planes - b * C;
    const {idx} L = ({idx})OH * OW;
    {ct} acc = 0;
    _Pragma("unroll") for (int ki = 0; ki < KH; ++ki) {{
        const {idx} hh = h + PH - ki * DH;
        const int on_h = hh >= 0 && hh % SH == 0 && hh / SH < OH;
        _Pragma("unroll") for (int kj = 0; kj < KW; ++kj) {{
            const {idx} ww = w + PW - kj * DW;
            const int on = on_h && ww >= 0 && ww % SW == 0 && ww / SW < OW;
            const {idx} at = on ? ((b * C + c) * (KH * KW) + ki * KW + kj) * L + (hh / SH) * OW + ww / SW : 0;
            const {ct} v = ({ct})cols[at];
            acc = on ? acc + v : acc;
        }}
    }}
    x[gid] = ({st})acc;
}}
"""
_COL2IM_CPU_DIVISORS = ("W", "H", "C")
_COL2IM_CPU_WINDOW = ("KH", "KW", "SH", "SW", "PH", "PW", "DH", "DW")

#: ``gemm_backward_input``'s kernel: its columns per image, (N, C*KH*KW, OH*OW), or as one product's rows,
#: (C*KH*KW, N*OH*OW), every image's pixels of a tap in one row; an addend added after the sum (as an ``add`` of
#: the two would) where given.
_COL2IM_ROWS = _COL2IM_GATHER.replace("{name}", "col2im_rows")

#: Prepared im2col / col2im launches by (kernel, device, dtype, sizes, geometry): the sizes bound once.
_LAYOUTS = PlanCache("conv2d-im2col")


def _run(template: str, name: str, geo: ConvGeometry, src: Tensor, dst: Tensor) -> Tensor:
    key = (name, dst.device, dst.dtype, src.size, dst.size, geo.N, *geo.values)
    call = _LAYOUTS.plans.get(key)
    if call is None:
        call = _LAYOUTS.keep(key, _prepare_layout(template, name, geo, src.size, dst))
    call(src.data, dst.data)
    return dst


def _prepare_layout(
    template: str, name: str, geo: ConvGeometry, src_size: int, dst: Tensor, cpu_variant: bool = True
) -> Callable[..., None]:
    """``_run``'s launch of ``netcl_<name>`` for tensors of these sizes (src and dst passed per call);
    im2col on a CPU OpenCL device runs ``_IM2COL_CPU`` unless ``cpu_variant`` is False."""
    idx = index_ctype(src_size, dst.size)
    st, ct = storage_ctype(dst.dtype), compute_ctype(dst.dtype)
    extra: list[int] = []
    types = [None, None] + [index_dtype(idx)] * (1 + len(_GEOMETRY))
    if name == "im2col" and cpu_variant and not dst.device.is_gpu:
        template, name = _IM2COL_CPU, "im2col_cpu"
        extra = magic_div.values([getattr(geo, d) for d in _IM2COL_CPU_DIVISORS])
        types += magic_div.arg_types(_IM2COL_CPU_DIVISORS)
    elif name == "col2im" and cpu_variant and not dst.device.is_gpu:
        return _prepare_col2im_cpu(geo, src_size, dst)

    def source() -> str:
        return template.format(
            pragmas=pragmas([dst.dtype]),
            st=st,
            ct=ct,
            idx=idx,
            geometry=params(idx, _GEOMETRY),
            div=magic_div.macro(idx),
            magic=magic_div.params(_IM2COL_CPU_DIVISORS),
        )

    bound = {2 + i: int(v) for i, v in enumerate([dst.size, *geo.values, *extra])}
    resolved = get_kernel(("layers", name, st, idx), dst.device, source, f"netcl_{name}", types)
    if name.startswith("im2col"):
        grid = _im2col_grid(geo, resolved.max_local, several_rows=name != "im2col_cpu")
        if grid is None:
            return lambda *raw: None
        sizes: tuple = grid
    else:
        if dst.size <= 0:
            return lambda *raw: None
        local = resolved.max_local
        sizes = (round_up(dst.size, local), local)
    return PreparedLaunch.binding(resolved.kernel, *sizes, bound, dst.device.queue).call


def _prepare_col2im_cpu(geo: ConvGeometry, src_size: int, dst: Tensor) -> Callable[..., None]:
    """The launch of ``_COL2IM_CPU`` for these sizes (cols and x passed per call), its program the window's."""
    if dst.size <= 0:
        return lambda *raw: None
    idx = index_ctype(src_size, dst.size)
    st, ct = storage_ctype(dst.dtype), compute_ctype(dst.dtype)
    window = tuple(int(getattr(geo, name)) for name in _COL2IM_CPU_WINDOW)

    def source() -> str:
        return _COL2IM_CPU.format(
            pragmas=pragmas([dst.dtype]),
            div=magic_div.macro(idx),
            window="".join(f"\n#define {k} {v}" for k, v in zip(_COL2IM_CPU_WINDOW, window, strict=True)),
            st=st,
            ct=ct,
            idx=idx,
            magic=magic_div.params(_COL2IM_CPU_DIVISORS),
        )

    types = [None, None] + [index_dtype(idx)] * 6 + magic_div.arg_types(_COL2IM_CPU_DIVISORS)
    resolved = get_kernel(("layers", "col2im_cpu", st, idx, *window), dst.device, source, "netcl_col2im_cpu", types)
    values = [dst.size, geo.C, geo.H, geo.W, geo.OH, geo.OW]
    values += magic_div.values([getattr(geo, d) for d in _COL2IM_CPU_DIVISORS])
    bound = {2 + i: int(v) for i, v in enumerate(values)}
    local = resolved.max_local
    return PreparedLaunch.binding(resolved.kernel, round_up(dst.size, local), local, bound, dst.device.queue).call


@backend_op(_TWINS)
def im2col(x: Tensor, geo: ConvGeometry) -> Tensor:
    """x (N, C, H, W) -> cols (N, C*KH*KW, OH*OW)."""
    shape = (geo.N, geo.C * geo.KH * geo.KW, geo.OH * geo.OW)
    return _run(_IM2COL, "im2col", geo, x, Tensor.empty(shape, x.dtype, x.device))


def im2col_rows(x: Tensor, geo: ConvGeometry) -> Tensor:
    """x (N, C, H, W) -> cols (C*KH*KW, N*OH*OW), the layout of one product over the batch (OpenCL devices)."""
    shape = (geo.C * geo.KH * geo.KW, geo.N * geo.OH * geo.OW)
    dst = Tensor.empty(shape, x.dtype, x.device)
    key = ("im2col_rows", dst.device, dst.dtype, geo)
    call = _LAYOUTS.plans.get(key)
    if call is None:
        call = _LAYOUTS.keep(key, _prepare_im2col_rows(geo, x.size, dst))
    call(x.data, dst.data)
    return dst


def _prepare_im2col_rows(geo: ConvGeometry, x_size: int, dst: Tensor) -> Callable[..., None]:
    """The launch of ``_IM2COL_ROWS`` for this layer (x and cols passed per call)."""
    idx = index_ctype(x_size, dst.size)
    st = storage_ctype(dst.dtype)

    def source() -> str:
        return _IM2COL_ROWS.format(pragmas=pragmas([dst.dtype]), sizes=_layer_defines(geo), st=st, idx=idx)

    resolved = get_kernel(
        ("layers", "im2col_rows", st, idx, geo.key), dst.device, source, "netcl_im2col_rows", [None, None]
    )
    grid = _im2col_grid(geo, resolved.max_local, several_rows=True)
    if grid is None:
        return lambda *raw: None
    return PreparedLaunch.binding(resolved.kernel, *grid, {}, dst.device.queue).call


def _layer_defines(geo: ConvGeometry, **more: int) -> str:
    """``#define`` lines of a layout kernel whose program is one layer's: the batch N, the geometry (C, H, W, KH,
    ...) and ``more``."""
    sizes = {**more, "N": geo.N, **{name: getattr(geo, name) for name in _GEOMETRY}}
    return "".join(f"\n#define {name} {value}" for name, value in sizes.items())


def _im2col_grid(geo: ConvGeometry, max_local: int, several_rows: bool) -> tuple[tuple, tuple] | None:
    """(global, local) sizes of an im2col kernel: output pixels, rows (c, ki, kj), images; a work-group spans output
    pixels of one image and, where ``several_rows``, as many rows as fill it (else one: ``_IM2COL_CPU``'s divisions
    stay uniform in a group; one row of a small image, 16 pixels of a 4x4 one, a group makes more groups than a GPU
    launches fast). None for an empty grid."""
    grid = (geo.OH * geo.OW, geo.C * geo.KH * geo.KW, geo.N)
    if min(grid) <= 0:
        return None
    local = min(max_local, pow2_ceil(grid[0]))
    rows = max(1, min(max_local // local, pow2_ceil(grid[1]))) if several_rows else 1
    return (round_up(grid[0], local), round_up(grid[1], rows), grid[2]), (local, rows, 1)


@backend_op(_TWINS)
def col2im(cols: Tensor, geo: ConvGeometry) -> Tensor:
    """The adjoint of ``im2col``: cols (N, C*KH*KW, OH*OW) -> x (N, C, H, W), overlaps summed."""
    shape = (geo.N, geo.C, geo.H, geo.W)
    return _run(_COL2IM, "col2im", geo, cols, Tensor.empty(shape, cols.dtype, cols.device))


def gemm_forward(x: Tensor, w: Tensor, b: Tensor | None, geo: ConvGeometry) -> Tensor:
    """conv2d (groups 1, OpenCL devices) as one product of stored operands: ``w (O, C*KH*KW) @`` x's receptive
    fields laid out as rows (``im2col_rows``, (C*KH*KW, N*OH*OW)), the result's images moved in front of its channels
    by a copy, then the bias (O,) added where given. The GEMM, tensor cores included, reads no views (the implicit
    GEMM loads through the im2col addresses); which is faster for a layer is measured (``_gpu_algorithm``)."""
    n, o, length = geo.N, int(w.shape[0]), geo.OH * geo.OW
    y_rows = matmul(w.reshape(o, geo.C * geo.KH * geo.KW), im2col_rows(x, geo))  # (O, N*L)
    y = transpose(y_rows.reshape(o, n, length), (1, 0, 2)).reshape(n, o, geo.OH, geo.OW)
    return y if b is None else add(y, b.reshape(1, o, 1, 1))


def gemm_backward_input(
    grad: Tensor, w: Tensor, geo: ConvGeometry, batched: bool = False, addend: Tensor | None = None
) -> Tensor:
    """d conv2d / d x (groups 1, OpenCL devices) as a product of stored operands and a gather: the columns
    ``w^T (C*KH*KW, O) @ dy``, then each input pixel sums the columns of the taps that reach it (``_COL2IM_ROWS``:
    at stride 2 a quarter of the taps of a 3x3 window, on average), plus ``addend`` (x's shape and dtype, checked
    by the caller) where given. ``batched``: one product per image, ``(N, C*KH*KW, OH*OW)``, on dy as stored; else
    one product ``(C*KH*KW, N*OH*OW)`` of dy with its images moved behind its channels by a copy (one long product
    where the per-image ones are short). The GEMM, tensor cores included, reads no views either way."""
    n, o, length = geo.N, int(w.shape[0]), geo.OH * geo.OW
    w_rows = w.reshape(o, geo.C * geo.KH * geo.KW)
    if batched:
        cols = matmul(w_rows, grad.reshape(n, o, length), transpose_a=True)
    else:
        dy_rows = transpose(grad.reshape(n, o, length), (1, 0, 2))  # (O, N, L)
        cols = matmul(w_rows, dy_rows.reshape(o, n * length), transpose_a=True)
    x = Tensor.empty((geo.N, geo.C, geo.H, geo.W), cols.dtype, cols.device)
    key = ("col2im_rows", x.device, x.dtype, geo, batched, addend is not None)
    call = _LAYOUTS.plans.get(key)
    if call is None:
        call = _LAYOUTS.keep(key, _prepare_col2im_rows(geo, cols.size, x, batched, addend is not None))
    call(cols.data, x.data, x.data if addend is None else addend.data)
    return x


def _prepare_col2im_rows(
    geo: ConvGeometry, cols_size: int, x: Tensor, batched: bool, addend: bool
) -> Callable[..., None]:
    """The launch of ``_COL2IM_ROWS`` for this layer, column layout and addend or none (cols, x and the addend, x
    where there is none, passed per call): one work-item per input pixel."""
    idx = index_ctype(cols_size, x.size)
    st, ct = storage_ctype(x.dtype), compute_ctype(x.dtype)

    def source() -> str:
        return _COL2IM_ROWS.format(
            pragmas=pragmas([x.dtype]),
            sizes=_layer_defines(geo, n=x.size),
            params=f", __global const {st}* addend",
            column="(b * C * KH * KW + row)" if batched else "(row * N + b)",
            unroll="#pragma unroll\n    ",
            finish=f"acc = ({ct})addend[gid] + acc;\n    " if addend else "",
            st=st,
            ct=ct,
            idx=idx,
        )

    key = ("layers", "col2im_rows", st, idx, geo.key, batched, addend)
    resolved = get_kernel(key, x.device, source, "netcl_col2im_rows", [None, None, None])
    if x.size <= 0:
        return lambda *raw: None
    return PreparedLaunch.binding(
        resolved.kernel, round_up(x.size, resolved.max_local), resolved.max_local, {}, x.device.queue
    ).call


# ---- conv2d --------------------------------------------------------------------------------------
_GEOMETRIES = PlanCache("conv2d-geometry")


def check_conv2d(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    b_shape: Sequence[int] | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: Any,
) -> ConvGeometry:
    """Validate a conv2d call by shapes (ShapeError/ValueError naming the argument); returns its geometry
    (one shared object per signature: callers must not change it)."""
    key = (
        x_shape if type(x_shape) is tuple else UNKEYED,
        w_shape if type(w_shape) is tuple else UNKEYED,
        b_shape if b_shape is None or type(b_shape) is tuple else UNKEYED,
        window(stride),
        window(padding),
        window(dilation),
        groups if type(groups) is int else UNKEYED,
    )
    return _GEOMETRIES.planned(key, _check_conv2d, x_shape, w_shape, b_shape, stride, padding, dilation, groups)


def _check_conv2d(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    b_shape: Sequence[int] | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: Any,
) -> ConvGeometry:
    """``check_conv2d`` in full."""
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    if len(x_shape) != 4:
        raise ShapeError(f"conv2d: x must be 4-d (N, C, H, W), got shape {x_shape}")
    if len(w_shape) != 4:
        raise ShapeError(f"conv2d: w must be 4-d (out_channels, in_channels / groups, KH, KW), got shape {w_shape}")
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"conv2d: groups must be a positive int, got {groups!r}")
    groups = int(groups)
    out_ch, per_group = w_shape[0], w_shape[1]
    if x_shape[1] % groups or out_ch % groups:
        raise ValueError(
            f"conv2d: groups={groups} must divide both in_channels {x_shape[1]} (x shape {x_shape}) "
            f"and out_channels {out_ch} (w shape {w_shape})"
        )
    if per_group * groups != x_shape[1]:
        raise ShapeError(
            f"conv2d: w shape {w_shape} expects {per_group * groups} input channels "
            f"({per_group} per group x {groups} groups), x shape {x_shape} has {x_shape[1]}"
        )
    if b_shape is not None and tuple(b_shape) != (out_ch,):
        raise ShapeError(f"conv2d: b must have shape ({out_ch},) (one bias per output channel), got {tuple(b_shape)}")
    kernel = (int(w_shape[2]), int(w_shape[3]))
    if min(kernel) < 1:
        raise ShapeError(f"conv2d: w shape {w_shape} has an empty kernel")
    return ConvGeometry(
        x_shape,
        kernel,
        pair(stride, "stride", "conv2d", 1),
        pair(padding, "padding", "conv2d", 0),
        pair(dilation, "dilation", "conv2d", 1),
        "conv2d",
    )


def _grouped_weight(w: Tensor, groups: int) -> Tensor:
    out_ch = w.shape[0]
    return w.reshape(groups, out_ch // groups, w.size // out_ch)


#: On a host-BLAS CPU device the implicit kernels lose to im2col + BLAS below this reduction length (C*KH*KW); from
#: it on, which wins depends on the OpenCL compiler, so the first use of each layer times both on one image
#: (``_implicit_wins_on_host``; see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", conv.py).
HOST_IMPLICIT_MIN_K = 256


def _use_implicit(
    implicit: bool, a: Tensor, b: Tensor, bias: Tensor | None, groups: int, geo: ConvGeometry, kind: str = "fwd"
) -> bool:
    """Whether the implicit GEMM runs this pass (``kind`` "fwd", "dx" or "dw"; operands as
    ``conv_implicit.supports`` takes them)."""
    if not implicit or not conv_implicit.supports(a, b, bias, groups):
        return False
    if not (host_blas.enabled() and host_blas.host_memory_device(a.device)):
        return True
    if geo.C * geo.KH * geo.KW < HOST_IMPLICIT_MIN_K:
        return False
    out_ch = int(a.shape[1] if kind == "dw" else b.shape[0])
    return _implicit_wins_on_host(a.device, geo, out_ch, kind, a.dtype)


def _implicit_wins_on_host(device, geo: ConvGeometry, out_ch: int, kind: str, dtype) -> bool:
    """Whether the implicit GEMM beats im2col + a product (``gemm_cpu`` or the host BLAS) for this pass of this
    layer on a host-memory CPU device: measured at the first use (one image, scratch operands) and stored like a tile
    search (``tune.select(..., cpu=True)``); "implicit" without a measurement (``NETCL_TUNE=0``)."""
    from netcl.runtime import tune

    key = f"conv-algorithm-{kind}|{np.dtype(dtype).str}|{out_ch}|{geo.values}"
    trial = _AlgorithmTrial(device, geo, out_ch, kind, np.dtype(dtype))
    choice = tune.select(
        device, key, ["implicit", "im2col"], "implicit", trial, lambda c: {"algorithm": c}, lambda d: d["algorithm"],
        cpu=True,
    )  # fmt: skip
    return choice == "implicit"


#: The algorithms a pass of a layer may run on a GPU (``_gpu_algorithm``): Winograd (where it applies), the implicit
#: GEMM, or a product of stored operands beside a layout kernel: the forward's ``gemm_forward`` ("gemm"), the input
#: gradient's ``gemm_backward_input`` as one long product ("gemm") or one product per image ("batched-gemm"). The
#: weight gradient runs Winograd where it applies, searched only against its variants (``WINOGRAD_TF32``,
#: ``WINOGRAD_BF16X3``).
_ALGORITHMS = {
    "fwd": ("winograd", "implicit", "gemm"),
    "dx": ("winograd", "implicit", "gemm", "batched-gemm"),
    "dw": ("winograd",),
}
#: A further candidate of every pass where "high" runs Winograd's products as tf32x3 (``_winograd_precision``):
#: F(2x2) with its products at tf32, the current precision. Its error is the implicit GEMM's on tf32 (F(2x2)'s
#: transforms barely grow the products' rounding; F(4x4)'s grow it about 4x, so F(4x4) keeps tf32x3), and at
#: 128-512 channels it is the faster pass (see benchmarks/RESULTS.md, "Thirty-sixth session").
WINOGRAD_TF32 = "winograd-tf32"
#: And where tensor cores take bf16x3: F(4x4) with its products at "bf16x3" (each operand as two bf16 parts, about
#: 16 bits: F(4x4)'s growth of the products' rounding stays far under tf32's) at half tf32x3's tensor-core work.
WINOGRAD_BF16X3 = "winograd-bf16x3"

#: The largest share of a device's global memory the column buffer of a "gemm" path (C*KH*KW x N*OH*OW values) may
#: take; a layer whose columns are larger keeps Winograd or the implicit GEMM (no buffer) without a search.
_COLUMNS_SHARE = 1 / 16


def _gpu_algorithm(
    kind: str, implicit: bool, a: Tensor, b: Tensor, groups: int, geo: ConvGeometry, out_ch: int, tile: int,
    products: str | None, asked: bool = False,
) -> str:  # fmt: skip
    """Which of ``_ALGORITHMS[kind]`` runs this pass ("fwd": a = x, b = w; "dx": a = the upstream gradient, b = w;
    "dw": a = the upstream gradient, b = x) of a layer, Winograd F(``tile`` x ``tile``) a candidate where ``tile``
    (its products at ``products``; where those are "tf32x3", ``WINOGRAD_TF32`` too, and ``WINOGRAD_BF16X3`` where
    F(4x4) runs and tensor cores take bf16x3), and the choice without a search where the caller ``asked`` for it
    (``winograd=True``, 2 or 4) or there is one candidate. On a GPU: measured at the
    layer's first use at its batch size (rounded up to a power of two) and matmul precision, by the device time of
    each path's kernels, and stored like a tile search (``tune.select``). Without a measurement (``NETCL_TUNE=0``,
    deterministic algorithms), off GPUs and where the columns would take more than ``_COLUMNS_SHARE`` of the
    device's memory: Winograd where ``tile``, else the implicit GEMM."""
    from netcl.runtime import tune
    from netcl.runtime.ops import gemm_mma

    fallback = "winograd" if tile else "implicit"
    device = a.device
    candidates = [name for name in _ALGORITHMS[kind] if tile or name != "winograd"]
    if tile and products == "tf32x3":
        candidates.insert(1, WINOGRAD_TF32)
        if tile == 4 and gemm_mma.available(device, "bf16x3"):
            candidates.insert(1, WINOGRAD_BF16X3)
    if (tile and asked) or not implicit or groups != 1 or not device.is_gpu or len(candidates) < 2:
        return fallback
    if not conv_implicit.supports(a, b, None, groups):
        return fallback
    columns = geo.C * geo.KH * geo.KW * geo.N * geo.OH * geo.OW * a.dtype.itemsize
    if columns > min(device.max_alloc_size, device.global_mem_size * _COLUMNS_SHARE):
        return fallback
    mode = conv_implicit.mma_mode(device, a.dtype)
    key = f"conv-{kind}-algorithm|{a.dtype.str}|{mode}|{tune.pow2_class(geo.N)}|{out_ch}|{geo.values}"
    if tile:  # another list of candidates: its own key (a strided layer's keeps the key it had before Winograd)
        key += f"|winograd {tile}" + (" or 2 on tf32" if WINOGRAD_TF32 in candidates else "")
        key += " or 4 on bf16x3" if WINOGRAD_BF16X3 in candidates else ""
    trial = _WholeBatchTrial(device, geo, out_ch, kind, a.dtype, tile, products)

    def decode(stored: dict[str, Any]) -> str:  # a ValueError for a choice this version does not offer: searched again
        if stored["algorithm"] not in candidates:
            raise ValueError(f"unknown {kind} algorithm {stored['algorithm']!r}")
        return stored["algorithm"]

    return tune.select(device, key, candidates, fallback, trial, lambda c: {"algorithm": c}, decode)


#: The scratch operands a pass's trial reads (``_AlgorithmTrial``): x, the weights w, the upstream gradient g.
_TRIAL_OPERANDS = {"fwd": ("x", "w"), "dx": ("w", "g"), "dw": ("x", "g")}


class _AlgorithmTrial:
    """One pass of one layer on scratch operands, by the implicit GEMM, by im2col, by a product of stored operands
    (``gemm_forward``, ``gemm_backward_input``) or by Winograd F(``tile`` x ``tile``) (its products at
    ``products``): at batch 1, or at the layer's batch where ``whole`` (the operands are made at the first trial:
    a stored choice needs none)."""

    def __init__(
        self, device, geo: ConvGeometry, out_ch: int, kind: str, dtype: np.dtype, whole: bool = False, tile: int = 0,
        products: str | None = None,
    ) -> None:  # fmt: skip
        self.device, self.geo, self.out_ch, self.kind, self.dtype = device, geo, out_ch, kind, dtype
        self.whole, self.tile, self.products = whole, tile, products
        self.scratch: tuple[ConvGeometry, dict[str, Tensor]] | None = None

    def _scratch(self) -> tuple[ConvGeometry, dict[str, Tensor]]:
        """The trial's geometry (one image unless ``whole``) and the operands its pass reads (uniform scratch
        values; the seeds those of x, w, g in that order, whichever are made)."""
        from netcl.runtime import tune

        if self.scratch is None:
            geo, out_ch = self.geo, self.out_ch
            n = geo.N if self.whole else 1
            one = ConvGeometry(
                (n, geo.C, geo.H, geo.W),
                (geo.KH, geo.KW),
                (geo.SH, geo.SW),
                (geo.PH, geo.PW),
                (geo.DH, geo.DW),
                "trial",
            )
            shapes = {
                "x": (n, geo.C, geo.H, geo.W),
                "w": (out_ch, geo.C, geo.KH, geo.KW),
                "g": (n, out_ch, one.OH, one.OW),
            }
            used = _TRIAL_OPERANDS[self.kind]
            operands = {
                name: tune.trial_operand(int(np.prod(shape)), self.dtype, self.device, seed).reshape(*shape)
                for seed, (name, shape) in enumerate(shapes.items(), start=1)
                if name in used
            }
            self.scratch = (one, operands)
        return self.scratch

    def __call__(self, algorithm: str):
        geo, operands = self._scratch()
        x, w, g = operands.get("x"), operands.get("w"), operands.get("g")
        variant = _winograd_variant(algorithm, self.tile, self.products)
        if variant is not None:
            tile, products = variant
            run = {
                "fwd": lambda: conv_winograd.forward(x, w, None, geo, tile),
                "dx": lambda: conv_winograd.backward_input(g, w, geo, None, tile),
                "dw": lambda: conv_winograd.backward_weight(g, x, geo, None, tile),
            }[self.kind]
            return at_matmul_precision(products, run)
        if algorithm in ("gemm", "batched-gemm"):
            if self.kind == "fwd":
                return lambda: gemm_forward(x, w, None, geo)
            return lambda: gemm_backward_input(g, w, geo, batched=algorithm == "batched-gemm")
        if algorithm == "implicit":
            passes = {
                "fwd": lambda: conv_implicit.forward(x, w, None, geo),
                "dx": lambda: conv_implicit.backward_input(g, w, geo),
                "dw": lambda: conv_implicit.backward_weight(g, x, self.out_ch, geo),
            }
        else:
            step, pad, dil = (geo.SH, geo.SW), (geo.PH, geo.PW), (geo.DH, geo.DW)
            passes = {
                "fwd": lambda: conv2d(x, w, None, step, pad, dil, implicit=False),
                "dx": lambda: conv2d_backward_input(g, w, geo, 1, implicit=False),
                "dw": lambda: conv2d_backward_weight(
                    g, x, (self.out_ch, geo.C, geo.KH, geo.KW), geo, 1, implicit=False
                ),
            }
        return passes[self.kind]


class _WholeBatchTrial(_AlgorithmTrial):
    """``_AlgorithmTrial`` at the layer's batch, timed by the summed device time of its kernels: the gather
    path's three launches against the implicit GEMM's one, timed between two queue markers, measured 3-7x their
    device time on an H200 (the launches' host latency, which a replayed step does not pay)."""

    def __init__(
        self, device, geo: ConvGeometry, out_ch: int, kind: str, dtype: np.dtype, tile: int = 0,
        products: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(device, geo, out_ch, kind, dtype, True, tile, products)

    def timed(self, run: Callable[[], Any]) -> float:
        """``tune.search``'s timing of one run, in ms."""
        from netcl.profiler import profile

        with profile(self.device) as recorded:
            run()
        return sum(event.self_device_time for event in recorded.events()) / 1e3


def _winograd_tile(
    winograd: bool | int | None, implicit: bool, a: Tensor, b: Tensor, groups: int, geo, op: str, out_ch: int
) -> tuple[int, str | None]:
    """The Winograd tile m of F(m x m, 3 x 3) that runs this pass, 0 for none (``a``, ``b``: its two
    operands: x and w, the upstream gradient and w, or the upstream gradient and x), and the matmul
    precision its products run at when not the current one (``_winograd_precision``).

    ``winograd=None`` picks it for float32 3x3 stride-1 layers of >= ``conv_winograd.MIN_CHANNELS``
    input and output channels (OpenCL devices, the NumPy backend) at the "highest" or "tf32x3" matmul
    precision (its 16 products then run in that precision), and at "high" where tensor cores take
    tf32x3 too (its products then run as tf32x3, ``_winograd_precision``: more accurate than tf32's
    rounding and, as F(4x4), faster than the implicit GEMM on tf32; a GPU's search may pick F(2x2) on tf32
    or F(4x4) on bf16x3 instead, ``WINOGRAD_TF32``, ``WINOGRAD_BF16X3``); "medium" keeps the implicit GEMM
    on the mma kernel, whose rounding Winograd's transforms would only add to. The tile is what
    ``conv_winograd.default_tile`` says (``NETCL_WINOGRAD``; unset: 4 where tf32x3 runs on tensor
    cores, else 2; 0 turns this choice off); True asks for it with that tile, 2 or 4 with that tile
    (an error where it cannot run); False never. ``implicit=False`` forces im2col either way.
    """
    if winograd is False or not implicit:
        return 0, None
    if winograd is not None and winograd is not True and winograd not in (2, 4):
        raise ValueError(f"{op}: winograd must be None, True, False, 2 or 4, got {winograd!r}")
    fits = conv_winograd.applies(a, b, groups, geo)
    if winograd is not None and not fits:
        raise ValueError(
            f"{op}: winograd={winograd} needs float32 operands (OpenCL or NumPy backend), groups 1, a 3x3 "
            f"window, stride 1, dilation 1 and padding <= 2; got {a.dtype} on {a.device.kind}, groups "
            f"{groups}, window {(geo.KH, geo.KW)}, stride {(geo.SH, geo.SW)}, dilation {(geo.DH, geo.DW)}, "
            f"padding {(geo.PH, geo.PW)}"
        )
    mode = conv_implicit.mma_mode(a.device, float32)
    products = _winograd_precision(a.device, mode)
    three = mode in ("tf32x3", "bf16x3") or products is not None
    if winograd is not None:
        return (int(winograd) if winograd is not True else (conv_winograd.default_tile(three) or 2)), products
    picked = fits and min(geo.C, out_ch) >= conv_winograd.MIN_CHANNELS and (mode is None or three)
    return (conv_winograd.default_tile(three) if picked else 0), products


def _winograd_precision(device, mode: str | None) -> str | None:
    """The matmul precision Winograd's products run at when it is not the current one (whose
    tensor-core mode on ``device`` is ``mode``): "tf32x3" where the current precision asks for tf32 on tensor cores
    that take tf32x3 as well (faster there than the implicit GEMM on tf32, at fp32-class error; see
    benchmarks/RESULTS.md, "Measurements moved out of source docstrings", conv.py); None: the current one."""
    from netcl.runtime.ops import gemm_mma

    if device.kind != "opencl" or mode != "tf32":
        return None
    return "tf32x3" if gemm_mma.available(device, "tf32x3") else None


def _winograd_variant(algorithm: str, tile: int, products: str | None) -> tuple[int, str | None] | None:
    """The (tile, products' precision) a Winograd ``algorithm`` runs ("winograd": the layer's ``tile`` and
    ``products``; ``WINOGRAD_TF32``: F(2x2) at the current precision; ``WINOGRAD_BF16X3``: F(4x4) on bf16x3), None
    for another path."""
    if algorithm == "winograd":
        return tile, products
    if algorithm == WINOGRAD_TF32:
        return 2, None
    if algorithm == WINOGRAD_BF16X3:
        return 4, "bf16x3"
    return None


_FORWARDS = PlanCache("conv2d")


def conv2d(
    x: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    stride: int | Pair = 1,
    padding: int | Pair = 0,
    dilation: int | Pair = 1,
    groups: int = 1,
    *,
    implicit: bool = True,
    winograd: bool | int | None = None,
    keep: list | None = None,
    gather: list | None = None,
) -> Tensor:
    """Cross-correlation of x (N, C, H, W) with w (O, C/groups, KH, KW), plus bias b (O,): (N, O, OH, OW).

    ``implicit=False`` forces im2col + matmul where the implicit GEMM would run (see the module
    docstring); ``winograd`` chooses Winograd's F(m x m, 3 x 3) for 3x3 stride-1 layers
    (``_winograd_tile``: None picks it by layer, True / 2 / 4 ask for it, False never). The choice is
    made once per call signature (``call_plans``). ``keep``: a list to which a Winograd forward appends x's
    input transform (``conv_winograd.InputTransform``), for ``conv2d_backward_weight(..., transformed=)``;
    ``gather``: one to which it appends the output's per-channel moments (``moments.ChannelMoments``), for
    ``batchnorm.batch_norm_forward(..., moments=)``, where ``conv_winograd.gathers_moments``. The other paths
    append nothing.
    """
    key = (
        tensor_sig(x) if x is not None else UNKEYED,
        tensor_sig(w) if w is not None else UNKEYED,
        tensor_sig(b),
        window(stride),
        window(padding),
        window(dilation),
        groups if type(groups) is int else UNKEYED,
        exact(implicit, bool),
        exact(winograd, type(None), bool, int),
        context(),
    )
    plan = _FORWARDS.plans.get(key)
    if plan is None:
        plan = _FORWARDS.keep(
            complete(key), _forward_plan(x, w, b, stride, padding, dilation, groups, implicit, winograd)
        )
    return plan(x, w, b, keep, gather)


def _forward_plan(
    x: Tensor, w: Tensor, b: Tensor | None, stride: Any, padding: Any, dilation: Any, groups: Any, implicit: bool,
    winograd: bool | int | None,
) -> Callable[[Tensor, Tensor, Tensor | None, list | None, list | None], Tensor]:  # fmt: skip
    """``conv2d``'s checks and choice of path for these arguments, as ``run(x, w, b, keep, gather) -> y``."""
    for name, value in (("x", x), ("w", w), ("b", b)):
        if not isinstance(value, Tensor) and not (name == "b" and value is None):
            raise TypeError(f"conv2d: {name} must be a Tensor, got {type(value).__name__}")
    device = device_of((x, w) if b is None else (x, w, b), "conv2d")
    if device.kind == "opencl":  # the NumPy backend computes bfloat16 in float32; no OpenCL kernel here does
        for value in (x, w, b):
            refuse_bfloat16("conv2d", None if value is None else value.dtype)
    geo = check_conv2d(x.shape, w.shape, None if b is None else b.shape, stride, padding, dilation, groups)
    out_ch = int(w.shape[0])
    tile, products = (
        _winograd_tile(winograd, implicit, x, w, groups, geo, "conv2d", out_ch)
        if b is None or b.dtype == float32
        else (0, None)
    )
    if _pointwise(implicit, x, w, groups, geo):
        return lambda x, w, b, keep, gather: _pointwise_forward(x, w, b, geo)
    algorithm = _gpu_algorithm("fwd", implicit, x, w, groups, geo, out_ch, tile, products, winograd is not None)
    variant = _winograd_variant(algorithm, tile, products)
    if variant is not None:
        m, precision = variant
        gathers = conv_winograd.gathers_moments(device)

        def winograd(x: Tensor, w: Tensor, b: Tensor | None, keep: list | None, gather: list | None) -> Tensor:
            return conv_winograd.forward(x, w, b, geo, m, keep=keep, gather=gather if gathers else None)

        return at_matmul_precision(precision, winograd)
    if algorithm == "gemm":
        return lambda x, w, b, keep, gather: gemm_forward(x, w, b, geo)
    if _use_implicit(implicit, x, w, b, groups, geo):
        return lambda x, w, b, keep, gather: conv_implicit.forward(x, w, b, geo)
    g = int(groups)
    return lambda x, w, b, keep, gather: _im2col_forward(x, w, b, geo, g)


def _im2col_forward(x: Tensor, w: Tensor, b: Tensor | None, geo: ConvGeometry, g: int) -> Tensor:
    cols = im2col(x, geo).reshape(geo.N, g, geo.C // g * geo.KH * geo.KW, geo.OH * geo.OW)
    weights = _grouped_weight(w, g)
    if b is not None and g == 1:  # the bias in a CPU product kernel's store where one runs the product
        summed = product_plus_rows(weights, cols, b)
        if summed is not None:
            return summed.reshape(geo.N, w.shape[0], geo.OH, geo.OW)
    out = matmul(weights, cols).reshape(geo.N, w.shape[0], geo.OH, geo.OW)
    if b is not None:
        out = add(out, b.reshape(1, w.shape[0], 1, 1))
    return out


def _pointwise(implicit: bool, a: Tensor, b: Tensor, groups: int, geo: ConvGeometry) -> bool:
    """Whether a pass of this layer is one batched product of the stored tensors (a 1x1 window at
    stride 1, no padding, groups 1, operands of one float dtype); ``implicit=False`` keeps im2col."""
    window = (geo.KH, geo.KW, geo.SH, geo.SW, geo.PH, geo.PW)
    return implicit and int(groups) == 1 and window == (1, 1, 1, 1, 0, 0) and a.dtype == b.dtype and a.dtype.kind == "f"


def _pointwise_forward(x: Tensor, w: Tensor, b: Tensor | None, geo: ConvGeometry) -> Tensor:
    """conv2d of a 1x1 layer (``_pointwise``): ``w (O, C) @ x[n] (C, H*W)`` for every image, NCHW already."""
    out_ch = int(w.shape[0])
    y = matmul(w.reshape(out_ch, geo.C), x.reshape(geo.N, geo.C, geo.H * geo.W))
    if b is not None:
        y = add(y, b.reshape(1, out_ch, 1))
    return y.reshape(geo.N, out_ch, geo.OH, geo.OW)


def _pointwise_backward_input(grad: Tensor, w: Tensor, geo: ConvGeometry, addend: Tensor | None) -> Tensor:
    """d x of a 1x1 layer: ``w (O, C)^T @ grad[n] (O, H*W)``, ``addend`` summed in the product's store."""
    out_ch = int(w.shape[0])
    g3 = grad.reshape(geo.N, out_ch, geo.OH * geo.OW)
    extra = None if addend is None else addend.reshape(geo.N, geo.C, geo.H * geo.W)
    dx = matmul(w.reshape(out_ch, geo.C), g3, transpose_a=True, addend=extra)
    return dx.reshape(geo.N, geo.C, geo.H, geo.W)


#: Whether the runtime's matmul reads a stored operand transposed (``transpose_a=`` / ``transpose_b=``).
_MATMUL_TRANSPOSES = "transpose_a" in inspect.signature(matmul).parameters


def _matmul_t(a: Tensor, b: Tensor, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    """``a @ b`` with a's / b's last two axes swapped: in the GEMM when it can, else by transpose kernels."""
    if _MATMUL_TRANSPOSES:
        return matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    swap_a = transpose(a, (*range(a.ndim - 2), a.ndim - 1, a.ndim - 2)) if transpose_a else a
    swap_b = transpose(b, (*range(b.ndim - 2), b.ndim - 1, b.ndim - 2)) if transpose_b else b
    return matmul(swap_a, swap_b)


_GRADIENTS = PlanCache("conv2d-gradient")


def _gradient_key(
    kind: str, a: Tensor, b: Tensor, geo: Any, groups: Any, implicit: Any, winograd: Any, addend: Any, extra: Any = None
) -> tuple[Any, ...]:
    """The plan key of one gradient pass (``extra``: what else the pass's result depends on, w's shape for dw)."""
    return (
        kind,
        tensor_sig(a) if a is not None else UNKEYED,
        tensor_sig(b) if b is not None else UNKEYED,
        geo if type(geo) is ConvGeometry else UNKEYED,
        groups if type(groups) is int else UNKEYED,
        exact(implicit, bool),
        exact(winograd, type(None), bool, int),
        tensor_sig(addend),
        extra,
        context(),
    )


def _gradient(
    kind: str,
    a: Tensor,
    b: Tensor,
    groups: int,
    geo: ConvGeometry,
    out_ch: int,
    implicit: bool,
    winograd: bool | int | None,
    addend: bool,
    paths: dict[str, Callable[..., Any]],
) -> Callable[..., Tensor]:
    """The plan of one gradient pass (``kind`` "dx" or "dw", operands ``a``, ``b``, an addend when ``addend``)
    as ``run(a, b, addend[, transformed]) -> result`` (``transformed``: the weight gradient's, which the paths
    of ``paths`` take where they read it, ``conv2d_backward_weight``): one batched product of a 1x1 layer
    (``paths["pointwise"]``, where given); Winograd where asked for; where ``paths`` has "gemm" (the input
    gradient) the path ``_gpu_algorithm`` measured on a GPU, Winograd, the implicit GEMM or the product of stored
    operands and gather (``paths["gemm"](batched)`` makes its run, the addend summed in its gather), else Winograd
    where it applies (``paths["winograd"](tile, products)`` makes its run; the variant ``_gpu_algorithm``
    measured where it has two); then the implicit GEMM (``paths["implicit"]``, the addend summed in its store in
    float32), else im2col (``paths["im2col"]``, taking no addend). Where a path cannot take the addend it is
    added by an ``add``."""
    op = "conv2d_backward_input" if kind == "dx" else "conv2d_backward_weight"
    tile, products = _winograd_tile(winograd, implicit, a, b, groups, geo, op, out_ch)
    if "pointwise" in paths and _pointwise(implicit, a, b, groups, geo):
        return paths["pointwise"]
    if "gemm" in paths or tile:  # searched (Winograd where asked for; the weight gradient among Winograd's variants)
        algorithm = _gpu_algorithm(kind, implicit, a, b, groups, geo, out_ch, tile, products, winograd is not None)
    else:
        algorithm = "implicit"
    variant = _winograd_variant(algorithm, tile, products)
    if variant is not None:
        return paths["winograd"](*variant)
    if algorithm != "implicit":
        return paths["gemm"](algorithm == "batched-gemm")
    if _use_implicit(implicit, a, b, None, groups, geo, kind):
        run = paths["implicit"]
        if not addend or a.dtype == float32:
            return run
        return lambda a, b, extra, transformed=None: add(extra, run(a, b, None))
    im2col_run = paths["im2col"]
    if not addend:
        return lambda a, b, extra, transformed=None: im2col_run(a, b)
    return lambda a, b, extra, transformed=None: add(extra, im2col_run(a, b))


def conv2d_backward_input(
    grad: Tensor,
    w: Tensor,
    geo: ConvGeometry,
    groups: int,
    *,
    implicit: bool = True,
    addend: Tensor | None = None,
    winograd: bool | int | None = None,
) -> Tensor:
    """d conv2d / d x for upstream ``grad`` (N, O, OH, OW).

    ``addend`` (a tensor of x's shape and grad's dtype): the result is ``addend + d x``, summed in the
    implicit GEMM's or Winograd's store where it runs in float32, else by an ``add``. ``implicit`` and
    ``winograd`` as in ``conv2d``; the path is chosen once per call signature (``call_plans``)."""
    key = _gradient_key("dx", grad, w, geo, groups, implicit, winograd, addend)
    plan = _GRADIENTS.plans.get(key)
    if plan is None:
        if addend is not None:
            _check_addend("conv2d_backward_input", addend, (geo.N, geo.C, geo.H, geo.W), grad)
        paths = {
            "winograd": lambda tile, products: at_matmul_precision(
                products, lambda grad, w, extra: conv_winograd.backward_input(grad, w, geo, extra, tile)
            ),
            "pointwise": lambda grad, w, extra: _pointwise_backward_input(grad, w, geo, extra),
            "gemm": lambda batched: lambda grad, w, extra: gemm_backward_input(grad, w, geo, batched, extra),
            "implicit": lambda grad, w, extra: conv_implicit.backward_input(grad, w, geo, extra),
            "im2col": lambda grad, w: _im2col_backward_input(grad, w, geo, groups),
        }
        made = _gradient("dx", grad, w, groups, geo, int(w.shape[0]), implicit, winograd, addend is not None, paths)
        plan = _GRADIENTS.keep(complete(key), made)
    return plan(grad, w, addend)


def _im2col_backward_input(grad: Tensor, w: Tensor, geo: ConvGeometry, groups: int) -> Tensor:
    g = int(groups)
    w3 = _grouped_weight(w, g)
    g4 = grad.reshape(geo.N, g, w.shape[0] // g, geo.OH * geo.OW)
    cols = _matmul_t(w3, g4, transpose_a=True)  # (N, g, K, L)
    return col2im(cols.reshape(geo.N, geo.C * geo.KH * geo.KW, geo.OH * geo.OW), geo)


def conv2d_backward_weight(
    grad: Tensor,
    x: Tensor,
    w_shape: Sequence[int],
    geo: ConvGeometry,
    groups: int,
    *,
    implicit: bool = True,
    addend: Tensor | None = None,
    winograd: bool | int | None = None,
    transformed: conv_winograd.InputTransform | None = None,
) -> Tensor:
    """d conv2d / d w for upstream ``grad`` (N, O, OH, OW): sum over the batch of grad @ cols^T.

    ``addend`` (a tensor of w's shape and grad's dtype): the result is ``addend + d w``, summed in the
    implicit GEMM's or Winograd's store where it runs in float32, else by an ``add``. ``implicit`` and
    ``winograd`` as in ``conv2d``; the path is chosen once per call signature (``call_plans``).
    ``transformed``: x's input transform kept by the forward (``conv2d(..., keep=)``), which Winograd reads
    instead of transforming x again where it runs at the same tile (the same bits)."""
    shape_key = w_shape if type(w_shape) is tuple else UNKEYED
    key = _gradient_key("dw", grad, x, geo, groups, implicit, winograd, addend, shape_key)
    try:
        plan = _GRADIENTS.plans.get(key)
    except TypeError:  # an unhashable w_shape
        plan, key = None, (UNKEYED,)
    if plan is None:
        if addend is not None:
            _check_addend("conv2d_backward_weight", addend, w_shape, grad)
        out_ch = int(w_shape[0])
        paths = {
            "winograd": lambda tile, products: at_matmul_precision(
                products,
                lambda grad, x, extra, transformed: conv_winograd.backward_weight(
                    grad, x, geo, extra, tile, kept=transformed
                ),
            ),
            "implicit": lambda grad, x, extra, transformed: conv_implicit.backward_weight(grad, x, out_ch, geo, extra),
            "im2col": lambda grad, x: _im2col_backward_weight(grad, x, w_shape, geo, groups),
        }
        made = _gradient("dw", grad, x, groups, geo, out_ch, implicit, winograd, addend is not None, paths)
        plan = _GRADIENTS.keep(complete(key), made)
    return plan(grad, x, addend, transformed)


def _im2col_backward_weight(grad: Tensor, x: Tensor, w_shape: Sequence[int], geo: ConvGeometry, groups: int) -> Tensor:
    g = int(groups)
    out_ch = int(w_shape[0])
    K = geo.C // g * geo.KH * geo.KW
    cols = im2col(x, geo).reshape(geo.N, g, K, geo.OH * geo.OW)
    g4 = grad.reshape(geo.N, g, out_ch // g, geo.OH * geo.OW)
    per_image = _matmul_t(g4, cols, transpose_b=True)  # (N, g, O/g, K)
    total = per_image.reshape(g, out_ch // g, K) if geo.N == 1 else reduce_sum(per_image, axis=0)  # N 0: zeros
    return total.reshape(tuple(int(d) for d in w_shape))


def _check_addend(op: str, addend: Tensor, shape: Sequence[int], grad: Tensor) -> None:
    if not isinstance(addend, Tensor):
        raise TypeError(f"{op}: addend must be a Tensor, got {type(addend).__name__}")
    want = tuple(int(d) for d in shape)
    if tuple(addend.shape) != want or addend.dtype != grad.dtype:
        raise ShapeError(
            f"{op}: addend must have shape {want} and the gradient's dtype {grad.dtype}, "
            f"got {tuple(addend.shape)} {addend.dtype}"
        )
    device_of((grad, addend), op)


def conv2d_backward_bias(grad: Tensor, addend: Tensor | None = None) -> Tensor:
    """d conv2d / d b: the upstream gradient summed over batch and space (plus ``addend``, of b's shape
    and grad's dtype, added in the sum's last store)."""
    return reduce_sum(grad, axis=(0, 2, 3), addend=addend)
