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


def _is_tensor(x: Any) -> bool:
    return isinstance(x, (Node, Tensor))


def _apply_with(forward: Any, grad: Any, x: Any, extra: Any, op_name: str, attrs: dict[str, Any]) -> Node:
    """apply_op on ``x`` and, when it is a Node or Tensor, ``extra`` as a second argument (so a jitted
    function reads each call's tensor); anything else (NumPy targets, None) stays in the closure."""
    if _is_tensor(extra):
        return apply_op(
            forward,
            lambda g, values, out: [*grad(g, values[:1], out, values[1]), None],
            x,
            extra,
            op_name=op_name,
            attrs=attrs,
        )
    return apply_op(
        lambda v: forward(v, extra), lambda g, values, out: grad(g, values, out, extra), x, op_name=op_name, attrs=attrs
    )


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
    _check_class("cross_entropy", logits, target, reduction)
    eps = float(label_smoothing)
    saved: dict[str, Any] = {}

    def forward(x: Tensor, labels: Any) -> Tensor:
        out, lse, count, t = RL.cross_entropy_forward(x, labels, eps, ignore_index, reduction)
        saved.update(out=out, lse=lse, count=count, target=t)
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor, labels: Any) -> _Grads:
        (x,) = values
        if saved.get("out") is not out:  # fn was re-run on other inputs (a tracer's fallback): recompute
            forward(x, labels)
        s = saved
        gx = RL.class_loss_backward(
            "cross_entropy", g, x, s["target"], s["lse"], s["count"], reduction, ignore_index, eps
        )
        return [gx]

    attrs = {"label_smoothing": eps, "ignore_index": ignore_index, "reduction": reduction}
    return _apply_with(forward, grad, logits, target, "cross_entropy", attrs)


def nll_loss(log_probs: Any, target: Any, ignore_index: int = -100, reduction: str = "mean") -> Node:
    """``-log_probs[n, target[n], ...]`` reduced (PyTorch's ``nll_loss``; ``log_probs`` as ``log_softmax`` gives)."""
    _check_class("nll_loss", log_probs, target, reduction)
    saved: dict[str, Any] = {}

    def forward(x: Tensor, labels: Any) -> Tensor:
        out, count, t = RL.nll_loss_forward(x, labels, ignore_index, reduction)
        saved.update(out=out, count=count, target=t)
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor, labels: Any) -> _Grads:
        (x,) = values
        if saved.get("out") is not out:
            forward(x, labels)
        s = saved
        return [RL.class_loss_backward("nll_loss", g, x, s["target"], None, s["count"], reduction, ignore_index)]

    return _apply_with(
        forward, grad, log_probs, target, "nll_loss", {"ignore_index": ignore_index, "reduction": reduction}
    )


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
    count = math.prod(probs.shape)

    def forward(p: Tensor, t: Tensor, w: Any = 1.0) -> Tensor:
        terms = RL.bce_terms(p, t, w)
        if reduction == "none":
            return terms
        return R.mean(terms) if reduction == "mean" else R.sum(terms)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        p, t = values[:2]
        w = values[2] if len(values) > 2 else 1.0
        scale = R.mul(g, 1.0 / count) if reduction == "mean" and count else g
        return [*RL.bce_grads(p, t, w, scale, _needs(probs), _needs(target)), None][: len(values)]

    args = (probs, target) if weight is None else (probs, target, weight)
    return apply_op(forward, grad, *args, op_name="binary_cross_entropy", attrs={"reduction": reduction})


__all__ = ["binary_cross_entropy", "cross_entropy", "nll_loss"]
