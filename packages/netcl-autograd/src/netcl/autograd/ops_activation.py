"""Differentiable activations and math: silu, leaky_relu, softplus, elu, sin, cos, rsqrt, log1p, eq, ne.

Each is generated from its definition (``netcl.runtime.ops.elementwise_defs``, through
``netcl.autograd.elementwise``) and named after its JIT primitive, so traced chains fuse.
Parameters (slope, alpha, beta, threshold) are ``attrs`` baked into the fused source, as
PyTorch's functional forms take them.
"""

from __future__ import annotations

from typing import Any

from netcl.autograd.elementwise import apply_elementwise, binary, unary
from netcl.autograd.engine import Node

Operand = Any  # Node | Tensor

silu = unary("silu")
sin = unary("sin")
cos = unary("cos")
rsqrt = unary("rsqrt")
log1p = unary("log1p")
eq = binary("eq")
ne = binary("ne")


def leaky_relu(x: Operand, negative_slope: float = 0.01) -> Node:
    """x where x > 0, else ``negative_slope * x`` (gradient ``negative_slope`` at 0, as PyTorch)."""
    return apply_elementwise("leaky_relu", (x,), {"negative_slope": float(negative_slope)})


def elu(x: Operand, alpha: float = 1.0) -> Node:
    """x where x > 0, else ``alpha * (exp(x) - 1)``."""
    return apply_elementwise("elu", (x,), {"alpha": float(alpha)})


def softplus(x: Operand, beta: float = 1.0, threshold: float = 20.0) -> Node:
    """``log(1 + exp(beta * x)) / beta``, and ``x`` where ``beta * x > threshold`` (PyTorch's softplus)."""
    beta, threshold = float(beta), float(threshold)
    if beta == 0:
        raise ValueError("softplus: beta must be non-zero, got 0.0")
    return apply_elementwise("softplus", (x,), {"beta": beta, "threshold": threshold})


__all__ = ["cos", "elu", "eq", "leaky_relu", "log1p", "ne", "rsqrt", "silu", "sin", "softplus"]
