"""Differentiable losses, each one ``apply_op`` call named after its JIT primitive.

``mse_loss``, ``cross_entropy``, ``bce_with_logits`` and ``smooth_l1`` return the mean over all
elements (a 0-d Node). ``weighted_bce`` and ``weighted_smooth_l1`` are the elementwise terms of
the detection loss in docs/architecture.md (no reduction) with gradients w.r.t. ``pred`` only;
``weighted_bce_logits`` is ``weighted_bce`` with torch's ``pos_weight``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op
from netcl.autograd.row_hook import provided
from netcl.core import ShapeError, Tensor
from netcl.runtime.ops import class_loss, layout, pointwise, reduce, rowwise
from netcl.runtime.ops._table import numpy_sigmoid

_Grads = list[Tensor | None]


def np_bce_logits(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """NumPy twin of PRIMITIVE_PREAMBLE's BCE_LOGITS."""
    return np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))


#: Overflow-free logistic function (the eager NumPy backend's SIGMOID).
np_sigmoid = numpy_sigmoid


def np_smooth_l1(d: np.ndarray, beta: float) -> np.ndarray:
    """NumPy twin of SMOOTH_L1: 0.5*d*d/beta inside |d| < beta, |d| - 0.5*beta outside."""
    a = np.abs(d)
    return np.where(a < beta, 0.5 * d * d / (beta if beta > 0 else 1.0), a - 0.5 * beta)


def np_smooth_l1_grad(d: np.ndarray, beta: float) -> np.ndarray:
    """NumPy twin of SMOOTH_L1_GRAD: d/beta inside the band, sign(d) outside."""
    return np.where(np.abs(d) < beta, d / (beta if beta > 0 else 1.0), np.sign(d))


def _needs(x: Any) -> bool:
    return isinstance(x, Node) and x.requires_grad


def _reduce(grad: Tensor | None, like: Any) -> Tensor | None:
    return None if grad is None else layout.sum_to_shape(grad, tuple(like.shape))


def _scaled(g: Tensor, count: int) -> Tensor:
    """The upstream gradient of a mean, divided by the element count (a 0-d tensor)."""
    return pointwise.mul(g, 1.0 / count)


def mse_loss(pred: Any, target: Any) -> Node:
    """mean((pred - target) ** 2); target broadcasts against pred."""

    def forward(p: Tensor, t: Tensor) -> Tensor:
        return reduce.mean(pointwise.squared_difference(p, t))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t = values
        size = math.prod(np.broadcast_shapes(tuple(p.shape), tuple(t.shape)))
        gd = pointwise.scaled_difference(p, t, pointwise.mul(g, 2.0 / size))
        return [_reduce(gd, p) if _needs(pred) else None, _reduce(pointwise.neg(gd), t) if _needs(target) else None]

    return apply_op(forward, grad, pred, target, op_name="mse_loss")


_REDUCTIONS = ("mean", "sum", "none")


def class_targets(target: Any, logits: Any, op: str, ignore_index: int) -> Tensor | np.ndarray:
    """``target`` as an int Tensor of shape (N, d1, ...) with values in [0, C) or ``ignore_index``.

    ``logits`` is (N, C) or (N, C, d1, ...). A NumPy target (or one on the NumPy backend) is checked on the
    host here; an OpenCL Tensor target is checked by the kernels that read it, without a wait
    (``class_loss``: ``IndexError`` at the next wait).
    """
    shape = tuple(logits.shape)
    if len(shape) < 2:
        raise ShapeError(f"{op}: input must be (N, C) or (N, C, d1, ...), got shape {shape}")
    expected = (shape[0], *shape[2:])
    if isinstance(target, Node) and not isinstance(target.value, Tensor):  # traced by jit_compile
        if np.dtype(target.dtype).kind not in "iu" or tuple(target.shape) != expected:
            raise TypeError(f"{op}: target must be integer class indices of shape {expected}")
        return target  # type: ignore[return-value]
    labels = target.value if isinstance(target, Node) else target
    if isinstance(labels, Tensor):
        host = None
        if labels.dtype.kind not in "iu":
            raise TypeError(f"{op}: target must hold integer class indices, got dtype {labels.dtype}")
    else:
        host = np.asarray(labels)
        if host.dtype.kind not in "iu":
            raise TypeError(f"{op}: target must hold integer class indices, got dtype {host.dtype}")
    if tuple(labels.shape) != expected:
        raise ShapeError(
            f"{op}: target must have shape {expected} for input of shape {shape}, got {tuple(labels.shape)}"
        )
    if host is None:  # labels in host memory (the NumPy backend) are checked here; on a device, by the kernel
        host = labels.device.storage.host_array(labels)
    if host is not None and host.size:
        bad = host[(host != ignore_index) & ((host < 0) | (host >= shape[1]))]
        if bad.size:
            raise IndexError(
                f"{op}: target value {int(bad[0])} is out of range: expected 0 <= target < {shape[1]} "
                f"or target == ignore_index ({ignore_index})"
            )
    if isinstance(labels, Tensor):
        return labels
    if isinstance(logits, Node) and not isinstance(logits.value, Tensor):
        return host.astype(np.int32)  # traced logits have no device yet: uploaded when the op runs
    return Tensor.from_host(logits.device, host.astype(np.int32))


def _device_targets(t: Any, like: Tensor) -> Tensor:
    """Class targets as a Tensor on ``like``'s device (a host array kept by a traced call is uploaded)."""
    return Tensor.from_host(like.device, t) if isinstance(t, np.ndarray) else t


def _check_reduction(reduction: str, op: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _f32(t: Tensor) -> Tensor:
    """float16 computes in float32 (losses stay float32); other dtypes pass through."""
    return layout.cast(t, np.float32) if t.dtype == np.float16 else t


def _class_loss(
    x: Any,
    target: Any,
    ignore_index: int,
    reduction: str,
    smoothing: float,
    from_logits: bool,
    op: str,
    checked: bool = False,
) -> Node:
    """cross_entropy (``from_logits``: log_softmax over axis 1 first) or nll_loss, as PyTorch defines them.

    Per position: ``-sum_c q_c * logp_c`` with ``q = (1 - s) * one_hot(t) + s / C``, 0 where
    ``t == ignore_index``; "mean" divides by the number of non-ignored positions.
    """
    _check_reduction(reduction, op)
    labels = target if checked else class_targets(target, x, op, ignore_index)
    if from_logits and len(tuple(x.shape)) == 2 and x.shape[1]:
        return _logit_rows_loss(x, labels, ignore_index, reduction, smoothing, op)
    shape = tuple(x.shape)
    classes = shape[1]
    rows = math.prod(shape) // classes if classes else 0
    kept_shape = (shape[0], *shape[2:])
    saved: dict[str, Any] = {}

    def parts(v: Tensor, t: Tensor) -> tuple[Tensor, tuple[int, ...], Tensor, Tensor]:
        t = _device_targets(t, v)
        class_loss.check_targets(t, classes, ignore_index, op)  # one_hot below reads a bad target as no class
        flat, perm, _, _ = rowwise.rows_layout(_f32(v), (1,))
        logp = rowwise.softmax_forward(flat, (1,), rowwise.LOG_SOFTMAX)[0] if from_logits else flat
        ignored = pointwise.eq(t.reshape(rows), ignore_index)
        valid = pointwise.sub(1.0, ignored)
        q = layout.one_hot(pointwise.where(ignored, 0, t.reshape(rows)), classes)
        if smoothing:
            q = pointwise.add(pointwise.mul(q, 1.0 - smoothing), smoothing / classes)
        return logp, perm, valid, q

    def forward(v: Tensor, t: Tensor) -> Tensor:
        logp, perm, valid, q = parts(v, t)
        per_row = pointwise.mul(pointwise.neg(reduce.sum(pointwise.mul(q, logp), 1)), valid)
        if reduction == "none":
            out = per_row.reshape(kept_shape)
        elif reduction == "sum":
            out = reduce.sum(per_row)
        else:
            out = pointwise.div(reduce.sum(per_row), reduce.sum(valid))
        saved.update(out=out, parts=(logp, perm, valid, q))
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        v, t = values
        logp, perm, valid, q = saved["parts"] if saved.get("out") is out else parts(v, t)
        if reduction == "none":
            scale = pointwise.mul(g.reshape(rows), valid)
        elif reduction == "sum":
            scale = pointwise.mul(valid, g)
        else:
            # every target ignored: the loss is 0/0 = NaN (PyTorch), but no position gets a gradient
            scale = pointwise.mul(valid, pointwise.div(g, pointwise.maximum(reduce.sum(valid), 1.0)))
        base = pointwise.sub(pointwise.exp(logp), q) if from_logits else pointwise.neg(q)
        gflat = pointwise.mul(base, scale.reshape(rows, 1))
        gx = rowwise.restore_rows(gflat, shape, perm)
        return [gx if gx.dtype == v.dtype else layout.cast(gx, v.dtype), None]

    attrs = {"ignore_index": ignore_index, "reduction": reduction, "label_smoothing": smoothing}
    return apply_op(forward, grad, x, labels, op_name=op, attrs=attrs)


def _logit_rows_loss(x: Any, labels: Any, ignore_index: int, reduction: str, smoothing: float, op: str) -> Node:
    """cross_entropy of (N, C) logits on the runtime's class-loss kernels (``class_loss``): one row
    kernel and one reduction forward, one row kernel backward."""
    saved: dict[str, Any] = {}

    def forward(v: Tensor, t: Tensor) -> Tensor:
        t = _device_targets(t, v)
        rows_loss, rowmax, rowsum = class_loss.class_loss_forward(_f32(v), t, ignore_index, smoothing, op)
        out, count = rows_loss, rowmax  # "none": the backward reads no count
        if reduction != "none":
            out, count = class_loss.class_loss_reduce(rows_loss, t, ignore_index, reduction == "mean")
        saved.update(out=out, stats=(t, rowmax, rowsum, count))
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        v = values[0]
        if saved.get("out") is not out:
            forward(v, values[1])
        t, rowmax, rowsum, count = saved["stats"]
        gx = class_loss.class_loss_backward(g, _f32(v), t, rowmax, rowsum, count, ignore_index, smoothing, reduction)
        return [gx if gx.dtype == v.dtype else layout.cast(gx, v.dtype), None]

    attrs = {"ignore_index": ignore_index, "reduction": reduction, "label_smoothing": smoothing}
    return apply_op(forward, grad, x, labels, op_name=op, attrs=attrs)


def cross_entropy(
    logits: Any, target: Any, label_smoothing: float = 0.0, ignore_index: int = -100, reduction: str = "mean"
) -> Node:
    """PyTorch's ``cross_entropy`` with integer class targets.

    ``logits`` (N, C) or (N, C, d1, ...), ``target`` (N,) or (N, d1, ...) ints (a Tensor or a NumPy
    array). Log-softmax over axis 1 with the row max subtracted (logits of magnitude 1e4 stay
    finite); ``label_smoothing`` mixes the one-hot target with the uniform distribution;
    positions whose target equals ``ignore_index`` add nothing and do not count in the mean.
    The gradient w.r.t. the logits is ``(softmax - q) * scale``; ``target`` gets none. Float16
    logits are computed in float32 and the loss is float32.
    """
    smoothing = float(label_smoothing)
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    _check_reduction(reduction, "cross_entropy")
    attrs = {"ignore_index": int(ignore_index), "reduction": reduction, "label_smoothing": smoothing}
    # eager: the targets are checked once, then the fused row kernels may take the call
    traced = isinstance(logits, Node) and not isinstance(logits.value, Tensor)
    if not traced and isinstance(target, (Tensor, Node)) and len(tuple(logits.shape)) == 2:
        labels = class_targets(target, logits, "cross_entropy", int(ignore_index))
        fused = provided("cross_entropy", (logits, labels), attrs)
        if fused is not None:
            return fused
        return _class_loss(logits, labels, int(ignore_index), reduction, smoothing, True, "cross_entropy", True)
    return _class_loss(logits, target, int(ignore_index), reduction, smoothing, True, "cross_entropy")


def nll_loss(log_probs: Any, target: Any, ignore_index: int = -100, reduction: str = "mean") -> Node:
    """PyTorch's ``nll_loss``: ``-log_probs[n, target[n], ...]``, reduced; shapes as ``cross_entropy``."""
    return _class_loss(log_probs, target, int(ignore_index), reduction, 0.0, False, "nll_loss")


def _np_bce(p: np.ndarray, t: np.ndarray, w: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return -w * (t * np.maximum(np.log(p), -100.0) + (1 - t) * np.maximum(np.log1p(-p), -100.0))


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(shape[::-1], target[::-1], strict=False))


def binary_cross_entropy(probs: Any, target: Any, weight: Any = None, reduction: str = "mean") -> Node:
    """PyTorch's ``binary_cross_entropy`` on probabilities: ``-w (t log p + (1 - t) log(1 - p))``.

    The logs are clamped at -100 (as PyTorch), so p = 0 or 1 gives a finite loss. ``target`` and
    ``weight`` broadcast to ``probs``'s shape. Gradients: ``probs`` gets ``w (p - t) / max(p (1 - p),
    1e-12)``, ``target`` gets ``-w (log p - log(1 - p))`` (clamped logs); ``weight`` gets none.
    """
    _check_reduction(reduction, "binary_cross_entropy")
    shape = tuple(probs.shape)
    for arg, t in (("target", target), ("weight", weight)):
        if t is not None and not _broadcasts_to(tuple(t.shape), shape):
            raise ShapeError(f"binary_cross_entropy: {arg} of shape {tuple(t.shape)} does not broadcast to {shape}")
    count = math.prod(shape)

    def terms(p: Tensor, t: Tensor, w: Any) -> Tensor:
        return pointwise.elementwise(
            "-{2} * ({1} * fmax(log({0}), -100.0f) + (1.0f - {1}) * fmax(log(1.0f - {0}), -100.0f))",
            _np_bce,
            _f32(p),
            _f32(t),
            w,
        )

    def forward(p: Tensor, t: Tensor, *rest: Tensor) -> Tensor:
        w = rest[0] if rest else 1.0
        per = terms(p, t, w)
        if per.shape != shape:
            per = layout.broadcast_to(per, shape)
        if reduction == "none":
            return per
        return reduce.sum(per) if reduction == "sum" else reduce.mean(per)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t = _f32(values[0]), _f32(values[1])
        w = values[2] if len(values) > 2 else 1.0
        gs = pointwise.mul(g, 1.0 / count) if reduction == "mean" else g
        gp = gt = None
        if _needs(probs):
            gp = pointwise.elementwise(
                "{2} * ({0} - {1}) / fmax({0} * (1.0f - {0}), 1e-12f) * {3}",
                lambda a, b, c, s: c * (a - b) / np.maximum(a * (1 - a), 1e-12) * s,
                p,
                t,
                w,
                gs,
            )
            gp = _reduce(gp, values[0])
            gp = gp if gp.dtype == values[0].dtype else layout.cast(gp, values[0].dtype)
        if _needs(target):
            gt = pointwise.elementwise(
                "-{2} * (fmax(log({0}), -100.0f) - fmax(log(1.0f - {0}), -100.0f)) * {3}",
                _np_bce_target_grad,
                p,
                t,
                w,
                gs,
            )
            gt = _reduce(gt, values[1])
            gt = gt if gt.dtype == values[1].dtype else layout.cast(gt, values[1].dtype)
        return [gp, gt] + ([None] if len(values) > 2 else [])

    args = (probs, target) if weight is None else (probs, target, weight)
    return apply_op(forward, grad, *args, op_name="binary_cross_entropy", attrs={"reduction": reduction})


def _np_bce_target_grad(p: np.ndarray, t: np.ndarray, w: Any, s: Any) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return -w * (np.maximum(np.log(p), -100.0) - np.maximum(np.log1p(-p), -100.0)) * s


def bce_with_logits(pred: Any, target: Any) -> Node:
    """mean(max(x, 0) - x*t + log1p(exp(-|x|))): binary cross-entropy on logits, overflow-free."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        x, t = values
        gs = _scaled(g, math.prod(np.broadcast_shapes(tuple(x.shape), tuple(t.shape))))
        gx = pointwise.elementwise("BCE_LOGITS_GRAD({0}, {1}) * {2}", _np_bce_grad, x, t, gs) if _needs(pred) else None
        gt = pointwise.mul(pointwise.neg(x), gs) if _needs(target) else None
        return [_reduce(gx, x), _reduce(gt, t)]

    return apply_op(
        lambda x, t: reduce.mean(pointwise.elementwise("BCE_LOGITS({0}, {1})", np_bce_logits, x, t)),
        grad,
        pred,
        target,
        op_name="bce_with_logits",
    )


def _np_bce_grad(x: np.ndarray, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    return (np_sigmoid(x) - t) * g


def smooth_l1(pred: Any, target: Any, beta: float = 1.0) -> Node:
    """mean(smooth_l1(pred - target, beta)); plain L1 when ``beta == 0``."""
    beta = float(beta)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t = values
        gs = _scaled(g, math.prod(np.broadcast_shapes(tuple(p.shape), tuple(t.shape))))
        gd = pointwise.elementwise(
            "SMOOTH_L1_GRAD({0} - {1}, {2}) * {3}", lambda a, b, c, s: np_smooth_l1_grad(a - b, c) * s, p, t, beta, gs
        )
        return [_reduce(gd, p) if _needs(pred) else None, _reduce(pointwise.neg(gd), t) if _needs(target) else None]

    return apply_op(
        lambda p, t: reduce.mean(
            pointwise.elementwise("SMOOTH_L1({0} - {1}, {2})", lambda a, b, c: np_smooth_l1(a - b, c), p, t, beta)
        ),
        grad,
        pred,
        target,
        op_name="smooth_l1",
        attrs={"beta": beta},
    )


def weighted_bce(pred: Any, target: Any, weight: Any) -> Node:
    """Elementwise ``weight * bce_logits(pred, target)``; gradient w.r.t. ``pred`` only."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t, w = values
        gp = pointwise.elementwise(
            "{2} * BCE_LOGITS_GRAD({0}, {1}) * {3}", lambda a, b, c, s: c * (np_sigmoid(a) - b) * s, p, t, w, g
        )
        return [_reduce(gp, p), None, None]

    return apply_op(
        lambda p, t, w: pointwise.elementwise(
            "{2} * BCE_LOGITS({0}, {1})", lambda a, b, c: c * np_bce_logits(a, b), p, t, w
        ),
        grad,
        pred,
        target,
        weight,
        op_name="weighted_bce",
    )


def weighted_bce_logits(pred: Any, target: Any, weight: Any, pos_weight: Any) -> Node:
    """Elementwise ``weight * ((1 - t) * softplus(x) + pos_weight * t * softplus(-x))`` on logits ``x`` (torch's
    ``binary_cross_entropy_with_logits`` terms with ``pos_weight``), computed as ``BCE_LOGITS(x, t) +
    (pos_weight - 1) * t * BCE_LOGITS(x, 1)``: overflow-free. Gradient w.r.t. ``pred`` only, ``weight * ((1 +
    (pos_weight - 1) t) sigmoid(x) - pos_weight t)``; the operands broadcast."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t, w, pw = values
        gp = pointwise.elementwise(
            "{2} * (BCE_LOGITS_GRAD({0}, {1}) + ({3} - 1.0f) * {1} * BCE_LOGITS_GRAD({0}, 1.0f)) * {4}",
            lambda a, b, c, q, s: c * (np_sigmoid(a) - b + (q - 1) * b * (np_sigmoid(a) - 1)) * s,
            p,
            t,
            w,
            pw,
            g,
        )
        return [_reduce(gp, p), None, None, None]

    return apply_op(
        lambda p, t, w, pw: pointwise.elementwise(
            "{2} * (BCE_LOGITS({0}, {1}) + ({3} - 1.0f) * {1} * BCE_LOGITS({0}, 1.0f))",
            lambda a, b, c, q: c * (np_bce_logits(a, b) + (q - 1) * b * np_bce_logits(a, 1.0)),
            p,
            t,
            w,
            pw,
        ),
        grad,
        pred,
        target,
        weight,
        pos_weight,
        op_name="weighted_bce_logits",
    )


def weighted_smooth_l1(pred: Any, target: Any, weight: Any, beta: float = 0.05) -> Node:
    """Elementwise ``weight * smooth_l1(pred - target, beta)``; gradient w.r.t. ``pred`` only.

    ``beta`` defaults to the detection loss's 0.05 (see docs/architecture.md).
    """
    beta = float(beta)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t, w = values
        gp = pointwise.elementwise(
            "{2} * SMOOTH_L1_GRAD({0} - {1}, {3}) * {4}",
            lambda a, b, c, bt, s: c * np_smooth_l1_grad(a - b, bt) * s,
            p,
            t,
            w,
            beta,
            g,
        )
        return [_reduce(gp, p), None, None]

    return apply_op(
        lambda p, t, w: pointwise.elementwise(
            "{2} * SMOOTH_L1({0} - {1}, {3})", lambda a, b, c, bt: c * np_smooth_l1(a - b, bt), p, t, w, beta
        ),
        grad,
        pred,
        target,
        weight,
        op_name="weighted_smooth_l1",
        attrs={"beta": beta},
    )
