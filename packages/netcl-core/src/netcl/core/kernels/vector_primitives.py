"""Vector twins of the PRIMITIVE_PREAMBLE helpers: a fused body evaluated on ``floatN`` values.

On CPU OpenCL devices a fused kernel whose body is written on ``floatN`` vectors compiles to SIMD code whatever the
compiler's work-group vectorizer does; the math builtins (``exp``, ``tanh``, ``log1p`` on ``float8``) are the
vectorized ones (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", vector_primitives.py).

``SIN`` and ``COS`` have no twin: PoCL's ``cos`` on ``float8`` is 400 ulp off its scalar ``cos`` near 0.

``vector_preamble(width)`` defines ``VF``/``VI`` (``floatN``/``intN``) and ``V_<NAME>`` for every
helper whose scalar form is a function or a comparison macro (``ADD``/``SUB``/``MUL``/``DIV``/
``NEG`` are plain operators and work on vectors as they are). Each twin computes what the scalar
helper computes, with ``select`` in place of branches: the same formulas, NaN and overflow
behaviour (``SIGMOID`` and ``BCE_LOGITS`` never overflow ``exp``). ``vectorize(expr)`` rewrites a
body expression to call the twins, or returns None when the expression uses anything else (a
user primitive's own C), which then runs one lane at a time.
"""

from __future__ import annotations

import re

from netcl.core.kernels.primitives import gelu_source

#: Helpers with a ``V_`` twin.
VECTOR_HELPERS = (
    "LT LE GT GE EQ WHERE RELU RELU_GRAD ABS SIGN EXP LOG LOG1P SQRT RSQRT POW TANH MAX MIN CLAMP "
    "SIGMOID GELU GELU_GRAD BCE_LOGITS BCE_LOGITS_GRAD SMOOTH_L1 SMOOTH_L1_GRAD NE SILU SILU_GRAD "
    "LEAKY_RELU LEAKY_RELU_GRAD ELU ELU_GRAD SOFTPLUS SOFTPLUS_GRAD GELU_ERF GELU_ERF_GRAD"
).split()
#: Twins of helpers whose scalar form calls a math builtin (``exp``, ``log1p``, ``erfc``, ...): a CPU compiler turns
#: the scalar form into one library call per element, where the twin calls the vector builtin.
MATH_HELPERS = (
    "EXP LOG LOG1P SQRT RSQRT POW TANH SIGMOID GELU GELU_GRAD BCE_LOGITS BCE_LOGITS_GRAD SILU SILU_GRAD ELU "
    "ELU_GRAD SOFTPLUS SOFTPLUS_GRAD GELU_ERF GELU_ERF_GRAD"
).split()
#: Names an expression may use as they are: operator macros and type-generic OpenCL builtins.
_GENERIC = set("ADD SUB MUL DIV NEG NAN INFINITY fmax fmin fabs exp log log1p sqrt tanh pow".split())
_TOKEN = re.compile(
    r"\s*(?:(?P<name>[A-Za-z_]\w*)|(?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[fF]?)|(?P<op>[-+*/(),]))"
)
_VARIABLE = re.compile(r"^(?:x|v|g|gin)\d+$|^gout$")


def vectorize(expr: str) -> str | None:
    """``expr`` with each helper call renamed to its ``V_`` twin; None if it uses other C."""
    out = []
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            return None if expr[position:].strip() else "".join(out)
        name = match.group("name")
        if name is not None and name in VECTOR_HELPERS:
            out.append(match.group(0).replace(name, "V_" + name))  # keeps the spacing
        elif name is None or name in _GENERIC or _VARIABLE.match(name):
            out.append(match.group(0))
        else:
            return None
        position = match.end()
    return "".join(out)


def vector_preamble(width: int) -> str:
    """The ``V_`` helpers for ``float{width}`` (after PRIMITIVE_PREAMBLE, which defines GELU_K/GELU_C)."""
    if width not in (2, 3, 4, 8, 16):
        raise ValueError(f"vector width must be 2, 3, 4, 8 or 16, got {width}")
    return _TEMPLATE.replace("@W@", str(width))


_TEMPLATE = r"""
typedef float@W@ VF;
typedef int@W@ VI;
#define V_LT(a, b) select((VF)0.0f, (VF)1.0f, (VF)(a) < (VF)(b))
#define V_LE(a, b) select((VF)0.0f, (VF)1.0f, (VF)(a) <= (VF)(b))
#define V_GT(a, b) select((VF)0.0f, (VF)1.0f, (VF)(a) > (VF)(b))
#define V_GE(a, b) select((VF)0.0f, (VF)1.0f, (VF)(a) >= (VF)(b))
#define V_EQ(a, b) select((VF)0.0f, (VF)1.0f, (VF)(a) == (VF)(b))
#define V_NE(a, b) select((VF)0.0f, (VF)1.0f, (VF)(a) != (VF)(b))
#define V_WHERE(c, a, b) select((VF)(b), (VF)(a), (VF)(c) != (VF)0.0f)
inline VF V_RELU_(VF x) { return select((VF)0.0f, x, (x > 0.0f) | (x != x)); }
inline VF V_RELU_GRAD_(VF x) { return select((VF)0.0f, (VF)1.0f, x > 0.0f); }
inline VF V_SIGN_(VF x) {
    VF s = select((VF)0.0f, (VF)1.0f, x > 0.0f);
    s = select(s, (VF)-1.0f, x < 0.0f);
    return select(s, x, x != x);
}
inline VF V_MAX_(VF a, VF b) { return select(b, a, (a > b) | (a != a)); }
inline VF V_MIN_(VF a, VF b) { return select(b, a, (a < b) | (a != a)); }
/* SIGMOID: x >= 0: 1 / (1 + exp(-x)); x < 0: e / (1 + e), e = exp(x) -- both with e = exp(-|x|) */
inline VF V_SIGMOID_(VF x) {
    VF e = exp(-fabs(x));
    VF d = 1.0f + e;
    return select(e / d, 1.0f / d, x >= 0.0f);
}
@GELU@
inline VF V_GELU_ERF_(VF x) { return 0.5f * x * erfc(-0.70710678118654752f * x); }
inline VF V_GELU_ERF_GRAD_(VF x) {
    VF phi = 0.39894228040143268f * exp(-0.5f * x * x);
    return 0.5f * erfc(-0.70710678118654752f * x) + select(x * phi, (VF)0.0f, phi == 0.0f);
}
inline VF V_SILU_(VF x) { return x * V_SIGMOID_(x); }
inline VF V_SILU_GRAD_(VF x) { VF s = V_SIGMOID_(x); return s * (1.0f + x * (1.0f - s)); }
inline VF V_LEAKY_RELU_(VF x, VF slope) { return select(x * slope, x, (x > 0.0f) | (x != x)); }
inline VF V_LEAKY_RELU_GRAD_(VF x, VF slope) { return select(slope, (VF)1.0f, x > 0.0f); }
inline VF V_ELU_(VF x, VF alpha) { return select(alpha * expm1(x), x, x > 0.0f); }
inline VF V_ELU_GRAD_(VF x, VF alpha) { return select(alpha * exp(x), (VF)1.0f, x > 0.0f); }
inline VF V_SOFTPLUS_(VF x, VF beta, VF threshold) {
    VF z = beta * x;
    return select((fmax(z, 0.0f) + log1p(exp(-fabs(z)))) / beta, x, z > threshold);
}
inline VF V_SOFTPLUS_GRAD_(VF x, VF beta, VF threshold) {
    VF z = beta * x;
    return select(V_SIGMOID_(z), (VF)1.0f, z > threshold);
}
inline VF V_BCE_LOGITS_(VF x, VF t) { return fmax(x, 0.0f) - x * t + log1p(exp(-fabs(x))); }
inline VF V_SMOOTH_L1_(VF d, VF beta) {
    VF a = fabs(d);
    return select(a - 0.5f * beta, 0.5f * d * d / beta, a < beta);
}
inline VF V_SMOOTH_L1_GRAD_(VF d, VF beta) { return select(V_SIGN_(d), d / beta, fabs(d) < beta); }
#define V_RELU(x) V_RELU_((VF)(x))
#define V_RELU_GRAD(x) V_RELU_GRAD_((VF)(x))
#define V_ABS(x) fabs((VF)(x))
#define V_SIGN(x) V_SIGN_((VF)(x))
#define V_EXP(x) exp((VF)(x))
#define V_LOG(x) log((VF)(x))
#define V_LOG1P(x) log1p((VF)(x))
#define V_SQRT(x) sqrt((VF)(x))
#define V_RSQRT(x) rsqrt((VF)(x))
#define V_POW(a, b) pow((VF)(a), (VF)(b))
#define V_TANH(x) tanh((VF)(x))
#define V_MAX(a, b) V_MAX_((VF)(a), (VF)(b))
#define V_MIN(a, b) V_MIN_((VF)(a), (VF)(b))
#define V_CLAMP(x, lo, hi) V_MIN(V_MAX(x, lo), hi)
#define V_SIGMOID(x) V_SIGMOID_((VF)(x))
#define V_GELU(x) V_GELU_((VF)(x))
#define V_GELU_GRAD(x) V_GELU_GRAD_((VF)(x))
#define V_BCE_LOGITS(x, t) V_BCE_LOGITS_((VF)(x), (VF)(t))
#define V_BCE_LOGITS_GRAD(x, t) (V_SIGMOID_((VF)(x)) - (VF)(t))
#define V_SMOOTH_L1(d, beta) V_SMOOTH_L1_((VF)(d), (VF)(beta))
#define V_SMOOTH_L1_GRAD(d, beta) V_SMOOTH_L1_GRAD_((VF)(d), (VF)(beta))
#define V_GELU_ERF(x) V_GELU_ERF_((VF)(x))
#define V_GELU_ERF_GRAD(x) V_GELU_ERF_GRAD_((VF)(x))
#define V_SILU(x) V_SILU_((VF)(x))
#define V_SILU_GRAD(x) V_SILU_GRAD_((VF)(x))
#define V_LEAKY_RELU(x, slope) V_LEAKY_RELU_((VF)(x), (VF)(slope))
#define V_LEAKY_RELU_GRAD(x, slope) V_LEAKY_RELU_GRAD_((VF)(x), (VF)(slope))
#define V_ELU(x, alpha) V_ELU_((VF)(x), (VF)(alpha))
#define V_ELU_GRAD(x, alpha) V_ELU_GRAD_((VF)(x), (VF)(alpha))
#define V_SOFTPLUS(x, beta, threshold) V_SOFTPLUS_((VF)(x), (VF)(beta), (VF)(threshold))
#define V_SOFTPLUS_GRAD(x, beta, threshold) V_SOFTPLUS_GRAD_((VF)(x), (VF)(beta), (VF)(threshold))
""".replace("@GELU@", gelu_source("VF"))
