"""Elementwise kernel definitions: ``OpDef`` (C expression, NumPy function, result-dtype rule), the
NumPy twins of the preamble helpers, the runtime's helper kernels, and the float64 helper twins.

The differentiable ops are defined in ``elementwise_defs``, which builds their ``OpDef``s.

Kinds decide the result dtype (see ``_common.promote``):

- ``float``: float result (float32 for integer inputs), computed with the preamble's float helpers;
- ``arith``: the promoted operand dtype (bool -> float32); ``int_expr`` is used for integer types;
- ``compare``: computed in the promoted dtype, result float32 1.0/0.0;
- ``where``: ``arith`` over the two value operands; the condition is read in its own dtype.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from netcl.core.kernels.primitives import GELU_C, GELU_K, gelu_source


@dataclass(frozen=True)
class OpDef:
    name: str
    expr: str
    numpy_fn: Callable[..., np.ndarray]
    kind: str
    int_expr: str | None = None
    #: C helpers the expression calls beyond ``PRIMITIVE_PREAMBLE`` (a JIT primitive's ``preamble=``)
    preamble: str = ""


def numpy_sigmoid(x: np.ndarray) -> np.ndarray:
    """SIGMOID of the preamble, in NumPy (no overflow for large |x|)."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def numpy_gelu(x: np.ndarray) -> np.ndarray:
    """GELU of the preamble (tanh form), in NumPy."""
    # As the preamble: x * sigmoid(2u), u = K (x + C x^3) (the tanh form without cancellation).
    return x * numpy_sigmoid(2.0 * GELU_K * (x + GELU_C * x * x * x))


def numpy_gelu_grad(x: np.ndarray) -> np.ndarray:
    """GELU_GRAD of the preamble, in NumPy."""
    # As the preamble: sigmoid(2u) + 0.5 x sech(u)^2 K (1 + 3 C x^2), sech^2 = 4e / (1 + e)^2, e = exp(-2|u|).
    u = GELU_K * (x + GELU_C * x * x * x)
    e = np.exp(-2.0 * np.abs(u))
    sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e))
    # sech2 is 0 long before 3 C x^2 overflows: the term is 0 there, not 0 * inf = NaN
    tail = 0.5 * x * sech2 * GELU_K * (1.0 + 3.0 * GELU_C * x * x)
    return numpy_sigmoid(2.0 * u) + np.where(sech2 == 0, 0.0, tail)


#: erfc on every element, in float64 (NumPy has no erfc ufunc; ``math.erfc`` is the C library's)
_ERFC = np.frompyfunc(math.erfc, 1, 1)


def numpy_gelu_erf(x: np.ndarray) -> np.ndarray:
    """GELU_ERF of the preamble (exact GELU, x Phi(x)), in NumPy (erfc through ``math.erfc``, element by element)."""
    x = np.asarray(x)
    phi_cdf = 0.5 * _ERFC(-0.7071067811865476 * x.astype(np.float64)).astype(np.float64)
    return (x * phi_cdf).astype(_float_type(x), copy=False)


def numpy_gelu_erf_grad(x: np.ndarray) -> np.ndarray:
    """GELU_ERF_GRAD of the preamble, in NumPy: Phi(x) + x phi(x), the second term 0 where phi underflows."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    phi = 0.3989422804014327 * np.exp(-0.5 * x64 * x64)
    with np.errstate(invalid="ignore"):
        tail = np.where(phi == 0, 0.0, x64 * phi)
    cdf = 0.5 * _ERFC(-0.7071067811865476 * x64).astype(np.float64)
    return (cdf + tail).astype(_float_type(x), copy=False)


def _float_type(x: np.ndarray) -> np.dtype:
    return x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)


def numpy_silu(x: np.ndarray) -> np.ndarray:
    return x * numpy_sigmoid(x)


def numpy_silu_grad(x: np.ndarray) -> np.ndarray:
    s = numpy_sigmoid(x)
    return s * (1 + x * (1 - s))


def numpy_leaky_relu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, x * slope)


def numpy_leaky_relu_grad(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.where(x > 0, 1.0, slope + 0 * x)


def numpy_elu(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def numpy_elu_grad(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    return np.where(x > 0, 1.0, alpha * np.exp(np.minimum(x, 0)))


def numpy_softplus(x: np.ndarray, beta: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    z = beta * x
    return np.where(z > threshold, x, (np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))) / beta)


def numpy_softplus_grad(x: np.ndarray, beta: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    z = beta * x
    return np.where(z > threshold, 1.0, numpy_sigmoid(z))


def numpy_relu(x: np.ndarray) -> np.ndarray:
    """RELU of the preamble, in NumPy (NaN stays NaN)."""
    return np.where(np.isnan(x), x, np.maximum(x, 0))


# The differentiable ops (exp, add, where, ...) are defined in ``elementwise_defs``, which builds
# their OpDefs (and their derivatives' kernels, ``derivative_opdef``); these tables hold the runtime's
# helper kernels: the preamble's derivative helpers alone (``relu_grad``), fused loss terms, and ops
# without an autograd front (``eq``, ``sign``).
UNARY: dict[str, OpDef] = {
    op.name: op
    for op in (
        OpDef("sign", "SIGN({0})", np.sign, "float"),
        OpDef("relu_grad", "RELU_GRAD({0})", lambda x: (x > 0).astype(x.dtype), "float"),
        OpDef("gelu_grad", "GELU_GRAD({0})", numpy_gelu_grad, "float"),
        OpDef("silu_grad", "SILU_GRAD({0})", numpy_silu_grad, "float"),
    )
}

BINARY: dict[str, OpDef] = {
    op.name: op
    for op in (
        OpDef("eq", "EQ({0}, {1})", lambda a, b: np.equal(a, b).astype(np.float32), "compare"),
        OpDef("leaky_relu_grad", "LEAKY_RELU_GRAD({0}, {1})", numpy_leaky_relu_grad, "float"),
        OpDef("elu_grad", "ELU_GRAD({0}, {1})", numpy_elu_grad, "float"),
        # (a - b)^2: the mean squared error's terms in one kernel
        OpDef("squared_difference", "MUL(SUB({0}, {1}), SUB({0}, {1}))", lambda a, b: (a - b) * (a - b), "float"),
    )
}

TERNARY: dict[str, OpDef] = {
    op.name: op
    for op in (
        OpDef("softplus_grad", "SOFTPLUS_GRAD({0}, {1}, {2})", numpy_softplus_grad, "float"),
        # (a - b) * c: the mean squared error's gradient in one kernel
        OpDef("scaled_difference", "MUL(SUB({0}, {1}), {2})", lambda a, b, c: (a - b) * c, "float"),
    )
}

#: Double-precision twins of the preamble's float helpers (whose float parameters would round a
#: double to float). Kernels computing in double get this source, and their expression has
#: ``NAME(`` rewritten to ``NAME_F64(`` (see ``f64_expr``).
F64_SOURCE = r"""
inline double RELU_F64(double x) { return x > 0.0 ? x : (x != x ? x : 0.0); }
inline double RELU_GRAD_F64(double x) { return x > 0.0 ? 1.0 : 0.0; }
inline double ABS_F64(double x) { return fabs(x); }
inline double SIGN_F64(double x) { return x != x ? x : (double)((x > 0.0) - (x < 0.0)); }
inline double EXP_F64(double x) { return exp(x); }
inline double LOG_F64(double x) { return log(x); }
inline double LOG1P_F64(double x) { return log1p(x); }
inline double SQRT_F64(double x) { return sqrt(x); }
inline double RSQRT_F64(double x) { return rsqrt(x); }
inline double POW_F64(double a, double b) { return pow(a, b); }
inline double TANH_F64(double x) { return tanh(x); }
inline double MAX_F64(double a, double b) { return (a > b || a != a) ? a : b; }
inline double MIN_F64(double a, double b) { return (a < b || a != a) ? a : b; }
inline double CLAMP_F64(double x, double lo, double hi) { return MIN_F64(MAX_F64(x, lo), hi); }
inline double SIGMOID_F64(double x) {
    if (x >= 0.0) { return 1.0 / (1.0 + exp(-x)); }
    double e = exp(x);
    return e / (1.0 + e);
}
@GELU@
inline double GELU_ERF_F64(double x) { return 0.5 * x * erfc(-0.70710678118654752 * x); }
inline double GELU_ERF_GRAD_F64(double x) {
    double phi = 0.39894228040143268 * exp(-0.5 * x * x);
    return 0.5 * erfc(-0.70710678118654752 * x) + (phi == 0.0 ? 0.0 : x * phi);
}
inline double BCE_LOGITS_F64(double x, double t) { return fmax(x, 0.0) - x * t + log1p(exp(-fabs(x))); }
inline double BCE_LOGITS_GRAD_F64(double x, double t) { return SIGMOID_F64(x) - t; }
inline double SMOOTH_L1_F64(double d, double beta) {
    double a = fabs(d);
    return a < beta ? 0.5 * d * d / beta : a - 0.5 * beta;
}
inline double SMOOTH_L1_GRAD_F64(double d, double beta) { return fabs(d) < beta ? d / beta : SIGN_F64(d); }
inline double SIN_F64(double x) { return sin(x); }
inline double COS_F64(double x) { return cos(x); }
inline double SILU_F64(double x) { return x * SIGMOID_F64(x); }
inline double SILU_GRAD_F64(double x) { double s = SIGMOID_F64(x); return s * (1.0 + x * (1.0 - s)); }
inline double LEAKY_RELU_F64(double x, double slope) { return x > 0.0 ? x : (x != x ? x : x * slope); }
inline double LEAKY_RELU_GRAD_F64(double x, double slope) { return x > 0.0 ? 1.0 : slope; }
inline double ELU_F64(double x, double alpha) { return x > 0.0 ? x : alpha * expm1(x); }
inline double ELU_GRAD_F64(double x, double alpha) { return x > 0.0 ? 1.0 : alpha * exp(x); }
inline double SOFTPLUS_F64(double x, double beta, double threshold) {
    double z = beta * x;
    return z > threshold ? x : (fmax(z, 0.0) + log1p(exp(-fabs(z)))) / beta;
}
inline double SOFTPLUS_GRAD_F64(double x, double beta, double threshold) {
    double z = beta * x;
    return z > threshold ? 1.0 : SIGMOID_F64(z);
}
""".replace("@GELU@", gelu_source("double"))

_F64_NAMES = re.compile(
    r"\b(RELU_GRAD|RELU|ABS|SIGN|EXP|LOG1P|LOG|SQRT|RSQRT|POW|TANH|MAX|MIN|CLAMP|SIGMOID|GELU_ERF_GRAD|GELU_ERF|GELU_GRAD|GELU|"
    r"BCE_LOGITS_GRAD|BCE_LOGITS|SMOOTH_L1_GRAD|SMOOTH_L1|SIN|COS|SILU_GRAD|SILU|LEAKY_RELU_GRAD|LEAKY_RELU|"
    r"ELU_GRAD|ELU|SOFTPLUS_GRAD|SOFTPLUS)\("
)


def f64_expr(expr: str) -> str:
    """``expr`` with every float preamble helper replaced by its ``_F64`` twin."""
    return _F64_NAMES.sub(lambda m: f"{m.group(1)}_F64(", expr)
