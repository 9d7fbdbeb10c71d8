"""Loss modules as torch's: ``CrossEntropyLoss``, ``NLLLoss``, ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``,
``BCELoss`` and ``BCEWithLogitsLoss``, each with torch's ``reduction`` ("mean", "sum", "none").

A "mean" loss is netcl's fused loss op (one kernel forward and one backward); "sum" and "none" compose the
elementwise form. Not supported, each refused by name: class ``weight`` of ``CrossEntropyLoss`` / ``NLLLoss``
and ``pos_weight`` of ``BCEWithLogitsLoss``.
"""

from __future__ import annotations

from typing import Any

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.nn.module import Module

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
        _refuse("CrossEntropyLoss", "weight (class weights)", weight)
        super().__init__(reduction)
        self.ignore_index, self.label_smoothing = int(ignore_index), float(label_smoothing)

    def forward(self, logits: Any, target: Any) -> Node:
        return ag.cross_entropy(logits, target, self.label_smoothing, self.ignore_index, self.reduction)


class NLLLoss(_Loss):
    """``ag.nll_loss`` (log-probabilities, integer targets) with torch's arguments."""

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean") -> None:
        _refuse("NLLLoss", "weight (class weights)", weight)
        super().__init__(reduction)
        self.ignore_index = int(ignore_index)

    def forward(self, log_probs: Any, target: Any) -> Node:
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
