"""Classification losses with PyTorch's signatures: ``cross_entropy``, ``nll_loss``, ``binary_cross_entropy``.

``cross_entropy``/``nll_loss`` take (N, C) or (N, C, d1, ...) inputs and integer class targets (a
Tensor, a Node's value or a NumPy/list of ints) of shape (N,) or (N, d1, ...); targets equal to
``ignore_index`` contribute nothing and do not count in the mean. ``reduction`` is 'mean', 'sum' or
'none'. Forward: one row kernel (plus one reduction kernel for 'mean'/'sum'); backward: one row
kernel recomputing the softmax from the saved per-row log-sum-exp (``netcl.runtime.ops.losses``).
float16 inputs are computed in float32 and the loss returned in float16. The targets get no gradient.
"""

from __future__ import annotations

import math
from typing import Any

from netcl.autograd.engine import Node, apply_op
from netcl.core import Tensor
from netcl.runtime import ops as R  # noqa: N812
from netcl.runtime.ops import losses as RL  # noqa: N812

_Grads = list[Tensor | None]


def _needs(x: Any) -> bool:
    return isinstance(x, Node) and x.requires_grad


def _target(target: Any) -> Any:
    """A Node's value (targets are data, not graph inputs); anything else as given."""
    return target.value if isinstance(target, Node) else target


def _check_class(op: str, x: Any, target: Any, reduction: str) -> None:
    if not hasattr(x, "shape"):
        raise TypeError(f"{op}: input must be a Node or Tensor, got {type(x).__name__}")
    RL.check_reduction(reduction, op)
    RL.check_class_target(tuple(x.shape), target, op, "input")


def cross_entropy(
    logits: Any,
    target: Any,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Node:
    """Negative log-likelihood of the integer class ``target`` under ``softmax(logits)`` over axis 1.

    With ``label_smoothing`` eps the target distribution is ``(1 - eps) onehot + eps / C`` (PyTorch).
    The max is subtracted, so logits of magnitude 1e4 stay finite. The gradient w.r.t. the logits is
    ``g (softmax - (1 - eps) onehot - eps / C)`` per counted target (divided by their count for 'mean').
    """
    labels = _target(target)
    _check_class("cross_entropy", logits, labels, reduction)
    eps = float(label_smoothing)
    saved: dict[str, Any] = {}

    def forward(x: Tensor) -> Tensor:
        out, lse, count, t = RL.cross_entropy_forward(x, labels, eps, ignore_index, reduction)
        saved.update(out=out, lse=lse, count=count, target=t)
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (x,) = values
        if saved.get("out") is not out:  # fn was re-run on other inputs (a tracer's fallback): recompute
            forward(x)
        s = saved
        gx = RL.class_loss_backward(
            "cross_entropy", g, x, s["target"], s["lse"], s["count"], reduction, ignore_index, eps
        )
        return [gx]

    attrs = {"label_smoothing": eps, "ignore_index": ignore_index, "reduction": reduction}
    return apply_op(forward, grad, logits, op_name="cross_entropy", attrs=attrs)


def nll_loss(log_probs: Any, target: Any, ignore_index: int = -100, reduction: str = "mean") -> Node:
    """``-log_probs[n, target[n], ...]`` reduced (PyTorch's ``nll_loss``; ``log_probs`` as ``log_softmax`` gives)."""
    labels = _target(target)
    _check_class("nll_loss", log_probs, labels, reduction)
    saved: dict[str, Any] = {}

    def forward(x: Tensor) -> Tensor:
        out, count, t = RL.nll_loss_forward(x, labels, ignore_index, reduction)
        saved.update(out=out, count=count, target=t)
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (x,) = values
        if saved.get("out") is not out:
            forward(x)
        s = saved
        return [RL.class_loss_backward("nll_loss", g, x, s["target"], None, s["count"], reduction, ignore_index)]

    attrs = {"ignore_index": ignore_index, "reduction": reduction}
    return apply_op(forward, grad, log_probs, op_name="nll_loss", attrs=attrs)


def binary_cross_entropy(probs: Any, target: Any, weight: Any = None, reduction: str = "mean") -> Node:
    """``-weight (t log p + (1 - t) log(1 - p))`` reduced; each log is clamped at -100 (PyTorch).

    ``probs`` must lie in [0, 1] (apply ``sigmoid`` first, or use ``bce_with_logits``); ``target``
    has the shape of ``probs`` and ``weight`` (a Tensor or None) broadcasts to it. Gradients flow to
    ``probs`` (``w (p - t) / max(p (1 - p), 1e-12)``) and ``target``; ``weight`` gets none.
    """
    RL.check_reduction(reduction, "binary_cross_entropy")
    for arg, value in (("input", probs), ("target", target)):
        if not hasattr(value, "shape"):
            raise TypeError(f"binary_cross_entropy: {arg} must be a Node or Tensor, got {type(value).__name__}")
    RL.check_bce(tuple(probs.shape), tuple(target.shape), None if weight is None else tuple(weight.shape))
    w = _target(weight) if weight is not None else 1.0
    count = math.prod(probs.shape)

    def forward(p: Tensor, t: Tensor) -> Tensor:
        terms = RL.bce_terms(p, t, w)
        if reduction == "none":
            return terms
        return R.mean(terms) if reduction == "mean" else R.sum(terms)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t = values
        scale = R.mul(g, 1.0 / count) if reduction == "mean" and count else g
        return list(RL.bce_grads(p, t, w, scale, _needs(probs), _needs(target)))

    return apply_op(forward, grad, probs, target, op_name="binary_cross_entropy", attrs={"reduction": reduction})


__all__ = ["binary_cross_entropy", "cross_entropy", "nll_loss"]
