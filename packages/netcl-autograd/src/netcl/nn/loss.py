"""Loss modules as torch's: ``CrossEntropyLoss``, ``NLLLoss``, ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``,
``HuberLoss``, ``KLDivLoss``, ``BCELoss`` and ``BCEWithLogitsLoss``, each with torch's ``reduction`` ("mean",
"sum", "none"; ``KLDivLoss`` also "batchmean").

Each module keeps its arguments and calls the function of ``netcl.nn.functional`` that defines the loss; class
weights and ``pos_weight`` given as host arrays are converted to the input's device and dtype once, at the
first call.
"""

from __future__ import annotations

from typing import Any

from netcl.autograd.engine import Node
from netcl.nn import functional
from netcl.nn.functional.losses import check_reduction, on_device_of
from netcl.nn.module import Module


class _Loss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = check_reduction(type(self).__name__, reduction)

    def extra_repr(self) -> str:
        return "" if self.reduction == "mean" else f"reduction={self.reduction!r}"


class _WeightedLoss(_Loss):
    """A loss with an optional ``weight`` kept on the input's device after the first call (a Node, a learned
    weight, stays itself)."""

    def __init__(self, weight: Any = None, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.weight = weight

    def _kept(self, name: str, like: Any) -> Any:
        value = getattr(self, name)
        if value is not None:
            value = on_device_of(value, like)
            setattr(self, name, value)
        return value


class CrossEntropyLoss(_WeightedLoss):
    """``F.cross_entropy``: logits (N, C) or (N, C, d...), integer targets."""

    def __init__(
        self,
        weight: Any = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, reduction)
        self.ignore_index, self.label_smoothing = int(ignore_index), float(label_smoothing)

    def forward(self, logits: Any, target: Any) -> Node:
        return functional.cross_entropy(
            logits,
            target,
            self._kept("weight", logits),
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class NLLLoss(_WeightedLoss):
    """``F.nll_loss``: log-probabilities, integer targets."""

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(weight, reduction)
        self.ignore_index = int(ignore_index)

    def forward(self, log_probs: Any, target: Any) -> Node:
        weight = self._kept("weight", log_probs)
        return functional.nll_loss(log_probs, target, weight, ignore_index=self.ignore_index, reduction=self.reduction)


class MSELoss(_Loss):
    """``F.mse_loss``: ``(input - target) ** 2``, reduced."""

    def forward(self, pred: Any, target: Any) -> Node:
        return functional.mse_loss(pred, target, reduction=self.reduction)


class L1Loss(_Loss):
    """``F.l1_loss``: ``|input - target|``, reduced."""

    def forward(self, pred: Any, target: Any) -> Node:
        return functional.l1_loss(pred, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """``F.smooth_l1_loss``: ``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - beta / 2``; plain L1 at ``beta``
    0."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        if beta < 0:
            raise ValueError(f"SmoothL1Loss: beta must be >= 0, got {beta!r}")
        self.beta = float(beta)

    def forward(self, pred: Any, target: Any) -> Node:
        return functional.smooth_l1_loss(pred, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """``F.huber_loss``: ``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - delta / 2)``."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        if not delta > 0:
            raise ValueError(f"HuberLoss: delta must be > 0, got {delta!r}")
        self.delta = float(delta)

    def forward(self, pred: Any, target: Any) -> Node:
        return functional.huber_loss(pred, target, self.reduction, self.delta)


class KLDivLoss(Module):
    """``F.kl_div``: log-probability inputs; ``reduction`` "batchmean" is the KL divergence (torch's "mean" divides by
    every element); ``log_target`` when the targets are log-probabilities too."""

    def __init__(self, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__()
        if reduction != "batchmean":
            check_reduction("KLDivLoss", reduction)
        self.reduction, self.log_target = reduction, bool(log_target)

    def forward(self, log_probs: Any, target: Any) -> Node:
        return functional.kl_div(log_probs, target, reduction=self.reduction, log_target=self.log_target)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, log_target={self.log_target}"


class BCELoss(_WeightedLoss):
    """``F.binary_cross_entropy`` on probabilities, with an optional elementwise ``weight``."""

    def forward(self, probs: Any, target: Any) -> Node:
        return functional.binary_cross_entropy(probs, target, self._kept("weight", probs), reduction=self.reduction)


class BCEWithLogitsLoss(_WeightedLoss):
    """``F.binary_cross_entropy_with_logits``: overflow-free, with an optional elementwise ``weight`` and torch's
    ``pos_weight`` (one per class, broadcast along the last axis)."""

    def __init__(self, weight: Any = None, reduction: str = "mean", pos_weight: Any = None) -> None:
        super().__init__(weight, reduction)
        self.pos_weight = pos_weight

    def forward(self, logits: Any, target: Any) -> Node:
        return functional.binary_cross_entropy_with_logits(
            logits,
            target,
            self._kept("weight", logits),
            reduction=self.reduction,
            pos_weight=self._kept("pos_weight", logits),
        )
