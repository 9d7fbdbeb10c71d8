"""C elementwise expressions as Python over NumPy: the NumPy twin of a kernel expression, generated.

An expression over ``PRIMITIVE_PREAMBLE`` helpers (``"MUL({g}, SUB(1.0f, MUL({out}, {out})))"``)
uses only calls, ``+ - * /`` and float literals, so with the suffixes dropped (``to_python``) it is
Python, and evaluated in ``NAMESPACE`` it computes on NumPy arrays what the kernel computes.
These helpers keep their operands' dtype (float32 stays float32, float64 stays float64; literals
are weak Python floats), so one expression serves the ``cpu`` backend at every float dtype. The
JIT's NumPy path (``netcl.jit.numpy_helpers``) has float32 twins of its own, tuned for speed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.runtime.ops._table import (
    numpy_elu,
    numpy_elu_grad,
    numpy_gelu,
    numpy_gelu_erf,
    numpy_gelu_erf_grad,
    numpy_gelu_grad,
    numpy_leaky_relu,
    numpy_leaky_relu_grad,
    numpy_relu,
    numpy_sigmoid,
    numpy_silu,
    numpy_silu_grad,
    numpy_softplus,
    numpy_softplus_grad,
)

_FLOAT_SUFFIX = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[fF]\b")
_C_ONLY = ("?", "&&", "||", "->", "++", "--")


def to_python(expr: str) -> str:
    """``expr`` as Python: float literal suffixes dropped. ValueError for C-only syntax."""
    if any(token in expr for token in _C_ONLY):
        raise ValueError(f"expression {expr!r} uses C syntax the NumPy path cannot run")
    return _FLOAT_SUFFIX.sub(r"\1", expr)


def _flag(condition: Any, *operands: Any) -> np.ndarray:
    """A comparison as 1.0 / 0.0 in the operands' float dtype (float32 when they have none)."""
    dtype = np.result_type(*operands)
    return np.asarray(condition).astype(dtype if dtype.kind == "f" else np.float32)


def _max(a: Any, b: Any) -> Any:
    return np.where((a > b) | np.isnan(a), a, b)


def _min(a: Any, b: Any) -> Any:
    return np.where((a < b) | np.isnan(a), a, b)


#: The preamble helpers (and C math builtins) by name, dtype-preserving.
NAMESPACE: dict[str, Any] = {
    "ADD": np.add,
    "SUB": np.subtract,
    "MUL": np.multiply,
    "DIV": np.divide,
    "NEG": np.negative,
    "LT": lambda a, b: _flag(np.less(a, b), a, b),
    "LE": lambda a, b: _flag(np.less_equal(a, b), a, b),
    "GT": lambda a, b: _flag(np.greater(a, b), a, b),
    "GE": lambda a, b: _flag(np.greater_equal(a, b), a, b),
    "EQ": lambda a, b: _flag(np.equal(a, b), a, b),
    "NE": lambda a, b: _flag(np.not_equal(a, b), a, b),
    "WHERE": lambda c, a, b: np.where(np.not_equal(c, 0), a, b),
    "RELU": numpy_relu,
    "RELU_GRAD": lambda x: _flag(np.greater(x, 0), x),
    "ABS": np.abs,
    "SIGN": np.sign,
    "EXP": np.exp,
    "LOG": np.log,
    "LOG1P": np.log1p,
    "SQRT": np.sqrt,
    "RSQRT": lambda x: 1.0 / np.sqrt(x),
    "POW": np.power,
    "TANH": np.tanh,
    "SIN": np.sin,
    "COS": np.cos,
    "MAX": _max,
    "MIN": _min,
    "CLAMP": lambda x, lo, hi: _min(_max(x, lo), hi),
    "SIGMOID": numpy_sigmoid,
    "GELU": numpy_gelu,
    "GELU_GRAD": numpy_gelu_grad,
    "GELU_ERF": numpy_gelu_erf,
    "GELU_ERF_GRAD": numpy_gelu_erf_grad,
    "SILU": numpy_silu,
    "SILU_GRAD": numpy_silu_grad,
    "LEAKY_RELU": numpy_leaky_relu,
    "LEAKY_RELU_GRAD": numpy_leaky_relu_grad,
    "ELU": numpy_elu,
    "ELU_GRAD": numpy_elu_grad,
    "SOFTPLUS": numpy_softplus,
    "SOFTPLUS_GRAD": numpy_softplus_grad,
    "max": np.maximum,
    "min": np.minimum,
    "fmax": np.fmax,
    "fmin": np.fmin,
    "fabs": np.abs,
    "INFINITY": np.inf,
    "NAN": np.nan,
    "np": np,
}


def numpy_function(expr: str, params: Sequence[str], name: str = "expression") -> Callable[..., Any]:
    """``expr`` (placeholders ``{p}`` for each name in ``params``) as a Python function of ``params``, in order."""
    body = to_python(expr)
    for param in params:
        body = body.replace(f"{{{param}}}", f"p_{param}")
    source = f"lambda {', '.join(f'p_{p}' for p in params)}: {body}"
    return eval(compile(source, f"<{name}: {expr}>", "eval"), dict(NAMESPACE))
