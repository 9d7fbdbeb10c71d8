"""NumPy versions of the PRIMITIVE_PREAMBLE helpers, so fused bodies also run as Python.

SIGMOID, GELU, GELU_GRAD and the activations' helpers (SILU, ELU, SOFTPLUS, ...) are the eager
NumPy backend's own functions (``netcl.runtime.ops._table``, one formula each) on float32.

Each works on float32 arrays (or scalars) and keeps float32, mirroring the C helpers.
"""

from __future__ import annotations

import numpy as np

from netcl.runtime.ops import _table
from netcl.runtime.ops._table import numpy_gelu, numpy_gelu_erf, numpy_gelu_erf_grad, numpy_gelu_grad, numpy_sigmoid

_F = np.float32
GELU_K = _F(_table.GELU_K)
GELU_C = _F(_table.GELU_C)


def _flag(condition):
    return np.asarray(condition).astype(_F)


def ADD(a, b):
    return a + b


def SUB(a, b):
    return a - b


def MUL(a, b):
    return a * b


def DIV(a, b):
    return np.divide(a, b)


def NEG(a):
    return -a


def LT(a, b):
    return _flag(np.less(a, b))


def LE(a, b):
    return _flag(np.less_equal(a, b))


def GT(a, b):
    return _flag(np.greater(a, b))


def GE(a, b):
    return _flag(np.greater_equal(a, b))


def EQ(a, b):
    return _flag(np.equal(a, b))


def NE(a, b):
    return _flag(np.not_equal(a, b))


def WHERE(c, a, b):
    return np.where(np.not_equal(c, 0), a, b).astype(_F)


def RELU(x):
    return np.maximum(x, _F(0))


def RELU_GRAD(x):
    return _flag(np.greater(x, 0))


def ABS(x):
    return np.abs(x)


def SIGN(x):
    return np.sign(x)


def EXP(x):
    return np.exp(x)


def LOG(x):
    return np.log(x)


def LOG1P(x):
    return np.log1p(x)


def SQRT(x):
    return np.sqrt(x)


def RSQRT(x):
    return _F(1) / np.sqrt(x)


def POW(a, b):
    return np.power(a, b)


def TANH(x):
    return np.tanh(x)


def MAX(a, b):
    return np.maximum(a, b)


def MIN(a, b):
    return np.minimum(a, b)


def CLAMP(x, lo, hi):
    return np.minimum(np.maximum(x, lo), hi)


def SIGMOID(x):
    return numpy_sigmoid(np.asarray(x, dtype=_F)).astype(_F, copy=False)


def GELU(x):
    return numpy_gelu(np.asarray(x, dtype=_F)).astype(_F, copy=False)


def GELU_GRAD(x):
    return numpy_gelu_grad(np.asarray(x, dtype=_F)).astype(_F, copy=False)


def GELU_ERF(x):
    return numpy_gelu_erf(np.asarray(x, dtype=_F)).astype(_F, copy=False)


def GELU_ERF_GRAD(x):
    return numpy_gelu_erf_grad(np.asarray(x, dtype=_F)).astype(_F, copy=False)


# ``out=`` twins for the fused NumPy path (numpy_source): same values, written into scratch
# buffers. ``out`` may alias ``x`` (each reads x before writing out); ``tmp`` aliases neither.
def SIGMOID_OUT(x, out, tmp):
    """SIGMOID as exp(min(x, 0)) / (1 + exp(-|x|)), branch-free: the numerator is max(e, x >= 0)."""
    np.absolute(x, out=tmp)  # np.copysign(x, -1) would be one call, but has no SIMD loop
    np.negative(tmp, out=tmp)
    np.exp(tmp, out=tmp)
    np.greater_equal(x, _F(0), out=out)
    np.maximum(tmp, out, out=out)
    np.add(tmp, _F(1), out=tmp)
    return np.divide(out, tmp, out=out)


def SIGMOID_NONNEG(x):
    """SIGMOID of a value the body proves >= 0 (or NaN); ``numpy_ranges`` picks it."""
    return SIGMOID(x)


def SIGMOID_NONNEG_OUT(x, out):
    """SIGMOID_OUT where x >= 0 or NaN: 1 / (1 + exp(-x)), the same float32 value in 4 passes, not 7."""
    np.negative(x, out=out)
    np.exp(out, out=out)
    np.add(out, _F(1), out=out)
    return np.divide(_F(1), out, out=out)


def GELU_OUT(x, out, tmp, tmp2):
    """GELU as x * sigmoid(2u), u = K (x + C x^3), in the order of the eager twin (same float32 values)."""
    np.multiply(x, GELU_C, out=tmp)
    np.multiply(tmp, x, out=tmp)
    np.multiply(tmp, x, out=tmp)
    np.add(x, tmp, out=tmp)
    np.multiply(tmp, _F(2.0 * _table.GELU_K), out=tmp)
    SIGMOID_OUT(tmp, tmp, tmp2)
    return np.multiply(x, tmp, out=out)


def RELU_GRAD_OUT(x, out):
    return np.greater(x, _F(0), out=out)


def BCE_LOGITS(x, t):
    return np.maximum(x, _F(0)) - x * t + np.log1p(np.exp(-np.abs(x)))


def BCE_LOGITS_GRAD(x, t):
    return SIGMOID(x) - t


def SMOOTH_L1(d, beta):
    a = np.abs(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a < beta, _F(0.5) * d * d / beta, a - _F(0.5) * beta).astype(_F)


def SMOOTH_L1_GRAD(d, beta):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.abs(d) < beta, d / beta, np.sign(d)).astype(_F)


def SIN(x):
    return np.sin(x)


def COS(x):
    return np.cos(x)


def _float32(fn):
    """``fn`` (a NumPy twin of ``netcl.runtime.ops._table``) on float32 arguments, returning float32."""

    def helper(*args):
        return np.asarray(fn(*[np.asarray(a, dtype=_F) for a in args])).astype(_F, copy=False)

    helper.__name__ = fn.__name__
    return helper


SILU = _float32(_table.numpy_silu)
SILU_GRAD = _float32(_table.numpy_silu_grad)
LEAKY_RELU = _float32(_table.numpy_leaky_relu)
LEAKY_RELU_GRAD = _float32(_table.numpy_leaky_relu_grad)
ELU = _float32(_table.numpy_elu)
ELU_GRAD = _float32(_table.numpy_elu_grad)
SOFTPLUS = _float32(_table.numpy_softplus)
SOFTPLUS_GRAD = _float32(_table.numpy_softplus_grad)


# C math builtins user primitives may call.
fmax, fmin, fabs, exp, log, log1p, sqrt, tanh, pow = (
    np.fmax,
    np.fmin,
    np.abs,
    np.exp,
    np.log,
    np.log1p,
    np.sqrt,
    np.tanh,
    np.power,
)
INFINITY = _F(np.inf)
NAN = _F(np.nan)

NAMESPACE = {name: value for name, value in globals().items() if not name.startswith("_") and name not in ("np",)}
NAMESPACE["np"] = np
