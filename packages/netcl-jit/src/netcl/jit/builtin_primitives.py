"""The built-in primitives: one flat table of forward and backward C templates, side by side.

Templates use ``{a}``, ``{b}``, ``{c}`` for the inputs, ``{g}`` for the upstream gradient,
``{out}`` for the op's output, ``{s}`` for a scalar attribute and ``{beta}`` for smooth-L1's
beta, all as C expressions. Only PRIMITIVE_PREAMBLE helpers and ``+ - * /`` are used, so the
same expressions also evaluate as Python over NumPy arrays (the NumPy path).
"""

from __future__ import annotations

import math

from netcl.jit.primitives import register_primitive

ZERO = "0.0f"
#: d(a**b)/da = b * a**(b-1), and 0 where b == 0: a**0 is constant, and at a = 0 the product
#: would be 0 * inf = NaN (PyTorch's rule masks it the same way).
POW_GRAD_BASE = "WHERE(EQ({b}, 0.0f), 0.0f, MUL({b}, POW({a}, SUB({b}, 1.0f))))"

#: name -> (forward template, [backward template per input])
UNARY = {
    "neg": ("NEG({a})", ["NEG({g})"]),
    "exp": ("EXP({a})", ["MUL({g}, {out})"]),
    "log": ("LOG({a})", ["DIV({g}, {a})"]),
    "sqrt": ("SQRT({a})", ["DIV({g}, MUL(2.0f, {out}))"]),
    "abs": ("ABS({a})", ["MUL({g}, SIGN({a}))"]),
    "relu": ("RELU({a})", ["MUL({g}, RELU_GRAD({a}))"]),
    "gelu": ("GELU({a})", ["MUL({g}, GELU_GRAD({a}))"]),
    "sigmoid": ("SIGMOID({a})", ["MUL({g}, MUL({out}, SUB(1.0f, {out})))"]),
    "tanh": ("TANH({a})", ["MUL({g}, SUB(1.0f, MUL({out}, {out})))"]),
    "rsqrt": ("RSQRT({a})", ["MUL({g}, MUL(-0.5f, MUL({out}, MUL({out}, {out}))))"]),
    "log1p": ("LOG1P({a})", ["DIV({g}, ADD(1.0f, {a}))"]),
    "sin": ("SIN({a})", ["MUL({g}, COS({a}))"]),
    "cos": ("COS({a})", ["NEG(MUL({g}, SIN({a})))"]),
    "silu": ("SILU({a})", ["MUL({g}, SILU_GRAD({a}))"]),
    "leaky_relu": ("LEAKY_RELU({a}, {negative_slope})", ["MUL({g}, LEAKY_RELU_GRAD({a}, {negative_slope}))"]),
    "elu": ("ELU({a}, {alpha})", ["MUL({g}, ELU_GRAD({a}, {alpha}))"]),
    "softplus": ("SOFTPLUS({a}, {beta}, {threshold})", ["MUL({g}, SOFTPLUS_GRAD({a}, {beta}, {threshold}))"]),
}

BINARY = {
    "add": ("ADD({a}, {b})", ["{g}", "{g}"]),
    "sub": ("SUB({a}, {b})", ["{g}", "NEG({g})"]),
    "mul": ("MUL({a}, {b})", ["MUL({g}, {b})", "MUL({g}, {a})"]),
    "div": ("DIV({a}, {b})", ["DIV({g}, {b})", "NEG(DIV(MUL({g}, {out}), {b}))"]),
    "pow": ("POW({a}, {b})", ["MUL({g}, " + POW_GRAD_BASE + ")", "MUL({g}, MUL({out}, LOG({a})))"]),
    "maximum": ("MAX({a}, {b})", ["MUL({g}, GE({a}, {b}))", "MUL({g}, LT({a}, {b}))"]),
    "minimum": ("MIN({a}, {b})", ["MUL({g}, LE({a}, {b}))", "MUL({g}, GT({a}, {b}))"]),
    "lt": ("LT({a}, {b})", [ZERO, ZERO]),
    "le": ("LE({a}, {b})", [ZERO, ZERO]),
    "gt": ("GT({a}, {b})", [ZERO, ZERO]),
    "ge": ("GE({a}, {b})", [ZERO, ZERO]),
    "ne": ("NE({a}, {b})", [ZERO, ZERO]),
    "add_relu": ("RELU(ADD({a}, {b}))", ["MUL({g}, RELU_GRAD(ADD({a}, {b})))"] * 2),
}

#: Binary ops against a Python constant baked into the source as ``{s}``.
SCALAR_RIGHT = {
    name: (fwd.replace("{b}", "{s}"), [bwd[0].replace("{b}", "{s}")]) for name, (fwd, bwd) in BINARY.items()
}
SCALAR_LEFT = {
    name: (fwd.replace("{a}", "{s}").replace("{b}", "{a}"), [bwd[1].replace("{a}", "{s}").replace("{b}", "{a}")])
    for name, (fwd, bwd) in BINARY.items()
}
for _table in (SCALAR_RIGHT, SCALAR_LEFT):
    _table.pop("add_relu")
# pow with a constant exponent: d/da a**s = s * a**(s-1); the exponent is not an input.
SCALAR_RIGHT["pow"] = ("POW({a}, {s})", ["MUL({g}, " + POW_GRAD_BASE.replace("{b}", "{s}") + ")"])

TERNARY = {
    "where": ("WHERE({a}, {b}, {c})", [ZERO, "WHERE({a}, {g}, 0.0f)", "WHERE({a}, 0.0f, {g})"]),
    "clamp": (
        "CLAMP({a}, {b}, {c})",
        [
            "MUL({g}, MUL(GE({a}, {b}), LE({a}, {c})))",
            "MUL({g}, LT({a}, {b}))",
            "MUL({g}, MUL(GE({a}, {b}), GT({a}, {c})))",
        ],
    ),
    "weighted_bce": ("MUL({c}, BCE_LOGITS({a}, {b}))", ["MUL({g}, MUL({c}, BCE_LOGITS_GRAD({a}, {b})))", ZERO, ZERO]),
    "weighted_smooth_l1": (
        "MUL({c}, SMOOTH_L1(SUB({a}, {b}), {beta}))",
        ["MUL({g}, MUL({c}, SMOOTH_L1_GRAD(SUB({a}, {b}), {beta})))", ZERO, ZERO],
    ),
}


WHERE_SCALAR = {
    "where_scalar_right": ("WHERE({a}, {b}, {s})", [ZERO, "WHERE({a}, {g}, 0.0f)"]),
    "where_scalar_left": ("WHERE({a}, {s}, {b})", [ZERO, "WHERE({a}, 0.0f, {g})"]),
}


def c_literal(value: float) -> str:
    """A float constant as an OpenCL C (and, without the suffix, Python) literal."""
    value = float(value)
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    text = repr(value)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if value < 0 else f"{text}f"


def _attr_values(attrs: dict) -> dict[str, str]:
    values = {}
    if "scalar" in attrs:
        values["s"] = c_literal(attrs["scalar"])
    values["beta"] = c_literal(attrs.get("beta", 0.05))
    for key in ("lo", "hi", "negative_slope", "alpha", "threshold"):
        if key in attrs and attrs[key] is not None:
            values[key] = c_literal(attrs[key])
    return values


def _make(forward_template: str, backward_templates: list[str]):
    names = "abc"

    def forward(args: list[str], attrs: dict) -> str:
        return forward_template.format(**dict(zip(names, args, strict=False)), **_attr_values(attrs))

    def backward(args: list[str], grad_var: str, attrs: dict, out_var: str) -> list[str]:
        fields = {**dict(zip(names, args, strict=False)), "g": grad_var, "out": out_var, **_attr_values(attrs)}
        return [template.format(**fields) for template in backward_templates]

    return forward, backward


def register_builtins() -> None:
    """Register every built-in primitive (called once at import of netcl.jit)."""
    for table, arity, suffix in (
        (UNARY, 1, ""),
        (BINARY, 2, ""),
        (SCALAR_RIGHT, 1, "_scalar_right"),
        (SCALAR_LEFT, 1, "_scalar_left"),
        (TERNARY, 3, ""),
    ):
        for name, (fwd, bwd) in table.items():
            forward, backward = _make(fwd, bwd)
            register_primitive(name + suffix, forward, backward, arity=arity, probe=False)  # tested, not probed
    # where with one constant branch (the scalar in attrs): the inputs are the condition and the other branch.
    for name, (fwd, bwd) in WHERE_SCALAR.items():
        forward, backward = _make(fwd, bwd)
        register_primitive(name, forward, backward, arity=2, probe=False)
    # clamp with constant bounds: autograd passes lo/hi as attrs when they are Python numbers.
    forward, backward = _make("CLAMP({a}, {lo}, {hi})", ["MUL({g}, MUL(GE({a}, {lo}), LE({a}, {hi})))"])
    register_primitive("clamp_scalar", forward, backward, arity=1)
