"""Reductions (sum, mean, max) against float64 NumPy references, on PoCL and the NumPy backend.

Tolerances: a float32 sum of n terms carries rounding error that grows with the depth of its
summation tree; these kernels add <= 16 terms serially and then combine by trees, so for the
small shapes here (n <= 60) the error stays below ~n * eps relative to sum(|x|); we check
rtol 1e-6 with atol 1e-6 * sum(|x|). max is exact. The large-vector test is the accuracy one:
16M uniform values must sum within 1e-6 relative to the float64 sum (a serial float32 loop
is off by ~1e-3 there: once the running sum reaches ~8e6, each addition rounds by ~0.25).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops
from netcl.runtime.capture import capture_graph
from netcl.runtime.ops.reduce import merged_layout
from netcl.runtime.scheduler import Stream

SHAPE = (3, 4, 5)
AXES = [None, 0, 1, 2, -1, (0, 2), (1, 2), (0, 1, 2)]


def _data(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2.0, 2.0, shape).astype(np.float32)


def _close(result: nc.Tensor, expected: np.ndarray, scale: np.ndarray | float = 1.0) -> None:
    host = result.to_host()
    assert host.dtype == np.float32
    assert host.shape == np.shape(expected)
    np.testing.assert_allclose(host, expected, rtol=1e-6, atol=1e-6 * np.max(scale))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES)
def test_sum_mean_max(device: nc.Device, axis: object, keepdims: bool) -> None:
    x = _data(SHAPE, seed=1)
    x64 = x.astype(np.float64)
    t = nc.tensor(x, device=device)
    scale = np.sum(np.abs(x64), axis=axis, keepdims=keepdims)
    _close(ops.sum(t, axis, keepdims), np.sum(x64, axis=axis, keepdims=keepdims), scale)
    _close(ops.mean(t, axis=axis, keepdims=keepdims), np.mean(x64, axis=axis, keepdims=keepdims), scale)
    expected_max = np.max(x64, axis=axis, keepdims=keepdims)
    np.testing.assert_array_equal(ops.max(t, axis=axis, keepdims=keepdims).to_host(), expected_max)


@pytest.mark.parametrize("shape", [(300,), (37, 70), (2, 5000), (300, 20)])
def test_long_reductions(device: nc.Device, shape: tuple[int, ...]) -> None:
    """Rows long enough for the work-group tree (and, for 5000 > 4096, a second stage); columns
    (axis 0 with the last axis kept) long enough for the coalesced column kernel (300 > 128: in
    three chunks and a second stage)."""
    x = _data(shape, seed=2)
    x64 = x.astype(np.float64)
    t = nc.tensor(x, device=device)
    _close(ops.sum(t, axis=-1), x64.sum(-1), np.abs(x64).sum(-1))
    _close(ops.sum(t), x64.sum(), np.abs(x64).sum())
    np.testing.assert_array_equal(ops.max(t, axis=-1).to_host(), x64.max(-1))
    if len(shape) == 2:
        _close(ops.mean(t, axis=0, keepdims=True), x64.mean(0, keepdims=True), np.abs(x64).sum(0))
        np.testing.assert_array_equal(ops.max(t, axis=0).to_host(), x64.max(0))


@pytest.mark.parametrize(
    ("shape", "axis"),
    [((6, 5, 70), (0, 2)), ((64, 8, 4, 4), (0, 2, 3)), ((16, 8, 8, 8), (0, 2, 3)), ((3, 4, 5, 6, 7), (0, 2, 4))],
)
def test_axes_split_by_kept_ones(device: nc.Device, shape: tuple[int, ...], axis: tuple[int, ...]) -> None:
    """Reduced axes with kept ones between them (a bias gradient's (N, C, H, W) over N, H and W; on CPU devices
    the innermost run is reduced first, then the rest): every op against float64, a NaN carried through."""
    x = _data(shape, seed=6)
    x64 = x.astype(np.float64)
    t = nc.tensor(x, device=device)
    scale = np.abs(x64).sum(axis=axis)
    _close(ops.sum(t, axis), x64.sum(axis=axis), scale)
    _close(ops.mean(t, axis=axis), x64.mean(axis=axis), scale)
    np.testing.assert_array_equal(ops.max(t, axis=axis).to_host(), x64.max(axis=axis))
    np.testing.assert_array_equal(ops.min(t, axis=axis).to_host(), x64.min(axis=axis))
    x[(0,) * x.ndim] = np.nan
    np.testing.assert_array_equal(ops.max(nc.tensor(x, device=device), axis=axis).to_host(), np.max(x, axis=axis))


@pytest.mark.parametrize(("side", "mode"), [((8, 8), "serial"), ((5, 13), "tree")])
def test_a_cpu_device_sums_runs_of_up_to_64_elements_one_work_item_each(cl_device, side, mode) -> None:
    """On a CPU device the innermost run of a bias gradient's sum over N, H and W is summed one work-item a run
    ("serial") up to 64 elements (an 8x8 image), by a work-group's tree from 65 on (5x13): against float64."""
    from netcl.runtime.ops import reduce

    if cl_device.is_gpu:
        pytest.skip("GPUs sum runs of more than 16 elements by a tree")
    x = _data((16, 8, *side), seed=9)
    x64 = x.astype(np.float64)
    _close(ops.sum(nc.tensor(x, device=cl_device), (0, 2, 3)), x64.sum(axis=(0, 2, 3)), np.abs(x64).sum(axis=(0, 2, 3)))
    run = side[0] * side[1]
    # the first stage's: 16 x 8 runs kept, each of ``run`` elements reduced (another test's sum of ``run`` elements
    # into one output, a tree on any device, is not this one)
    modes = {key[1] for key in reduce._STAGES if key[2:4] == (((16 * 8, run),), ((run, 1),)) and key[-1] == cl_device}
    assert modes == {mode}


def test_large_sum_is_accurate(device: nc.Device) -> None:
    x = np.random.default_rng(3).random(1 << 24, dtype=np.float32)
    reference = x.sum(dtype=np.float64)
    result = float(ops.sum(nc.tensor(x, device=device)).to_host())
    assert abs(result - reference) / reference < 1e-6


def test_max_propagates_nan(device: nc.Device) -> None:
    x = _data((4, 300), seed=4)
    x[1, 7] = np.nan
    x[3, 299] = np.nan
    result = ops.max(nc.tensor(x, device=device), axis=1).to_host()
    np.testing.assert_array_equal(result, np.max(x, axis=1))
    assert np.isnan(float(ops.max(nc.tensor(x, device=device)).to_host()))


def test_zero_d_and_empty(device: nc.Device) -> None:
    scalar = nc.tensor(np.float32(2.5), device=device)
    assert ops.sum(scalar).to_host() == np.float32(2.5)
    assert ops.max(scalar, axis=None, keepdims=True).shape == ()
    empty = nc.tensor(np.zeros((0, 3), np.float32), device=device)
    np.testing.assert_array_equal(ops.sum(empty, axis=0).to_host(), np.zeros(3, np.float32))
    assert ops.sum(empty, axis=1).shape == (0,)
    assert np.isnan(ops.mean(empty, axis=0).to_host()).all()
    with pytest.raises(ValueError, match="zero elements"):
        ops.max(empty, axis=0)


def test_integer_inputs(device: nc.Device) -> None:
    x = np.arange(-5, 7, dtype=np.int32).reshape(3, 4)
    t = nc.tensor(x, device=device)
    total = ops.sum(t, axis=1)
    assert total.dtype == np.int64
    np.testing.assert_array_equal(total.to_host(), x.sum(axis=1))
    assert ops.max(t).dtype == np.int32 and int(ops.max(t).to_host()) == 6
    assert ops.mean(t).dtype == np.float32


def test_axis_errors(device: nc.Device) -> None:
    t = nc.tensor(_data((2, 3)), device=device)
    with pytest.raises(np.exceptions.AxisError):
        ops.sum(t, axis=2)
    with pytest.raises(ValueError, match="repeated"):
        ops.sum(t, axis=(0, -2))


def test_merged_layout() -> None:
    assert merged_layout((3, 4, 5), (2,)) == (((12, 5),), ((5, 1),))
    assert merged_layout((3, 4, 5), (0,)) == (((20, 1),), ((3, 20),))
    assert merged_layout((3, 4, 5), (1,)) == (((3, 20), (5, 1)), ((4, 5),))
    assert merged_layout((3, 1, 5), (0, 1)) == (((5, 1),), ((3, 5),))


@pytest.mark.parametrize(
    ("shape", "axis"),
    [((40, 9), 0), ((3, 5), 1), ((70000,), 0), ((5, 3000), 1), ((600, 24), 0), ((2, 3, 4, 5), (0, 2, 3))],
    ids=["cols", "serial", "all-multi-stage", "tree", "cols-multi-stage", "conv-bias"],
)
def test_sum_with_an_addend(device, shape, axis):
    """``sum(x, axis, addend=a)``: the bits of ``sum(x, axis) + a`` (one float add, in the last stage's
    store), in every reduction mode and across stages; bad addends raise before any launch."""
    rng = np.random.default_rng(4)
    x = nc.tensor(rng.standard_normal(shape).astype(np.float32), device=device)
    plain = ops.sum(x, axis).to_host()
    a = rng.standard_normal(plain.shape).astype(np.float32)
    got = ops.sum(x, axis, addend=nc.tensor(a, device=device)).to_host()
    np.testing.assert_array_equal(got, plain + a)
    with pytest.raises(nc.ShapeError, match="addend must have the result's shape"):
        ops.sum(x, axis, addend=nc.tensor(np.zeros((*plain.shape, 2), np.float32), device=device))
    with pytest.raises(TypeError, match="addend must be a Tensor"):
        ops.sum(x, axis, addend=a)


@pytest.mark.parametrize("shape", [(1000, 70), (2048, 512), (300, 9)])
def test_column_sums_over_several_chunks_in_one_launch(cl_device, launch_counter, shape) -> None:
    """Columns of up to 128 chunks: one launch whose last work-group per block of 32 columns sums the block's
    partials (a ragged last block, 3 to 16 chunks here). Against float64; a replay on new values gives the
    eager bits again and again (each block's ticket is back at 0 after every launch), also on another queue."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-2.0, 2.0, shape).astype(np.float32)
    t = nc.tensor(x, device=cl_device)
    with launch_counter(cl_device.queue) as launches:
        total = ops.sum(t, 0)
    assert launches.names == ["netcl_reduce"]
    _close(total, x.astype(np.float64).sum(0), np.abs(x.astype(np.float64)).sum(0))
    x[5, 3] = np.nan
    np.testing.assert_array_equal(ops.max(nc.tensor(x, device=cl_device), 0).to_host(), x.max(0))
    graph = capture_graph(cl_device.queue, lambda a: ops.mean(a, 0), t)
    other = Stream(device=cl_device)  # a replay elsewhere: the captured launch has tickets of its own
    for seed in range(4):
        fresh = nc.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device=cl_device)
        replayed = graph.execute(fresh, copy_outputs=True, queue=other if seed == 3 else None)
        other.finish()
        np.testing.assert_array_equal(replayed.to_host(), ops.mean(fresh, 0).to_host())


def test_column_sums_over_more_chunks_take_a_second_stage(cl_device, launch_counter) -> None:
    """Beyond 128 chunks (a serial loop of more than 16 partials a lane) the partials take a second launch."""
    x = _data((20000, 40), seed=8)
    t = nc.tensor(x, device=cl_device)
    with launch_counter(cl_device.queue) as launches:
        total = ops.sum(t, 0)
    assert launches.names == ["netcl_reduce", "netcl_reduce"]
    _close(total, x.astype(np.float64).sum(0), np.abs(x.astype(np.float64)).sum(0))
