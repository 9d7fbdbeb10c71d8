"""Differentiable elementwise activations and functions: silu, leaky_relu, softplus, elu, sin, cos,
rsqrt, log1p, and the comparison ``ne``.

Each is one ``apply_op`` named after its JIT primitive (parameters in ``attrs``, so a jitted chain
fuses them); forwards and gradients are one runtime kernel each (the gradient multiplies the
upstream gradient inside the same kernel). At the kinks the gradient is the ``x <= 0`` branch's,
as PyTorch: leaky_relu'(0) = negative_slope, elu'(0) = alpha.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op
from netcl.autograd.ops import _binary
from netcl.core import Tensor
from netcl.runtime import ops as R  # noqa: N812
from netcl.runtime.ops import _table as T  # noqa: N812

Operand = Any  # Node | Tensor
_Grads = list[Tensor | None]


def _grad_kernel(expr: str, numpy_fn: Callable[..., Any], *params: float) -> Callable[..., _Grads]:
    """A grad rule ``[expr(g, x, out, *params)]`` evaluated in one elementwise kernel."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [R.elementwise(expr, numpy_fn, g, values[0], out, *params)]

    return grad


def _apply(
    name: str, forward: Callable[[Tensor], Tensor], grad: Callable[..., _Grads], x: Operand, **attrs: Any
) -> Node:
    return apply_op(forward, grad, x, op_name=name, attrs=attrs or None)


def silu(x: Operand) -> Node:
    """x * sigmoid(x) (SiLU / swish)."""
    return _apply("silu", R.silu, _grad_kernel("{0} * SILU_GRAD({1})", lambda g, v, o: g * T.numpy_silu_grad(v)), x)


def leaky_relu(x: Operand, negative_slope: float = 0.01) -> Node:
    """x where x > 0, else negative_slope * x."""
    slope = float(negative_slope)
    grad = _grad_kernel("{0} * LEAKY_RELU_GRAD({1}, {3})", lambda g, v, o, s: g * T.numpy_leaky_relu_grad(v, s), slope)
    return _apply("leaky_relu", lambda v: R.leaky_relu(v, slope), grad, x, negative_slope=slope)


def elu(x: Operand, alpha: float = 1.0) -> Node:
    """x where x > 0, else alpha * (exp(x) - 1)."""
    a = float(alpha)
    grad = _grad_kernel("{0} * ELU_GRAD({1}, {3})", lambda g, v, o, s: g * T.numpy_elu_grad(v, s), a)
    return _apply("elu", lambda v: R.elu(v, a), grad, x, alpha=a)


def softplus(x: Operand, beta: float = 1.0, threshold: float = 20.0) -> Node:
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (PyTorch); overflow-free."""
    b, t = float(beta), float(threshold)
    grad = _grad_kernel(
        "{0} * SOFTPLUS_GRAD({1}, {3}, {4})", lambda g, v, o, bb, tt: g * T.numpy_softplus_grad(v, bb, tt), b, t
    )
    return _apply("softplus", lambda v: R.softplus(v, b, t), grad, x, beta=b, threshold=t)


def sin(x: Operand) -> Node:
    """Sine."""
    return _apply("sin", R.sin, _grad_kernel("{0} * COS({1})", lambda g, v, o: g * np.cos(v)), x)


def cos(x: Operand) -> Node:
    """Cosine."""
    return _apply("cos", R.cos, _grad_kernel("-{0} * SIN({1})", lambda g, v, o: -g * np.sin(v)), x)


def rsqrt(x: Operand) -> Node:
    """1 / sqrt(x) (gradient -0.5 * out**3)."""
    grad = _grad_kernel("{0} * -0.5f * {2} * {2} * {2}", lambda g, v, o: g * -0.5 * o * o * o)
    return _apply("rsqrt", R.rsqrt, grad, x)


def log1p(x: Operand) -> Node:
    """log(1 + x), accurate for small x (gradient 1 / (1 + x))."""
    return _apply("log1p", R.log1p, _grad_kernel("{0} / (1.0f + {1})", lambda g, v, o: g / (1 + v)), x)


def ne(a: Operand, b: Operand) -> Node:
    """1.0 where a != b else 0.0 (no gradient)."""
    return _binary("ne", R.ne, None, a, b)


__all__ = ["cos", "elu", "leaky_relu", "log1p", "ne", "rsqrt", "silu", "sin", "softplus"]
