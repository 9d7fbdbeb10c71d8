"""``PRIMITIVE_PREAMBLE``: the inline C helpers every generated netcl kernel starts with.

Arithmetic, comparisons and ``WHERE`` are macros, so they work for every element type.
The transcendental helpers are ``float`` functions: they are what fused float32 chains use.
Comparisons yield the C int 1 or 0 (promoted to float in float arithmetic). ``MAX``/``MIN`` propagate NaN as NumPy's
``maximum``/``minimum`` do. ``SIGMOID`` and ``BCE_LOGITS`` are written so that no ``exp``
overflows for large logits. A NaN test is ``x != x``, never the ``isnan`` builtin, here and in every
kernel netcl writes: PoCL's ``isnan`` call stops its work-group vectorizer, which made ``RELU`` / ``MAX``
10-20x slower on a CPU (benchmarks/RESULTS.md, "isnan on PoCL").
"""

#: GELU's tanh form: 0.5 x (1 + tanh(u)), u = GELU_K (x + GELU_C x^3). Its one formula is
#: ``gelu_source`` (the float and double C helpers); the NumPy twins (``netcl.runtime.ops._table``)
#: and the ``V_`` vector helpers use these constants.
GELU_K = 0.7978845608028654
GELU_C = 0.044715


def gelu_source(ctype: str) -> str:
    """C helpers ``GELU`` and ``GELU_GRAD`` for ``ctype``: "float" (the preamble's), "double"
    (``GELU_F64`` / ``GELU_GRAD_F64``, calling ``SIGMOID_F64``) or "VF" (the vector twins
    ``V_GELU_`` / ``V_GELU_GRAD_`` of ``vector_primitives``, calling ``V_SIGMOID_``)."""
    names = {
        "float": ("f", "GELU", "GELU_GRAD", "SIGMOID"),
        "double": ("", "GELU_F64", "GELU_GRAD_F64", "SIGMOID_F64"),
        "VF": ("f", "V_GELU_", "V_GELU_GRAD_", "V_SIGMOID_"),
    }
    if ctype not in names:
        raise ValueError(f"gelu_source: ctype must be 'float', 'double' or 'VF', got {ctype!r}")
    f, gelu, grad, sigmoid = names[ctype]
    k, c, t = f"{GELU_K!r}{f}", f"{GELU_C!r}{f}", ctype
    term = f"0.5{f} * x * sech2 * {k} * (1.0{f} + 3.0{f} * {c} * x * x)"
    # sech2 is 0 long before 3 C x^2 overflows (|x| > 1.8e19): the term is skipped there, 0 * inf is NaN
    tail = f"select({term}, (VF)0.0f, sech2 == 0.0f)" if ctype == "VF" else f"sech2 == 0.0{f} ? 0.0{f} : {term}"
    return f"""/* GELU, tanh form: 0.5 x (1 + tanh(u)) with u = K (x + C x^3), written as x * sigmoid(2u) and
   sech(u)^2 = 4e / (1 + e)^2 with e = exp(-2|u|): no 1 - tanh(u)^2 cancellation, which a tanh a few
   ulps off +-1 turns into errors growing like x^3 (GELU_GRAD(-100) = -0.0064 instead of 0). */
inline {t} {gelu}({t} x) {{
    return x * {sigmoid}(2.0{f} * {k} * (x + {c} * x * x * x));
}}
inline {t} {grad}({t} x) {{
    {t} u = {k} * (x + {c} * x * x * x);
    {t} e = exp(-2.0{f} * fabs(u));
    {t} sech2 = 4.0{f} * e / ((1.0{f} + e) * (1.0{f} + e));
    {t} tail = {tail};
    return {sigmoid}(2.0{f} * u) + tail;
}}
"""


PRIMITIVE_PREAMBLE = r"""
#define ADD(a, b) ((a) + (b))
#define SUB(a, b) ((a) - (b))
#define MUL(a, b) ((a) * (b))
#define DIV(a, b) ((a) / (b))
#define NEG(a) (-(a))
#define LT(a, b) ((a) < (b) ? 1 : 0)
#define LE(a, b) ((a) <= (b) ? 1 : 0)
#define GT(a, b) ((a) > (b) ? 1 : 0)
#define GE(a, b) ((a) >= (b) ? 1 : 0)
#define EQ(a, b) ((a) == (b) ? 1 : 0)
#define NE(a, b) ((a) != (b) ? 1 : 0)
#define WHERE(c, a, b) ((c) != 0 ? (a) : (b))

inline float RELU(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }
inline float RELU_GRAD(float x) { return x > 0.0f ? 1.0f : 0.0f; }
inline float ABS(float x) { return fabs(x); }
inline float SIGN(float x) { return x != x ? x : (float)((x > 0.0f) - (x < 0.0f)); }
inline float EXP(float x) { return exp(x); }
inline float LOG(float x) { return log(x); }
inline float LOG1P(float x) { return log1p(x); }
inline float SQRT(float x) { return sqrt(x); }
inline float RSQRT(float x) { return rsqrt(x); }
inline float POW(float a, float b) { return pow(a, b); }
inline float TANH(float x) { return tanh(x); }
inline float MAX(float a, float b) { return (a > b || a != a) ? a : b; }
inline float MIN(float a, float b) { return (a < b || a != a) ? a : b; }
inline float CLAMP(float x, float lo, float hi) { return MIN(MAX(x, lo), hi); }

inline float SIGMOID(float x) {
    if (x >= 0.0f) { return 1.0f / (1.0f + exp(-x)); }
    float e = exp(x);
    return e / (1.0f + e);
}

@GELU@
/* GELU, exact (PyTorch's approximate="none"): x Phi(x), Phi the normal CDF written with erfc (no 1 + erf
   cancellation for negative x); the derivative Phi(x) + x phi(x), the second term skipped where phi underflows
   (x * 0 would be NaN at +-inf). */
inline float GELU_ERF(float x) { return 0.5f * x * erfc(-0.70710678118654752f * x); }
inline float GELU_ERF_GRAD(float x) {
    float phi = 0.39894228040143268f * exp(-0.5f * x * x);
    return 0.5f * erfc(-0.70710678118654752f * x) + (phi == 0.0f ? 0.0f : x * phi);
}
/* Activations (PyTorch definitions). */
inline float SIN(float x) { return sin(x); }
inline float COS(float x) { return cos(x); }
inline float SILU(float x) { return x * SIGMOID(x); }
inline float SILU_GRAD(float x) { float s = SIGMOID(x); return s * (1.0f + x * (1.0f - s)); }
inline float LEAKY_RELU(float x, float slope) { return x > 0.0f ? x : (x != x ? x : x * slope); }
inline float LEAKY_RELU_GRAD(float x, float slope) { return x > 0.0f ? 1.0f : slope; }
inline float ELU(float x, float alpha) { return x > 0.0f ? x : alpha * expm1(x); }
inline float ELU_GRAD(float x, float alpha) { return x > 0.0f ? 1.0f : alpha * exp(x); }
/* softplus(x) = log1p(exp(beta x)) / beta, linear above threshold (beta x > threshold). */
inline float SOFTPLUS(float x, float beta, float threshold) {
    float z = beta * x;
    return z > threshold ? x : (fmax(z, 0.0f) + log1p(exp(-fabs(z)))) / beta;
}
inline float SOFTPLUS_GRAD(float x, float beta, float threshold) {
    float z = beta * x;
    return z > threshold ? 1.0f : SIGMOID(z);
}

/* Detection loss terms (see docs/architecture.md, detection_loss). */
inline float BCE_LOGITS(float x, float t) {
    return fmax(x, 0.0f) - x * t + log1p(exp(-fabs(x)));
}
inline float BCE_LOGITS_GRAD(float x, float t) { return SIGMOID(x) - t; }
inline float SMOOTH_L1(float d, float beta) {
    float a = fabs(d);
    return a < beta ? 0.5f * d * d / beta : a - 0.5f * beta;
}
inline float SMOOTH_L1_GRAD(float d, float beta) {
    return fabs(d) < beta ? d / beta : SIGN(d);
}
""".replace(
    "@GELU@",
    f"#define GELU_K {GELU_K!r}f\n#define GELU_C {GELU_C!r}f\n" + gelu_source("float"),
)

#: The helper names the preamble defines, for codegen and tests.
PRIMITIVE_NAMES = (
    "ADD SUB MUL DIV NEG LT LE GT GE EQ WHERE RELU RELU_GRAD ABS SIGN EXP LOG LOG1P SQRT RSQRT POW TANH "
    "MAX MIN CLAMP SIGMOID GELU GELU_GRAD GELU_ERF GELU_ERF_GRAD BCE_LOGITS BCE_LOGITS_GRAD SMOOTH_L1 SMOOTH_L1_GRAD "
    "NE SIN COS SILU SILU_GRAD LEAKY_RELU LEAKY_RELU_GRAD ELU ELU_GRAD SOFTPLUS SOFTPLUS_GRAD"
).split()
