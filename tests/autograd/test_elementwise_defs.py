"""Every op of ``netcl.runtime.ops.elementwise_defs``, one row each: forward vs float64 NumPy, gradients vs
finite differences of that reference and ``gradcheck`` (``check``), the scalar variants, and the JIT
primitive generated from the same entry (fused equals eager, forward and backward).

``test_every_definition_has_a_row`` fails for a definition without a row here: adding an elementwise op
is its entry in ``elementwise_defs.DEFS`` plus its row in ``ROWS``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.jit import jit_compile
from netcl.runtime.ops.elementwise_defs import ALL, DEFS

# points at least 0.2 from 0 and each pair (X, Y) at least 0.3 apart: no finite difference (eps 1e-3)
# straddles a kink (relu, abs, leaky_relu at 0; maximum / minimum at ties)
X = np.array([[-1.7, -0.9, -0.3, 0.2], [0.7, 1.1, 1.6, -1.3]])
Y = np.array([[0.6, -1.4, 0.4, -0.5], [1.5, 0.3, -0.8, 1.9]])
TIES = np.array([[-1.7, -1.4, -0.3, -0.5], [1.5, 1.1, -0.8, 1.9]])  # equal to X at three places
POS = np.abs(X) + 0.3  # the domain of log, sqrt, rsqrt and pow's base
COND = (X > 0) * 1.0
# clamp bounds: X is below lo at 3 points, inside at 4, above hi at 1, each 0.2 or more from a bound
LO = np.array([[-1.0, -0.5, -0.6, -0.1], [0.0, 0.8, -1.0, -1.0]])
HI = LO + 1.0


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _softplus(x, beta, threshold):
    return np.where(beta * x > threshold, x, np.log1p(np.exp(beta * x)) / beta)


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _gelu_erf(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


#: name -> (float64 reference, inputs, keyword attributes); no gradient is checked for comparisons
ROWS = {
    "neg": (np.negative, [X], {}),
    "exp": (np.exp, [X], {}),
    "log": (np.log, [POS], {}),
    "sqrt": (np.sqrt, [POS], {}),
    "abs": (np.abs, [X], {}),
    "relu": (lambda x: np.maximum(x, 0), [X], {}),
    "gelu": (_gelu, [X], {}),
    "gelu_erf": (_gelu_erf, [X], {}),
    "sigmoid": (_sig, [X], {}),
    "tanh": (np.tanh, [X], {}),
    "rsqrt": (lambda x: 1 / np.sqrt(x), [POS], {}),
    "log1p": (np.log1p, [POS], {}),
    "sin": (np.sin, [X], {}),
    "cos": (np.cos, [X], {}),
    "silu": (lambda x: x * _sig(x), [X], {}),
    "softsign": (lambda x: x / (1 + np.abs(x)), [X], {}),
    "leaky_relu": (lambda x: np.where(x > 0, x, 0.2 * x), [X], {"negative_slope": 0.2}),
    "elu": (lambda x: np.where(x > 0, x, 0.7 * np.expm1(x)), [X], {"alpha": 0.7}),
    # beta 2, threshold 1: X on both sides of the switch at 0.5, none within 0.2 of it
    "softplus": (lambda x: _softplus(x, 2.0, 1.0), [X], {"beta": 2.0, "threshold": 1.0}),
    "add": (np.add, [X, Y], {}),
    "sub": (np.subtract, [X, Y], {}),
    "mul": (np.multiply, [X, Y], {}),
    "div": (np.divide, [X, Y], {}),
    "pow": (np.power, [POS, Y], {}),
    "maximum": (np.maximum, [X, Y], {}),
    "minimum": (np.minimum, [X, Y], {}),
    "lt": (lambda a, b: (a < b) * 1.0, [X, Y], {}),
    "le": (lambda a, b: (a <= b) * 1.0, [X, Y], {}),
    "gt": (lambda a, b: (a > b) * 1.0, [X, Y], {}),
    "ge": (lambda a, b: (a >= b) * 1.0, [X, Y], {}),
    "eq": (lambda a, b: (a == b) * 1.0, [X, TIES], {}),
    "ne": (lambda a, b: (a != b) * 1.0, [X, TIES], {}),
    "where": (lambda c, a, b: np.where(c != 0, a, b), [COND, X, Y], {}),
    "clamp": (lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), [X, LO, HI], {}),
}
SCALAR = 0.45  # at least 0.15 from every entry of X (maximum / minimum ties)


def _differentiable(name):
    return [grad != "0.0f" for grad in ALL[name].grads]


def _fn(name, kwargs):
    op = getattr(ag, name)
    return functools.partial(op, **kwargs) if kwargs else op


def test_every_definition_has_a_row():
    variants = {f"{name}_scalar_{side}" for name in ROWS for side in ("right", "left") if ALL[name].scalar_variants}
    covered = set(ROWS) | variants | {"where_scalar_right", "where_scalar_left", "clamp_scalar"}
    missing = sorted(set(ALL) - covered)
    assert not missing, f"definitions without a test row in ROWS: {missing}"
    assert set(ROWS) == {d.name for d in DEFS}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_forward_and_gradients(check, name):
    reference, inputs, kwargs = ROWS[name]
    check([x.shape for x in inputs], reference, _fn(name, kwargs), vals=inputs, requires_grad=_differentiable(name))


@pytest.mark.parametrize("name", sorted(n for n in ROWS if ALL[n].scalar_variants))
@pytest.mark.parametrize("side", ["right", "left"])
def test_scalar_variants(check, name, side):
    reference = ROWS[name][0]
    op = getattr(ag, name)
    x = POS if name == "pow" and side == "right" else X
    if side == "right":
        fns = (lambda v: reference(v, SCALAR), lambda v: op(v, SCALAR))
    else:
        fns = (lambda v: reference(SCALAR, v), lambda v: op(SCALAR, v))
    check([x.shape], *fns, vals=[x], requires_grad=[ALL[f"{name}_scalar_{side}"].differentiable])


@pytest.mark.parametrize(
    ("ref", "fn"),
    [
        (lambda c, x: np.where(c != 0, x, SCALAR), lambda c, x: ag.where(c, x, SCALAR)),
        (lambda c, x: np.where(c != 0, SCALAR, x), lambda c, x: ag.where(c, SCALAR, x)),
    ],
    ids=["where_scalar_right", "where_scalar_left"],
)
def test_where_scalar_variants(check, ref, fn):
    check([COND.shape, X.shape], ref, fn, vals=[COND, X], requires_grad=[False, True])


def test_clamp_scalar(check):
    # X is at least 0.2 from both bounds: below, inside and above
    check([X.shape], lambda x: np.clip(x, -0.5, 0.5), lambda x: ag.clamp(x, -0.5, 0.5), vals=[X])


def _run(fn, arrays, device, wants):
    nodes = [
        ag.tensor(a.astype(np.float32), requires_grad=w, device=device) for a, w in zip(arrays, wants, strict=True)
    ]
    with ag.Tape() as tape:
        out = fn(*nodes)
    if not any(wants):
        return out.to_host(), []
    tape.backward(out, grad=np.linspace(-1.0, 1.0, out.size, dtype=np.float32).reshape(out.shape))
    return out.to_host(), [n.grad.to_host() for n, w in zip(nodes, wants, strict=True) if w]


@pytest.mark.parametrize("name", sorted(ROWS))
def test_jit_primitive_matches_eager(device, name):
    """The op inside ``jit_compile`` is its generated primitive: one fused kernel each way, eager's values."""
    _, inputs, kwargs = ROWS[name]
    op = _fn(name, kwargs)

    def chain(*xs):
        return op(*xs) * 1.5 + 0.25  # the op fuses with its neighbours

    wants = _differentiable(name)
    fused = jit_compile(chain)
    out_f, grads_f = _run(fused, inputs, device, wants)
    out_e, grads_e = _run(chain, inputs, device, wants)
    # the same float32 expressions, fused or one kernel each: a few ulps apart at most
    np.testing.assert_allclose(out_f, out_e, rtol=1e-5, atol=1e-6)
    for gf, ge in zip(grads_f, grads_e, strict=True):
        np.testing.assert_allclose(gf, ge, rtol=1e-5, atol=1e-6)
    assert fused.cache_info()["fallbacks"] == 0
    plan = fused.plan_for(*[ag.tensor(a.astype(np.float32), device=device) for a in inputs])
    assert len(plan.fused_steps) == 1 and len(plan.steps) == 1
