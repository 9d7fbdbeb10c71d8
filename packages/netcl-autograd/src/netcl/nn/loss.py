"""Loss modules as torch's: ``CrossEntropyLoss``, ``NLLLoss``, ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``,
``BCELoss`` and ``BCEWithLogitsLoss``, each with torch's ``reduction`` ("mean", "sum", "none").

A "mean" loss is netcl's fused loss op (one kernel forward and one backward); "sum" and "none" compose the
elementwise form, and so do the class ``weight`` of ``CrossEntropyLoss`` / ``NLLLoss`` (``weighted_class_loss``:
torch's normalization by the weights of the targets, label smoothing included). ``pos_weight`` of
``BCEWithLogitsLoss`` is refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.autograd.losses import class_targets
from netcl.core import ShapeError, Tensor
from netcl.nn.module import Module
from netcl.runtime.ops import pointwise

_REDUCTIONS = ("mean", "sum", "none")


def _reduction(owner: str, reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{owner}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


def _refuse(owner: str, name: str, value: Any) -> None:
    if value is not None:
        raise ValueError(f"{owner}: {name} is not supported by netcl (got {type(value).__name__})")


def _reduced(loss: Node, reduction: str) -> Node:
    """An elementwise ``loss`` reduced as ``reduction`` asks."""
    if reduction == "none":
        return loss
    return ag.sum(loss) if reduction == "sum" else ag.mean(loss)


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
    if tuple(weight.shape) != (classes,):
        raise ShapeError(f"class weight must have shape ({classes},) (one per class), got {tuple(weight.shape)}")
    device = (scores.value if isinstance(scores, Node) else scores).device
    labels = labels.value if isinstance(labels, Node) else labels
    labels = labels if isinstance(labels, Tensor) else Tensor.from_host(device, np.asarray(labels, np.int32))
    logp = ag.log_softmax(scores, 1) if from_logits else scores
    if len(shape) > 2:  # classes last, positions flattened: (N * d1 * ..., C)
        logp = ag.reshape(ag.permute(logp, (0, *range(2, len(shape)), 1)), (-1, classes))
    flat = labels.reshape(labels.size)
    kept = pointwise.ne(flat, ignore_index)  # 1.0 where the position counts
    safe = pointwise.where(kept, flat, 0)  # ignored positions read class 0, then weigh nothing
    w = weight if isinstance(weight, Node) else Node(class_weights(weight, device, scores.dtype))
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


def class_weights(weight: Any, device: Any, dtype: Any) -> Tensor:
    """``weight`` (a Tensor or anything NumPy reads) as a Tensor of ``dtype`` on ``device``: itself when it is one."""
    if isinstance(weight, Tensor) and weight.device is device and weight.dtype == dtype:
        return weight
    host = weight.to_host() if isinstance(weight, Tensor) else np.asarray(weight)
    return Tensor.from_host(device, host, dtype)


def _kept_weights(weight: Any, scores: Any) -> Any:
    """A module's class weights on the scores' device and dtype, converted once (a Node, a learned weight, stays)."""
    if isinstance(weight, Node):
        return weight
    value = scores.value if isinstance(scores, Node) else scores
    return class_weights(weight, value.device, value.dtype)


class _Loss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _reduction(type(self).__name__, reduction)

    def extra_repr(self) -> str:
        return "" if self.reduction == "mean" else f"reduction={self.reduction!r}"


class CrossEntropyLoss(_Loss):
    """``ag.cross_entropy`` (logits (N, C) or (N, C, d...), integer targets) with torch's arguments."""

    def __init__(
        self,
        weight: Any = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(reduction)
        self.weight, self.ignore_index, self.label_smoothing = weight, int(ignore_index), float(label_smoothing)

    def forward(self, logits: Any, target: Any) -> Node:
        if self.weight is not None:
            self.weight = _kept_weights(self.weight, logits)
            args = (self.ignore_index, self.reduction, self.label_smoothing, True)
            return weighted_class_loss(logits, target, self.weight, *args)
        return ag.cross_entropy(logits, target, self.label_smoothing, self.ignore_index, self.reduction)


class NLLLoss(_Loss):
    """``ag.nll_loss`` (log-probabilities, integer targets) with torch's arguments."""

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.weight, self.ignore_index = weight, int(ignore_index)

    def forward(self, log_probs: Any, target: Any) -> Node:
        if self.weight is not None:
            self.weight = _kept_weights(self.weight, log_probs)
            return weighted_class_loss(log_probs, target, self.weight, self.ignore_index, self.reduction, 0.0, False)
        return ag.nll_loss(log_probs, target, self.ignore_index, self.reduction)


class MSELoss(_Loss):
    """``(input - target) ** 2``, reduced."""

    def forward(self, pred: Any, target: Any) -> Node:
        if self.reduction == "mean":
            return ag.mse_loss(pred, target)
        diff = ag.sub(pred, target)
        return _reduced(ag.mul(diff, diff), self.reduction)


class L1Loss(_Loss):
    """``|input - target|``, reduced."""

    def forward(self, pred: Any, target: Any) -> Node:
        return _reduced(ag.abs(ag.sub(pred, target)), self.reduction)


class SmoothL1Loss(_Loss):
    """torch's smooth L1 (Huber divided by ``beta``): ``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - beta / 2``;
    plain L1 at ``beta`` 0."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        if beta < 0:
            raise ValueError(f"SmoothL1Loss: beta must be >= 0, got {beta!r}")
        self.beta = float(beta)

    def forward(self, pred: Any, target: Any) -> Node:
        if self.reduction == "mean":
            return ag.smooth_l1(pred, target, self.beta)
        diff = ag.sub(pred, target)
        size = ag.abs(diff)
        if self.beta == 0:
            return _reduced(size, self.reduction)
        quadratic = ag.mul(ag.mul(diff, diff), 0.5 / self.beta)
        return _reduced(ag.where(ag.lt(size, self.beta), quadratic, ag.sub(size, 0.5 * self.beta)), self.reduction)


class BCELoss(_Loss):
    """``ag.binary_cross_entropy`` on probabilities, with an optional elementwise ``weight``."""

    def __init__(self, weight: Any = None, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.weight = weight

    def forward(self, probs: Any, target: Any) -> Node:
        return ag.binary_cross_entropy(probs, target, self.weight, self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross-entropy on logits (overflow-free), with an optional elementwise ``weight``. A "mean" without a
    weight is ``ag.bce_with_logits``; otherwise ``ag.weighted_bce`` reduced (the target then gets no gradient)."""

    def __init__(self, weight: Any = None, reduction: str = "mean", pos_weight: Any = None) -> None:
        _refuse("BCEWithLogitsLoss", "pos_weight", pos_weight)
        super().__init__(reduction)
        self.weight = weight

    def forward(self, logits: Any, target: Any) -> Node:
        if self.weight is None and self.reduction == "mean":
            return ag.bce_with_logits(logits, target)
        weight = 1.0 if self.weight is None else self.weight
        return _reduced(ag.weighted_bce(logits, target, weight), self.reduction)
