"""Every differentiable op: forward and gradients vs float64 NumPy plus gradcheck, one line each.

Shapes are few on purpose (each new shape compiles new PoCL kernels): ``S`` for same-shape
operands, ``S`` with ``ROW``/``COL`` for broadcasting, and Python scalars on both sides.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import netcl.autograd as ag

S, ROW, COL = (2, 3), (3,), (2, 1)


def np_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# ---- binary ops, same shapes, broadcast, scalars on both sides ----------------------------------
def test_add(check):
    check([S, S], np.add, ag.add)


def test_add_broadcast(check):
    check([S, ROW], np.add, lambda a, b: a + b)


def test_add_broadcast_both(check):
    check([COL, ROW], np.add, ag.add)


def test_add_scalar_right(check):
    check([S], lambda x: x + 1.5, lambda x: x + 1.5)


def test_add_scalar_left(check):
    check([S], lambda x: 1.5 + x, lambda x: 1.5 + x)


def test_sub(check):
    check([S, ROW], np.subtract, lambda a, b: a - b)


def test_sub_scalar_right(check):
    check([S], lambda x: x - 0.5, lambda x: x - 0.5)


def test_sub_scalar_left(check):
    check([S], lambda x: 0.5 - x, lambda x: 0.5 - x)


def test_mul(check):
    check([S, S], np.multiply, lambda a, b: a * b)


def test_mul_broadcast(check):
    check([COL, S], np.multiply, ag.mul)


def test_mul_scalar_right(check):
    check([S], lambda x: x * 3.0, lambda x: x * 3.0)


def test_mul_scalar_left(check):
    check([S], lambda x: 3.0 * x, lambda x: 3.0 * x)


def test_div(check):
    check([S, S], np.divide, lambda a, b: a / b, vals=[None, np.full(S, 1.5) + np.arange(6).reshape(S)])


def test_div_broadcast(check):
    check([S, ROW], np.divide, ag.div, vals=[None, [1.5, -2.0, 2.5]])


def test_div_scalar_right(check):
    check([S], lambda x: x / 4.0, lambda x: x / 4.0)


def test_div_scalar_left(check):
    check([S], lambda x: 2.0 / x, lambda x: 2.0 / x, low=0.5, high=2.0)


def test_pow(check):
    check([S, S], np.power, lambda a, b: a**b, low=0.5, high=2.0)


def test_pow_scalar_right(check):
    check([S], lambda x: x**3.0, lambda x: x**3.0)


def test_pow_scalar_left(check):
    check([S], lambda x: 2.0**x, lambda x: 2.0**x)


#: Bases where b * a ** (b - 1) meets 0, inf or a negative base, and the exponents of issue 11.
SPECIAL_BASES = np.array([0.0, -0.0, -2.0, -0.5, 3.0, np.inf, -np.inf], np.float32)
SPECIAL_EXPONENTS = [0.0, 1.0, 2.0, -1.0, 0.5]


def pow_base_grad(a, b):
    """d(a ** b)/da as PyTorch defines it: b * a ** (b - 1), and 0 where b == 0 (a ** 0 is constant)."""
    a, b = np.broadcast_arrays(np.float64(a), np.float64(b))
    with np.errstate(all="ignore"):
        return np.where(b == 0, 0.0, b * np.power(a, b - 1.0))


@pytest.mark.parametrize("exponent", SPECIAL_EXPONENTS)
@pytest.mark.parametrize("form", ["scalar", "tensor", "jit scalar", "jit tensor"])
def test_pow_gradient_at_special_bases(device, exponent, form):
    """x ** 0.0 has gradient 0 at x = 0 (it was 0 * 0 ** -1 = NaN); the other points follow the rule.

    The reference is the rule in float64; every value here is exact or inf/NaN in float32 except
    0.5 * 3 ** -0.5 and 0.5 * 0.5 ** -0.5 (a few ulps), so rtol 1e-6 with NaN/inf matched exactly.
    """
    from netcl.jit import jit_compile

    x = ag.tensor(SPECIAL_BASES, requires_grad=True, device=device)
    e = exponent if "scalar" in form else ag.tensor(np.full(SPECIAL_BASES.shape, exponent, np.float32), device=device)
    fn = (lambda t, u: t**u) if "tensor" in form else (lambda t: t**exponent)
    if form.startswith("jit"):
        fn = jit_compile(fn)
    out = fn(x, e) if "tensor" in form else fn(x)
    ag.sum(out).backward()
    expected = pow_base_grad(SPECIAL_BASES, exponent)
    np.testing.assert_allclose(x.grad.to_host(), expected, rtol=1e-6)
    if form.startswith("jit"):
        assert fn.cache_info()["fallbacks"] == 0


def test_maximum(check):
    check([S, ROW], np.maximum, ag.maximum)


def test_maximum_scalar(check):
    check([S], lambda x: np.maximum(x, 0.25), lambda x: ag.maximum(x, 0.25))


def test_minimum(check):
    check([S, S], np.minimum, ag.minimum)


def test_minimum_scalar_left(check):
    check([S], lambda x: np.minimum(0.25, x), lambda x: ag.minimum(0.25, x))


# ---- unary ops -------------------------------------------------------------------------------
def test_neg(check):
    check([S], np.negative, lambda x: -x)


def test_exp(check):
    check([S], np.exp, ag.exp)


def test_log(check):
    check([S], np.log, ag.log, low=0.5, high=3.0)


def test_sqrt(check):
    check([S], np.sqrt, ag.sqrt, low=0.5, high=3.0)


def test_abs(check):
    check([S], np.abs, ag.abs)


def test_relu(check):
    check([S], lambda x: np.maximum(x, 0), ag.relu)


def test_gelu(check):
    check([S], np_gelu, ag.gelu)


def test_sigmoid(check):
    check([S], np_sigmoid, ag.sigmoid)


def test_tanh(check):
    check([S], np.tanh, ag.tanh)


# ---- ternary ops -------------------------------------------------------------------------------
COND = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])


def test_where(check):
    check([S, S, ROW], np.where, ag.where, vals=[COND, None, None], requires_grad=[False, True, True])


def test_where_scalar(check):
    check(
        [S, S],
        lambda c, a: np.where(c, a, -1.0),
        lambda c, a: ag.where(c, a, -1.0),
        vals=[COND, None],
        requires_grad=[False, True],
    )


def test_clamp_scalar(check):
    check([S], lambda x: np.clip(x, -0.5, 1.0), lambda x: ag.clamp(x, -0.5, 1.0))


def test_clamp_one_sided(check):
    check([S], lambda x: np.maximum(x, -0.5), lambda x: ag.clamp(x, lo=-0.5))


def test_clamp_tensor(check):
    check(
        [S, S, ROW],
        lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
        ag.clamp,
        vals=[None, np.full(S, -0.7) + 0.1 * np.arange(6).reshape(S), [0.3, 0.9, 1.1]],
    )


# ---- matmul, reductions, shape ops -----------------------------------------------------------
def test_matmul(check):
    check([(2, 4), (4, 3)], np.matmul, ag.matmul)


def test_matmul_batched_broadcast(check):
    check([(2, 2, 4), (4, 3)], np.matmul, lambda a, b: a @ b)


def test_sum_all(check):
    check([S], np.sum, ag.sum)


def test_sum_axis(check):
    check([(2, 3, 4)], lambda x: np.sum(x, axis=(0, 2)), lambda x: ag.sum(x, axis=(0, -1)))


def test_sum_keepdims(check):
    check([S], lambda x: np.sum(x, 1, keepdims=True), lambda x: x.sum(1, keepdims=True))


def test_mean_all(check):
    check([S], np.mean, ag.mean)


def test_mean_axis(check):
    check([S], lambda x: np.mean(x, 0), lambda x: ag.mean(x, 0))


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("axes", [(1, 3), (1,), None])
def test_reduction_over_a_zero_size_axis(device, op, axes):
    """Forward as NumPy (sum 0, mean NaN); backward an empty gradient (mean raised ZeroDivisionError)."""
    host = np.zeros((2, 0, 3, 4), np.float32)
    x = ag.tensor(host, requires_grad=True, device=device)
    out = getattr(ag, op)(x, axes)
    with warnings.catch_warnings():  # NumPy warns "Mean of empty slice"; NaN is the answer we compare with
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = getattr(np, op)(host.astype(np.float64), axis=axes)
    np.testing.assert_array_equal(out.to_host(), expected)
    ag.sum(out * 2.0).backward()
    assert x.grad.shape == (2, 0, 3, 4) and x.grad.to_host().size == 0


def test_max_all(check):
    check([S], np.max, ag.max)


def test_max_axis_keepdims(check):
    check([S], lambda x: np.max(x, 1, keepdims=True), lambda x: ag.max(x, -1, keepdims=True))


def test_reshape(check):
    check([S], lambda x: x.reshape(3, 2) * 2.0, lambda x: ag.reshape(x, (3, -1)) * 2.0)


def test_transpose(check):
    check([(2, 3, 4)], lambda x: x.transpose(2, 0, 1), lambda x: ag.transpose(x, (2, 0, 1)))


def test_transpose_default(check):
    check([S], lambda x: x.T, lambda x: x.T)


def test_broadcast_to(check):
    check([COL], lambda x: np.broadcast_to(x, (2, 2, 3)), lambda x: ag.broadcast_to(x, (2, 2, 3)))


# ---- comparisons: forward only, never a gradient ------------------------------------------------
@pytest.mark.parametrize(
    ("np_fn", "ag_fn"),
    [
        (lambda a, b: (a < b) * 1.0, lambda a, b: a < b),
        (lambda a, b: (a <= b) * 1.0, lambda a, b: a <= b),
        (lambda a, b: (a > b) * 1.0, lambda a, b: a > b),
        (lambda a, b: (a >= b) * 1.0, lambda a, b: a >= b),
        (lambda a, b: (a < 0.5) * 1.0, lambda a, b: ag.lt(a, 0.5)),
        (lambda a, b: (b >= 0.5) * 1.0, lambda a, b: ag.le(0.5, b)),
        (lambda a, b: (a > b) * 1.0, ag.gt),
        (lambda a, b: (a >= b) * 1.0, ag.ge),
    ],
)
def test_comparisons_have_no_gradient(check, np_fn, ag_fn):
    a = np.array([[0.0, 1.0, 2.0], [3.0, 0.5, -1.0]])
    b = np.array([1.0, 1.0, -1.0])
    check([S, ROW], np_fn, ag_fn, vals=[a, b], requires_grad=[False, False])
    x, y = ag.tensor(a, requires_grad=True), ag.tensor(b, requires_grad=True)
    out = ag_fn(x, y)
    assert not out.requires_grad and out.grad_fn is None and out.parents == []
