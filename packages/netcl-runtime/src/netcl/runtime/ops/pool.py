"""2-D pooling on NCHW: ``max_pool2d``, ``avg_pool2d``, ``adaptive_avg_pool2d``, with torch's ``ceil_mode``
(a last, partial window where one starts inside the input or its left / top padding) and ``count_include_pad``
(avg: whether padding cells count in the divisor; a window running past the padded input never counts those
cells, as in torch).

Forwards give each output element one work-item that walks its window. Backwards give each
*input* element one work-item that visits the windows covering it and gathers their gradient,
so nothing is accumulated with atomics and results are deterministic. ``max_pool2d_backward``
recomputes each covering window's arg-max from x (the first maximum in row-major order, NaN
winning, as PyTorch) instead of storing indices, so the forward keeps no state. Every size is a
kernel argument (one program per dtype and index width). On a CPU OpenCL device unpadded max pooling runs
``pool_cpu``'s kernels instead (the window compiled in, so the work-items vectorize; same results, bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.core.dtypes import refuse_bfloat16
from netcl.core.errors import ShapeError
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops import pool_cpu
from netcl.runtime.ops._common import compute_ctype, get_kernel, pragmas, round_up, storage_ctype
from netcl.runtime.ops._grid import index_ctype, index_dtype, params
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.call_plans import UNKEYED, PlanCache, exact, window
from netcl.runtime.ops.conv import ConvGeometry, pair

_TWINS = "netcl.runtime.numpy_twins.pool"

_POOL = ["n", "H", "W", "OH", "OW", "KH", "KW", "SH", "SW", "PH", "PW"]

_MAX_ARGMAX = """
inline {idx} netcl_window_argmax(__global const {st}* x, const {idx} plane, const {idx} oh, const {idx} ow,
                                 const {idx} H, const {idx} W, const {idx} KH, const {idx} KW,
                                 const {idx} SH, const {idx} SW, const {idx} PH, const {idx} PW) {{
    {ct} best = -INFINITY;
    {idx} at = -1;
    for ({idx} ki = 0; ki < KH; ++ki) {{
        const {idx} h = oh * SH - PH + ki;
        if (h < 0 || h >= H) continue;
        for ({idx} kj = 0; kj < KW; ++kj) {{
            const {idx} w = ow * SW - PW + kj;
            if (w < 0 || w >= W) continue;
            const {ct} v = ({ct})x[plane + h * W + w];
            if (at < 0 || v > best || (v != v && best == best)) {{ best = v; at = h * W + w; }}
        }}
    }}
    return at;
}}
"""

_MAX_FORWARD = """{pragmas}{argmax}
__kernel void netcl_max_pool(__global const {st}* x, __global {st}* out, {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} ow = gid % OW;
    const {idx} oh = (gid / OW) % OH;
    const {idx} plane = (gid / (({idx})OW * OH)) * H * W;
    const {idx} at = netcl_window_argmax(x, plane, oh, ow, H, W, KH, KW, SH, SW, PH, PW);
    out[gid] = x[plane + at];
}}
"""

_MAX_BACKWARD = """{pragmas}{argmax}
__kernel void netcl_max_pool_backward(__global const {st}* x, __global const {st}* g, __global {st}* gx,
                                      {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} w = gid % W;
    const {idx} h = (gid / W) % H;
    const {idx} p = gid / (({idx})W * H);
    const {idx} plane = p * H * W;
    const {idx} oh_lo = max(({idx})0, (h + PH - KH + SH) / SH);
    const {idx} oh_hi = min(({idx})OH - 1, (h + PH) / SH);
    const {idx} ow_lo = max(({idx})0, (w + PW - KW + SW) / SW);
    const {idx} ow_hi = min(({idx})OW - 1, (w + PW) / SW);
    {ct} acc = 0;
    for ({idx} oh = oh_lo; oh <= oh_hi; ++oh) {{
        for ({idx} ow = ow_lo; ow <= ow_hi; ++ow) {{
            if (netcl_window_argmax(x, plane, oh, ow, H, W, KH, KW, SH, SW, PH, PW) == h * W + w) {{
                acc += ({ct})g[(p * OH + oh) * OW + ow];
            }}
        }}
    }}
    gx[gid] = ({st})acc;
}}
"""

#: an average window's divisor (torch's): the window clipped to the padded input, or (CIP 0) to the input
_AVG_DIVISOR = """
inline {idx} netcl_avg_divisor(const {idx} oh, const {idx} ow, const {idx} H, const {idx} W, const {idx} KH,
                               const {idx} KW, const {idx} SH, const {idx} SW, const {idx} PH, const {idx} PW,
                               const {idx} CIP) {{
    const {idx} hs = oh * SH - PH, ws = ow * SW - PW;
    const {idx} he = min(hs + KH, H + PH), we = min(ws + KW, W + PW);
    if (CIP) return (he - hs) * (we - ws);
    return (min(he, H) - max(hs, ({idx})0)) * (min(we, W) - max(ws, ({idx})0));
}}
"""

_AVG_FORWARD = """{pragmas}{divisor}
__kernel void netcl_avg_pool(__global const {st}* x, __global {st}* out, {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} ow = gid % OW;
    const {idx} oh = (gid / OW) % OH;
    const {idx} plane = (gid / (({idx})OW * OH)) * H * W;
    {ct} acc = 0;
    for ({idx} ki = 0; ki < KH; ++ki) {{
        const {idx} h = oh * SH - PH + ki;
        if (h < 0 || h >= H) continue;
        for ({idx} kj = 0; kj < KW; ++kj) {{
            const {idx} w = ow * SW - PW + kj;
            if (w >= 0 && w < W) acc += ({ct})x[plane + h * W + w];
        }}
    }}
    out[gid] = ({st})(acc / ({ct})netcl_avg_divisor(oh, ow, H, W, KH, KW, SH, SW, PH, PW, CIP));
}}
"""

_AVG_BACKWARD = """{pragmas}{divisor}
__kernel void netcl_avg_pool_backward(__global const {st}* g, __global {st}* gx, {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} w = gid % W;
    const {idx} h = (gid / W) % H;
    const {idx} p = gid / (({idx})W * H);
    const {idx} oh_lo = max(({idx})0, (h + PH - KH + SH) / SH);
    const {idx} oh_hi = min(({idx})OH - 1, (h + PH) / SH);
    const {idx} ow_lo = max(({idx})0, (w + PW - KW + SW) / SW);
    const {idx} ow_hi = min(({idx})OW - 1, (w + PW) / SW);
    {ct} acc = 0;
    for ({idx} oh = oh_lo; oh <= oh_hi; ++oh) {{
        for ({idx} ow = ow_lo; ow <= ow_hi; ++ow) {{
            const {idx} d = netcl_avg_divisor(oh, ow, H, W, KH, KW, SH, SW, PH, PW, CIP);
            acc += ({ct})g[(p * OH + oh) * OW + ow] / ({ct})d;
        }}
    }}
    gx[gid] = ({st})acc;
}}
"""

_AVG = [*_POOL, "CIP"]

_ADAPTIVE = ["n", "H", "W", "OH", "OW"]

_ADAPTIVE_FORWARD = """{pragmas}
__kernel void netcl_adaptive_avg_pool(__global const {st}* x, __global {st}* out, {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} ow = gid % OW;
    const {idx} oh = (gid / OW) % OH;
    const {idx} plane = (gid / (({idx})OW * OH)) * H * W;
    const {idx} h0 = (oh * H) / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
    const {idx} w0 = (ow * W) / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
    {ct} acc = 0;
    for ({idx} h = h0; h < h1; ++h) {{
        for ({idx} w = w0; w < w1; ++w) {{ acc += ({ct})x[plane + h * W + w]; }}
    }}
    out[gid] = ({st})(acc / ({ct})((h1 - h0) * (w1 - w0)));
}}
"""

_ADAPTIVE_BACKWARD = """{pragmas}
__kernel void netcl_adaptive_avg_pool_backward(__global const {st}* g, __global {st}* gx, {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} w = gid % W;
    const {idx} h = (gid / W) % H;
    const {idx} p = gid / (({idx})W * H);
    const {idx} oh_lo = (h * OH) / H, oh_hi = ((h + 1) * OH + H - 1) / H;
    const {idx} ow_lo = (w * OW) / W, ow_hi = ((w + 1) * OW + W - 1) / W;
    {ct} acc = 0;
    for ({idx} oh = oh_lo; oh < oh_hi; ++oh) {{
        const {idx} h0 = (oh * H) / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
        for ({idx} ow = ow_lo; ow < ow_hi; ++ow) {{
            const {idx} w0 = (ow * W) / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
            acc += ({ct})g[(p * OH + oh) * OW + ow] / ({ct})((h1 - h0) * (w1 - w0));
        }}
    }}
    gx[gid] = ({st})acc;
}}
"""


#: Prepared pooling launches by (kernel, device, dtype, sizes): the size arguments bound once.
_LAUNCHES = PlanCache("pool")


def _launch(template: str, name: str, names: list[str], values: list[int], out: Tensor, *buffers: Tensor) -> Tensor:
    """Launch ``netcl_<name>`` over ``out``'s elements on ``buffers`` then ``out``, with the sizes ``values``."""
    key = (name, out.device, out.dtype, out.size, *[b.size for b in buffers], *values)
    call = _LAUNCHES.plans.get(key)
    if call is None:
        call = _LAUNCHES.keep(key, _prepare(template, name, names, values, out, buffers))
    call(*[b.data for b in buffers], out.data)
    return out


def _prepare(
    template: str, name: str, names: list[str], values: list[int], out: Tensor, buffers: tuple[Tensor, ...]
) -> Callable[..., None]:
    """``_launch``'s launch for tensors of these sizes and ``out``'s dtype (the buffers passed per call)."""
    if out.size <= 0:
        return lambda *raw: None
    idx = index_ctype(out.size, *(b.size for b in buffers))
    st, ct = storage_ctype(out.dtype), compute_ctype(out.dtype)
    fmt = {"pragmas": pragmas([out.dtype]), "st": st, "ct": ct, "idx": idx}
    argmax, divisor = _MAX_ARGMAX.format(**fmt), _AVG_DIVISOR.format(**fmt)

    def source() -> str:
        return template.format(argmax=argmax, divisor=divisor, sizes=params(idx, names), **fmt)

    count = len(buffers) + 1
    types = [None] * count + [index_dtype(idx)] * len(names)
    resolved = get_kernel(("layers", name, st, idx), out.device, source, f"netcl_{name}", types)
    local = resolved.max_local
    bound = {count + i: int(v) for i, v in enumerate([out.size, *values])}
    return PreparedLaunch.binding(resolved.kernel, round_up(out.size, local), local, bound, out.device.queue).call


def _check_input(x: Any, op: str) -> None:
    """x (a Tensor, or anything with ``shape`` and ``dtype``) must be a 4-d float tensor."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{op}: x must be a Tensor, got {type(x).__name__}")
    if len(x.shape) != 4:
        raise ShapeError(f"{op}: x must be 4-d (N, C, H, W), got shape {tuple(x.shape)}")
    refuse_bfloat16(op, np.dtype(x.dtype))
    if np.dtype(x.dtype).kind != "f":
        raise TypeError(f"{op}: x must be a floating-point tensor, got dtype {x.dtype}")


_GEOMETRIES = PlanCache("pool-geometry")


def pool_geometry(
    x: Any, kernel_size: Any, stride: Any, padding: Any, op: str, ceil_mode: bool = False
) -> ConvGeometry:
    """Validate a pooling call (torch rules: padding at most half the kernel) and return its geometry; with
    ``ceil_mode`` the output rounds up, dropping a last window that would start in the right / bottom padding.
    One shared geometry per signature (x's shape and dtype, the windows as plain ints, the op): callers must not
    change it."""
    shape = getattr(x, "shape", None)
    key = (
        shape if type(shape) is tuple else UNKEYED,
        getattr(x, "dtype", UNKEYED),
        window(kernel_size),
        None if stride is None else window(stride),
        window(padding),
        exact(ceil_mode, bool),
        op,
    )
    return _GEOMETRIES.planned(key, _pool_geometry, x, kernel_size, stride, padding, op, ceil_mode)


def _pool_geometry(x: Any, kernel_size: Any, stride: Any, padding: Any, op: str, ceil_mode: bool) -> ConvGeometry:
    """``pool_geometry`` in full."""
    _check_input(x, op)
    if not isinstance(ceil_mode, (bool, np.bool_)):
        raise TypeError(f"{op}: ceil_mode must be a bool, got {ceil_mode!r}")
    kernel = pair(kernel_size, "kernel_size", op, 1)
    steps = kernel if stride is None else pair(stride, "stride", op, 1)
    pads = pair(padding, "padding", op, 0)
    if pads[0] > kernel[0] // 2 or pads[1] > kernel[1] // 2:
        raise ValueError(f"{op}: padding {padding!r} must be at most half of kernel_size {kernel_size!r}")
    geo = ConvGeometry(x.shape, kernel, steps, pads, (1, 1), op)
    if not ceil_mode:
        return geo
    return geo.with_output(
        *(_ceil_size(*axis) for axis in ((geo.H, geo.KH, geo.SH, geo.PH), (geo.W, geo.KW, geo.SW, geo.PW)))
    )


def _ceil_size(size: int, kernel: int, stride: int, pad: int) -> int:
    """torch's ceil-mode output length: rounded up, less one if the last window would start past size + pad."""
    out = (size + 2 * pad - kernel + stride - 1) // stride + 1
    return out - 1 if (out - 1) * stride >= size + pad else out


def _pool_values(geo: ConvGeometry) -> list[int]:
    return [geo.H, geo.W, geo.OH, geo.OW, geo.KH, geo.KW, geo.SH, geo.SW, geo.PH, geo.PW]


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False) -> Tensor:
    """Max over KH x KW windows (padding counts as -inf); (N, C, OH, OW)."""
    return max_pool(x, pool_geometry(x, kernel_size, stride, padding, "max_pool2d", ceil_mode))


@backend_op(_TWINS)
def max_pool(x: Tensor, geo: ConvGeometry) -> Tensor:
    """``max_pool2d`` of a checked call."""
    if pool_cpu.applies(x, geo):
        return pool_cpu.max_pool(x, geo)
    out = Tensor.empty((geo.N, geo.C, geo.OH, geo.OW), x.dtype, x.device)
    return _launch(_MAX_FORWARD, "max_pool", _POOL, _pool_values(geo), out, x)


def max_pool2d_backward(
    grad: Tensor, x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False
) -> Tensor:
    """d max_pool2d / d x: each window's gradient goes to its (first) maximum."""
    return max_pool_backward(grad, x, pool_geometry(x, kernel_size, stride, padding, "max_pool2d", ceil_mode))


@backend_op(_TWINS)
def max_pool_backward(grad: Tensor, x: Tensor, geo: ConvGeometry) -> Tensor:
    """``max_pool2d_backward`` of a checked call."""
    if pool_cpu.applies(x, geo):
        return pool_cpu.max_pool_backward(grad, x, geo)
    out = Tensor.empty(x.shape, x.dtype, x.device)
    return _launch(_MAX_BACKWARD, "max_pool_backward", _POOL, _pool_values(geo), out, x, grad)


def avg_pool2d(
    x: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """Mean over KH x KW windows; padding cells count in the divisor unless ``count_include_pad`` is False."""
    geo = pool_geometry(x, kernel_size, stride, padding, "avg_pool2d", ceil_mode)
    return avg_pool(x, geo, _include_pad(count_include_pad))


def _include_pad(count_include_pad: Any) -> bool:
    if not isinstance(count_include_pad, (bool, np.bool_)):
        raise TypeError(f"avg_pool2d: count_include_pad must be a bool, got {count_include_pad!r}")
    return bool(count_include_pad)


@backend_op(_TWINS)
def avg_pool(x: Tensor, geo: ConvGeometry, count_include_pad: bool = True) -> Tensor:
    """``avg_pool2d`` of a checked call."""
    out = Tensor.empty((geo.N, geo.C, geo.OH, geo.OW), x.dtype, x.device)
    return _launch(_AVG_FORWARD, "avg_pool", _AVG, [*_pool_values(geo), int(count_include_pad)], out, x)


def avg_pool2d_backward(
    grad: Tensor,
    x_shape: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """d avg_pool2d / d x: each window's gradient spread evenly over its cells (its divisor's share)."""
    like = Tensor.empty(tuple(x_shape), grad.dtype, grad.device)
    geo = pool_geometry(like, kernel_size, stride, padding, "avg_pool2d", ceil_mode)
    return avg_pool_backward(grad, like, geo, _include_pad(count_include_pad))


@backend_op(_TWINS)
def avg_pool_backward(grad: Tensor, out: Tensor, geo: ConvGeometry, count_include_pad: bool = True) -> Tensor:
    """``avg_pool2d_backward`` of a checked call, written into ``out`` (x's shape)."""
    values = [*_pool_values(geo), int(count_include_pad)]
    return _launch(_AVG_BACKWARD, "avg_pool_backward", _AVG, values, out, grad)


def adaptive_output(x: Any, output_size: Any, op: str = "adaptive_avg_pool2d") -> tuple[int, int]:
    """Validate ``output_size`` (an int or pair; None keeps that input size) against x."""
    _check_input(x, op)
    items = (output_size, output_size) if not isinstance(output_size, (tuple, list)) else tuple(output_size)
    if len(items) != 2:
        raise ValueError(f"{op}: output_size must be an int or a pair, got {output_size!r}")
    sizes = tuple(x.shape[2 + i] if v is None else v for i, v in enumerate(items))
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in sizes):
        raise ValueError(f"{op}: output_size must be positive ints, got {output_size!r}")
    return int(sizes[0]), int(sizes[1])


def adaptive_avg_pool2d(x: Tensor, output_size: Any) -> Tensor:
    """Average over PyTorch's adaptive windows ``[floor(i*H/OH), ceil((i+1)*H/OH))``: (N, C, OH, OW)."""
    return adaptive_avg_pool(x, *adaptive_output(x, output_size))


@backend_op(_TWINS)
def adaptive_avg_pool(x: Tensor, out_h: int, out_w: int) -> Tensor:
    """``adaptive_avg_pool2d`` of a checked call."""
    N, C, H, W = x.shape
    out = Tensor.empty((N, C, out_h, out_w), x.dtype, x.device)
    return _launch(_ADAPTIVE_FORWARD, "adaptive_avg_pool", _ADAPTIVE, [H, W, out_h, out_w], out, x)


@backend_op(_TWINS)
def adaptive_avg_pool2d_backward(grad: Tensor, x_shape: Any) -> Tensor:
    """d adaptive_avg_pool2d / d x for upstream ``grad`` (N, C, OH, OW)."""
    N, C, H, W = (int(d) for d in x_shape)
    OH, OW = grad.shape[2], grad.shape[3]
    out = Tensor.empty((N, C, H, W), grad.dtype, grad.device)
    return _launch(_ADAPTIVE_BACKWARD, "adaptive_avg_pool_backward", _ADAPTIVE, [H, W, OH, OW], out, grad)
