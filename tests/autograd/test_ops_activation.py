"""silu, leaky_relu, softplus, elu, sin, cos, rsqrt, log1p, ne vs float64 NumPy, one ``check`` line per case.

Elementwise in float32: forwards within 1e-5 of float64, gradients within check_op's defaults.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag


def _sig(x):
    return 1 / (1 + np.exp(-x))


def np_softplus(x, beta=1.0, threshold=20.0):
    return np.where(beta * x > threshold, x, np.log1p(np.exp(beta * x)) / beta)


CASES = [
    ("silu", lambda x: x * _sig(x), ag.silu, {}),
    ("leaky_relu", lambda x: np.where(x > 0, x, 0.01 * x), ag.leaky_relu, {}),
    ("leaky_relu_0.2", lambda x: np.where(x > 0, x, 0.2 * x), lambda x: ag.leaky_relu(x, 0.2), {}),
    ("softplus", np_softplus, ag.softplus, {}),
    # beta 2, threshold 1: values both sides of the linear switch (|x - 0.5| >= 0.02 from it)
    ("softplus_beta", lambda x: np_softplus(x, 2.0, 1.0), lambda x: ag.softplus(x, 2.0, 1.0), {}),
    ("elu", lambda x: np.where(x > 0, x, np.expm1(x)), ag.elu, {}),
    ("elu_alpha", lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)), lambda x: ag.elu(x, 0.5), {}),
    ("sin", np.sin, ag.sin, {}),
    ("cos", np.cos, ag.cos, {}),
    ("rsqrt", lambda x: 1 / np.sqrt(x), ag.rsqrt, {"low": 0.5, "high": 3.0}),
    ("log1p", np.log1p, ag.log1p, {"low": -0.5, "high": 3.0}),
]

# inputs away from the kinks at 0 (and softplus_beta's switch at 0.5): finite differences straddle none
KINK_FREE = np.array([[-1.7, -0.9, -0.3, 0.2], [0.7, 1.1, 1.6, -1.3]])


@pytest.mark.parametrize(("name", "ref", "fn", "kw"), CASES, ids=[c[0] for c in CASES])
def test_activation(check, name, ref, fn, kw):
    vals = None if kw else [KINK_FREE]
    check([(2, 4)], ref, fn, vals=vals, **kw)


def test_ne(check, device):
    a = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 2.0]])
    check([(2, 3), (3,)], lambda x, y: (x != y) * 1.0, ag.ne, vals=[a, [1.0, 0.0, 2.0]], requires_grad=[False, False])
    x = ag.tensor(a.astype(np.float32), requires_grad=True, device=device)
    np.testing.assert_array_equal(ag.ne(x, 2.0).to_host(), (a != 2.0) * 1.0)
    assert not ag.ne(x, 2.0).requires_grad


def test_softplus_beta_zero_is_an_error(device):
    with pytest.raises(ValueError, match="softplus: beta must be non-zero"):
        ag.softplus(ag.tensor(np.ones(3, np.float32), device=device), beta=0.0)
