"""matmul against a float64 NumPy reference: odd sizes, batched with broadcast, 1-D, edge cases.

Tolerance: each output is a K-term float32 dot product. With inputs in [-1, 1] its rounding
error is bounded by ~K * eps * sum|a_ik b_kj| in the worst case and is ~sqrt(K) * eps of it
in practice; we allow atol = 4 * K * eps * max|a| * max|b| (a few 1e-6 for K = 33), which a
wrong index, a missed tile or an un-zeroed padding element (errors of order 0.1) exceed by far.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops

EPS = float(np.finfo(np.float32).eps)


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape).astype(np.float32)


def _check(device: nc.Device, sa: tuple[int, ...], sb: tuple[int, ...], seed: int = 0) -> None:
    a, b = _data(sa, seed), _data(sb, seed + 1)
    result = ops.matmul(nc.tensor(a, device=device), nc.tensor(b, device=device))
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    host = result.to_host()
    assert host.dtype == np.float32 and host.shape == expected.shape
    k = sa[-1]
    np.testing.assert_allclose(host, expected, rtol=0, atol=4 * max(k, 1) * EPS)


@pytest.mark.parametrize(
    ("sa", "sb"),
    [
        ((17, 33), (33, 5)),  # odd sizes: partial tiles in M, K and N
        ((16, 16), (16, 16)),  # exactly one tile
        ((1, 40), (40, 1)),  # a dot product
        ((3, 17, 33), (33, 5)),  # batched left, shared right
        ((2, 1, 4, 3), (3, 3, 5)),  # broadcast batch dims (2, 1) x (3,) -> (2, 3)
        ((33,), (33, 5)),  # 1-D on the left
        ((17, 33), (33,)),  # 1-D on the right
    ],
)
def test_matmul(device: nc.Device, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    _check(device, sa, sb)


def test_zero_sizes(device: nc.Device) -> None:
    a = nc.tensor(np.zeros((3, 0), np.float32), device=device)
    b = nc.tensor(np.zeros((0, 4), np.float32), device=device)
    np.testing.assert_array_equal(ops.matmul(a, b).to_host(), np.zeros((3, 4), np.float32))
    rows = nc.tensor(np.zeros((0, 2), np.float32), device=device)
    empty = ops.matmul(rows, nc.tensor(_data((2, 3), 1), device=device))
    assert empty.shape == (0, 3)


def test_shape_errors(device: nc.Device) -> None:
    a = nc.tensor(_data((2, 3), 0), device=device)
    with pytest.raises(nc.ShapeError, match=r"inner dimensions 3 and 4"):
        ops.matmul(a, nc.tensor(_data((4, 2), 1), device=device))
    with pytest.raises(nc.ShapeError, match="batch"):
        ops.matmul(nc.tensor(_data((2, 2, 3), 0), device=device), nc.tensor(_data((3, 3, 2), 1), device=device))


def test_integer_operands_give_float32(device: nc.Device) -> None:
    a = nc.tensor(np.arange(6, dtype=np.int32).reshape(2, 3), device=device)
    b = nc.tensor(np.ones((3, 2), np.float32), device=device)
    result = ops.matmul(a, b)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result.to_host(), [[3, 3], [12, 12]])


@pytest.mark.parametrize(("sa", "sb"), [((5, 16384), (16384, 7)), ((64, 8192), (8192, 3))])
def test_small_output_with_large_k_is_split_along_k(device, sa, sb):
    """Few output blocks and a large K take the split-K path (partial products, then their sum)."""
    from netcl.runtime.ops.linalg import _k_splits

    assert _k_splits(sa[0], sb[1], sa[1], (), (np.float32,) * 3) > 1
    _check(device, sa, sb)
