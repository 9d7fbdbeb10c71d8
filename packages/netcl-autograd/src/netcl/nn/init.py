"""Parameter initialization in place, as ``torch.nn.init`` (same names, same bounds).

Random draws come from the runtime's counter-based generator (``netcl.autograd.manual_seed``
makes them repeat), so a model built twice after the same seed has the same weights on every
device. The values differ from PyTorch's (another generator); the distributions are the same.
"""

from __future__ import annotations

import math
from typing import Any

from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.runtime.ops import layout, pointwise, random, upload
from netcl.runtime.ops.random import next_seed


def _tensor(x: Node | Tensor, op: str) -> Tensor:
    value = x.value if isinstance(x, Node) else x
    if not isinstance(value, Tensor):
        raise TypeError(f"{op}: expected a Parameter, Node or Tensor, got {type(x).__name__}")
    return value


def _assign(dst: Tensor, src: Tensor) -> None:
    src = layout.cast(src, dst.dtype) if src.dtype != dst.dtype else src
    upload.copy_into(dst, src)


def calculate_fan_in_and_fan_out(x: Node | Tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight (out, in, *kernel), as torch computes them."""
    shape = _tensor(x, "calculate_fan_in_and_fan_out").shape
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need a tensor with at least 2 dimensions, got shape {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def uniform_(x: Any, a: float = 0.0, b: float = 1.0) -> Any:
    """Fill with U(a, b); returns x."""
    t = _tensor(x, "uniform_")
    _assign(t, random.uniform(t.shape, a, b, seed=next_seed(), device=t.device))
    return x


def normal_(x: Any, mean: float = 0.0, std: float = 1.0) -> Any:
    """Fill with N(mean, std**2); returns x."""
    t = _tensor(x, "normal_")
    _assign(t, random.normal(t.shape, mean, std, seed=next_seed(), device=t.device))
    return x


def constant_(x: Any, value: float) -> Any:
    """Fill with ``value``; returns x."""
    pointwise.fill_(_tensor(x, "constant_"), value)
    return x


def zeros_(x: Any) -> Any:
    return constant_(x, 0.0)


def ones_(x: Any) -> Any:
    return constant_(x, 1.0)


def kaiming_uniform_(x: Any, a: float = 0.0, nonlinearity: str = "leaky_relu") -> Any:
    """U(-bound, bound) with bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a**2)) for leaky_relu."""
    fan_in, _ = calculate_fan_in_and_fan_out(x)
    if nonlinearity == "leaky_relu":
        gain = math.sqrt(2.0 / (1 + a * a))
    elif nonlinearity == "relu":
        gain = math.sqrt(2.0)
    elif nonlinearity in ("linear", "sigmoid"):
        gain = 1.0
    elif nonlinearity == "tanh":
        gain = 5.0 / 3
    else:
        raise ValueError(f"kaiming_uniform_: unknown nonlinearity {nonlinearity!r}")
    bound = gain * math.sqrt(3.0 / fan_in) if fan_in else 0.0
    return uniform_(x, -bound, bound)


def xavier_uniform_(x: Any, gain: float = 1.0) -> Any:
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(x)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(x, -bound, bound)
