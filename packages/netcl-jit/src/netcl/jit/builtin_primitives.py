"""The built-in primitives: the elementwise definitions' forward and derivative templates, and a
few JIT-only fused ones.

Every differentiable elementwise op and its variants (``add``, ``add_scalar_right``, ``where``,
``clamp_scalar``, ...) is registered from its one definition in
``netcl.runtime.ops.elementwise_defs`` (``{a}``, ``{b}``, ``{c}`` the inputs, ``{g}`` the upstream
gradient, ``{out}`` the output, attributes by name). ``EXTRA`` holds the primitives that exist only
here: ``add_relu`` (a fusion product) and the weighted detection-loss terms (``{beta}`` smooth-L1's
beta). Only PRIMITIVE_PREAMBLE helpers and ``+ - * /`` are used, so the same expressions also
evaluate as Python over NumPy arrays (the NumPy path).
"""

from __future__ import annotations

import math

from netcl.jit.primitives import register_primitive
from netcl.runtime.ops.elementwise_defs import ALL, ZERO

#: JIT-only primitives: name -> (forward template, [backward template per input])
EXTRA = {
    "add_relu": ("RELU(ADD({a}, {b}))", ["MUL({g}, RELU_GRAD(ADD({a}, {b})))"] * 2),
    "weighted_bce": ("MUL({c}, BCE_LOGITS({a}, {b}))", ["MUL({g}, MUL({c}, BCE_LOGITS_GRAD({a}, {b})))", ZERO, ZERO]),
    "weighted_smooth_l1": (
        "MUL({c}, SMOOTH_L1(SUB({a}, {b}), {beta}))",
        ["MUL({g}, MUL({c}, SMOOTH_L1_GRAD(SUB({a}, {b}), {beta})))", ZERO, ZERO],
    ),
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
    values["beta"] = c_literal(attrs.get("beta", 0.05))
    for key in ("scalar", "lo", "hi", "negative_slope", "alpha", "threshold"):
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
    for d in ALL.values():
        forward, backward = _make(d.forward, list(d.grads))
        register_primitive(d.name, forward, backward, arity=len(d.inputs), probe=False)  # tested, not probed
    for name, (fwd, bwd) in EXTRA.items():
        forward, backward = _make(fwd, bwd)
        register_primitive(name, forward, backward, arity=len(bwd), probe=False)
