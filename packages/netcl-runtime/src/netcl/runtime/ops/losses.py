"""Classification losses: ``cross_entropy`` and ``nll_loss`` (row kernels), ``binary_cross_entropy``.

``cross_entropy(logits, target)`` takes (N, C) or (N, C, d1, ...) logits and integer class targets of
shape (N,) or (N, d1, ...): one row kernel computes, per target position, the row's online-softmax
statistics (max ``m``, ``s = sum(exp(x - m))``) and the loss ``(1 - eps)(m - x_t) + eps (m - mean(x))
+ log(s)`` (label smoothing ``eps``; the max is subtracted, so logits of 1e4 stay finite), storing
``(m, log(s))`` per row (not their sum, whose rounding at |m| ~ 1e4 would cost the softmax ~1e-3).
Targets equal to ``ignore_index`` add nothing and do not count. The
``mean`` (over the counted targets; NaN when none count, as PyTorch) and ``sum`` reductions are one
more single-work-group kernel. The backward is one row kernel recomputing ``softmax = exp((x - m) - log(s))``:
``g_row (softmax - (1 - eps) onehot - eps / C)``. ``nll_loss`` is the same over log-probabilities
(``-x_t``). Values are computed in float32 (float64 for float64 logits); float16 logits are read as
half and the loss is returned in their dtype.

Target values outside ``[0, C)`` (other than ``ignore_index``) raise ``IndexError`` before any launch:
a NumPy target is checked on the host; a Tensor target is read back (a synchronization point), except
while a capture records, where the kernel gives NaN for such a row instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import Device, Tensor, same_device
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime.capture import is_recording
from netcl.runtime.ops import _rows
from netcl.runtime.ops._common import ARG_DTYPES, storage_ctype, wrap_numpy
from netcl.runtime.ops._table import OpDef
from netcl.runtime.ops.layout import cast
from netcl.runtime.ops.pointwise import apply

REDUCTIONS = ("mean", "sum", "none")


# ---- validation --------------------------------------------------------------------------------------
def check_reduction(reduction: Any, op: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return reduction


def check_class_target(logits_shape: tuple[int, ...], target: Any, op: str, arg: str = "logits") -> None:
    """Shape and dtype of class targets for (N, C, d1, ...) ``logits`` (no value check)."""
    logits_shape = tuple(logits_shape)
    if len(logits_shape) < 2:
        raise ShapeError(f"{op}: {arg} must have shape (N, C) or (N, C, d1, ...), got {logits_shape}")
    tensor_like = hasattr(target, "shape") and hasattr(target, "dtype")  # a Tensor, a Node, a traced value
    dtype = np.dtype(target.dtype) if tensor_like else np.asarray(target).dtype
    if dtype.kind not in "iu":
        raise DTypeError(f"{op}: target must hold integer class indices (int32/int64), got dtype {dtype}")
    expected = (logits_shape[0], *logits_shape[2:])
    shape = tuple(target.shape) if tensor_like else np.shape(target)
    if shape != expected:
        raise ShapeError(
            f"{op}: target must have shape {expected} for {arg} of shape {logits_shape}, got {tuple(shape)}"
        )


def check_target_values(target: Tensor | np.ndarray, classes: int, ignore_index: int, op: str) -> None:
    """IndexError when a target is outside ``[0, classes)`` and not ``ignore_index`` (see the module doc)."""
    if target.size == 0:
        return
    if isinstance(target, np.ndarray):
        host = target
    elif target.device.kind != "cpu" and is_recording(target.device.queue):
        return
    else:
        host = np.asarray(target.data) if target.device.kind == "cpu" else target.to_host()
    host = host.astype(np.int64, copy=False)
    bad = host[((host < 0) | (host >= classes)) & (host != ignore_index)]
    if bad.size:
        raise IndexError(
            f"{op}: target value {int(bad[0])} is out of range: expected 0 <= target < {classes} "
            f"(the number of classes) or ignore_index={ignore_index}"
        )


def as_target(target: Any, device: Device, op: str) -> Tensor:
    """``target`` as an integer Tensor on ``device`` (NumPy arrays and lists are uploaded as int32)."""
    if isinstance(target, Tensor):
        same_device(device, target.device)
        return target
    host = np.asarray(target)
    if host.dtype.kind not in "iu":
        raise DTypeError(f"{op}: target must hold integer class indices (int32/int64), got dtype {host.dtype}")
    return Tensor.from_host(device, np.ascontiguousarray(host, dtype=np.int32))


def prepare(
    logits: Tensor, target: Any, ignore_index: int, reduction: str, op: str, label_smoothing: float = 0.0
) -> Tensor:
    """Every check of a class loss, then the target as a device Tensor."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(logits).__name__}")
    _rows.require_float(logits, op, "input")
    check_reduction(reduction, op)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"{op}: ignore_index must be an int, got {ignore_index!r}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    check_class_target(logits.shape, target, op, "input")
    host = None if isinstance(target, Tensor) else np.asarray(target)
    check_target_values(target if host is None else host, logits.shape[1], int(ignore_index), op)
    if host is not None and (host.min(initial=0) < -(2**31) or host.max(initial=0) >= 2**31):
        raise IndexError(f"{op}: target values must fit in int32")
    return as_target(target, logits.device, op)


# ---- kernels -------------------------------------------------------------------------------------------
def _split(logits: Tensor) -> tuple[int, int, int]:
    return _rows.row_split(logits.shape, 1, 1)


_CE_ROWS = (
    "    ACC m = -INFINITY, s = 0, sx = 0;\n"
    "    for (IDX i = LID; i < R; i += LSIZE) {\n"
    "        const ACC v = (ACC)x[AT(i)];\n"
    "        SMOOTH_SUM\n"
    f"        {_rows.MAXSUM_STEP}\n"
    "    }\n"
    "    ROW_MAXSUM(m, s);\n"
    "    SMOOTH_REDUCE\n"
    "    if (LID == 0) {\n"
    "        const long t = (long)target[row];\n"
    "        lse[2 * row] = m;\n"
    "        lse[2 * row + 1] = log(s);\n"
    "        if (t == ignore) { loss[row] = 0; valid[row] = 0; }\n"
    "        else if (t < 0 || t >= R) { loss[row] = NAN; valid[row] = 1; }\n"
    "        else {\n"
    "            loss[row] = (1 - eps) * (m - (ACC)x[AT(t)]) SMOOTH_TERM + log(s);\n"
    "            valid[row] = 1;\n"
    "        }\n"
    "    }"
)

_NLL_ROWS = (
    "    const long t = (long)target[row];\n"
    "    if (t == ignore) { loss[row] = 0; valid[row] = 0; }\n"
    "    else if (t < 0 || t >= R) { loss[row] = NAN; valid[row] = 1; }\n"
    "    else { loss[row] = -(ACC)x[AT(t)]; valid[row] = 1; }"
)

_FINALIZE = (
    "    ACC a = 0, b = 0;\n"
    "    for (IDX i = LID; i < R; i += LSIZE) { a += loss[i]; b += valid[i]; }\n"
    "    ROW_SUM2(a, b);\n"
    "    if (LID == 0) { out[0] = (OT)(MEAN ? a / b : a); count[0] = b; }"
)


def _class_rows(kind: str, x: Tensor, target: Tensor, ignore_index: int, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(loss per row, (max, log-sum) per row (cross_entropy) or the loss again, valid flag per row)."""
    outer, C, inner = _split(x)
    rows = outer * inner
    stat = _rows.acc_dtype(x.dtype)
    loss = Tensor.empty((rows,), stat, x.device)
    valid = Tensor.empty((rows,), stat, x.device)
    lse = Tensor.empty((rows, 2), stat, x.device) if kind == "cross_entropy" else loss
    acc = _rows.acc_ctype(x.dtype)
    idx = _rows.index_for(x.size)
    layout = _rows.layout_of(inner)
    smooth = kind == "cross_entropy" and eps > 0
    name = f"netcl_{kind}_rows"
    params = [
        f"__global const {storage_ctype(x.dtype)}* x",
        f"__global const {storage_ctype(target.dtype)}* target",
        f"__global {acc}* loss",
        *([f"__global {acc}* lse"] if kind == "cross_entropy" else []),
        f"__global {acc}* valid",
        "const long ignore",
        f"const {acc} eps",
    ]
    body = _CE_ROWS if kind == "cross_entropy" else _NLL_ROWS
    body = (
        body.replace("SMOOTH_SUM", "sx += v;" if smooth else "")
        .replace("SMOOTH_REDUCE", "sx = ROW_SUM(sx);" if smooth else "")
        .replace("SMOOTH_TERM", "+ eps * (m - sx / (ACC)R)" if smooth else "")
    )
    buffers = [x, target, loss, *([lse] if kind == "cross_entropy" else []), valid]

    def make(mode: str) -> str:
        return _rows.source(name, params, body, layout, mode, acc, idx, [x.dtype, stat])

    key = (layout, x.dtype.str, target.dtype.str, smooth, acc, idx)
    types = [None] * len(buffers) + [ARG_DTYPES["long"], ARG_DTYPES[acc]]
    mode = None if kind == "cross_entropy" else "serial"  # nll reads one element per row
    scalars = (np.int64(ignore_index), ARG_DTYPES[acc].type(eps))
    _rows.run(key, x.device, make, name, types, rows, C, inner, idx, *buffers, *scalars, mode=mode)
    return loss, lse, valid


def _reduce_rows(loss: Tensor, valid: Tensor, reduction: str, out_dtype: np.dtype) -> tuple[Tensor, Tensor]:
    """(the reduced 0-d loss, the count of valid targets as a 1-element tensor)."""
    device = loss.device
    out = Tensor.empty((), out_dtype, device)
    count = Tensor.empty((1,), loss.dtype, device)
    acc = _rows.acc_ctype(loss.dtype)
    idx = _rows.index_for(loss.size)
    mean = reduction == "mean"
    name = "netcl_class_loss_reduce"
    ot = storage_ctype(out_dtype)
    params = [
        f"__global const {acc}* loss",
        f"__global const {acc}* valid",
        f"__global {ot}* out",
        f"__global {acc}* count",
    ]
    body = _FINALIZE.replace("OT", ot).replace("MEAN", "1" if mean else "0")

    def make(mode: str) -> str:
        return _rows.source(name, params, body, _rows.CONTIG, mode, acc, idx, [loss.dtype, out_dtype])

    key = (out_dtype.str, mean, acc, idx)
    _rows.run(key, device, make, name, [None] * 4, 1, loss.size, 1, idx, loss, valid, out, count, mode="group")
    return out, count


def _np_class_rows(
    kind: str, x: Tensor, target: Tensor, ignore_index: int, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    stat = _rows.acc_dtype(x.dtype)
    v = np.moveaxis(np.asarray(x.data, dtype=stat), 1, -1).reshape(-1, x.shape[1])  # rows in target order
    t = np.asarray(target.data).reshape(-1).astype(np.int64)
    valid = t != ignore_index
    safe = np.where(valid & (t >= 0) & (t < x.shape[1]), t, 0)
    picked = v[np.arange(v.shape[0]), safe] if v.shape[0] else np.zeros(0, stat)
    with np.errstate(all="ignore"):
        if kind == "cross_entropy":
            m = v.max(axis=1) if v.shape[1] else np.full(v.shape[0], -np.inf, stat)
            m_safe = np.where(np.isfinite(m), m, 0)
            s = np.exp(v - m_safe[:, None]).sum(axis=1)
            log_s = np.log(s) + (m_safe - m)
            loss = (1 - eps) * (m - picked) + eps * (m - v.mean(axis=1)) + log_s if eps > 0 else (m - picked) + log_s
            lse = np.stack([m, log_s], axis=1)
        else:
            loss = -picked
            lse = loss
    loss = np.where(valid, loss, 0).astype(stat)
    return loss, lse.astype(stat), valid.astype(stat)


def _finish(
    loss: Tensor, valid: Tensor, reduction: str, x: Tensor, target_shape: tuple[int, ...]
) -> tuple[Tensor, Tensor | None]:
    """OpenCL: the per-row losses reduced (or reshaped, for 'none') and the count of counted targets."""
    if reduction == "none":
        out = loss.reshape(target_shape)
        return (out if out.dtype == x.dtype else cast(out, x.dtype)), None
    return _reduce_rows(loss, valid, reduction, x.dtype)


def cross_entropy_forward(
    logits: Tensor,
    target: Any,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """(loss, (max, log-sum-exp minus max) per row, count of counted targets (None for 'none'), target)."""
    t = prepare(logits, target, ignore_index, reduction, "cross_entropy", label_smoothing)
    eps = float(label_smoothing)
    if logits.device.kind == "cpu" or logits.size == 0:
        loss, lse, valid = _np_class_rows("cross_entropy", _host_view(logits), _host_view(t), ignore_index, eps)
        out, count = _finish_host(loss, valid, reduction, logits, t.shape)
        return out, wrap_or_upload(lse, logits.device), count, t
    loss, lse, valid = _class_rows("cross_entropy", logits, t, int(ignore_index), eps)
    out, count = _finish(loss, valid, reduction, logits, tuple(t.shape))
    return out, lse, count, t


def nll_loss_forward(
    log_probs: Tensor, target: Any, ignore_index: int = -100, reduction: str = "mean"
) -> tuple[Tensor, Tensor | None, Tensor]:
    """(loss, count of counted targets (None for 'none'), target as a Tensor)."""
    t = prepare(log_probs, target, ignore_index, reduction, "nll_loss")
    if log_probs.device.kind == "cpu" or log_probs.size == 0:
        loss, _, valid = _np_class_rows("nll_loss", _host_view(log_probs), _host_view(t), ignore_index, 0.0)
        out, count = _finish_host(loss, valid, reduction, log_probs, t.shape)
        return out, count, t
    loss, _, valid = _class_rows("nll_loss", log_probs, t, int(ignore_index), 0.0)
    out, count = _finish(loss, valid, reduction, log_probs, tuple(t.shape))
    return out, count, t


def _host_view(t: Tensor) -> Tensor:
    """``t`` itself on the NumPy backend; a NumPy-backend copy of an (empty) OpenCL tensor."""
    if t.device.kind == "cpu":
        return t
    return Tensor(t.to_host(), t.shape, t.dtype, t.device)


def _finish_host(
    loss: np.ndarray, valid: np.ndarray, reduction: str, x: Tensor, target_shape: tuple[int, ...]
) -> tuple[Tensor, Tensor | None]:
    device = x.device
    if reduction == "none":
        return wrap_or_upload(loss.reshape(target_shape), device, x.dtype), None
    total, count = loss.sum(dtype=loss.dtype), valid.sum(dtype=valid.dtype)
    with np.errstate(all="ignore"):
        value = total / count if reduction == "mean" else total
    return wrap_or_upload(np.asarray(value), device, x.dtype), wrap_or_upload(np.asarray([count]), device)


def wrap_or_upload(values: np.ndarray, device: Device, dtype: Any = None) -> Tensor:
    """A Tensor of ``values`` on ``device`` (wrapped on the NumPy backend, uploaded on OpenCL)."""
    values = np.asarray(values, dtype=dtype if dtype is not None else values.dtype)
    if device.kind == "cpu":
        return wrap_numpy(values, device)
    return Tensor.from_host(device, np.ascontiguousarray(values))


def cross_entropy(
    logits: Tensor, target: Any, label_smoothing: float = 0.0, ignore_index: int = -100, reduction: str = "mean"
) -> Tensor:
    """PyTorch's ``F.cross_entropy`` with integer class targets (see the module docstring)."""
    return cross_entropy_forward(logits, target, label_smoothing, ignore_index, reduction)[0]


def nll_loss(log_probs: Tensor, target: Any, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """PyTorch's ``F.nll_loss``: ``-log_probs[n, target[n], ...]``, reduced."""
    return nll_loss_forward(log_probs, target, ignore_index, reduction)[0]


_CE_GRAD = (
    "    const long t = (long)target[row];\n"
    "    if (t == ignore) { for (IDX i = LID; i < R; i += LSIZE) gx[AT(i)] = (GT)0; return; }\n"
    "    const ACC gg = GSCALE;\n"
    "    const ACC mx = lse[2 * row], ls = lse[2 * row + 1];\n"
    "    for (IDX i = LID; i < R; i += LSIZE)\n"
    "        gx[AT(i)] = (GT)(gg * (exp(((ACC)x[AT(i)] - mx) - ls) - (i == t ? (ACC)1 - eps : (ACC)0) - eps / (ACC)R));"
)

_NLL_GRAD = (
    "    const long t = (long)target[row];\n"
    "    const ACC gg = t == ignore ? (ACC)0 : GSCALE;\n"
    "    for (IDX i = LID; i < R; i += LSIZE) gx[AT(i)] = (GT)(i == t ? -gg : (ACC)0);"
)


def _gscale(reduction: str) -> str:
    return {"none": "(ACC)g[row]", "sum": "(ACC)g[0]", "mean": "(ACC)g[0] / count[0]"}[reduction]


def class_loss_backward(
    kind: str,
    g: Tensor,
    x: Tensor,
    target: Tensor,
    lse: Tensor | None,
    count: Tensor | None,
    reduction: str,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    """d loss / d logits (``kind`` 'cross_entropy') or d loss / d log_probs ('nll_loss'); one kernel."""
    eps = float(label_smoothing)
    if x.device.kind == "cpu" or x.size == 0:
        return _np_class_backward(kind, g, x, target, lse, count, reduction, ignore_index, eps)
    outer, C, inner = _split(x)
    gx = Tensor.empty(x.shape, g.dtype, x.device)
    acc = _rows.acc_ctype(x.dtype)
    idx = _rows.index_for(x.size)
    layout = _rows.layout_of(inner)
    gt = storage_ctype(g.dtype)
    name = f"netcl_{kind}_backward"
    ce = kind == "cross_entropy"
    params = [
        f"__global const {storage_ctype(x.dtype)}* x",
        f"__global const {storage_ctype(target.dtype)}* target",
        *([f"__global const {acc}* lse"] if ce else []),
        f"__global const {gt}* g",
        *([f"__global const {acc}* count"] if reduction == "mean" else []),
        f"__global {gt}* gx",
        "const long ignore",
        f"const {acc} eps",
    ]
    body = (_CE_GRAD if ce else _NLL_GRAD).replace("GSCALE", _gscale(reduction)).replace("GT", gt)
    buffers = [x, target, *([lse] if ce else []), g, *([count] if reduction == "mean" else []), gx]

    def make(mode: str) -> str:
        return _rows.source(name, params, body, layout, mode, acc, idx, [x.dtype, g.dtype])

    key = (layout, x.dtype.str, target.dtype.str, g.dtype.str, reduction, acc, idx)
    types = [None] * len(buffers) + [ARG_DTYPES["long"], ARG_DTYPES[acc]]
    scalars = (np.int64(ignore_index), ARG_DTYPES[acc].type(eps))
    _rows.run(key, x.device, make, name, types, outer * inner, C, inner, idx, *buffers, *scalars)
    return gx


def _np_class_backward(
    kind: str,
    g: Tensor,
    x: Tensor,
    target: Tensor,
    lse: Tensor | None,
    count: Tensor | None,
    reduction: str,
    ignore_index: int,
    eps: float,
) -> Tensor:
    stat = _rows.acc_dtype(x.dtype)
    C = x.shape[1]

    def host(t: Tensor) -> np.ndarray:
        return np.asarray(t.data) if t.device.kind == "cpu" else t.to_host()

    v = np.moveaxis(host(x).astype(stat), 1, -1).reshape(-1, C)
    t = host(target).reshape(-1).astype(np.int64)
    gv = host(g).astype(stat).reshape(-1)
    if reduction == "none":
        scale = gv
    elif reduction == "sum":
        scale = np.full(t.shape, gv[0], stat)
    else:
        with np.errstate(all="ignore"):
            scale = np.full(t.shape, gv[0] / host(count).astype(stat)[0], stat)
    scale = np.where(t == ignore_index, 0, scale).astype(stat)
    onehot = (t[:, None] == np.arange(C)[None, :]).astype(stat)
    with np.errstate(all="ignore"):
        if kind == "cross_entropy":
            stats = host(lse).astype(stat).reshape(-1, 2)
            p = np.exp((v - stats[:, :1]) - stats[:, 1:])
            rows = scale[:, None] * (p - (1 - eps) * onehot - eps / C)
        else:
            rows = -scale[:, None] * onehot
    moved = (x.shape[0], *x.shape[2:], C)
    result = np.moveaxis(rows.reshape(moved), -1, 1)
    return wrap_or_upload(np.ascontiguousarray(result), x.device, g.dtype)


# ---- binary cross-entropy ------------------------------------------------------------------------------
def _np_bce(p: np.ndarray, t: np.ndarray, w: np.ndarray) -> np.ndarray:
    return -w * (t * np.maximum(np.log(p), -100) + (1 - t) * np.maximum(np.log1p(-p), -100))


def _np_bce_grad_p(p: np.ndarray, t: np.ndarray, w: np.ndarray, g: np.ndarray) -> np.ndarray:
    return g * w * (p - t) / np.maximum((1 - p) * p, 1e-12)


def _np_bce_grad_t(p: np.ndarray, t: np.ndarray, w: np.ndarray, g: np.ndarray) -> np.ndarray:
    return g * w * (np.maximum(np.log1p(-p), -100) - np.maximum(np.log(p), -100))


#: -w (t log p + (1 - t) log(1 - p)), each log clamped at -100 (PyTorch), and its two gradients times g
BCE = OpDef(
    "bce", "(-{2} * ({1} * fmax(log({0}), -100.0f) + (1 - {1}) * fmax(log1p(-{0}), -100.0f)))", _np_bce, "float"
)
BCE_GRAD_P = OpDef("bce_grad_p", "({3} * {2} * ({0} - {1}) / fmax((1 - {0}) * {0}, 1e-12f))", _np_bce_grad_p, "float")
BCE_GRAD_T = OpDef(
    "bce_grad_t", "({3} * {2} * (fmax(log1p(-{0}), -100.0f) - fmax(log({0}), -100.0f)))", _np_bce_grad_t, "float"
)


def check_bce(p_shape: tuple[int, ...], t_shape: tuple[int, ...], w_shape: tuple[int, ...] | None) -> None:
    if tuple(t_shape) != tuple(p_shape):
        raise ShapeError(
            f"binary_cross_entropy: target must have the input's shape {tuple(p_shape)}, got {tuple(t_shape)}"
        )
    if w_shape is not None:
        try:
            out = np.broadcast_shapes(tuple(w_shape), tuple(p_shape))
        except ValueError:
            out = None
        if out != tuple(p_shape):
            raise ShapeError(
                f"binary_cross_entropy: weight of shape {tuple(w_shape)} does not broadcast to the input's "
                f"shape {tuple(p_shape)}"
            )


def bce_terms(p: Tensor, t: Tensor, w: Tensor | float = 1.0) -> Tensor:
    """Elementwise ``-w (t log p + (1 - t) log(1 - p))`` with each log clamped at -100 (PyTorch)."""
    return apply(BCE, (p, t, w))


def bce_grads(
    p: Tensor, t: Tensor, w: Tensor | float, g: Tensor | float, need_p: bool = True, need_t: bool = True
) -> tuple[Tensor | None, Tensor | None]:
    """(d/dp, d/dt) of ``bce_terms`` times ``g`` (one kernel each, only those needed):
    ``g w (p - t) / max(p (1 - p), 1e-12)`` and ``g w (log(1 - p) - log p)`` (clamped logs)."""
    gp = apply(BCE_GRAD_P, (p, t, w, g)) if need_p else None
    gt = apply(BCE_GRAD_T, (p, t, w, g)) if need_t else None
    return gp, gt


__all__ = [
    "as_target",
    "bce_grads",
    "bce_terms",
    "check_bce",
    "check_class_target",
    "check_reduction",
    "check_target_values",
    "class_loss_backward",
    "cross_entropy",
    "cross_entropy_forward",
    "nll_loss",
    "nll_loss_forward",
]
