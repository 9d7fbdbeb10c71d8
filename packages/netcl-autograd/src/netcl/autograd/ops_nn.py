"""Differentiable softmax, log_softmax, layer_norm, rms_norm and batch_norm (PyTorch semantics).

Each forward is one runtime kernel (``netcl.runtime.ops.softmaxes`` / ``norm``) and each backward one
kernel for the input gradient (the norms add one column kernel for weight and bias gradients), which
recomputes from the saved row statistics (mean and 1/std, or the softmax output). float16 inputs are
normalized in float32 and returned as float16 (weights, biases and running statistics keep their
own dtype), as ``amp`` runs norms.
"""

from __future__ import annotations

from typing import Any

from netcl.autograd.engine import Node, apply_op
from netcl.core import Tensor
from netcl.runtime.ops import norm as RN  # noqa: N812
from netcl.runtime.ops import softmaxes as RX  # noqa: N812

Operand = Any  # Node | Tensor
_Grads = list[Tensor | None]


def _needs(x: Any) -> bool:
    return isinstance(x, Node) and x.requires_grad


def _shape(x: Any, op: str, arg: str) -> tuple[int, ...] | None:
    if x is None:
        return None
    if not hasattr(x, "shape"):
        raise TypeError(f"{op}: {arg} must be a Node or Tensor, got {type(x).__name__}")
    return tuple(x.shape)


def softmax(x: Operand, axis: int = -1) -> Node:
    """exp(x - max) / sum(exp(x - max)) along ``axis`` (one kernel; backward one kernel from the output)."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [RX.softmax_backward(out, g, axis)]

    return apply_op(lambda v: RX.softmax(v, axis), grad, x, op_name="softmax", attrs={"axis": axis})


def log_softmax(x: Operand, axis: int = -1) -> Node:
    """(x - max) - log(sum(exp(x - max))) along ``axis`` (one kernel each way)."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [RX.log_softmax_backward(out, g, axis)]

    return apply_op(lambda v: RX.log_softmax(v, axis), grad, x, op_name="log_softmax", attrs={"axis": axis})


class _Saved:
    """Statistics a forward keeps for its backward, valid only for the output they were made with
    (a tracer's fallback may re-run the forward on other inputs: then the backward recomputes)."""

    __slots__ = ("out", "stats")

    def __init__(self) -> None:
        self.out: Tensor | None = None
        self.stats: tuple[Any, ...] = ()

    def keep(self, out: Tensor, *stats: Any) -> Tensor:
        self.out, self.stats = out, stats
        return out

    def get(self, out: Tensor) -> tuple[Any, ...] | None:
        return self.stats if self.out is out else None


def layer_norm(
    x: Operand,
    normalized_shape: int | tuple[int, ...],
    weight: Operand | None = None,
    bias: Operand | None = None,
    eps: float = 1e-5,
) -> Node:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape`` (biased var)."""
    shape = RN.check_norm(
        _shape(x, "layer_norm", "x"),
        normalized_shape,
        _shape(weight, "layer_norm", "weight"),
        _shape(bias, "layer_norm", "bias"),
        "layer_norm",
    )
    eps = float(eps)
    saved = _Saved()

    def forward(v: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
        y, mean, rstd = RN.layer_norm_forward(v, shape, w, b, eps)
        return saved.keep(y, mean, rstd)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        v, w, b = values
        stats = saved.get(out) or RN.layer_norm_forward(v, shape, w, b, eps)[1:]
        needs = (_needs(x), _needs(weight), _needs(bias))
        return list(RN.layer_norm_backward(g, v, stats[0], stats[1], shape, w, needs))

    attrs = {"normalized_shape": shape, "eps": eps}
    return apply_op(forward, grad, x, weight, bias, op_name="layer_norm", attrs=attrs)


def rms_norm(
    x: Operand, normalized_shape: int | tuple[int, ...], weight: Operand | None = None, eps: float | None = None
) -> Node:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing ``normalized_shape``; ``eps=None`` is
    the machine epsilon of x's dtype (PyTorch's ``rms_norm``)."""
    shape = RN.check_norm(
        _shape(x, "rms_norm", "x"), normalized_shape, _shape(weight, "rms_norm", "weight"), None, "rms_norm"
    )
    saved = _Saved()

    def forward(v: Tensor, w: Tensor | None) -> Tensor:
        y, _, rstd = RN.rms_norm_forward(v, shape, w, eps)
        return saved.keep(y, rstd)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        v, w = values
        stats = saved.get(out) or (RN.rms_norm_forward(v, shape, w, eps)[2],)
        gx, gw, _ = RN.layer_norm_backward(g, v, None, stats[0], shape, w, (_needs(x), _needs(weight), False))
        return [gx, gw]

    attrs = {"normalized_shape": shape, "eps": eps}
    return apply_op(forward, grad, x, weight, op_name="rms_norm", attrs=attrs)


def batch_norm(
    x: Operand,
    running_mean: Tensor | Node | None,
    running_var: Tensor | Node | None,
    weight: Operand | None = None,
    bias: Operand | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Node:
    """PyTorch's ``F.batch_norm`` on (N, C) or (N, C, *) input.

    Training: normalize by the batch mean and biased variance and, when given, update
    ``running_mean``/``running_var`` in place (``(1 - momentum) r + momentum * stat``, the variance
    unbiased). Evaluation: normalize by the running statistics. ``weight``/``bias`` are per channel.
    The running statistics are state, not graph inputs: they get no gradient.
    """
    _shape(weight, "batch_norm", "weight")
    _shape(bias, "batch_norm", "bias")
    RN.check_batch_norm(_shape(x, "batch_norm", "x"), running_mean, running_var, weight, bias, bool(training))
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
        raise TypeError(f"batch_norm: momentum must be a number, got {momentum!r}")
    training, momentum, eps = bool(training), float(momentum), float(eps)
    saved = _Saved()

    # The running statistics go through apply_op as arguments (no gradient), so that a jitted
    # function updates the tensors of each call, not the ones it was traced with.
    def forward(v: Tensor, w: Tensor | None, b: Tensor | None, rm: Tensor | None, rv: Tensor | None) -> Tensor:
        y, mean, rstd = RN.batch_norm_forward(v, rm, rv, w, b, training, momentum, eps)
        return saved.keep(y, mean, rstd)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        v, w, _, rm, rv = values
        stats = saved.get(out)
        if stats is None:  # re-derive what the forward normalized with, without touching the running stats
            if training:
                stats = RN.batch_norm_forward(v, None, None, w, None, True, momentum, eps)[1:]
            else:
                stats = RN.batch_norm_forward(v, rm, rv, w, None, False, momentum, eps)[1:]
        needs = (_needs(x), _needs(weight), _needs(bias))
        return [*RN.batch_norm_backward(g, v, stats[0], stats[1], w, training, needs), None, None]

    attrs = {"training": training, "momentum": momentum, "eps": eps}
    return apply_op(forward, grad, x, weight, bias, running_mean, running_var, op_name="batch_norm", attrs=attrs)


__all__ = ["batch_norm", "layer_norm", "log_softmax", "rms_norm", "softmax"]
