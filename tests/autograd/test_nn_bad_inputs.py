"""Bad inputs of softmax, the losses and the normalizations: a named error before any kernel launch.

On OpenCL each call runs inside a ``Graph`` capture and the test checks that nothing was
recorded (the error came first). tests/README.md lists every case.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core import DTypeError, ShapeError


def node(shape, device, dtype=np.float32):
    return ag.tensor(np.ones(shape, dtype), requires_grad=dtype == np.float32, device=device)


AXIS = np.exceptions.AxisError
T3 = np.array([0, 1, 2])

CASES = [
    ("softmax axis", lambda d: ag.softmax(node((2, 3), d), 2), AXIS, r"softmax: axis 2 is out of range for a 2-d"),
    ("log_softmax 0-d", lambda d: ag.log_softmax(node((), d)), ShapeError, r"log_softmax: x must have at least 1"),
    ("softmax int", lambda d: ag.softmax(node((2, 3), d, np.int32)), DTypeError, r"softmax: x must be a floating"),
    ("logsumexp axis", lambda d: ag.logsumexp(node((2, 3), d), (0, -3)), AXIS, r"logsumexp: axis -3 is out of range"),
    ("ce 1-d", lambda d: ag.cross_entropy(node((5,), d), T3), ShapeError, r"cross_entropy: input must be \(N, C\)"),
    (
        "ce target shape",
        lambda d: ag.cross_entropy(node((3, 4), d), np.array([0, 1])),
        ShapeError,
        r"cross_entropy: target must have shape \(3,\) for input of shape \(3, 4\), got \(2,\)",
    ),
    (
        "ce spatial target shape",
        lambda d: ag.cross_entropy(node((2, 4, 3), d), np.zeros((2, 4), np.int64)),
        ShapeError,
        r"target must have shape \(2, 3\) for input of shape \(2, 4, 3\), got \(2, 4\)",
    ),
    (
        "ce target range",
        lambda d: ag.cross_entropy(node((3, 4), d), np.array([0, 4, 1])),
        IndexError,
        r"cross_entropy: target value 4 is out of range: expected 0 <= target < 4 or target == ignore_index \(-100\)",
    ),
    (
        "ce negative target",
        lambda d: ag.cross_entropy(node((3, 4), d), np.array([0, -1, 1])),
        IndexError,
        r"target value -1 is out of range",
    ),
    (
        "ce float target",
        lambda d: ag.cross_entropy(node((3, 4), d), np.zeros(3)),
        TypeError,
        r"cross_entropy: target must hold integer class indices, got dtype float64",
    ),
    (
        "ce reduction",
        lambda d: ag.cross_entropy(node((3, 4), d), T3, reduction="avg"),
        ValueError,
        r"cross_entropy: reduction must be one of \('mean', 'sum', 'none'\), got 'avg'",
    ),
    (
        "ce smoothing",
        lambda d: ag.cross_entropy(node((3, 4), d), T3, label_smoothing=1.5),
        ValueError,
        r"label_smoothing must be in \[0, 1\], got 1.5",
    ),
    (
        "nll target range",
        lambda d: ag.nll_loss(node((3, 2), d), T3),
        IndexError,
        r"nll_loss: target value 2 is out of range: expected 0 <= target < 2",
    ),
    (
        "bce target shape",
        lambda d: ag.binary_cross_entropy(node((3, 4), d), node((3, 5), d)),
        ShapeError,
        r"binary_cross_entropy: target of shape \(3, 5\) does not broadcast to \(3, 4\)",
    ),
    (
        "layer_norm shape",
        lambda d: ag.layer_norm(node((2, 3, 4), d), (3, 5)),
        ShapeError,
        r"layer_norm: normalized_shape \(3, 5\) must equal the trailing dimensions of x, got x of shape \(2, 3, 4\)",
    ),
    (
        "layer_norm weight",
        lambda d: ag.layer_norm(node((2, 4), d), 4, node((3,), d)),
        ShapeError,
        r"layer_norm: weight must have shape \(4,\) \(normalized_shape\), got \(3,\)",
    ),
    (
        "rms_norm weight",
        lambda d: ag.rms_norm(node((2, 4), d), (4,), node((4, 1), d)),
        ShapeError,
        r"rms_norm: weight must have shape \(4,\)",
    ),
    ("batch_norm 1-d", lambda d: ag.batch_norm(node((4,), d), None, None, training=True), ShapeError, r"\(N, C\)"),
    (
        "batch_norm running_mean",
        lambda d: ag.batch_norm(node((4, 3), d), node((4,), d), node((3,), d)),
        ShapeError,
        r"batch_norm: running_mean must have shape \(3,\) \(the channels of x\), got \(4,\)",
    ),
    (
        "batch_norm eval without stats",
        lambda d: ag.batch_norm(node((4, 3), d), None, None),
        ValueError,
        r"running_mean and running_var are required when training=False",
    ),
    (
        "batch_norm one value per channel",
        lambda d: ag.batch_norm(node((1, 3), d), None, None, training=True),
        ValueError,
        r"expected more than 1 value per channel when training",
    ),
]


@pytest.mark.parametrize(("name", "call", "error", "match"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(device, name, call, error, match, raises_before_launch):
    raises_before_launch(device, error, match, lambda: call(device))


def test_tensor_target_out_of_range(device):
    # a Tensor target is checked where it lives: on the host at once, on OpenCL by the kernel (raised at the
    # next wait, here the loss's read; tests/runtime/test_device_index_checks.py has the rest)
    labels = ag.tensor(np.array([0, 9, 1], np.int32), device=device).value
    with pytest.raises(IndexError, match=r"cross_entropy: target value 9 is out of range"):
        ag.cross_entropy(node((3, 4), device), labels).item()
