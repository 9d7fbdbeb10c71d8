"""float16 tensors on every device, storage-only where the device lacks ``cl_khr_fp16`` (PoCL here,
NVIDIA's OpenCL): copies and moves (slices, concat, pad, flip, broadcast, transposes), casts,
elementwise ops, reductions, the row kernels (softmax, norms, cross-entropy: tests/autograd) and
matmul take them there; every other kernel raises a DTypeError that says so before it is built.
Casts and elementwise ops are checked bit for bit against NumPy (float16 values computed in
float32, rounded once to nearest even), reductions and products against float64 results of the
same float16 values.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import netcl.core as nc
from netcl.core.dtypes import storage_only_message
from netcl.runtime import ops as R

#: float32 values whose float16 rounding is delicate: ties (2049, 2051 lie halfway between
#: float16 neighbours), the largest finite value and the first that overflows, subnormals and
#: the underflow boundary, signed zero, infinities and NaN
_FINITE = [1.0, 0.1, -2.5, 2049.0, 2051.0, 65504.0, 65519.0, 65520.0, 1e-8, 3e-8, 6e-8, 5.96e-8, 3.0e-5, -0.0]
SPECIAL = np.array([*_FINITE, np.inf, -np.inf, np.nan, 1 / 3, -1e5], np.float32)


def _half(values: np.ndarray) -> np.ndarray:
    """NumPy's float16 conversion (overflow to inf is part of what is checked)."""
    with np.errstate(over="ignore"):
        return values.astype(np.float16)


def _same_bits(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint16), expected[~nan].view(np.uint16))


def test_float16_tensors_round_trip_and_copy(device):
    assert device.supports(nc.float16)
    host = _half(SPECIAL).reshape(19, 1)
    t = nc.tensor(host, device=device)
    assert t.dtype == nc.float16
    _same_bits(t.to_host(), host)
    _same_bits(R.copy(t).to_host(), host)
    _same_bits(R.cast(t, nc.float16).to_host(), host)
    _same_bits(nc.Tensor.zeros((3, 2), nc.float16, device).to_host(), np.zeros((3, 2), np.float16))


def test_float16_transposes_move_the_bits(device):
    host = _half(np.concatenate([SPECIAL, SPECIAL[:5]]).reshape(2, 3, 4))
    t = nc.tensor(host, device=device)
    _same_bits(R.transpose(t, (0, 2, 1)).to_host(), np.ascontiguousarray(host.transpose(0, 2, 1)))  # tiled swap
    _same_bits(R.transpose(t, (2, 0, 1)).to_host(), np.ascontiguousarray(host.transpose(2, 0, 1)))  # gather


def test_float16_moves_slice_pad_broadcast_and_fill(device):
    """The raw-word movers (slicing, narrow, concat, pad, flip), broadcast_to and fills keep every bit."""
    host = _half(np.concatenate([SPECIAL, SPECIAL[:5]]).reshape(2, 3, 4))
    t = nc.tensor(host, device=device)
    cases = [
        (R.getitem(t, (slice(None), 1)), host[:, 1]),
        (R.narrow(t, 2, 1, 2), host[:, :, 1:3]),
        (R.concat([t, t], axis=1), np.concatenate([host, host], 1)),
        (R.pad(t, (1, 2, 0, 1), value=0.5), np.pad(host, ((0, 0), (0, 1), (1, 2)), constant_values=np.float16(0.5))),
        (R.flip(t, 1), host[:, ::-1]),
        (R.broadcast_to(R.narrow(t, 1, 0, 1), (3, 2, 5, 4)), np.broadcast_to(host[:, :1], (3, 2, 5, 4))),
        (R.full((2, 3), 1 / 3, nc.float16, device), _half(np.full((2, 3), 1 / 3))),  # rounded once, to nearest
        (R.zeros_like(t), np.zeros_like(host)),
    ]
    for got, expected in cases:
        _same_bits(got.to_host(), np.ascontiguousarray(expected))


def test_casts_to_float16_round_like_numpy(device):
    _same_bits(R.cast(nc.tensor(SPECIAL, device=device), nc.float16).to_host(), _half(SPECIAL))
    ints = np.array([0, 1, -7, 2049, 2051, 65504, 65519, 65520, 100000, -(2**31)], np.int32)
    _same_bits(R.cast(nc.tensor(ints, device=device), nc.float16).to_host(), _half(ints))
    flags = np.array([True, False, True])
    _same_bits(R.cast(nc.tensor(flags, device=device), nc.float16).to_host(), _half(flags))
    if device.supports(nc.float64):  # float64 rounds to float16 directly, not through float32
        wide = np.array([1 + 2**-11 + 2**-40, 1 + 2**-11, 65519.99, 1e-300, np.nan], np.float64)
        got = R.cast(nc.tensor(wide, dtype=nc.float64, device=device), nc.float16).to_host()
        _same_bits(got, _half(wide))


def test_casts_from_float16_are_exact(device):
    halves = _half(SPECIAL)
    _same_bits(R.cast(nc.tensor(halves, device=device), nc.float32).to_host().astype(np.float16), halves)
    np.testing.assert_array_equal(R.cast(nc.tensor(halves, device=device), nc.float32).to_host(), halves.astype("f4"))
    if device.supports(nc.float64):
        got = R.cast(nc.tensor(halves, device=device), nc.float64).to_host()
        np.testing.assert_array_equal(got, halves.astype(np.float64))
    small = np.array([0.0, 1.0, 2.75, 255.0, 17.5], np.float16)  # in range of every integer target
    for dtype in (nc.int32, nc.int64, nc.uint8, nc.bool_):
        np.testing.assert_array_equal(R.cast(nc.tensor(small, device=device), dtype).to_host(), small.astype(dtype))


@pytest.mark.parametrize(("trans_a", "trans_b"), [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize(("m", "k", "n"), [(33, 17, 9), (2056, 64, 1032)], ids=["odd", "big"])
def test_float16_matmul_matches_float64(device, trans_a, trans_b, m, k, n):
    """float16 x float16: the float32 result within K float32 additions of float64, the float16 one
    its single rounding (bit for bit; odd rows of C unaligned for paired stores, and the big shape the
    wgmma / paired-store kernels on a Hopper GPU)."""
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (k, m) if trans_a else (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (n, k) if trans_b else (k, n)).astype(np.float16)
    ta, tb = nc.tensor(a, device=device), nc.tensor(b, device=device)
    x, y = (a.T if trans_a else a).astype(np.float64), (b.T if trans_b else b).astype(np.float64)
    reference, scale = x @ y, np.abs(x) @ np.abs(y)
    wide = R.matmul(ta, tb, transpose_a=trans_a, transpose_b=trans_b, out_dtype=nc.float32)
    assert wide.dtype == nc.float32
    # float16 x float16 products are exact in float32; K float32 additions: K * 2**-24 of sum |x y|
    assert np.all(np.abs(wide.to_host() - reference) <= k * 2.0**-24 * scale + 1e-30)
    narrow = R.matmul(ta, tb, transpose_a=trans_a, transpose_b=trans_b)
    assert narrow.dtype == nc.float16
    np.testing.assert_array_equal(narrow.to_host(), wide.to_host().astype(np.float16))  # one rounding of the sum
    mixed = R.matmul(ta, R.cast(tb, nc.float32), transpose_a=trans_a, transpose_b=trans_b)  # promoted: float32
    assert mixed.dtype == nc.float32  # (an fp32 kernel: its sums may round apart from the tensor cores')
    assert np.all(np.abs(mixed.to_host() - reference) <= k * 2.0**-24 * scale + 1e-30)


def test_float16_elementwise_ops_round_like_numpy(device):
    """Elementwise ops load float16 with ``vload_half``, compute in float32 and store with
    ``vstore_half_rte``: NumPy's float16 ufuncs do the same (float32 loops, one rounding), so the
    bits agree, broadcasts and specials included; a Python scalar is a float32 operand (torch's
    rule; NumPy would round it to float16 first); exp and tanh (float32 libraries that may differ
    in the last float32 bit) within one float16 step. Mixed with float32: float32."""
    rng = np.random.default_rng(3)
    a = np.concatenate([rng.uniform(-8, 8, 40), [0.0, -0.0, 1e-7, 65504, np.inf, -np.inf, np.nan, 2049]])
    a = _half(a.reshape(6, 8))
    b = _half(rng.uniform(-8, 8, 8))
    ta, tb = nc.tensor(a, device=device), nc.tensor(b, device=device)
    with np.errstate(all="ignore"):
        exact = [
            (R.add(ta, tb), a + b),
            (R.sub(ta, tb), a - b),
            (R.mul(ta, tb), a * b),
            (R.mul(ta, 0.3), _half(a.astype(np.float32) * np.float32(0.3))),  # the scalar in float32, as torch
            (R.maximum(ta, tb), np.maximum(a, b)),
            (R.relu(ta), np.where((a > 0) | np.isnan(a), a, np.float16(0))),  # as float32: -0 -> +0, NaN stays
            (R.neg(ta), -a),
            (R.abs(ta), np.abs(a)),
            (R.where(R.gt(ta, 0.0), ta, tb), np.where(a > 0, a, b)),
        ]
        close = [(R.exp(ta), np.exp(a)), (R.tanh(ta), np.tanh(a))]
    for got, expected in exact:
        assert got.dtype == nc.float16
        _same_bits(got.to_host(), expected)
    for got, expected in close:
        host, finite = got.to_host(), np.isfinite(expected)
        np.testing.assert_array_equal(np.isnan(host), np.isnan(expected))
        assert np.all(np.abs(host[finite] - expected[finite]) <= np.spacing(np.abs(expected[finite])))
    mixed = R.add(ta, nc.tensor(b.astype(np.float32), device=device))
    assert mixed.dtype == nc.float32
    np.testing.assert_array_equal(mixed.to_host(), a.astype(np.float32) + b.astype(np.float32))


def test_float16_reductions_accumulate_in_float32(device):
    """sum, mean, max and min of float16 tensors load halves, accumulate in float32 (partials of a
    long reduction are float32) and round the result once: within one float16 step of the float64
    result (max / min exactly NumPy's), also over a long axis in several stages and with an addend."""
    rng = np.random.default_rng(4)
    x = _half(rng.uniform(-2, 2, (6, 5000)))
    t = nc.tensor(x, device=device)
    wide = x.astype(np.float64)

    def near(got, expected):
        assert got.dtype == nc.float16
        host = got.to_host().astype(np.float64)
        step = np.spacing(np.abs(expected).astype(np.float16)).astype(np.float64)
        assert np.all(np.abs(host - expected) <= step), np.abs(host - expected).max()

    near(R.sum(t, axis=1), wide.sum(1))
    near(R.sum(t), wide.sum())
    near(R.mean(t, axis=0, keepdims=True), wide.mean(0, keepdims=True))
    near(R.sum(t, axis=1, addend=R.sum(t, axis=1)), 2 * _half(wide.sum(1)).astype(np.float64))
    _same_bits(R.max(t, axis=1).to_host(), x.max(1))
    _same_bits(R.min(t, axis=0).to_host(), x.min(0))


def test_float16_arithmetic_where_storage_only_says_so(device):
    if device.computes(nc.float16):
        pytest.skip(f"{device.name} computes in float16 (cl_khr_fp16 or the NumPy backend)")
    h = nc.tensor(np.ones((4, 3), np.float16), device=device)
    message = re.escape(storage_only_message(nc.float16, device.name))
    h4 = nc.tensor(np.ones((1, 2, 4, 4), np.float16), device=device)
    for op in (lambda: R.cumsum(h, 1), lambda: R.max_pool2d(h4, 2)):
        with pytest.raises(nc.DTypeError, match=message):
            op()
    _same_bits(h.to_host(), np.ones((4, 3), np.float16))  # untouched, and still usable
    np.testing.assert_array_equal(R.add(R.cast(h, nc.float32), 1.0).to_host(), np.full((4, 3), 2.0, np.float32))
