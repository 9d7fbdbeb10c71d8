"""The elementwise op table: name -> C expression, NumPy function and result-dtype rule, side by side.

Kinds decide the result dtype (see ``_common.promote``):

- ``float``: float result (float32 for integer inputs), computed with the preamble's float helpers;
- ``arith``: the promoted operand dtype (bool -> float32); ``int_expr`` is used for integer types;
- ``compare``: computed in the promoted dtype, result float32 1.0/0.0;
- ``where``: ``arith`` over the two value operands; the condition is read in its own dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

GELU_K = 0.7978845608028654
GELU_C = 0.044715


@dataclass(frozen=True)
class OpDef:
    name: str
    expr: str
    numpy_fn: Callable[..., np.ndarray]
    kind: str
    int_expr: str | None = None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(GELU_K * (x + GELU_C * x * x * x)))


def _gelu_grad(x: np.ndarray) -> np.ndarray:
    t = np.tanh(GELU_K * (x + GELU_C * x * x * x))
    sech2 = 1.0 - t * t
    # sech2 is 0 long before 3 C x^2 overflows: the term is 0 there, not 0 * inf = NaN
    tail = 0.5 * x * sech2 * GELU_K * (1.0 + 3.0 * GELU_C * x * x)
    return 0.5 * (1.0 + t) + np.where(sech2 == 0, 0.0, tail)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(x), x, np.maximum(x, 0))


def _cmp(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda a, b: fn(a, b).astype(np.float32)


def _where(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(c != 0, a, b)


def _clamp(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    # MIN(MAX(x, lo), hi) with NaN propagation from x, as the preamble's CLAMP.
    return np.minimum(np.maximum(x, lo), hi)


_MAXIMUM_GENERIC = "(({0}) > ({1}) || isnan({0}) ? ({0}) : ({1}))"
_MINIMUM_GENERIC = "(({0}) < ({1}) || isnan({0}) ? ({0}) : ({1}))"

UNARY: dict[str, OpDef] = {
    op.name: op
    for op in (
        OpDef("neg", "NEG({0})", np.negative, "arith", "NEG({0})"),
        OpDef("exp", "EXP({0})", np.exp, "float"),
        OpDef("log", "LOG({0})", np.log, "float"),
        OpDef("log1p", "LOG1P({0})", np.log1p, "float"),
        OpDef("sqrt", "SQRT({0})", np.sqrt, "float"),
        OpDef("rsqrt", "RSQRT({0})", lambda x: 1.0 / np.sqrt(x), "float"),
        OpDef("abs", "ABS({0})", np.abs, "float"),
        OpDef("sign", "SIGN({0})", np.sign, "float"),
        OpDef("relu", "RELU({0})", _relu, "float"),
        OpDef("relu_grad", "RELU_GRAD({0})", lambda x: (x > 0).astype(x.dtype), "float"),
        OpDef("gelu", "GELU({0})", _gelu, "float"),
        OpDef("gelu_grad", "GELU_GRAD({0})", _gelu_grad, "float"),
        OpDef("sigmoid", "SIGMOID({0})", _sigmoid, "float"),
        OpDef("tanh", "TANH({0})", np.tanh, "float"),
    )
}

BINARY: dict[str, OpDef] = {
    op.name: op
    for op in (
        OpDef("add", "ADD({0}, {1})", np.add, "arith", "ADD({0}, {1})"),
        OpDef("sub", "SUB({0}, {1})", np.subtract, "arith", "SUB({0}, {1})"),
        OpDef("mul", "MUL({0}, {1})", np.multiply, "arith", "MUL({0}, {1})"),
        OpDef("div", "DIV({0}, {1})", np.true_divide, "float"),
        OpDef("pow", "POW({0}, {1})", np.power, "float"),
        OpDef("maximum", _MAXIMUM_GENERIC, np.maximum, "arith", "max({0}, {1})"),
        OpDef("minimum", _MINIMUM_GENERIC, np.minimum, "arith", "min({0}, {1})"),
        OpDef("lt", "LT({0}, {1})", _cmp(np.less), "compare"),
        OpDef("le", "LE({0}, {1})", _cmp(np.less_equal), "compare"),
        OpDef("gt", "GT({0}, {1})", _cmp(np.greater), "compare"),
        OpDef("ge", "GE({0}, {1})", _cmp(np.greater_equal), "compare"),
        OpDef("eq", "EQ({0}, {1})", _cmp(np.equal), "compare"),
    )
}

WHERE = OpDef("where", "WHERE({0}, {1}, {2})", _where, "where", "WHERE({0}, {1}, {2})")
CLAMP = OpDef("clamp", "CLAMP_G({0}, {1}, {2})", _clamp, "arith", "min(max({0}, {1}), {2})")

#: Type-generic clamp for float and double compute types (the preamble's CLAMP is float-only).
CLAMP_SOURCE = (
    "#define CLAMP_G(x, lo, hi) (" + _MINIMUM_GENERIC.format(_MAXIMUM_GENERIC.format("x", "lo"), "hi") + ")\n"
)
