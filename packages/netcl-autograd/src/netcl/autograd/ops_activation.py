"""Differentiable activations and math: silu, leaky_relu, softplus, elu, sin, cos, rsqrt, log1p, ne.

Each is one ``apply_op`` named after its JIT primitive (so traced chains fuse); forwards and
gradients run the runtime's elementwise kernels. Parameters (slope, alpha, beta, threshold) are
``attrs`` baked into the fused source, as PyTorch's functional forms take them.
"""

from __future__ import annotations

from typing import Any

from netcl.autograd.engine import Node, apply_op
from netcl.autograd.ops import _binary, _unary
from netcl.core import Tensor
from netcl.runtime import ops as R  # noqa: N812

Operand = Any  # Node | Tensor

silu = _unary("silu", R.silu, lambda g, x, out: R.silu_backward(g, x))
sin = _unary("sin", R.sin, lambda g, x, out: R.mul(g, R.cos(x)))
cos = _unary("cos", R.cos, lambda g, x, out: R.neg(R.mul(g, R.sin(x))))
rsqrt = _unary("rsqrt", R.rsqrt, lambda g, x, out: R.mul(g, R.mul(-0.5, R.mul(out, R.mul(out, out)))))
log1p = _unary("log1p", R.log1p, lambda g, x, out: R.div(g, R.add(x, 1.0)))
silu.__doc__ = "x * sigmoid(x) (SiLU / swish)."
sin.__doc__ = "Sine."
cos.__doc__ = "Cosine."
rsqrt.__doc__ = "1 / sqrt(x)."
log1p.__doc__ = "log(1 + x), accurate near 0."


def leaky_relu(x: Operand, negative_slope: float = 0.01) -> Node:
    """x where x > 0, else ``negative_slope * x`` (gradient ``negative_slope`` at 0, as PyTorch)."""
    slope = float(negative_slope)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        return [R.leaky_relu_backward(g, values[0], slope)]

    return apply_op(lambda v: R.leaky_relu(v, slope), grad, x, op_name="leaky_relu", attrs={"negative_slope": slope})


def elu(x: Operand, alpha: float = 1.0) -> Node:
    """x where x > 0, else ``alpha * (exp(x) - 1)``."""
    alpha = float(alpha)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        return [R.elu_backward(g, values[0], alpha)]

    return apply_op(lambda v: R.elu(v, alpha), grad, x, op_name="elu", attrs={"alpha": alpha})


def softplus(x: Operand, beta: float = 1.0, threshold: float = 20.0) -> Node:
    """``log(1 + exp(beta * x)) / beta``, and ``x`` where ``beta * x > threshold`` (PyTorch's softplus)."""
    beta, threshold = float(beta), float(threshold)
    if beta == 0:
        raise ValueError("softplus: beta must be non-zero, got 0.0")

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        return [R.mul(g, R.softplus_grad(values[0], beta, threshold))]

    return apply_op(
        lambda v: R.softplus(v, beta, threshold),
        grad,
        x,
        op_name="softplus",
        attrs={"beta": beta, "threshold": threshold},
    )


def ne(a: Operand, b: Operand) -> Node:
    """1.0 where a != b else 0.0 (no gradient)."""
    return _binary("ne", R.ne, None, a, b)


__all__ = ["cos", "elu", "leaky_relu", "log1p", "ne", "rsqrt", "silu", "sin", "softplus"]
