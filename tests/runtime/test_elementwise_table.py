"""The definition table itself (``netcl.runtime.ops.elementwise_defs``) and the C -> NumPy translation
(``c_expr``): templates name only what they may, every one runs as Python, variants put their constant
back where the base op had the input, and the generated NumPy twins keep float32 and float64.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from netcl.runtime.ops import c_expr
from netcl.runtime.ops.elementwise_defs import ALL, BY_NAME, DEFS, OPDEFS, derivative_opdef, forward_operands

_NAMES = re.compile(r"\{(\w+)\}")
X = np.array([-1.7, -0.3, 0.2, 1.1])


@pytest.mark.parametrize("name", sorted(ALL))
def test_templates_name_only_inputs_attributes_g_and_out(name):
    d = ALL[name]
    assert set(_NAMES.findall(d.forward)) <= {*d.inputs, *d.attrs}, d.forward
    for grad in d.grads:
        assert set(_NAMES.findall(grad)) <= {*d.inputs, *d.attrs, "g", "out"}, grad
        c_expr.to_python(grad)  # no C-only syntax: the NumPy path can run it
    c_expr.to_python(d.forward)


@pytest.mark.parametrize("name", sorted(n for n in ALL if ALL[n].base))
def test_variant_twin_equals_base_twin_with_the_constant_in_place(name):
    d = ALL[name]
    attrs = {a: 0.45 + 0.1 * k for k, a in enumerate(d.attrs)}
    inputs = [X * (k + 1) + 0.05 for k in range(len(d.inputs))]
    base = OPDEFS[d.base]
    with np.errstate(invalid="ignore"):  # pow of a negative base: NaN on both sides
        expected = base.numpy_fn(*forward_operands(d, inputs, attrs))
        got = d.twin()(*inputs, *attrs.values())
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(n for n in ALL if ALL[n].differentiable))
def test_derivative_twins_keep_the_dtype(name, dtype):
    d = ALL[name]
    for index, grad in enumerate(d.grads):
        if grad == "0.0f":
            continue
        op, params = derivative_opdef(name, index)
        values = {p: (np.abs(X) + 0.5).astype(dtype) for p in params}
        values.update({a: dtype(0.5) for a in d.attrs if a in values})
        result = np.asarray(op.numpy_fn(*[values[p] for p in params]))
        assert result.dtype == dtype, f"{name} d/d{d.inputs[index]}: {result.dtype}"


def test_generated_twin_matches_the_hand_written_one():
    # exp's twin is given, sigmoid's written from the same helpers: a generated twin of each forward agrees
    for name in ("exp", "sigmoid", "gelu", "maximum", "softplus"):
        d = BY_NAME[name]
        generated = c_expr.numpy_function(d.forward, (*d.inputs, *d.attrs))
        args = [X, X[::-1]][: len(d.inputs)] + [2.0, 1.0][: len(d.attrs)]
        np.testing.assert_allclose(generated(*args), d.numpy_fn(*args), rtol=1e-15)


def test_c_only_syntax_is_refused():
    with pytest.raises(ValueError, match="C syntax"):
        c_expr.to_python("{a} > 0 ? {a} : 0.0f")


def test_every_op_has_a_doc_or_a_front():
    # ops generated as autograd functions (no attributes, 1-2 inputs) take their docstring from the entry
    for d in DEFS:
        if not d.attrs and len(d.inputs) in (1, 2):
            assert d.doc, f"{d.name}: the entry needs doc= (the generated function's docstring)"
