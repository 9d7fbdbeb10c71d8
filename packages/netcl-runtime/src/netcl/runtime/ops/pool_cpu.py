"""Max pooling kernels for CPU OpenCL devices (PoCL, Intel's CPU runtime).

A CPU OpenCL compiler runs a work-group as a loop over its work-items and vectorizes that loop, so
a work-item's body must be straight-line code: ``pool.py``'s kernels (a window walk of data-dependent trip
count with early exits, integer division by runtime sizes) run one work-item at a time there. These
kernels bake the window (kernel size, stride, padding) into the source, unroll it, pick the maximum with
selects, track the arg-max as a window-local constant index, and divide by the image sizes with a
multiply and a shift (``magic_div``), so the work-item loop vectorizes. The image sizes and the element count
stay kernel arguments: one program per window and dtype, a new batch or image size builds nothing. Where
the windows tile the input exactly (2 x 2 stride 2 on even sizes, the usual CNN pooling) the forward and the
backward find a window's rows from the output row alone (one division a work-item, not two), and every
read indexes the buffer itself by a 32-bit offset (a gather from one base, not a vector of pointers).

They compute what ``pool.py``'s ``netcl_max_pool`` / ``netcl_max_pool_backward`` compute, bit for
bit: the same window maximum (the first maximum in row-major order, the first NaN winning), and each
input element's gradient summed over its covering windows in the same order, from zero.
"""

from __future__ import annotations

from collections.abc import Callable

from netcl.core import Tensor
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops import magic_div
from netcl.runtime.ops._common import compute_ctype, get_kernel, pragmas, round_up, storage_ctype
from netcl.runtime.ops._grid import index_ctype, index_dtype
from netcl.runtime.ops.call_plans import PlanCache
from netcl.runtime.ops.conv import ConvGeometry

#: The window a CPU pooling program is specialized on (``#define``d in its source).
WINDOW = ("KH", "KW", "SH", "SW", "PH", "PW")
#: The image sizes, kernel arguments after the element count (then ``col_step`` and the ``magic_div`` pair
#: of each of ``DIVISORS``).
SIZES = ("H", "W", "OH", "OW")
DIVISORS = ("H", "W", "OH", "OW")

_WINDOW = """
#define NETCL_NH ((KH + SH - 1) / SH)
#define NETCL_NW ((KW + SW - 1) / SW)
{div}
/* The window (oh, ow) of the H x W plane at x + plane: its maximum, and in *at its first maximum as a
   window-local index ki * KW + kj (row-major; a NaN beats every number and the first NaN wins). Every read
   indexes x itself by an integer offset (not a per-work-item pointer): vectorized, the reads are gathers
   of 32-bit offsets from one base. */
inline {ct} netcl_window_max(__global const {st}* x, const {idx} plane, const {idx} oh, const {idx} ow,
                             const {idx} H, const {idx} W, int* at) {{
    const {idx} h0 = oh * SH - PH, w0 = ow * SW - PW;
#if PH || PW
    const {idx} hs = h0 > 0 ? h0 : 0, ws = w0 > 0 ? w0 : 0;
#else
    const {idx} hs = h0, ws = w0;
#endif
    {ct} best = ({ct})x[plane + hs * W + ws];
    int where = (int)((hs - h0) * KW + (ws - w0));
    _Pragma("unroll") for (int ki = 0; ki < KH; ++ki) {{
        _Pragma("unroll") for (int kj = 0; kj < KW; ++kj) {{
#if PH || PW
            const {idx} h = h0 + ki, w = w0 + kj;
            const int inside = h >= 0 && h < H && w >= 0 && w < W;
            const {ct} v = ({ct})x[plane + (inside ? h * W + w : hs * W + ws)];
            const int take = inside && best == best && !(v <= best);
#else
            const {ct} v = ({ct})x[plane + (h0 + ki) * W + w0 + kj];
            const int take = best == best && !(v <= best);
#endif
            best = take ? v : best;
            where = take ? ki * KW + kj : where;
        }}
    }}
    *at = where;
    return best;
}}
"""

_FORWARD = """{pragmas}{window}
__kernel void netcl_max_pool_cpu(__global const {st}* x, __global {st}* out, {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} rows = NETCL_DIV(gid, OW), planes = NETCL_DIV(rows, OH);
    const {idx} ow = gid - rows * OW, oh = rows - planes * OH;
    int at;
    out[gid] = ({st})netcl_window_max(x, planes * (H * W), oh, ow, H, W, &at);
}}
"""

#: Where the windows tile the input (``tiles``), output row r = (plane, oh) reads the KH input rows from
#: r * KH * W on: one division a work-item instead of two.
_FORWARD_TILES = """{pragmas}{window}
__kernel void netcl_max_pool_tiles_cpu(__global const {st}* x, __global {st}* out, {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} rows = NETCL_DIV(gid, OW), ow = gid - rows * OW;
    int at;
    out[gid] = ({st})netcl_window_max(x, rows * (KH * W), 0, ow, H, W, &at);
}}
"""

_BACKWARD = """{pragmas}{window}
__kernel void netcl_max_pool_backward_cpu(__global const {st}* x, __global const {st}* g, __global {st}* gx,
                                          {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} rows = NETCL_DIV(gid, W), p = NETCL_DIV(rows, H);
    const {idx} w = gid - rows * W, h = rows - p * H;
    const {idx} plane = p * (H * W);
    const {idx} oh_lo = max(({idx})0, (h + PH - KH + SH) / SH), oh_hi = min(OH - 1, (h + PH) / SH);
    const {idx} ow_lo = max(({idx})0, (w + PW - KW + SW) / SW), ow_hi = min(OW - 1, (w + PW) / SW);
    {ct} acc = 0;
    _Pragma("unroll") for (int i = 0; i < NETCL_NH; ++i) {{
        _Pragma("unroll") for (int j = 0; j < NETCL_NW; ++j) {{
            const int ok = oh_lo + i <= oh_hi && ow_lo + j <= ow_hi;
            const {idx} oh = ok ? oh_lo + i : oh_lo, ow = ok ? ow_lo + j : ow_lo;
            int at;
            netcl_window_max(x, plane, oh, ow, H, W, &at);
            const int mine = ok && oh * SH - PH + at / KW == h && ow * SW - PW + at % KW == w;
            acc = mine ? acc + ({ct})g[(p * OH + oh) * OW + ow] : acc;
        }}
    }}
    gx[gid] = ({st})acc;
}}
"""

#: One work-item per window writes the window's gradient. Its stores step through a row by ``col_step``,
#: a kernel argument that is always 1: with a literal 1 PoCL's SLP vectorizer packs each row's adjacent
#: stores into a short vector, and a work-item loop holding vector values is not vectorized.
_BACKWARD_TILES = """{pragmas}{window}
__kernel void netcl_max_pool_backward_tiles_cpu(__global const {st}* x, __global const {st}* g, __global {st}* gx,
                                                {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} rows = NETCL_DIV(gid, OW), ow = gid - rows * OW, start = rows * (KH * W), window = start + ow * KW;
    int at;
    netcl_window_max(x, start, 0, ow, H, W, &at);
    const {ct} zero = 0;
    const {ct} grad = zero + ({ct})g[gid];
    _Pragma("unroll") for (int ki = 0; ki < KH; ++ki) {{
        _Pragma("unroll") for (int kj = 0; kj < KW; ++kj) {{
            gx[window + ki * W + kj * col_step] = ({st})(at == ki * KW + kj ? grad : zero);
        }}
    }}
}}
"""


#: Prepared launches by (kernel, device, dtype, element counts, window, image sizes).
_LAUNCHES = PlanCache("pool_cpu")


def applies(tensor: Tensor, geo: ConvGeometry) -> bool:
    """Whether a max pooling of ``geo`` on ``tensor``'s device takes these kernels: an OpenCL device that
    is not a GPU, and no padding (a padded window's bounds tests keep PoCL from vectorizing; there these
    kernels are no faster than pool.py's, its backward slower)."""
    device = tensor.device
    inside = (geo.OH - 1) * geo.SH + geo.KH <= geo.H and (geo.OW - 1) * geo.SW + geo.KW <= geo.W  # no ceil-mode tail
    return device.kind == "opencl" and not device.is_gpu and geo.PH == geo.PW == 0 and inside


def max_pool(x: Tensor, geo: ConvGeometry) -> Tensor:
    """``pool.max_pool`` on a CPU OpenCL device."""
    out = Tensor.empty((geo.N, geo.C, geo.OH, geo.OW), x.dtype, x.device)
    if tiles(geo):
        return _launch(_FORWARD_TILES, "max_pool_tiles_cpu", geo, out, out, x)
    return _launch(_FORWARD, "max_pool_cpu", geo, out, out, x)


def max_pool_backward(grad: Tensor, x: Tensor, geo: ConvGeometry) -> Tensor:
    """``pool.max_pool_backward`` on a CPU OpenCL device."""
    out = Tensor.empty(x.shape, x.dtype, x.device)
    if tiles(geo):
        return _launch(_BACKWARD_TILES, "max_pool_backward_tiles_cpu", geo, grad, out, x, grad)
    return _launch(_BACKWARD, "max_pool_backward_cpu", geo, out, out, x, grad)


def tiles(geo: ConvGeometry) -> bool:
    """Whether the windows tile the input exactly (stride = kernel, no padding, no cell left over): then
    each input element lies in one window, and one work-item per window writes all of its gradient."""
    return (
        (geo.SH, geo.SW) == (geo.KH, geo.KW)
        and geo.PH == geo.PW == 0
        and (geo.H, geo.W) == (geo.OH * geo.KH, geo.OW * geo.KW)
    )


def _launch(template: str, name: str, geo: ConvGeometry, over: Tensor, out: Tensor, *buffers: Tensor) -> Tensor:
    """Launch ``netcl_<name>``, one work-item per element of ``over``, on ``buffers`` then ``out``."""
    key = (name, out.device, out.dtype, over.size, out.size, *[b.size for b in buffers], *_window(geo), *_sizes(geo))
    call = _LAUNCHES.plans.get(key)
    if call is None:
        call = _LAUNCHES.keep(key, _prepare(template, name, geo, over.size, out, buffers))
    call(*[b.data for b in buffers], out.data)
    return out


def _window(geo: ConvGeometry) -> tuple[int, ...]:
    return (geo.KH, geo.KW, geo.SH, geo.SW, geo.PH, geo.PW)


def _sizes(geo: ConvGeometry) -> tuple[int, ...]:
    return (geo.H, geo.W, geo.OH, geo.OW)


def _prepare(
    template: str, name: str, geo: ConvGeometry, items: int, out: Tensor, buffers: tuple[Tensor, ...]
) -> Callable[..., None]:
    """``_launch``'s launch of ``items`` work-items for tensors of these sizes and ``out``'s dtype (the
    buffers passed per call, every size bound)."""
    if items <= 0:
        return lambda *raw: None
    idx = index_ctype(out.size, *(b.size for b in buffers))
    st, ct = storage_ctype(out.dtype), compute_ctype(out.dtype)
    window = _window(geo)
    defines = "".join(f"#define {k} {int(v)}\n" for k, v in zip(WINDOW, window, strict=True))
    names = [f"const {idx} {size}" for size in ("n", *SIZES)]
    names += [f"const {idx} col_step"]  # 1: see _BACKWARD_TILES
    names.append(magic_div.params(DIVISORS))
    fmt = {"pragmas": pragmas([out.dtype]), "st": st, "ct": ct, "idx": idx}
    text = _WINDOW.format(div=magic_div.macro(idx), **fmt)

    def source() -> str:
        return defines + template.format(window=text, sizes=", ".join(names), **fmt)

    count = len(buffers) + 1
    index = index_dtype(idx)
    types = [None] * count + [index] * (2 + len(SIZES)) + magic_div.arg_types(DIVISORS)
    resolved = get_kernel(("layers", name, st, idx, *window), out.device, source, f"netcl_{name}", types)
    sizes = dict(zip(SIZES, _sizes(geo), strict=True))
    values = [items, *sizes.values(), 1, *magic_div.values([sizes[d] for d in DIVISORS])]
    bound = {count + i: v for i, v in enumerate(values)}
    local = resolved.max_local
    return PreparedLaunch.binding(resolved.kernel, round_up(items, local), local, bound, out.device.queue).call
