"""Bad inputs of the reductions, scans and flip: a named error before any launch (softmax, the norms
and the losses have theirs in test_nn_bad_inputs.py).

On OpenCL each call runs inside a ``Graph`` capture, which must record nothing (the error came
before the first kernel); no gradient is written. tests/README.md has a row per case.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.core import ShapeError

AxisError = np.exceptions.AxisError


def node(shape, device, dtype=np.float32):
    return ag.tensor(np.ones(shape, dtype), requires_grad=np.dtype(dtype).kind == "f", device=device)


def tensor(values, device, dtype=np.float32):
    return nc.tensor(np.asarray(values, dtype), device=device)


X = (3, 5)

CASES = [
    # reductions and scans
    ("min axis", lambda x, d: ag.min(x, 2), ShapeError, r"axis 2 is out of range for a tensor with 2 dimensions"),
    ("var axis", lambda x, d: ag.var(x, (0, -3)), ShapeError, r"axis -3 is out of range"),
    ("argmax axis", lambda x, d: ag.argmax(x, 2), AxisError, r"argmax: axis 2 is out of range for a 2-d tensor"),
    ("argmax empty", lambda x, d: ag.argmax(node((0, 3), d)), ValueError, r"argmax: x of shape \(0, 3\) is empty"),
    ("cumsum axis", lambda x, d: ag.cumsum(x, -3), AxisError, r"cumsum: axis -3 is out of range for a 2-d tensor"),
    ("cumsum axis None", lambda x, d: ag.cumsum(x, None), TypeError, r"cumsum: axis must be an int, got None"),
    ("flip axis", lambda x, d: ag.flip(x, (0, 2)), ShapeError, r"axis 2 is out of range"),
    ("min of nothing", lambda x, d: ag.min(node((3, 0), d), 1), ValueError, r"min: .* covers zero elements"),
    ("matmul 0-d", lambda x, d: ag.matmul(node((), d), x), ShapeError, r"matmul needs operands with at least 1 dim"),
    (
        "matmul vector mismatch",
        lambda x, d: ag.matmul(x, node((4,), d)),
        ShapeError,
        r"matmul: shapes \(3, 5\) and \(4,\) do not align: 5 != 4",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_math_op_bad_input(device, case, raises_before_launch):
    _, call, error, match = case
    x = node(X, device)
    raises_before_launch(device, error, match, lambda: call(x, device))
    assert x.grad is None
