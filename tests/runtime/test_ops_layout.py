"""transpose, broadcast_to, copy, cast, full, zeros_like/ones_like, one_hot and sum_to_shape.

These move or convert values without arithmetic, so results must equal NumPy exactly, except
sum_to_shape, which sums (at most 12 float32 terms here: rtol 1e-6 covers ~n * eps).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops


def _data(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-3.0, 3.0, shape).astype(np.float32)


@pytest.mark.parametrize(
    ("shape", "axes"), [((5, 7), None), ((70, 40), None), ((2, 3, 4), (1, 2, 0)), ((2, 3, 4), (0, -1, 1))]
)
def test_transpose(device: nc.Device, shape: tuple[int, ...], axes: tuple[int, ...] | None) -> None:
    x = _data(shape)
    result = ops.transpose(nc.tensor(x, device=device), axes)
    np.testing.assert_array_equal(result.to_host(), np.transpose(x, axes))


def test_transpose_rejects_bad_axes(device: nc.Device) -> None:
    t = nc.tensor(_data((2, 3)), device=device)
    with pytest.raises(ValueError, match="permutation"):
        ops.transpose(t, (0, 0))
    with pytest.raises(ValueError, match="permutation"):
        ops.transpose(t, (0, 2))


def test_broadcast_to_and_copy(device: nc.Device) -> None:
    x = _data((3, 1))
    t = nc.tensor(x, device=device)
    np.testing.assert_array_equal(ops.broadcast_to(t, (2, 3, 4)).to_host(), np.broadcast_to(x, (2, 3, 4)))
    with pytest.raises(nc.ShapeError):
        ops.broadcast_to(t, (3, 2, 5))
    duplicate = ops.copy(t)
    assert duplicate.data is not t.data
    ops.fill_(duplicate, 0.0)
    np.testing.assert_array_equal(t.to_host(), x)


def test_cast(device: nc.Device) -> None:
    x = np.array([-2.7, -0.5, 0.0, 0.4, 1.9, 3.0], np.float32)
    t = nc.tensor(x, device=device)
    as_int = ops.cast(t, np.int32)
    assert as_int.dtype == np.int32
    np.testing.assert_array_equal(as_int.to_host(), x.astype(np.int32))  # truncation toward zero
    np.testing.assert_array_equal(ops.cast(as_int, np.float32).to_host(), x.astype(np.int32).astype(np.float32))
    np.testing.assert_array_equal(ops.cast(t, np.bool_).to_host(), x.astype(np.bool_))
    np.testing.assert_array_equal(ops.cast(t, np.float32).to_host(), x)


@pytest.mark.parametrize("target", [np.dtype(np.float16), nc.bfloat16], ids=["float16", "bfloat16"])
def test_a_repeated_storage_cast_rounds_as_the_first(device: nc.Device, target) -> None:
    """Where the 16-bit dtypes are storage-only, a cast seen before takes its remembered plan: the same
    rounding (NumPy's / ml_dtypes' nearest even) on the new tensor's values, and a new output each call."""
    try:
        device.check_dtype(target)
    except nc.DTypeError:
        pytest.skip(f"{device} does not hold {target}")
    want_dtype = np.float16 if target == np.float16 else nc.bfloat16
    first, second = _data((3, 50), 1), _data((3, 50), 2)
    a = ops.cast(nc.tensor(first, device=device), target)
    b = ops.cast(nc.tensor(second, device=device), target)
    assert b.dtype == target and b.shape == (3, 50) and b.data is not a.data
    for got, x in ((a, first), (b, second)):
        np.testing.assert_array_equal(got.to_host().astype(np.float32), x.astype(want_dtype).astype(np.float32))
    with pytest.raises(TypeError):
        ops.cast(nc.tensor(first, device=device), np.dtype(object))  # a new target: checked as ever


def test_full_and_likes(device: nc.Device) -> None:
    np.testing.assert_array_equal(ops.full((2, 3), 1.5, device=device).to_host(), np.full((2, 3), 1.5, np.float32))
    ints = ops.full(4, 7, dtype=np.int32, device=device)
    assert ints.dtype == np.int32 and ints.device is device
    np.testing.assert_array_equal(ints.to_host(), [7, 7, 7, 7])
    np.testing.assert_array_equal(ops.zeros_like(ints).to_host(), [0, 0, 0, 0])
    ones = ops.ones_like(nc.tensor(_data((2, 2)), device=device))
    np.testing.assert_array_equal(ones.to_host(), np.ones((2, 2), np.float32))
    assert ops.full((), -1.0, device=device).to_host().shape == ()


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_one_hot(device: nc.Device, dtype: type) -> None:
    labels = np.array([0, 3, 1, 3, 2, 7, -1], dtype)
    result = ops.one_hot(nc.tensor(labels, device=device), 4)
    assert result.dtype == np.float32 and result.shape == (7, 4)
    expected = (labels[:, None] == np.arange(4)).astype(np.float32)  # out-of-range labels: all-zero rows
    np.testing.assert_array_equal(result.to_host(), expected)
    with pytest.raises(nc.DTypeError):
        ops.one_hot(nc.tensor(np.zeros(3, np.float32), device=device), 4)


@pytest.mark.parametrize("target", [(1, 4), (4,), (3, 1), (), (3, 4)])
def test_sum_to_shape(device: nc.Device, target: tuple[int, ...]) -> None:
    x = _data((3, 4), seed=5)
    t = nc.tensor(x, device=device)
    result = ops.sum_to_shape(t, target)
    lead = x.ndim - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(target) if d == 1)
    expected = x.astype(np.float64).sum(axis=axes, keepdims=True).reshape(target)
    assert result.shape == target
    np.testing.assert_allclose(result.to_host(), expected, rtol=1e-6, atol=1e-6)
    if target == x.shape:
        assert result is t


def test_sum_to_shape_rejects_non_broadcast(device: nc.Device) -> None:
    with pytest.raises(nc.ShapeError, match="does not broadcast"):
        ops.sum_to_shape(nc.tensor(_data((3, 4)), device=device), (2, 4))
