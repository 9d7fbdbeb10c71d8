"""Every differentiable elementwise op, defined once: one ``Elementwise`` entry per op.

An entry holds the forward C template, its NumPy twin, the result-dtype kind and the derivative
per input (a C template). Everything else is generated from it:

- the runtime's eager kernel (``OPDEFS``, the ``OpDef`` that ``pointwise.apply`` runs);
- the autograd op and its gradient rule (``netcl.autograd.elementwise``): each derivative is ONE
  fused kernel (``derivative_opdef``), its NumPy twin generated from the same template
  (``c_expr.numpy_function``);
- the JIT primitive (``netcl.jit.builtin_primitives``): the same forward and derivative templates.

Templates are C expressions over ``PRIMITIVE_PREAMBLE`` helpers (calls, ``+ - * /`` and float
literals only, so they also run as Python). Placeholders: ``{a}``, ``{b}``, ``{c}`` the inputs,
``{g}`` the upstream gradient, ``{out}`` the op's output, an attribute by its name
(``{negative_slope}``; ``{scalar}`` is the Python number of a scalar variant). A derivative ``"0.0f"``
(``ZERO``) means no gradient for that input. Variants replace inputs by constants
(``variant``): ``add_scalar_right`` is ``add`` with ``{b}`` the attribute ``{scalar}``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from netcl.runtime.ops import c_expr
from netcl.runtime.ops._table import (
    OpDef,
    numpy_elu,
    numpy_gelu,
    numpy_gelu_erf,
    numpy_leaky_relu,
    numpy_relu,
    numpy_sigmoid,
    numpy_silu,
    numpy_softplus,
)

ZERO = "0.0f"
INPUTS = "abc"
PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Elementwise:
    """One elementwise op: its forward, NumPy twin, dtype kind and derivatives.

    ``grads`` has one derivative template per input (its length is the op's input count);
    ``attrs`` are the scalar attributes after the inputs (kernel arguments eagerly, constants
    baked into fused code). ``numpy_fn`` takes the inputs then the attributes, as arrays of the
    compute dtype; None: generated from ``forward`` (``twin``). ``kind`` is ``_table``'s
    result-dtype rule; ``int_forward`` the expression integer compute types use.
    ``scalar_variants``: a binary op also gets ``NAME_scalar_right`` / ``NAME_scalar_left`` (one
    side a Python number). ``doc``: the docstring of the generated autograd function.
    """

    name: str
    forward: str
    numpy_fn: Callable[..., np.ndarray] | None
    grads: tuple[str, ...]
    kind: str = "float"
    int_forward: str | None = None
    attrs: tuple[str, ...] = ()
    scalar_variants: bool = False
    doc: str = ""
    #: inputs read in their own dtype, not promoted with the others (where's condition)
    own_dtype: tuple[str, ...] = ()
    #: a variant: the op it specializes, and (input of that op, attribute in its place) per constant
    base: str = ""
    constants: tuple[tuple[str, str], ...] = ()

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(INPUTS[: len(self.grads)])

    @property
    def differentiable(self) -> bool:
        return any(grad != ZERO for grad in self.grads)

    def twin(self) -> Callable[..., np.ndarray]:
        """The forward's NumPy twin: ``numpy_fn``, or ``forward`` run as Python (``c_expr``)."""
        if self.numpy_fn is not None:
            return self.numpy_fn
        return c_expr.numpy_function(self.forward, (*self.inputs, *self.attrs), self.name)


def _cmp(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda a, b: fn(a, b).astype(np.float32)


def _where(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(c != 0, a, b)


def _clamp(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    # MIN(MAX(x, lo), hi) with NaN propagation from x, as the preamble's CLAMP.
    return np.minimum(np.maximum(x, lo), hi)


#: d(a**b)/da = b * a**(b-1), and 0 where b == 0: a**0 is constant, and at a = 0 the product
#: would be 0 * inf = NaN (PyTorch's rule masks it the same way).
POW_GRAD_BASE = "WHERE(EQ({b}, 0.0f), 0.0f, MUL({b}, POW({a}, SUB({b}, 1.0f))))"
_E = Elementwise

DEFS: tuple[Elementwise, ...] = (
    # ---- unary
    _E("neg", "NEG({a})", np.negative, ("NEG({g})",), "arith", "NEG({a})", doc="-x."),
    _E("exp", "EXP({a})", np.exp, ("MUL({g}, {out})",), doc="e ** x."),
    _E("log", "LOG({a})", np.log, ("DIV({g}, {a})",), doc="Natural logarithm."),
    _E("sqrt", "SQRT({a})", np.sqrt, ("DIV({g}, MUL(2.0f, {out}))",), doc="Square root."),
    _E("abs", "ABS({a})", np.abs, ("MUL({g}, SIGN({a}))",), doc="|x| (gradient sign(x), 0 at 0)."),
    _E("relu", "RELU({a})", numpy_relu, ("MUL({g}, RELU_GRAD({a}))",), doc="max(x, 0) (gradient 0 at 0)."),
    _E("gelu", "GELU({a})", numpy_gelu, ("MUL({g}, GELU_GRAD({a}))",), doc="GELU, tanh approximation."),
    _E(
        "gelu_erf",
        "GELU_ERF({a})",
        numpy_gelu_erf,
        ("MUL({g}, GELU_ERF_GRAD({a}))",),
        doc="GELU, exact: x * Phi(x) with Phi the normal CDF (PyTorch's approximate='none').",
    ),
    _E(
        "sigmoid",
        "SIGMOID({a})",
        numpy_sigmoid,
        ("MUL({g}, MUL({out}, SUB(1.0f, {out})))",),
        doc="1 / (1 + e ** -x), overflow-free.",
    ),
    _E("tanh", "TANH({a})", np.tanh, ("MUL({g}, SUB(1.0f, MUL({out}, {out})))",), doc="Hyperbolic tangent."),
    _E(
        "rsqrt",
        "RSQRT({a})",
        lambda x: 1.0 / np.sqrt(x),
        ("MUL({g}, MUL(-0.5f, MUL({out}, MUL({out}, {out}))))",),
        doc="1 / sqrt(x).",
    ),
    _E("log1p", "LOG1P({a})", np.log1p, ("DIV({g}, ADD(1.0f, {a}))",), doc="log(1 + x), accurate near 0."),
    _E("sin", "SIN({a})", np.sin, ("MUL({g}, COS({a}))",), doc="Sine."),
    _E("cos", "COS({a})", np.cos, ("NEG(MUL({g}, SIN({a})))",), doc="Cosine."),
    _E("silu", "SILU({a})", numpy_silu, ("MUL({g}, SILU_GRAD({a}))",), doc="x * sigmoid(x) (SiLU / swish)."),
    _E(
        "softsign",
        "DIV({a}, ADD(1.0f, ABS({a})))",
        None,
        ("DIV({g}, MUL(ADD(1.0f, ABS({a})), ADD(1.0f, ABS({a}))))",),
        doc="x / (1 + |x|).",
    ),
    _E(
        "leaky_relu",
        "LEAKY_RELU({a}, {negative_slope})",
        numpy_leaky_relu,
        ("MUL({g}, LEAKY_RELU_GRAD({a}, {negative_slope}))",),
        attrs=("negative_slope",),
    ),
    _E("elu", "ELU({a}, {alpha})", numpy_elu, ("MUL({g}, ELU_GRAD({a}, {alpha}))",), attrs=("alpha",)),
    _E(
        "softplus",
        "SOFTPLUS({a}, {beta}, {threshold})",
        numpy_softplus,
        ("MUL({g}, SOFTPLUS_GRAD({a}, {beta}, {threshold}))",),
        attrs=("beta", "threshold"),
    ),
    # ---- binary (each also against a Python number on either side)
    _E("add", "ADD({a}, {b})", np.add, ("{g}", "{g}"), "arith", "ADD({a}, {b})", scalar_variants=True, doc="a + b."),
    _E(
        "sub",
        "SUB({a}, {b})",
        np.subtract,
        ("{g}", "NEG({g})"),
        "arith",
        "SUB({a}, {b})",
        scalar_variants=True,
        doc="a - b.",
    ),
    _E(
        "mul",
        "MUL({a}, {b})",
        np.multiply,
        ("MUL({g}, {b})", "MUL({g}, {a})"),
        "arith",
        "MUL({a}, {b})",
        scalar_variants=True,
        doc="a * b.",
    ),
    _E(
        "div",
        "DIV({a}, {b})",
        np.true_divide,
        ("DIV({g}, {b})", "NEG(DIV(MUL({g}, {out}), {b}))"),  # d(a/b)/db = -a/b^2 = -out/b
        scalar_variants=True,
        doc="a / b.",
    ),
    _E(
        "pow",
        "POW({a}, {b})",
        np.power,
        ("MUL({g}, " + POW_GRAD_BASE + ")", "MUL({g}, MUL({out}, LOG({a})))"),
        scalar_variants=True,
        doc="a ** b (the gradient w.r.t. ``b`` is ``out * log(a)``: NaN for a <= 0).",
    ),
    _E(
        "maximum",
        "MAX({a}, {b})",
        np.maximum,
        ("MUL({g}, GE({a}, {b}))", "MUL({g}, LT({a}, {b}))"),  # ties send the gradient to ``a``
        "arith",
        "max({a}, {b})",
        scalar_variants=True,
        doc="Elementwise max; at ties the gradient goes to ``a``.",
    ),
    _E(
        "minimum",
        "MIN({a}, {b})",
        np.minimum,
        ("MUL({g}, LE({a}, {b}))", "MUL({g}, GT({a}, {b}))"),
        "arith",
        "min({a}, {b})",
        scalar_variants=True,
        doc="Elementwise min; at ties the gradient goes to ``a``.",
    ),
    *(
        _E(name, f"{name.upper()}({{a}}, {{b}})", _cmp(fn), (ZERO, ZERO), "compare", scalar_variants=True, doc=doc)
        for name, fn, doc in (
            ("lt", np.less, "1.0 where a < b else 0.0 (no gradient)."),
            ("le", np.less_equal, "1.0 where a <= b else 0.0 (no gradient)."),
            ("gt", np.greater, "1.0 where a > b else 0.0 (no gradient)."),
            ("ge", np.greater_equal, "1.0 where a >= b else 0.0 (no gradient)."),
            ("eq", np.equal, "1.0 where a == b else 0.0 (no gradient)."),
            ("ne", np.not_equal, "1.0 where a != b else 0.0 (no gradient)."),
        )
    ),
    # ---- ternary (fronts in netcl.autograd.ops: they pick the scalar variants below)
    _E(
        "where",
        "WHERE({a}, {b}, {c})",
        _where,
        (ZERO, "WHERE({a}, {g}, 0.0f)", "WHERE({a}, 0.0f, {g})"),
        "where",
        "WHERE({a}, {b}, {c})",
        own_dtype=("a",),
    ),
    _E(
        "clamp",
        "CLAMP({a}, {b}, {c})",
        _clamp,
        (
            "MUL({g}, MUL(GE({a}, {b}), LE({a}, {c})))",
            "MUL({g}, LT({a}, {b}))",
            "MUL({g}, MUL(GE({a}, {b}), GT({a}, {c})))",
        ),
        "arith",
        "min(max({a}, {b}), {c})",
    ),
)

BY_NAME: dict[str, Elementwise] = {d.name: d for d in DEFS}


def _rename(template: str, names: Mapping[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: "{" + names.get(m.group(1), m.group(1)) + "}", template)


def variant(base: Elementwise, name: str, constants: Mapping[str, str]) -> Elementwise:
    """``base`` with the inputs in ``constants`` replaced by attributes (input -> attribute name).

    The remaining inputs keep their order and are renamed ``a``, ``b``, ...; a replaced input's
    derivative is dropped; the attributes come after ``base``'s own. Its NumPy twin is generated
    from its forward (eagerly a variant runs its base op's kernel, ``forward_operands``).
    """
    kept = [i for i in base.inputs if i not in constants]
    names = {**constants, **{old: INPUTS[k] for k, old in enumerate(kept)}}
    return replace(
        base,
        name=name,
        forward=_rename(base.forward, names),
        int_forward=None if base.int_forward is None else _rename(base.int_forward, names),
        numpy_fn=None,
        grads=tuple(_rename(base.grads[base.inputs.index(i)], names) for i in kept),
        attrs=(*base.attrs, *dict.fromkeys(constants.values())),
        scalar_variants=False,
        own_dtype=tuple(names[i] for i in base.own_dtype if i in kept),
        base=base.name,
        constants=tuple(constants.items()),
    )


def _variants() -> tuple[Elementwise, ...]:
    found = []
    for d in DEFS:
        if d.scalar_variants:
            found.append(variant(d, f"{d.name}_scalar_right", {"b": "scalar"}))
            found.append(variant(d, f"{d.name}_scalar_left", {"a": "scalar"}))
    where, clamp = BY_NAME["where"], BY_NAME["clamp"]
    found.append(variant(where, "where_scalar_right", {"c": "scalar"}))
    found.append(variant(where, "where_scalar_left", {"b": "scalar"}))
    found.append(variant(clamp, "clamp_scalar", {"b": "lo", "c": "hi"}))
    return tuple(found)


#: The variants: ``NAME_scalar_right`` / ``_left`` of the binary ops, ``where_scalar_*``, ``clamp_scalar``.
VARIANTS: tuple[Elementwise, ...] = _variants()
ALL: dict[str, Elementwise] = {d.name: d for d in (*DEFS, *VARIANTS)}


def forward_operands(d: Elementwise, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The operands of ``OPDEFS[d.base or d.name]`` for ``d``'s inputs and attribute values: a
    variant's constants go back in the places of the inputs they replace (the base op's kernel)."""
    if not d.base:
        return (*inputs, *[attrs[a] for a in d.attrs])
    base = BY_NAME[d.base]
    placed = dict(d.constants)
    kept = iter(inputs)
    values = [attrs[placed[i]] if i in placed else next(kept) for i in base.inputs]
    return (*values, *[attrs[a] for a in base.attrs])


def positional(template: str, params: tuple[str, ...]) -> str:
    """``template`` with each named placeholder replaced by ``{i}``, i its index in ``params``."""
    return PLACEHOLDER.sub(lambda m: "{" + str(params.index(m.group(1))) + "}", template)


def opdef(d: Elementwise) -> OpDef:
    """The runtime ``OpDef`` of ``d``'s forward: operands are the inputs, then the attributes."""
    params = (*d.inputs, *d.attrs)
    int_expr = None if d.int_forward is None else positional(d.int_forward, params)
    return OpDef(d.name, positional(d.forward, params), d.twin(), d.kind, int_expr)


#: The eager forward kernels of ``DEFS`` (variants run their base op with a scalar operand).
OPDEFS: dict[str, OpDef] = {d.name: opdef(d) for d in DEFS}
#: ``OPDEFS`` by operand count (inputs and attributes): ``pointwise``'s UNARY / BINARY / TERNARY.
OPDEFS_BY_ARITY: dict[int, dict[str, OpDef]] = {
    n: {d.name: OPDEFS[d.name] for d in DEFS if len(d.inputs) + len(d.attrs) == n} for n in (1, 2, 3)
}


def used_params(d: Elementwise, template: str) -> tuple[str, ...]:
    """The placeholders ``template`` reads, in operand order: own-dtype inputs, other inputs, g, out, attributes."""
    used = set(PLACEHOLDER.findall(template))
    order = (*d.own_dtype, *[i for i in d.inputs if i not in d.own_dtype], "g", "out", *d.attrs)
    return tuple(p for p in order if p in used)


@cache
def derivative_opdef(name: str, index: int) -> tuple[OpDef, tuple[str, ...]]:
    """The derivative of op ``name`` for input ``index`` as ONE eager kernel, and the names of its
    operands in order (see ``used_params``). Computed in the promoted float dtype of its operands;
    an input of ``own_dtype`` (where's condition) is read in its own dtype and leaves the rest alone."""
    d = ALL[name]
    template = d.grads[index]
    params = used_params(d, template)
    kind = "where" if params and params[0] in d.own_dtype else "float"
    fn = c_expr.numpy_function(template, params, f"d {name} / d {d.inputs[index]}")
    return OpDef(f"{name}_grad{index}", positional(template, params), fn, kind), params
