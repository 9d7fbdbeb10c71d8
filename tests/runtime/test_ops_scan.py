"""Scans, arg-reductions, min/prod and flip of the eager library (``ops/scan.py``, ``ops/reduce.py``) against
float64 NumPy, on PoCL and the NumPy backend: both kernel modes (rows of <= 32 elements one per thread,
longer ones one per work-group), NumPy's tie and NaN rules, integer dtypes, and program reuse across
sizes.

Tolerances: float32 running sums of <= 45 terms of magnitude <= ~3: rtol 1e-5 with atol 1e-5; min,
argmax/argmin, integer results and flips are exact.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
import netcl.runtime.ops as R
from netcl.runtime import Variable
from netcl.runtime.cache import program_cache
from netcl.runtime.ops.scan import cumsum


def _t(values, device, dtype=np.float32):
    return nc.tensor(np.asarray(values, dtype), device=device)


def test_scans_arg_reductions_min_prod_flip(device):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 45)).astype(np.float32)
    t = _t(x, device)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(R.cumsum(t, 1).to_host(), np.cumsum(x64, 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(R.cumsum(t, 0).to_host(), np.cumsum(x64, 0), rtol=1e-6, atol=1e-6)
    rev = np.flip(np.cumsum(np.flip(x64, 1), 1), 1)
    np.testing.assert_allclose(cumsum(t, 1, reverse=True).to_host(), rev, rtol=1e-5, atol=1e-5)
    ints = rng.integers(-9, 9, (4, 40)).astype(np.int32)
    ti = _t(ints, device, np.int32)
    got = R.cumsum(ti, 1)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.to_host(), np.cumsum(ints, 1))
    np.testing.assert_array_equal(R.argmax(t, 1).to_host(), np.argmax(x, 1))
    np.testing.assert_array_equal(R.argmin(ti, 0).to_host(), np.argmin(ints, 0))
    assert R.argmax(t).to_host() == np.argmax(x) and R.argmax(t).dtype == np.int64
    np.testing.assert_array_equal(R.min(t, 1).to_host(), x.min(1))
    np.testing.assert_array_equal(R.min(ti).to_host(), ints.min())
    np.testing.assert_allclose(R.prod(_t(x[:, :6], device), 1).to_host(), x64[:, :6].prod(1), rtol=1e-5)
    np.testing.assert_array_equal(R.prod(_t(ints[:, :5], device, np.int32), 1).to_host(), ints[:, :5].prod(1))
    np.testing.assert_array_equal(R.prod(_t(np.zeros((2, 0)), device), 1).to_host(), [1.0, 1.0])
    np.testing.assert_array_equal(R.flip(t, (0, 1)).to_host(), x[::-1, ::-1])


def test_arg_reductions_follow_numpy_on_ties_and_nan(device):
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, np.nan, 5.0, np.nan], [1.0] * 4])
    x = np.concatenate([x, np.zeros((3, 36))], axis=1)  # 40 columns: the work-group kernel
    for width in (4, 40):
        t = _t(x[:, :width], device)
        np.testing.assert_array_equal(R.argmax(t, 1).to_host(), np.argmax(x[:, :width], 1))
        np.testing.assert_array_equal(R.argmin(t, 1).to_host(), np.argmin(x[:, :width], 1))


def test_argmax_into_stores_numpys_argmax_as_int32_at_the_position(device):
    """Greedy decoding's pick: each row's argmax (NumPy's tie and NaN rules) into ``ids[:, 0]`` and
    ``table[:, pos]``, the rest of ``table`` untouched; ``pos`` an int or a bound Variable."""
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, np.nan, 5.0, np.nan], [-1.0] * 4])
    x = np.concatenate([x, np.full((3, 36), -2.0)], axis=1)
    for width, pos in ((4, 0), (40, Variable("pos", 5).bind(5))):
        ids = _t(np.full((3, 1), -7), device, np.int32)
        table = _t(np.full((3, 6), -7), device, np.int32)
        R.argmax_into(_t(x[:, :width], device), ids, table, pos)
        expected = np.full((3, 6), -7)
        expected[:, int(pos)] = np.argmax(x[:, :width], 1)
        np.testing.assert_array_equal(ids.to_host()[:, 0], np.argmax(x[:, :width], 1))
        np.testing.assert_array_equal(table.to_host(), expected)


def test_argmax_into_rejects_bad_shapes_and_positions(device):
    x, ids, table = (
        _t(np.zeros((2, 5)), device),
        _t(np.zeros((2, 1)), device, np.int32),
        _t(np.zeros((2, 3)), device, np.int32),
    )
    with pytest.raises(ValueError, match=r"ids must be an int32 \(2, 1\) tensor, got shape \(2, 1\) dtype float32"):
        R.argmax_into(x, _t(np.zeros((2, 1)), device), table, 0)
    with pytest.raises(ValueError, match=r"table must be an int32 \(2, T\) tensor, got shape \(3, 3\)"):
        R.argmax_into(x, ids, _t(np.zeros((3, 3)), device, np.int32), 0)
    with pytest.raises(ValueError, match=r"pos must lie in \[0, 2\] \(table's columns\), got 3"):
        R.argmax_into(x, ids, table, 3)
    with pytest.raises(ValueError, match=r"pos must lie in \[0, 2\].*Variable"):
        R.argmax_into(x, ids, table, Variable("pos", 3))
    with pytest.raises(ValueError, match=r"x must be a non-empty \(B, V\) float tensor"):
        R.argmax_into(_t(np.zeros((2, 5)), device, np.int32), ids, table, 0)


def test_scan_and_arg_kernels_are_shape_generic(cl_device):
    """A new row count or row length (within one mode) builds no program."""
    rng = np.random.default_rng(9)

    def run(rows, width):
        x = _t(rng.standard_normal((rows, width)), cl_device)
        cumsum(x, 1)
        cumsum(x, 0, reverse=True)
        R.argmax(x, 1)
        R.argmin(x, 0)

    for width in (8, 64):  # the one-thread-per-row kernels, then the work-group ones
        run(3, width)
        before = dict(program_cache.stats().misses_by_kind)
        run(17, width + 5)
        after = dict(program_cache.stats().misses_by_kind)
        assert after == before, f"width {width}: new programs {set(after.items()) - set(before.items())}"
