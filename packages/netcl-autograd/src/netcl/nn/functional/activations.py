"""Activations in ``torch.nn.functional``'s names, argument order and defaults, each one call of the
autograd op that defines it (``netcl.autograd``), or a composition of such ops where torch's function is one.

``inplace=True`` is accepted, as torch documents it: an optional optimization. netcl computes out of
place (the input keeps its values; the result is the same).
"""

from __future__ import annotations

from typing import Any

import netcl.autograd as ag
from netcl.autograd.engine import Node

_GELU_FORMS = ("none", "tanh")


def relu(input: Any, inplace: bool = False) -> Node:
    """``max(x, 0)``."""
    return ag.relu(input)


def relu6(input: Any, inplace: bool = False) -> Node:
    """``min(max(x, 0), 6)``."""
    return ag.clamp(input, 0.0, 6.0)


def hardtanh(input: Any, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Node:
    """``clamp(x, min_val, max_val)``; ``max_val`` must exceed ``min_val``."""
    if max_val <= min_val:
        raise ValueError(f"hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})")
    return ag.clamp(input, float(min_val), float(max_val))


def hardsigmoid(input: Any, inplace: bool = False) -> Node:
    """``clamp(x / 6 + 1 / 2, 0, 1)``."""
    return ag.clamp(ag.add(ag.mul(input, 1.0 / 6.0), 0.5), 0.0, 1.0)


def hardswish(input: Any, inplace: bool = False) -> Node:
    """``x * hardsigmoid(x)``."""
    return ag.mul(input, hardsigmoid(input))


def elu(input: Any, alpha: float = 1.0, inplace: bool = False) -> Node:
    """``x`` where positive, else ``alpha * (exp(x) - 1)``."""
    return ag.elu(input, float(alpha))


def leaky_relu(input: Any, negative_slope: float = 0.01, inplace: bool = False) -> Node:
    """``x`` where positive, else ``negative_slope * x``."""
    return ag.leaky_relu(input, float(negative_slope))


def gelu(input: Any, approximate: str = "none") -> Node:
    """torch's default is the exact ``x * Phi(x)``; ``approximate="tanh"`` is GPT-2's approximation
    (``netcl.autograd.gelu`` defaults to the tanh form, as ``jax.nn.gelu``)."""
    if approximate not in _GELU_FORMS:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return ag.gelu(input, approximate=approximate)


def silu(input: Any, inplace: bool = False) -> Node:
    """``x * sigmoid(x)``."""
    return ag.silu(input)


def mish(input: Any, inplace: bool = False) -> Node:
    """``x * tanh(softplus(x))``."""
    return ag.mul(input, ag.tanh(ag.softplus(input)))


def sigmoid(input: Any) -> Node:
    """``1 / (1 + exp(-x))``."""
    return ag.sigmoid(input)


def tanh(input: Any) -> Node:
    """Hyperbolic tangent."""
    return ag.tanh(input)


def softplus(input: Any, beta: float = 1.0, threshold: float = 20.0) -> Node:
    """``log(1 + exp(beta * x)) / beta``, and ``x`` where ``beta * x > threshold``."""
    return ag.softplus(input, beta, threshold)


def softsign(input: Any) -> Node:
    """``x / (1 + |x|)``."""
    return ag.softsign(input)


def logsigmoid(input: Any) -> Node:
    """``log(sigmoid(x)) = -softplus(-x)``: finite for logits of any magnitude."""
    return ag.neg(ag.softplus(ag.neg(input)))


def softmax(input: Any, dim: int) -> Node:
    """softmax along ``dim`` (required: torch's implicit choice of dim is deprecated)."""
    return ag.softmax(input, dim)


def log_softmax(input: Any, dim: int) -> Node:
    """log_softmax along ``dim``."""
    return ag.log_softmax(input, dim)


def softmin(input: Any, dim: int) -> Node:
    """``softmax(-x)`` along ``dim``."""
    return ag.softmax(ag.neg(input), dim)


def glu(input: Any, dim: int = -1) -> Node:
    """``a * sigmoid(b)`` of the two halves ``a``, ``b`` of ``input`` along ``dim`` (its length must be even)."""
    shape = tuple(input.shape)
    if not shape or not -len(shape) <= dim < len(shape):
        raise ValueError(f"glu: dim {dim} is out of range for shape {shape}")
    if shape[dim] % 2:
        raise ValueError(f"glu: the halved dimension {dim} must have an even length, got {shape[dim]} in shape {shape}")
    first, second = ag.split(input, shape[dim] // 2, axis=dim)
    return ag.mul(first, ag.sigmoid(second))


__all__ = [
    "elu",
    "gelu",
    "glu",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "leaky_relu",
    "log_softmax",
    "logsigmoid",
    "mish",
    "relu",
    "relu6",
    "sigmoid",
    "silu",
    "softmax",
    "softmin",
    "softplus",
    "softsign",
    "tanh",
]
