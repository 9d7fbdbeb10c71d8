"""``layer_norm``, ``rms_norm`` (one row kernel each way) and ``batch_norm`` (one channel kernel each way).

layer_norm / rms_norm normalize over the trailing ``normalized_shape`` (a row of ``D`` elements).
Forward, per row: the mean and the mean of squared deviations (two passes over the row, so no
``E[x^2] - E[x]^2`` cancellation; rms_norm: the mean square), ``rstd = 1 / sqrt(var + eps)``, the
row written as ``(x - mean) * rstd * w + b``; the kernel also stores ``mean`` and ``rstd`` (float32,
one per row) for the backward. Backward: one row kernel for ``dx = rstd (gy - mean(gy) - xhat
mean(gy xhat))`` with ``gy = g w`` and ``xhat`` recomputed from the saved statistics (rms_norm:
without the ``mean(gy)`` term), and one column kernel for ``dw = sum(g xhat)``, ``db = sum(g)`` over
the rows (partials per chunk of rows, then the runtime's column sum when there are several).

batch_norm (PyTorch's ``F.batch_norm``): x is (N, C) or (N, C, *); a "row" is one channel, every
element of it (``N * prod(*)`` values). Training: the batch mean and biased variance normalize, and
``running_mean``/``running_var`` (when given) are updated in place in the same kernel with the
unbiased variance: ``r = (1 - momentum) r + momentum * stat``. Evaluation: the running statistics
normalize. Backward: one channel kernel gives ``dx`` and ``dw = sum(g xhat)``, ``db = sum(g)``.

Statistics are computed in float32 (float64 for float64 data); float16 data is read and written as
half (weights and running statistics keep their own dtype), which is what ``amp`` needs: norms run
in float32 on float16 activations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Tensor, same_device
from netcl.core.errors import ShapeError
from netcl.runtime.ops import _rows
from netcl.runtime.ops._common import ARG_DTYPES, storage_ctype, wrap_numpy
from netcl.runtime.ops._grid import run_rows, scalars
from netcl.runtime.ops.layout import cast
from netcl.runtime.ops.reduce import sum as _sum

Stats = tuple[Tensor, Tensor | None, Tensor]  # (y, mean or None, rstd)


def _shape_tuple(normalized_shape: Any, op: str) -> tuple[int, ...]:
    items = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else normalized_shape
    try:
        shape = tuple(int(d) for d in items)
    except TypeError:
        raise TypeError(f"{op}: normalized_shape must be an int or a tuple of ints, got {normalized_shape!r}") from None
    if any(isinstance(d, bool) for d in items) or not all(isinstance(d, (int, np.integer)) for d in items):
        raise TypeError(f"{op}: normalized_shape must be an int or a tuple of ints, got {normalized_shape!r}")
    return shape


def check_norm(
    x_shape: Sequence[int],
    normalized_shape: Any,
    weight_shape: Sequence[int] | None,
    bias_shape: Sequence[int] | None,
    op: str,
) -> tuple[int, ...]:
    """Validate a layer/rms norm by shapes; returns ``normalized_shape`` as a tuple."""
    shape = _shape_tuple(normalized_shape, op)
    x_shape = tuple(x_shape)
    if not shape:
        raise ShapeError(f"{op}: normalized_shape must name at least one dimension, got ()")
    if len(shape) > len(x_shape) or x_shape[len(x_shape) - len(shape) :] != shape:
        raise ShapeError(
            f"{op}: normalized_shape {shape} must equal the trailing dimensions of x, got x shape {x_shape}"
        )
    for arg, given in (("weight", weight_shape), ("bias", bias_shape)):
        if given is not None and tuple(given) != shape:
            raise ShapeError(f"{op}: {arg} must have shape {shape} (normalized_shape), got {tuple(given)}")
    return shape


def _check_tensors(op: str, x: Any, **others: Any) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: x must be a Tensor, got {type(x).__name__}")
    _rows.require_float(x, op)
    for name, t in others.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor or None, got {type(t).__name__}")
        _rows.require_float(t, op, name)
        same_device(x.device, t.device)


def _np(t: Tensor | None, dtype: np.dtype) -> np.ndarray | None:
    return None if t is None else np.asarray(t.data, dtype=dtype)


def _param(name: str, t: Tensor | None) -> list[str]:
    return [] if t is None else [f"__global const {storage_ctype(t.dtype)}* {name}"]


def _float(value: float, acc: str) -> Any:
    return ARG_DTYPES[acc].type(value)


# ---- layer_norm and rms_norm --------------------------------------------------------------------------
def layer_norm(
    x: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape``."""
    return layer_norm_forward(x, normalized_shape, weight, bias, eps)[0]


def rms_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing ``normalized_shape``; eps None: finfo(x).eps."""
    return rms_norm_forward(x, normalized_shape, weight, eps)[0]


def rms_eps(dtype: np.dtype, eps: float | None) -> float:
    """PyTorch's default: the machine epsilon of x's dtype when ``eps`` is None."""
    return float(np.finfo(dtype).eps) if eps is None else float(eps)


def layer_norm_forward(
    x: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Stats:
    """(y, mean, rstd): the output and the per-row statistics the backward reads (float32)."""
    return _norm_forward("layer_norm", x, normalized_shape, weight, bias, float(eps))


def rms_norm_forward(x: Tensor, normalized_shape: Any, weight: Tensor | None = None, eps: float | None = None) -> Stats:
    """(y, None, rstd) of ``rms_norm``."""
    _check_tensors("rms_norm", x, weight=weight)
    return _norm_forward("rms_norm", x, normalized_shape, weight, None, rms_eps(x.dtype, eps))


def _norm_forward(
    kind: str, x: Tensor, normalized_shape: Any, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Stats:
    _check_tensors(kind, x, weight=weight, bias=bias)
    shape = check_norm(x.shape, normalized_shape, _shape_of(weight), _shape_of(bias), kind)
    D = math.prod(shape)
    rows = x.size // D if D else math.prod(x.shape[: x.ndim - len(shape)])
    stat = _rows.acc_dtype(x.dtype)
    if x.device.kind == "cpu":
        return _np_norm_forward(kind, x, rows, D, weight, bias, eps, stat)
    y = Tensor.empty(x.shape, x.dtype, x.device)
    mean = Tensor.empty((rows,), stat, x.device) if kind == "layer_norm" else None
    rstd = Tensor.empty((rows,), stat, x.device)
    if x.size == 0:
        return y, mean, rstd
    acc = _rows.acc_ctype(x.dtype)
    idx = _rows.index_for(x.size)
    yt = storage_ctype(x.dtype)
    centred = kind == "layer_norm"
    scale = " * (ACC)w[i]" if weight is not None else ""
    shift = " + (ACC)b[i]" if bias is not None else ""
    x_minus = "((ACC)x[AT(i)] - mu)" if centred else "(ACC)x[AT(i)]"
    body = "".join(
        [
            "    ACC s1 = 0;\n    for (IDX i = LID; i < R; i += LSIZE) s1 += (ACC)x[AT(i)];\n"
            "    const ACC mu = ROW_SUM(s1) / (ACC)R;\n"
            if centred
            else "",
            f"    ACC s2 = 0;\n    for (IDX i = LID; i < R; i += LSIZE) {{ const ACC d = {x_minus}; s2 += d * d; }}\n",
            "    const ACC rs = rsqrt(ROW_SUM(s2) / (ACC)R + eps);\n",
            f"    for (IDX i = LID; i < R; i += LSIZE) y[AT(i)] = ({yt})({x_minus} * rs{scale}{shift});\n",
            "    if (LID == 0) { " + ("mean[row] = mu; " if centred else "") + "rstd[row] = rs; }",
        ]
    )
    params = [
        f"__global const {storage_ctype(x.dtype)}* x",
        *_param("w", weight),
        *_param("b", bias),
        f"__global {yt}* y",
        *([f"__global {acc}* mean"] if centred else []),
        f"__global {acc}* rstd",
        f"const {acc} eps",
    ]
    buffers = [x, *[t for t in (weight, bias) if t is not None], y, *([mean] if centred else []), rstd]
    dtypes = [t.dtype for t in buffers]
    name = f"netcl_{kind}"

    def make(mode: str) -> str:
        return _rows.source(name, params, body, _rows.CONTIG, mode, acc, idx, dtypes)

    key = (tuple(d.str for d in dtypes), weight is not None, bias is not None, acc, idx)
    types = [None] * len(buffers) + [ARG_DTYPES[acc]]
    _rows.run(key, x.device, make, name, types, rows, D, 1, idx, *buffers, _float(eps, acc))
    return y, mean, rstd


def _shape_of(t: Tensor | None) -> tuple[int, ...] | None:
    return None if t is None else tuple(t.shape)


def _np_norm_forward(
    kind: str,
    x: Tensor,
    rows: int,
    width: int,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    stat: np.dtype,
) -> Stats:
    v = _np(x, stat).reshape(rows, width)
    with np.errstate(all="ignore"):
        mu = v.mean(axis=1, keepdims=True) if kind == "layer_norm" else np.zeros((rows, 1), stat)
        d = v - mu
        rstd = (1 / np.sqrt((d * d).mean(axis=1, keepdims=True) + stat.type(eps))).astype(stat)
        y = d * rstd
        if weight is not None:
            y = y * _np(weight, stat).reshape(1, width)
        if bias is not None:
            y = y + _np(bias, stat).reshape(1, width)
    device = x.device
    mean = wrap_numpy(mu.reshape(rows), device, stat) if kind == "layer_norm" else None
    return wrap_numpy(y.reshape(x.shape), device, x.dtype), mean, wrap_numpy(rstd.reshape(rows), device, stat)


def layer_norm_backward(
    g: Tensor,
    x: Tensor,
    mean: Tensor | None,
    rstd: Tensor,
    normalized_shape: Any,
    weight: Tensor | None = None,
    needs: tuple[bool, bool, bool] = (True, True, True),
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dweight, dbias) of ``layer_norm`` (``mean`` None: of ``rms_norm``, which has no bias)
    from the saved statistics; ``needs`` picks which are computed."""
    kind = "layer_norm" if mean is not None else "rms_norm"
    shape = check_norm(x.shape, normalized_shape, _shape_of(weight), None, kind)
    D = math.prod(shape)
    rows = x.size // D if D else 0
    stat = _rows.acc_dtype(x.dtype)
    w_dtype = weight.dtype if weight is not None else x.dtype
    if x.device.kind == "cpu":
        return _np_norm_backward(g, x, mean, rstd, rows, D, weight, needs, stat, shape, w_dtype)
    gx = _norm_dx(kind, g, x, mean, rstd, rows, D, weight) if needs[0] else None
    gw = gb = None
    if (needs[1] and weight is not None) or (needs[2] and mean is not None):
        pw, pb = _norm_param_partials(g, x, mean, rstd, rows, D)
        gw = cast(pw.reshape(shape), w_dtype) if needs[1] and weight is not None else None
        gb = cast(pb.reshape(shape), w_dtype) if needs[2] and mean is not None else None
    return gx, gw, gb


def _norm_dx(
    kind: str,
    g: Tensor,
    x: Tensor,
    mean: Tensor | None,
    rstd: Tensor,
    rows: int,
    width: int,
    weight: Tensor | None,
) -> Tensor:
    gx = Tensor.empty(x.shape, g.dtype, x.device)
    if x.size == 0:
        return gx
    acc = _rows.acc_ctype(x.dtype)
    idx = _rows.index_for(x.size)
    centred = mean is not None
    gy = "(ACC)g[AT(i)]" + (" * (ACC)w[i]" if weight is not None else "")
    xh = "(((ACC)x[AT(i)] - mu) * rs)" if centred else "((ACC)x[AT(i)] * rs)"
    a_term = " - a" if centred else ""
    body = (
        f"    const ACC mu = {'mean[row]' if centred else '0'}, rs = rstd[row];\n"
        "    ACC a = 0, b = 0;\n"
        f"    for (IDX i = LID; i < R; i += LSIZE) {{ const ACC gy = {gy}; a += gy; b += gy * {xh}; }}\n"
        "    ROW_SUM2(a, b);\n"
        "    a /= (ACC)R; b /= (ACC)R;\n"
        f"    for (IDX i = LID; i < R; i += LSIZE) {{ const ACC gy = {gy};\n"
        f"        gx[AT(i)] = ({storage_ctype(g.dtype)})(rs * (gy{a_term} - {xh} * b)); }}"
    )
    params = [
        f"__global const {storage_ctype(x.dtype)}* x",
        *_param("w", weight),
        *([f"__global const {acc}* mean"] if centred else []),
        f"__global const {acc}* rstd",
        f"__global const {storage_ctype(g.dtype)}* g",
        f"__global {storage_ctype(g.dtype)}* gx",
    ]
    buffers = [x, *([weight] if weight is not None else []), *([mean] if centred else []), rstd, g, gx]
    dtypes = [t.dtype for t in buffers]
    name = f"netcl_{kind}_backward"

    def make(mode: str) -> str:
        return _rows.source(name, params, body, _rows.CONTIG, mode, acc, idx, dtypes)

    key = (tuple(d.str for d in dtypes), weight is not None, acc, idx)
    _rows.run(key, x.device, make, name, [None] * len(buffers), rows, width, 1, idx, *buffers)
    return gx


#: Rows each work-item of the weight-gradient kernel sums (at least; more when rows are many).
_PARAM_ROWS = 64
_MAX_CHUNKS = 256

_PARAM_GRAD = """{pragmas}
__kernel void netcl_norm_param_grad(__global const {xt}* x, {mean_param}__global const {acc}* rstd,
                                    __global const {gt}* g, __global {acc}* pw, __global {acc}* pb,
                                    const {idx} rows, const {idx} width, const {idx} per) {{
    const {idx} c = ({idx})get_global_id(0);
    const {idx} k = ({idx})get_global_id(1);
    if (c >= width) return;
    const {idx} start = k * per;
    const {idx} stop = start + per < rows ? start + per : rows;
    {acc} sw = 0, sb = 0;
    for ({idx} r = start; r < stop; ++r) {{
        const {acc} gg = ({acc})g[r * width + c];
        sb += gg;
        sw += gg * ({xhat});
    }}
    pw[k * width + c] = sw;
    pb[k * width + c] = sb;
}}
"""


def _norm_param_partials(
    g: Tensor,
    x: Tensor,
    mean: Tensor | None,
    rstd: Tensor,
    rows: int,
    width: int,
) -> tuple[Tensor, Tensor]:
    """(sum over rows of g * xhat, sum over rows of g), each (width,), in the statistics' dtype."""
    stat = _rows.acc_dtype(x.dtype)
    per = max(_PARAM_ROWS, -(-rows // _MAX_CHUNKS))
    chunks = max(1, -(-rows // per))
    pw = Tensor.empty((chunks, width), stat, x.device)
    pb = Tensor.empty((chunks, width), stat, x.device)
    if x.size == 0:
        from netcl.runtime.ops.pointwise import fill_

        return fill_(Tensor.empty((width,), stat, x.device), 0.0), fill_(Tensor.empty((width,), stat, x.device), 0.0)
    acc = _rows.acc_ctype(x.dtype)
    idx = _rows.index_for(x.size)
    centred = mean is not None
    xhat = "(({acc})x[r * width + c] - mean[r]) * rstd[r]" if centred else "({acc})x[r * width + c] * rstd[r]"

    def make() -> str:
        from netcl.runtime.ops._common import pragmas

        return _PARAM_GRAD.format(
            pragmas=pragmas([x.dtype, g.dtype, stat]),
            xt=storage_ctype(x.dtype),
            gt=storage_ctype(g.dtype),
            acc=acc,
            idx=idx,
            mean_param=f"__global const {acc}* mean, " if centred else "",
            xhat=xhat.format(acc=acc),
        )

    buffers = [x, *([mean] if centred else []), rstd, g, pw, pb]
    types = [None] * len(buffers) + [np.dtype(np.int64 if idx == "long" else np.int32)] * 3
    key = ("norm_param_grad", x.dtype.str, g.dtype.str, centred, acc, idx)
    sizes = scalars(idx, [rows, width, per])
    run_rows(key, x.device, make, "netcl_norm_param_grad", types, (width, chunks, 1), *buffers, *sizes)
    if chunks == 1:
        return pw.reshape(width), pb.reshape(width)
    return _sum(pw, 0), _sum(pb, 0)


def _np_norm_backward(
    g: Tensor,
    x: Tensor,
    mean: Tensor | None,
    rstd: Tensor,
    rows: int,
    width: int,
    weight: Tensor | None,
    needs: tuple[bool, bool, bool],
    stat: np.dtype,
    shape: tuple[int, ...],
    w_dtype: np.dtype,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    device = x.device
    with np.errstate(all="ignore"):
        v = _np(x, stat).reshape(rows, width)
        gv = _np(g, stat).reshape(rows, width)
        mu = _np(mean, stat).reshape(rows, 1) if mean is not None else 0
        rs = _np(rstd, stat).reshape(rows, 1)
        xh = (v - mu) * rs
        gy = gv * _np(weight, stat).reshape(1, width) if weight is not None else gv
        gx = gw = gb = None
        if needs[0]:
            inner = gy - xh * (gy * xh).mean(axis=1, keepdims=True)
            if mean is not None:
                inner = inner - gy.mean(axis=1, keepdims=True)
            gx = wrap_numpy((rs * inner).reshape(x.shape), device, g.dtype)
        if needs[1] and weight is not None:
            gw = wrap_numpy((gv * xh).sum(axis=0).reshape(shape), device, w_dtype)
        if needs[2] and mean is not None:
            gb = wrap_numpy(gv.sum(axis=0).reshape(shape), device, w_dtype)
    return gx, gw, gb


# ---- batch_norm -------------------------------------------------------------------------------------
def check_batch_norm(
    x_shape: Sequence[int],
    running_mean: Any,
    running_var: Any,
    weight: Any,
    bias: Any,
    training: bool,
) -> tuple[int, int, int]:
    """Validate ``batch_norm`` by shapes; returns (N, C, spatial size)."""
    x_shape = tuple(x_shape)
    if len(x_shape) < 2:
        raise ShapeError(f"batch_norm: x must have shape (N, C) or (N, C, *), got {x_shape}")
    N, C = x_shape[0], x_shape[1]
    S = math.prod(x_shape[2:])
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (C,):
            raise ShapeError(f"batch_norm: {name} must have shape ({C},) (one value per channel), got {tuple(t.shape)}")
    if (running_mean is None) != (running_var is None):
        raise ValueError("batch_norm: running_mean and running_var must both be given or both be None")
    if not training and running_mean is None:
        raise ValueError("batch_norm: training=False normalizes with running_mean and running_var, which are None")
    if training and N * S <= 1:
        raise ValueError(f"batch_norm: training needs more than 1 value per channel, got x shape {x_shape}")
    return N, C, S


def batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """PyTorch's ``F.batch_norm`` (see the module docstring); running statistics update in place."""
    return batch_norm_forward(x, running_mean, running_var, weight, bias, training, momentum, eps)[0]


def batch_norm_forward(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, mean, rstd per channel): what normalized x (batch or running statistics), for the backward."""
    _check_tensors("batch_norm", x, running_mean=running_mean, running_var=running_var, weight=weight, bias=bias)
    N, C, S = check_batch_norm(x.shape, running_mean, running_var, weight, bias, bool(training))
    momentum, eps = float(momentum), float(eps)
    stat = _rows.acc_dtype(x.dtype)
    if x.device.kind == "cpu":
        return _np_batch_norm(x, running_mean, running_var, weight, bias, bool(training), momentum, eps, stat)
    y = Tensor.empty(x.shape, x.dtype, x.device)
    mean = Tensor.empty((C,), stat, x.device)
    rstd = Tensor.empty((C,), stat, x.device)
    if C == 0 or (x.size == 0 and not training):
        return y, mean, rstd
    acc = _rows.acc_ctype(x.dtype)
    idx = _rows.index_for(x.size)
    yt = storage_ctype(x.dtype)
    running = running_mean is not None
    scale = " * (ACC)w[row]" if weight is not None else ""
    shift = " + (ACC)b[row]" if bias is not None else ""
    if training:
        update = (
            " rm[row] = (1 - momentum) * (ACC)rm[row] + momentum * mu;"
            " rv[row] = (1 - momentum) * (ACC)rv[row] + momentum * var * (ACC)R / (ACC)(R - 1);"
            if running
            else ""
        )
        stats = (
            "    ACC s1 = 0;\n    for (IDX i = LID; i < R; i += LSIZE) s1 += (ACC)x[AT(i)];\n"
            "    const ACC mu = ROW_SUM(s1) / (ACC)R;\n"
            "    ACC s2 = 0;\n"
            "    for (IDX i = LID; i < R; i += LSIZE) { const ACC d = (ACC)x[AT(i)] - mu; s2 += d * d; }\n"
            "    const ACC var = ROW_SUM(s2) / (ACC)R;\n"
            "    const ACC rs = rsqrt(var + eps);\n"
        )
        tail = f"    if (LID == 0) {{ mean[row] = mu; rstd[row] = rs;{update} }}"
    else:
        stats = "    const ACC mu = (ACC)rm[row], rs = rsqrt((ACC)rv[row] + eps);\n"
        tail = "    if (LID == 0) { mean[row] = mu; rstd[row] = rs; }"
    body = (
        stats
        + f"    for (IDX i = LID; i < R; i += LSIZE) y[AT(i)] = ({yt})(((ACC)x[AT(i)] - mu) * rs{scale}{shift});\n"
        + tail
    )
    running_access = "" if training else "const "
    params = [
        f"__global const {storage_ctype(x.dtype)}* x",
        *_param("w", weight),
        *_param("b", bias),
        *(
            [
                f"__global {running_access}{storage_ctype(running_mean.dtype)}* rm",
                f"__global {running_access}{storage_ctype(running_var.dtype)}* rv",
            ]
            if running
            else []
        ),
        f"__global {yt}* y",
        f"__global {acc}* mean",
        f"__global {acc}* rstd",
        f"const {acc} eps",
        f"const {acc} momentum",
    ]
    buffers = [
        x,
        *[t for t in (weight, bias) if t is not None],
        *([running_mean, running_var] if running else []),
        y,
        mean,
        rstd,
    ]
    dtypes = [t.dtype for t in buffers]
    name = "netcl_batch_norm"

    def make(mode: str) -> str:
        return _rows.source(name, params, body, _rows.CHANNEL, mode, acc, idx, dtypes)

    key = (tuple(d.str for d in dtypes), weight is not None, bias is not None, running, bool(training), acc, idx)
    types = [None] * len(buffers) + [ARG_DTYPES[acc]] * 2
    _rows.run(key, x.device, make, name, types, C, N * S, S, idx, *buffers, _float(eps, acc), _float(momentum, acc))
    return y, mean, rstd


def _np_batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
    stat: np.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    C = x.shape[1]
    axes = (0, *range(2, x.ndim))
    channel = (1, C) + (1,) * (x.ndim - 2)
    v = _np(x, stat)
    with np.errstate(all="ignore"):
        if training:
            mu = v.mean(axis=axes)
            var = ((v - mu.reshape(channel)) ** 2).mean(axis=axes)
            count = x.size // C if C else 0
            if running_mean is not None:
                m = stat.type(momentum)
                running_mean.data[...] = (1 - m) * _np(running_mean, stat) + m * mu
                unbiased = var * stat.type(count / (count - 1))
                running_var.data[...] = (1 - m) * _np(running_var, stat) + m * unbiased
        else:
            mu, var = _np(running_mean, stat), _np(running_var, stat)
        rstd = (1 / np.sqrt(var + stat.type(eps))).astype(stat)
        y = (v - mu.reshape(channel)) * rstd.reshape(channel)
        if weight is not None:
            y = y * _np(weight, stat).reshape(channel)
        if bias is not None:
            y = y + _np(bias, stat).reshape(channel)
    device = x.device
    return wrap_numpy(y, device, x.dtype), wrap_numpy(mu.astype(stat), device, stat), wrap_numpy(rstd, device, stat)


def batch_norm_backward(
    g: Tensor,
    x: Tensor,
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None = None,
    training: bool = False,
    needs: tuple[bool, bool, bool] = (True, True, True),
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dweight, dbias) of ``batch_norm`` from the statistics ``batch_norm_forward`` returned."""
    N, C, S = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    stat = _rows.acc_dtype(x.dtype)
    w_dtype = weight.dtype if weight is not None else stat
    if x.device.kind == "cpu":
        channel = (1, C) + (1,) * (x.ndim - 2)
        axes = (0, *range(2, x.ndim))
        with np.errstate(all="ignore"):
            v, gv = _np(x, stat), _np(g, stat)
            rs = _np(rstd, stat).reshape(channel)
            xh = (v - _np(mean, stat).reshape(channel)) * rs
            w = _np(weight, stat).reshape(channel) if weight is not None else stat.type(1)
            sum_g, sum_gx = gv.sum(axis=axes), (gv * xh).sum(axis=axes)
            if training:
                count = stat.type(N * S)
                gx = w * rs * (gv - sum_g.reshape(channel) / count - xh * sum_gx.reshape(channel) / count)
            else:
                gx = gv * w * rs
        device = x.device
        return (
            wrap_numpy(gx, device, g.dtype) if needs[0] else None,
            wrap_numpy(sum_gx, device, w_dtype) if needs[1] and weight is not None else None,
            wrap_numpy(sum_g, device, w_dtype) if needs[2] else None,
        )
    gx = Tensor.empty(x.shape, g.dtype, x.device)
    dw = Tensor.empty((C,), stat, x.device)
    db = Tensor.empty((C,), stat, x.device)
    if C and x.size:
        _batch_norm_backward_cl(g, x, mean, rstd, weight, bool(training), gx, dw, db, N * S, S)
    elif C:
        from netcl.runtime.ops.pointwise import fill_

        fill_(dw, 0.0)
        fill_(db, 0.0)
    return (
        gx if needs[0] else None,
        cast(dw, w_dtype) if needs[1] and weight is not None else None,
        cast(db, w_dtype) if needs[2] else None,
    )


def _batch_norm_backward_cl(
    g: Tensor,
    x: Tensor,
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
    training: bool,
    gx: Tensor,
    dw: Tensor,
    db: Tensor,
    count: int,
    spatial: int,
) -> None:
    acc = _rows.acc_ctype(x.dtype)
    idx = _rows.index_for(x.size)
    w = "(ACC)w[row]" if weight is not None else "(ACC)1"
    xh = "(((ACC)x[AT(i)] - mu) * rs)"
    dx = f"{w} * rs * ((ACC)g[AT(i)] - a - {xh} * b)" if training else f"(ACC)g[AT(i)] * {w} * rs"
    body = (
        "    const ACC mu = mean[row], rs = rstd[row];\n"
        "    ACC a = 0, b = 0;\n"
        f"    for (IDX i = LID; i < R; i += LSIZE) {{ const ACC gg = (ACC)g[AT(i)]; a += gg; b += gg * {xh}; }}\n"
        "    ROW_SUM2(a, b);\n"
        "    if (LID == 0) { dw[row] = b; db[row] = a; }\n"
        "    a /= (ACC)R; b /= (ACC)R;\n"
        f"    for (IDX i = LID; i < R; i += LSIZE) gx[AT(i)] = ({storage_ctype(g.dtype)})({dx});"
    )
    params = [
        f"__global const {storage_ctype(x.dtype)}* x",
        *_param("w", weight),
        f"__global const {acc}* mean",
        f"__global const {acc}* rstd",
        f"__global const {storage_ctype(g.dtype)}* g",
        f"__global {storage_ctype(g.dtype)}* gx",
        f"__global {acc}* dw",
        f"__global {acc}* db",
    ]
    buffers = [x, *([weight] if weight is not None else []), mean, rstd, g, gx, dw, db]
    dtypes = [t.dtype for t in buffers]
    name = "netcl_batch_norm_backward"

    def make(mode: str) -> str:
        return _rows.source(name, params, body, _rows.CHANNEL, mode, acc, idx, dtypes)

    key = (tuple(d.str for d in dtypes), weight is not None, training, acc, idx)
    _rows.run(key, x.device, make, name, [None] * len(buffers), x.shape[1], count, spatial, idx, *buffers)


__all__ = [
    "batch_norm",
    "batch_norm_backward",
    "batch_norm_forward",
    "check_batch_norm",
    "check_norm",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "rms_eps",
    "rms_norm",
    "rms_norm_forward",
]
