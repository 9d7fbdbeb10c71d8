"""Losses in ``torch.nn.functional``'s names, argument order and defaults, each with torch's ``reduction``
("mean", "sum", "none"); the loss modules of ``netcl.nn`` call these.

A "mean" loss without weights is netcl's fused loss op (one kernel forward and one backward); "sum" and "none"
compose the elementwise form. Class weights of ``cross_entropy`` / ``nll_loss`` follow torch's normalization
(``weighted_class_loss``: the mean divides by the weights of the kept targets, label smoothing included);
``binary_cross_entropy_with_logits`` takes torch's ``pos_weight``. Arguments torch keeps in positions after
its deprecated ``size_average`` / ``reduce`` are keyword-only here. Weights may be Tensors, Nodes or anything
NumPy reads (converted to the input's device and dtype).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.autograd.losses import class_targets, weighted_bce_logits
from netcl.core import ShapeError, Tensor
from netcl.runtime.ops import pointwise

_REDUCTIONS = ("mean", "sum", "none")


def check_reduction(owner: str, reduction: str) -> str:
    """``reduction`` itself, or a ValueError naming ``owner`` and the three allowed values."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{owner}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


def _reduced(loss: Node, reduction: str) -> Node:
    """An elementwise ``loss`` reduced as ``reduction`` asks."""
    if reduction == "none":
        return loss
    return ag.sum(loss) if reduction == "sum" else ag.mean(loss)


def on_device_of(value: Any, like: Any) -> Any:
    """``value`` as an operand beside ``like`` (a Node or Tensor): a Node, a Tensor of ``like``'s device and dtype
    or a Python number stays itself; anything else (a Tensor elsewhere, a NumPy array, a list) becomes a Tensor
    of ``like``'s dtype on ``like``'s device."""
    if isinstance(value, (Node, int, float)):
        return value
    target = like.value if isinstance(like, Node) else like
    if isinstance(value, Tensor) and value.device is target.device and value.dtype == target.dtype:
        return value
    host = value.to_host() if isinstance(value, Tensor) else np.asarray(value)
    return Tensor.from_host(target.device, host, target.dtype)


def cross_entropy(
    input: Any,
    target: Any,
    weight: Any = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Node:
    """Cross-entropy of logits (N, C) or (N, C, d...) against integer class targets (N,) or (N, d...)."""
    check_reduction("cross_entropy", reduction)
    if weight is not None:
        return weighted_class_loss(input, target, weight, int(ignore_index), reduction, float(label_smoothing), True)
    return ag.cross_entropy(input, target, label_smoothing, ignore_index, reduction)


def nll_loss(input: Any, target: Any, weight: Any = None, *, ignore_index: int = -100, reduction: str = "mean") -> Node:
    """``-input[n, target[n], ...]`` of log-probabilities, reduced; shapes as ``cross_entropy``."""
    check_reduction("nll_loss", reduction)
    if weight is not None:
        return weighted_class_loss(input, target, weight, int(ignore_index), reduction, 0.0, False)
    return ag.nll_loss(input, target, ignore_index, reduction)


def weighted_class_loss(
    scores: Any, target: Any, weight: Any, ignore_index: int, reduction: str, smoothing: float, from_logits: bool
) -> Node:
    """torch's ``cross_entropy`` (``from_logits``) or ``nll_loss`` with class weights (C,): each position's loss is
    ``w[y] * -logp[y]`` (and, smoothed, ``(1 - s)`` of that plus ``s / C * sum_c w[c] * -logp[c]``), a position whose
    target is ``ignore_index`` adds nothing, and the mean divides by the sum of ``w[y]`` over the kept positions.
    Composed from ``log_softmax``, ``gather`` and ``index_select`` (their device index checks included)."""
    shape = tuple(scores.shape)
    labels = class_targets(target, scores, "cross_entropy" if from_logits else "nll_loss", ignore_index)
    classes = shape[1]
    if tuple(weight.shape if hasattr(weight, "shape") else np.shape(weight)) != (classes,):
        got = tuple(weight.shape if hasattr(weight, "shape") else np.shape(weight))
        raise ShapeError(f"class weight must have shape ({classes},) (one per class), got {got}")
    device = (scores.value if isinstance(scores, Node) else scores).device
    labels = labels.value if isinstance(labels, Node) else labels
    labels = labels if isinstance(labels, Tensor) else Tensor.from_host(device, np.asarray(labels, np.int32))
    logp = ag.log_softmax(scores, 1) if from_logits else scores
    if len(shape) > 2:  # classes last, positions flattened: (N * d1 * ..., C)
        logp = ag.reshape(ag.permute(logp, (0, *range(2, len(shape)), 1)), (-1, classes))
    flat = labels.reshape(labels.size)
    kept = pointwise.ne(flat, ignore_index)  # 1.0 where the position counts
    safe = pointwise.where(kept, flat, 0)  # ignored positions read class 0, then weigh nothing
    w = weight if isinstance(weight, Node) else Node(on_device_of(weight, scores))
    w_target = ag.mul(ag.index_select(w, 0, safe), Node(kept))
    picked = ag.reshape(ag.gather(logp, 1, safe.reshape(flat.size, 1)), (flat.size,))
    loss = ag.neg(ag.mul(picked, w_target))
    if smoothing:
        spread = ag.neg(ag.sum(ag.mul(logp, ag.reshape(w, (1, classes))), axis=1))
        loss = ag.add(ag.mul(loss, 1.0 - smoothing), ag.mul(ag.mul(spread, Node(kept)), smoothing / classes))
    if reduction == "none":
        return ag.reshape(loss, tuple(labels.shape))
    total = ag.sum(loss)
    return total if reduction == "sum" else ag.div(total, ag.sum(w_target))


def mse_loss(input: Any, target: Any, *, reduction: str = "mean") -> Node:
    """``(input - target) ** 2``, reduced."""
    if check_reduction("mse_loss", reduction) == "mean":
        return ag.mse_loss(input, target)
    diff = ag.sub(input, target)
    return _reduced(ag.mul(diff, diff), reduction)


def l1_loss(input: Any, target: Any, *, reduction: str = "mean") -> Node:
    """``|input - target|``, reduced."""
    return _reduced(ag.abs(ag.sub(input, target)), check_reduction("l1_loss", reduction))


def smooth_l1_loss(input: Any, target: Any, *, reduction: str = "mean", beta: float = 1.0) -> Node:
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - beta / 2`` (d = input - target); plain L1 at beta 0."""
    check_reduction("smooth_l1_loss", reduction)
    beta = float(beta)
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be >= 0, got {beta!r}")
    if reduction == "mean":
        return ag.smooth_l1(input, target, beta)
    diff = ag.sub(input, target)
    size = ag.abs(diff)
    if beta == 0:
        return _reduced(size, reduction)
    quadratic = ag.mul(ag.mul(diff, diff), 0.5 / beta)
    return _reduced(ag.where(ag.lt(size, beta), quadratic, ag.sub(size, 0.5 * beta)), reduction)


def huber_loss(input: Any, target: Any, reduction: str = "mean", delta: float = 1.0) -> Node:
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - delta / 2)``: ``delta`` times ``smooth_l1_loss`` at
    ``beta = delta`` (``delta`` > 0)."""
    delta = float(delta)
    if not delta > 0:
        raise ValueError(f"huber_loss: delta must be > 0, got {delta!r}")
    return ag.mul(smooth_l1_loss(input, target, reduction=reduction, beta=delta), delta)


def binary_cross_entropy(input: Any, target: Any, weight: Any = None, *, reduction: str = "mean") -> Node:
    """``-w (t log p + (1 - t) log(1 - p))`` of probabilities, the logs clamped at -100 (as torch)."""
    check_reduction("binary_cross_entropy", reduction)
    weight = None if weight is None else on_device_of(weight, input)
    return ag.binary_cross_entropy(input, target, weight, reduction)


def binary_cross_entropy_with_logits(
    input: Any, target: Any, weight: Any = None, *, reduction: str = "mean", pos_weight: Any = None
) -> Node:
    """Binary cross-entropy of logits, overflow-free: ``w ((1 - t) softplus(x) + pos_weight t softplus(-x))``.
    ``target`` has the input's shape; ``weight`` and ``pos_weight`` (one per class, the last axis) broadcast to
    it. The fused mean without weights is ``ag.bce_with_logits``; with weights the target gets no gradient."""
    check_reduction("binary_cross_entropy_with_logits", reduction)
    shape = tuple(input.shape)
    if tuple(target.shape) != shape:
        raise ShapeError(
            f"binary_cross_entropy_with_logits: target has shape {tuple(target.shape)}, expected the input's {shape}"
        )
    if weight is None and pos_weight is None and reduction == "mean":
        return ag.bce_with_logits(input, target)
    w = 1.0 if weight is None else _broadcasting(on_device_of(weight, input), shape, "weight")
    if pos_weight is None:
        return _reduced(ag.weighted_bce(input, target, w), reduction)
    pw = _broadcasting(on_device_of(pos_weight, input), shape, "pos_weight")
    return _reduced(weighted_bce_logits(input, target, w, pw), reduction)


def kl_div(input: Any, target: Any, *, reduction: str = "mean", log_target: bool = False) -> Node:
    """torch's ``kl_div``: ``input`` holds log-probabilities, the pointwise loss is ``t (log t - input)`` (0 where
    ``t`` is 0), or ``exp(t) (t - input)`` with ``log_target``; reduction "batchmean" divides the sum by the batch
    size (the KL divergence; torch's "mean" divides by every element). The target gets no gradient."""
    if reduction != "batchmean":
        check_reduction("kl_div", reduction)
    shape = tuple(input.shape)
    if tuple(target.shape) != shape:
        raise ShapeError(f"kl_div: target has shape {tuple(target.shape)}, expected the input's {shape}")
    t = on_device_of(target.value if isinstance(target, Node) else target, input)
    if log_target:
        entropy = pointwise.elementwise("exp({0}) * {0}", lambda a: np.exp(a) * a, t)
        weight = pointwise.exp(t)
    else:  # xlogy(t, t): 0 where t is 0
        entropy = pointwise.elementwise("{0} > 0 ? {0} * log({0}) : 0", _xlogx, t)
        weight = t
    loss = ag.sub(Node(entropy), ag.mul(Node(weight), input))
    if reduction == "batchmean":
        return ag.div(ag.sum(loss), float(shape[0]) if shape else 1.0)
    return _reduced(loss, reduction)


def _xlogx(t: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t > 0, t * np.log(np.where(t > 0, t, 1.0)), 0.0)


def _broadcasting(value: Any, shape: tuple[int, ...], name: str) -> Any:
    """``value`` when its shape broadcasts to ``shape`` (without growing it), else a ShapeError naming it."""
    have = tuple(getattr(value, "shape", ()))
    fits = len(have) <= len(shape) and all(d in (1, s) for d, s in zip(have[::-1], shape[::-1], strict=False))
    if not fits:
        raise ShapeError(f"binary_cross_entropy_with_logits: {name} of shape {have} does not broadcast to {shape}")
    return value


__all__ = [
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "cross_entropy",
    "huber_loss",
    "kl_div",
    "l1_loss",
    "mse_loss",
    "nll_loss",
    "smooth_l1_loss",
]
