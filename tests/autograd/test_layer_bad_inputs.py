"""Bad inputs of the layer and shape ops: a named error raised before any kernel launch.

On OpenCL each call runs inside a ``Graph`` capture, and the test checks that the capture
recorded nothing: the error came before the first launch. tests/README.md lists every case.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.core import DTypeError, ShapeError


def node(shape, device, requires_grad=True):
    return ag.tensor(np.ones(shape, np.float32), requires_grad=requires_grad, device=device)


X4 = (2, 3, 5, 5)

CONV_CASES = [
    (
        "x not 4-d",
        (3, 5, 5),
        (4, 3, 3, 3),
        {},
        ShapeError,
        r"conv2d: x must be 4-d \(N, C, H, W\), got shape \(3, 5, 5\)",
    ),
    ("w not 4-d", X4, (4, 3, 3), {}, ShapeError, r"conv2d: w must be 4-d .* got shape \(4, 3, 3\)"),
    ("channels", X4, (4, 2, 3, 3), {}, ShapeError, r"w shape \(4, 2, 3, 3\) expects 2 input channels .* has 3"),
    ("groups", X4, (4, 1, 3, 3), {"groups": 2}, ValueError, r"groups=2 must divide both in_channels 3"),
    (
        "kernel too large",
        (1, 1, 2, 2),
        (1, 1, 3, 3),
        {},
        ShapeError,
        r"kernel of effective size \(3, 3\) is larger than the padded input \(2, 2\)",
    ),
    (
        "dilated kernel too large",
        X4,
        (4, 3, 3, 3),
        {"dilation": 3},
        ShapeError,
        r"effective size \(7, 7\) is larger than the padded input \(5, 5\)",
    ),
    ("stride 0", X4, (4, 3, 3, 3), {"stride": 0}, ValueError, r"conv2d: stride must be >= 1, got 0"),
    ("negative padding", X4, (4, 3, 3, 3), {"padding": (1, -1)}, ValueError, r"conv2d: padding must be >= 0"),
    ("unknown padding string", X4, (4, 3, 3, 3), {"padding": "full"}, ValueError, r"'same' or 'valid', got 'full'"),
    ("same with stride", X4, (4, 3, 3, 3), {"padding": "same", "stride": 2}, ValueError, r"'same' needs stride 1"),
    ("stride triple", X4, (4, 3, 3, 3), {"stride": (1, 2, 3)}, ValueError, r"stride must be an int or a pair of ints"),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv2d_bad_input(device, case, raises_before_launch):
    _, x_shape, w_shape, kwargs, error, match = case
    x, w = node(x_shape, device), node(w_shape, device)
    raises_before_launch(device, error, match, lambda: ag.conv2d(x, w, **kwargs))
    assert x.grad is None and w.grad is None


@pytest.mark.parametrize(
    ("ws", "kwargs", "error", "match"),
    [
        ((3, 2, 3, 3), {}, ShapeError, r"w must be \(in_channels=4, out_channels/groups, KH, KW\)"),
        ((4, 2, 3, 3), {"groups": 3}, ValueError, r"groups must be a positive int dividing x's 4 channels"),
        (
            (4, 2, 3, 3),
            {"stride": 2, "output_padding": 2},
            ValueError,
            r"output_padding 2 must be smaller than stride 2",
        ),
        ((4, 2, 3, 3), {"padding": 3}, ValueError, r"the output would be -2 x -2"),
    ],
)
def test_conv_transpose2d_bad_input(device, raises_before_launch, ws, kwargs, error, match):
    x = ag.tensor(np.zeros((1, 4, 2, 2), np.float32), device=device)
    w = ag.tensor(np.zeros(ws, np.float32), device=device)
    raises_before_launch(device, error, match, lambda: ag.conv_transpose2d(x, w, **kwargs))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 4, "scale_factor": 2}, "exactly one of size and scale_factor"),
        ({"size": (4, 0)}, r"size must be 2 positive int\(s\)"),
        ({"scale_factor": 2, "mode": "linear"}, r"mode for a 4-d input must be one of"),
        ({"scale_factor": 2, "align_corners": True}, "align_corners applies to the linear modes only"),
        ({"scale_factor": 0.1}, "leaves an empty axis"),
    ],
)
def test_interpolate_bad_input(device, raises_before_launch, kwargs, match):
    x = ag.tensor(np.zeros((1, 2, 3, 3), np.float32), device=device)
    raises_before_launch(device, ValueError, match, lambda: ag.interpolate(x, **kwargs))


@pytest.mark.parametrize(
    ("widths", "mode", "match"),
    [
        ((4, 0), "reflect", r"needs widths below the padded axis length 4"),
        ((0, 5), "circular", r"needs widths at most the padded axis length 4"),
        ((1, -1), "replicate", "takes widths >= 0"),
        ((1, 1), "wrap", "mode must be 'constant', 'reflect', 'replicate' or 'circular'"),
        ((1, 1) * 4, "reflect", "pads the last 1-3 axes"),
    ],
)
def test_pad_mode_bad_input(device, raises_before_launch, widths, mode, match):
    x = ag.tensor(np.zeros((2, 3, 4), np.float32), device=device)
    raises_before_launch(device, ValueError, match, lambda: ag.pad(x, widths, mode=mode))


def test_conv2d_bad_bias(device, raises_before_launch):
    x, w, b = node(X4, device), node((4, 3, 3, 3), device), node((3,), device)
    raises_before_launch(device, ShapeError, r"b must have shape \(4,\) .* got \(3,\)", lambda: ag.conv2d(x, w, b))


POOL_CASES = [
    (
        "x not 4-d",
        lambda x3, x4: ag.max_pool2d(x3, 2),
        ShapeError,
        r"max_pool2d: x must be 4-d .* got shape \(3, 5, 5\)",
    ),
    (
        "kernel too large",
        lambda x3, x4: ag.avg_pool2d(x4, 6),
        ShapeError,
        r"avg_pool2d: kernel of effective size \(6, 6\) is larger than the padded input \(5, 5\)",
    ),
    (
        "padding over half",
        lambda x3, x4: ag.max_pool2d(x4, 2, padding=2),
        ValueError,
        r"padding 2 must be at most half of kernel_size 2",
    ),
    ("kernel 0", lambda x3, x4: ag.max_pool2d(x4, 0), ValueError, r"kernel_size must be >= 1, got 0"),
    (
        "adaptive size 0",
        lambda x3, x4: ag.adaptive_avg_pool2d(x4, (0, 1)),
        ValueError,
        r"output_size must be positive ints, got \(0, 1\)",
    ),
    (
        "adaptive x not 4-d",
        lambda x3, x4: ag.adaptive_avg_pool2d(x3, 1),
        ShapeError,
        r"adaptive_avg_pool2d: x must be 4-d",
    ),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pool_bad_input(device, case, raises_before_launch):
    _, call, error, match = case
    x3, x4 = node((3, 5, 5), device), node(X4, device)
    raises_before_launch(device, error, match, lambda: call(x3, x4))


def test_dropout_bad_p(device, raises_before_launch):
    x = node((3,), device)
    raises_before_launch(
        device, ValueError, r"dropout: p must be a probability in \[0, 1\], got 1.5", lambda: ag.dropout(x, 1.5)
    )


# ---- indices ----------------------------------------------------------------------------------------
def test_embedding_ids_out_of_range(device, raises_before_launch):
    table = node((5, 3), device)
    raises_before_launch(
        device,
        IndexError,
        r"embedding: ids value 5 is out of range: expected 0 <= ids < 5",
        lambda: ag.embedding(np.array([[0, 5]]), table),
    )
    raises_before_launch(device, IndexError, r"ids value -1 is out of range", lambda: ag.embedding([1, -1], table))
    assert table.grad is None


def test_embedding_tensor_ids_out_of_range(device):
    """An index Tensor is checked where it lives: on the host at once, on OpenCL by the lookup kernel
    (raised at the next wait, here the result's read)."""
    table = node((5, 3), device)
    ids = nc.tensor(np.array([2, 7]), device=device)
    with pytest.raises(IndexError, match=r"embedding: ids value 7 is out of range: expected 0 <= ids < 5"):
        ag.embedding(ids, table).value.to_host()


def test_embedding_bad_ids_dtype_and_table(device, raises_before_launch):
    raises_before_launch(
        device,
        DTypeError,
        r"embedding: ids must hold integers .* got dtype float64",
        lambda: ag.embedding(np.array([0.0, 1.0]), node((5, 3), device)),
    )
    raises_before_launch(
        device,
        ShapeError,
        r"embedding: table must be 2-d .* got shape \(5,\)",
        lambda: ag.embedding(np.array([0]), node((5,), device)),
    )


def test_gather_bad_inputs(device, raises_before_launch):
    x = node((2, 3), device)
    raises_before_launch(
        device,
        np.exceptions.AxisError,
        r"gather: axis 2 is out of range for a 2-d tensor",
        lambda: ag.gather(x, 2, np.zeros((2, 3), int)),
    )
    raises_before_launch(
        device,
        ShapeError,
        r"gather: index must have as many dimensions as x \(2\), got index shape \(3,\)",
        lambda: ag.gather(x, 1, np.zeros(3, int)),
    )
    raises_before_launch(
        device,
        ShapeError,
        r"index shape \(3, 1\) exceeds x shape \(2, 3\) at axis 0",
        lambda: ag.gather(x, 1, np.zeros((3, 1), int)),
    )
    raises_before_launch(
        device,
        IndexError,
        r"gather: index value 3 is out of range along axis 1: expected 0 <= index < 3",
        lambda: ag.gather(x, 1, np.array([[0, 3]])),
    )


def test_index_select_bad_inputs(device, raises_before_launch):
    x = node((2, 3), device)
    raises_before_launch(
        device,
        ShapeError,
        r"index_select: index must be 0-d or 1-d, got shape \(1, 2\)",
        lambda: ag.index_select(x, 0, np.zeros((1, 2), int)),
    )
    raises_before_launch(
        device,
        IndexError,
        r"index_select: index value 2 is out of range along axis 0",
        lambda: ag.index_select(x, 0, np.array([0, 2])),
    )
    raises_before_launch(
        device,
        np.exceptions.AxisError,
        r"index_select: axis -3 is out of range",
        lambda: ag.index_select(x, -3, np.array([0])),
    )


GETITEM_CASES = [
    ("int out of range", 2, IndexError, r"index 2 is out of bounds for axis 0 with size 2"),
    ("negative out of range", (slice(None), -4), IndexError, r"index -4 is out of bounds for axis 1 with size 3"),
    (
        "too many indices",
        (0, 0, 0),
        IndexError,
        r"too many indices for a tensor of shape \(2, 3\): 3 indexed dimensions",
    ),
    ("step 0", (slice(None, None, 0),), ValueError, r"slice step cannot be zero \(axis 0\)"),
    ("float index", 1.0, IndexError, r"index 1.0 of type float is not supported: .* gather / index_select"),
    ("dict index", ({},), IndexError, r"index \{\} of type dict is not supported"),
    ("two arrays", ([0, 1], [0, 1]), IndexError, r"at most one integer-array index is supported, got 2"),
    ("bool mask", (np.array([True, False]),), IndexError, r"boolean-mask indices are not supported"),
    (
        "array apart from int",
        (0, slice(None), [1]),
        IndexError,
        r"integer-array index combined with integer indices that a slice",
    ),
    (
        "array out of range",
        (slice(None), [0, 3]),
        IndexError,
        r"getitem: index value 3 is out of range along axis 1: expected 0 <= index < 3",
    ),
    ("two ellipses", (Ellipsis, Ellipsis), IndexError, r"single ellipsis"),
]


@pytest.mark.parametrize("case", GETITEM_CASES, ids=[c[0] for c in GETITEM_CASES])
def test_getitem_bad_key(device, case, raises_before_launch):
    _, key, error, match = case
    x = node((2, 3), device)
    raises_before_launch(device, error, match, lambda: x[key])


# ---- shape ops ---------------------------------------------------------------------------------------
SHAPE_CASES = [
    (
        "concat shapes",
        lambda a, b: ag.concat([a, b], 1),
        ShapeError,
        r"concat: tensor 1 has shape \(3, 2\) but tensor 0 has \(2, 3\): shapes must match except along axis 1",
    ),
    ("concat empty", lambda a, b: ag.concat([]), ValueError, r"concat: expected a non-empty sequence"),
    (
        "concat axis",
        lambda a, b: ag.concat([a, a], 2),
        np.exceptions.AxisError,
        r"concat: axis 2 is out of range for a 2-d tensor",
    ),
    (
        "stack shapes",
        lambda a, b: ag.stack([a, b]),
        ShapeError,
        r"stack: item 1 has shape \(3, 2\) but item 0 has \(2, 3\)",
    ),
    (
        "split sections",
        lambda a, b: ag.split(a, [1, 1], axis=1),
        ValueError,
        r"sections \(1, 1\) sum to 2, but axis 1 of shape \(2, 3\) has size 3",
    ),
    ("split size 0", lambda a, b: ag.split(a, 0), ValueError, r"split_size must be positive, got 0"),
    (
        "pad odd length",
        lambda a, b: ag.pad(a, (1, 2, 3)),
        ValueError,
        r"pad \(1, 2, 3\) must have an even length of at most 2 \* ndim = 4",
    ),
    (
        "pad too long",
        lambda a, b: ag.pad(a, (1,) * 6),
        ValueError,
        r"must have an even length of at most 2 \* ndim = 4",
    ),
    ("pad non-int", lambda a, b: ag.pad(a, (1.5, 1)), ValueError, r"pad must be a tuple of ints"),
    (
        "pad crops past zero",
        lambda a, b: ag.pad(a, (-2, -2)),
        ShapeError,
        r"padding \(-2, -2\) of axis 1 \(size 3\) gives a negative size",
    ),
    ("squeeze axis", lambda a, b: ag.squeeze(a, 2), np.exceptions.AxisError, r"squeeze: axis 2 is out of range"),
    (
        "unsqueeze axis",
        lambda a, b: ag.unsqueeze(a, 3),
        np.exceptions.AxisError,
        r"unsqueeze: axis 3 is out of range for a new axis of a 2-d tensor \(expected -3 <= axis <= 2\)",
    ),
    ("flatten order", lambda a, b: ag.flatten(a, 1, 0), ValueError, r"flatten: start_axis 1 comes after end_axis 0"),
    ("flatten axis", lambda a, b: ag.flatten(a, 0, 5), np.exceptions.AxisError, r"flatten: end_axis 5 is out of range"),
    (
        "permute repeat",
        lambda a, b: a.permute(0, 0),
        ValueError,
        r"permute: axes \(0, 0\) are not a permutation of the 2 axes of shape \(2, 3\)",
    ),
    ("permute length", lambda a, b: ag.permute(a, (1,)), ValueError, r"axes \(1,\) are not a permutation"),
]


@pytest.mark.parametrize("case", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_shape_op_bad_input(device, case, raises_before_launch):
    _, call, error, match = case
    a, b = node((2, 3), device), node((3, 2), device)
    raises_before_launch(device, error, match, lambda: call(a, b))
