"""2-D pooling on NCHW: ``max_pool2d``, ``avg_pool2d`` (count_include_pad), ``adaptive_avg_pool2d``.

Forwards give each output element one work-item that walks its window. Backwards give each
*input* element one work-item that visits the windows covering it and gathers their gradient,
so nothing is accumulated with atomics and results are deterministic. ``max_pool2d_backward``
recomputes each covering window's arg-max from x (the first maximum in row-major order, NaN
winning, as PyTorch) instead of storing indices, so the forward keeps no state. Every size is a
kernel argument (one program per dtype and index width).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.core.errors import ShapeError
from netcl.runtime.ops._common import compute_ctype, pragmas, storage_ctype, wrap_numpy
from netcl.runtime.ops._grid import index_ctype, index_dtype, params, run_1d, scalars
from netcl.runtime.ops.conv import ConvGeometry, pair, window_indices

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
            if (at < 0 || v > best || (isnan(v) && !isnan(best))) {{ best = v; at = h * W + w; }}
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

_AVG_FORWARD = """{pragmas}
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
    out[gid] = ({st})(acc / ({ct})(KH * KW));
}}
"""

_AVG_BACKWARD = """{pragmas}
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
        for ({idx} ow = ow_lo; ow <= ow_hi; ++ow) {{ acc += ({ct})g[(p * OH + oh) * OW + ow]; }}
    }}
    gx[gid] = ({st})(acc / ({ct})(KH * KW));
}}
"""

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


def _launch(template: str, name: str, names: list[str], values: list[int], out: Tensor, *buffers: Tensor) -> Tensor:
    idx = index_ctype(out.size, *(b.size for b in buffers))
    st, ct = storage_ctype(out.dtype), compute_ctype(out.dtype)
    fmt = {"pragmas": pragmas([out.dtype]), "st": st, "ct": ct, "idx": idx}
    argmax = _MAX_ARGMAX.format(**fmt)

    def source() -> str:
        return template.format(argmax=argmax, sizes=params(idx, names), **fmt)

    types = [None] * (len(buffers) + 1) + [index_dtype(idx)] * len(names)
    run_1d(
        (name, st, idx),
        out.device,
        source,
        f"netcl_{name}",
        types,
        out.size,
        *buffers,
        out,
        *scalars(idx, [out.size, *values]),
    )
    return out


def _np_float(t: Tensor) -> type:
    """The NumPy dtype the twins compute in (as the kernels: float64 stays, others float32)."""
    return np.float64 if t.dtype == np.float64 else np.float32


def _check_input(x: Any, op: str) -> None:
    """x (a Tensor, or anything with ``shape`` and ``dtype``) must be a 4-d float tensor."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{op}: x must be a Tensor, got {type(x).__name__}")
    if len(x.shape) != 4:
        raise ShapeError(f"{op}: x must be 4-d (N, C, H, W), got shape {tuple(x.shape)}")
    if np.dtype(x.dtype).kind != "f":
        raise TypeError(f"{op}: x must be a floating-point tensor, got dtype {x.dtype}")


def pool_geometry(x: Any, kernel_size: Any, stride: Any, padding: Any, op: str) -> ConvGeometry:
    """Validate a pooling call (torch rules: padding at most half the kernel) and return its geometry."""
    _check_input(x, op)
    kernel = pair(kernel_size, "kernel_size", op, 1)
    steps = kernel if stride is None else pair(stride, "stride", op, 1)
    pads = pair(padding, "padding", op, 0)
    if pads[0] > kernel[0] // 2 or pads[1] > kernel[1] // 2:
        raise ValueError(f"{op}: padding {padding!r} must be at most half of kernel_size {kernel_size!r}")
    return ConvGeometry(x.shape, kernel, steps, pads, (1, 1), op)


def _pool_values(geo: ConvGeometry) -> list[int]:
    return [geo.H, geo.W, geo.OH, geo.OW, geo.KH, geo.KW, geo.SH, geo.SW, geo.PH, geo.PW]


def _np_windows(x: np.ndarray, geo: ConvGeometry, fill: float) -> np.ndarray:
    """(N, C, KH, KW, OH, OW) window values of x, ``fill`` in the padding (NumPy backend)."""
    h, w, inside = window_indices(geo)
    return np.where(inside, x[:, :, h, w], fill)


def _np_max_windows(x: Tensor, geo: ConvGeometry) -> tuple[np.ndarray, np.ndarray]:
    """(N, C, KH*KW, OH, OW) windows (padding -inf) and each window's first maximum (NumPy backend)."""
    windows = _np_windows(np.asarray(x.data), geo, -np.inf).reshape(geo.N, geo.C, -1, geo.OH, geo.OW)
    return windows, _first_argmax(windows)


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    """Max over KH x KW windows (padding counts as -inf); (N, C, OH, OW)."""
    geo = pool_geometry(x, kernel_size, stride, padding, "max_pool2d")
    out_shape = (geo.N, geo.C, geo.OH, geo.OW)
    if x.device.kind == "cpu":
        windows, first = _np_max_windows(x, geo)
        data = np.take_along_axis(windows, first[:, :, None], axis=2)[:, :, 0]
        return wrap_numpy(data, x.device, x.dtype)
    out = Tensor.empty(out_shape, x.dtype, x.device)
    return _launch(_MAX_FORWARD, "max_pool", _POOL, _pool_values(geo), out, x)


def _first_argmax(windows: np.ndarray) -> np.ndarray:
    """Index along axis 2 of the first maximum, a NaN winning (as the kernel)."""
    nan = np.isnan(windows)
    filled = np.where(nan, np.inf, windows)
    return np.where(nan.any(axis=2), nan.argmax(axis=2), filled.argmax(axis=2))


def max_pool2d_backward(grad: Tensor, x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    """d max_pool2d / d x: each window's gradient goes to its (first) maximum."""
    geo = pool_geometry(x, kernel_size, stride, padding, "max_pool2d")
    if x.device.kind == "cpu":
        _, first = _np_max_windows(x, geo)
        onehot = (np.arange(geo.KH * geo.KW)[None, None, :, None, None] == first[:, :, None]).astype(_np_float(x))
        cols = onehot * np.asarray(grad.data, dtype=_np_float(x))[:, :, None]
        return _np_fold(cols, geo, x)
    out = Tensor.empty(x.shape, x.dtype, x.device)
    return _launch(_MAX_BACKWARD, "max_pool_backward", _POOL, _pool_values(geo), out, x, grad)


def _np_fold(cols: np.ndarray, geo: ConvGeometry, like: Tensor) -> Tensor:
    from netcl.runtime.ops.conv import col2im

    flat = cols.reshape(geo.N, geo.C * geo.KH * geo.KW, geo.OH * geo.OW)
    return col2im(wrap_numpy(flat, like.device, like.dtype), geo)


def avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    """Mean over KH x KW windows, padding counted as zeros in the divisor (count_include_pad=True)."""
    geo = pool_geometry(x, kernel_size, stride, padding, "avg_pool2d")
    if x.device.kind == "cpu":
        windows = _np_windows(np.asarray(x.data, dtype=_np_float(x)), geo, 0.0)
        return wrap_numpy(windows.mean(axis=(2, 3)), x.device, x.dtype)
    out = Tensor.empty((geo.N, geo.C, geo.OH, geo.OW), x.dtype, x.device)
    return _launch(_AVG_FORWARD, "avg_pool", _POOL, _pool_values(geo), out, x)


def avg_pool2d_backward(grad: Tensor, x_shape: Any, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    """d avg_pool2d / d x: each window's gradient spread evenly over its KH*KW cells."""
    like = Tensor.empty(tuple(x_shape), grad.dtype, grad.device)
    geo = pool_geometry(like, kernel_size, stride, padding, "avg_pool2d")
    if grad.device.kind == "cpu":
        share = np.asarray(grad.data, dtype=_np_float(grad))[:, :, None, None] / (geo.KH * geo.KW)
        cols = np.broadcast_to(share, (geo.N, geo.C, geo.KH, geo.KW, geo.OH, geo.OW))
        return _np_fold(np.ascontiguousarray(cols), geo, like)
    return _launch(_AVG_BACKWARD, "avg_pool_backward", _POOL, _pool_values(geo), like, grad)


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


def _bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(out)
    return (i * size) // out, ((i + 1) * size + out - 1) // out


def adaptive_avg_pool2d(x: Tensor, output_size: Any) -> Tensor:
    """Average over PyTorch's adaptive windows ``[floor(i*H/OH), ceil((i+1)*H/OH))``: (N, C, OH, OW)."""
    OH, OW = adaptive_output(x, output_size)
    N, C, H, W = x.shape
    if x.device.kind == "cpu":
        data = np.asarray(x.data, dtype=_np_float(x))
        h0, h1 = _bounds(H, OH)
        w0, w1 = _bounds(W, OW)
        rows = np.stack([data[:, :, a:b].mean(axis=2) for a, b in zip(h0, h1, strict=True)], axis=2)
        out = np.stack([rows[..., a:b].mean(axis=3) for a, b in zip(w0, w1, strict=True)], axis=3)
        return wrap_numpy(out, x.device, x.dtype)
    out = Tensor.empty((N, C, OH, OW), x.dtype, x.device)
    return _launch(_ADAPTIVE_FORWARD, "adaptive_avg_pool", _ADAPTIVE, [H, W, OH, OW], out, x)


def adaptive_avg_pool2d_backward(grad: Tensor, x_shape: Any) -> Tensor:
    """d adaptive_avg_pool2d / d x for upstream ``grad`` (N, C, OH, OW)."""
    N, C, H, W = (int(d) for d in x_shape)
    OH, OW = grad.shape[2], grad.shape[3]
    if grad.device.kind == "cpu":
        g = np.asarray(grad.data, dtype=_np_float(grad))
        out = np.zeros((N, C, H, W), dtype=g.dtype)
        h0, h1 = _bounds(H, OH)
        w0, w1 = _bounds(W, OW)
        for i in range(OH):  # a loop over output cells (at most OH * OW), each adding a whole window
            for j in range(OW):
                area = g.dtype.type((h1[i] - h0[i]) * (w1[j] - w0[j]))
                out[:, :, h0[i] : h1[i], w0[j] : w1[j]] += (g[:, :, i, j] / area)[:, :, None, None]
        return wrap_numpy(out, grad.device, grad.dtype)
    out = Tensor.empty((N, C, H, W), grad.dtype, grad.device)
    return _launch(_ADAPTIVE_BACKWARD, "adaptive_avg_pool_backward", _ADAPTIVE, [H, W, OH, OW], out, grad)
