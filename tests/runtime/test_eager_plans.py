"""Per-shape eager plans (issue 33, eager host cost): softmax, transpose, getitem, index_select and gather
keep, per (shape, dtype, axes / key, device), what their checks and layout derived the first time, and a
repeat call only allocates and enqueues. These tests hold the plans to the first call's behaviour: the same
values as a float64 NumPy reference on every call (a plan that bound a stale size or buffer would differ),
a capture records a planned call, a profiler reports it, an out-of-range device index still raises at the
next wait, a new size builds no program, and keys that only hash alike (``True`` and ``1``) stay apart."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
import netcl.runtime.ops as R
from netcl.profiler import profile
from netcl.runtime import synchronize
from netcl.runtime.cache import program_cache
from netcl.runtime.graph import Graph
from netcl.runtime.ops import gathering, indexing, rowwise, selecting

# float32 kernels against float64 NumPy: softmax rounds exp/sum/divide (a few ulps); moves are exact
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _floats(device: nc.Device, shape: tuple[int, ...], seed: int) -> nc.Tensor:
    return nc.Tensor.from_host(device, np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    z = x.astype(np.float64) - x.max(axis=axis, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=axis, keepdims=True)


# (name, op(x), reference(host x)) for a (6, 40) float32 input; each runs three times on fresh values
CASES = [
    ("softmax last", lambda x: R.softmax(x, -1), lambda h: _softmax64(h, -1)),
    ("softmax axis 0", lambda x: R.softmax(x, 0), lambda h: _softmax64(h, 0)),
    ("log_softmax", lambda x: R.log_softmax(x, 1), lambda h: np.log(_softmax64(h, 1))),
    (
        "logsumexp",
        lambda x: rowwise.softmax_forward(x, (1,), rowwise.LOGSUMEXP)[0],
        lambda h: np.log(np.exp(h.astype(np.float64)).sum(axis=1)),
    ),
    ("transpose", lambda x: R.transpose(x), lambda h: h.T),
    ("transpose axes", lambda x: R.transpose(x, (1, 0)), lambda h: h.T),
    ("transpose 3-d", lambda x: R.transpose(x.reshape(2, 3, 40), (2, 0, 1)),
     lambda h: h.reshape(2, 3, 40).transpose(2, 0, 1)),
    ("getitem columns", lambda x: indexing.getitem(x, (slice(None), slice(3, 17, 2))), lambda h: h[:, 3:17:2]),
    ("getitem rows", lambda x: indexing.getitem(x, slice(1, 5)), lambda h: h[1:5]),
    ("getitem int", lambda x: indexing.getitem(x, (-2, Ellipsis, None)), lambda h: h[-2, ..., None]),
]  # fmt: skip


@pytest.mark.parametrize("name, op, reference", CASES, ids=[c[0] for c in CASES])
def test_repeat_calls_match_numpy(device, name, op, reference) -> None:
    for seed in range(3):  # the first call makes the plan, the later ones run through it
        x = _floats(device, (6, 40), seed)
        np.testing.assert_allclose(op(x).to_host(), reference(x.to_host()), **TOL)


@pytest.mark.parametrize("axis", [0, -2])
def test_index_select_and_gather_repeat_calls(device, axis: int) -> None:
    rng = np.random.default_rng(1)
    for seed in range(3):
        x = _floats(device, (7, 5), seed)
        h = x.to_host()
        index = rng.integers(0, 7, 4).astype(np.int32)
        out = selecting.index_select(x, axis, nc.Tensor.from_host(device, index))
        np.testing.assert_array_equal(out.to_host(), h[index])
        gidx = rng.integers(0, 7, (3, 5)).astype(np.int32)
        out = gathering.gather(x, axis, nc.Tensor.from_host(device, gidx))
        np.testing.assert_array_equal(out.to_host(), np.take_along_axis(h, gidx, axis=0))


@pytest.mark.parametrize(
    ("shape", "axis", "dtype"),
    [
        ((5, 8), 0, np.float32),  # runs of 8 floats: two 16-byte vectors a row
        ((5, 6), 0, np.float32),  # runs of 6: element by element
        ((3, 5, 16), 1, np.uint8),  # one uchar16 a run
        ((5, 2), 0, np.float64),  # one ulong2 a run
        ((4, 9, 8), 1, np.float16),  # one ushort8 a run
        ((6, 3), 1, np.int64),  # runs of 1
    ],
)
def test_index_select_copies_whole_vectors_or_elements(device, shape, axis: int, dtype) -> None:
    """Runs that hold whole 16-byte vectors are copied a vector a work-item, others an element; both equal NumPy."""
    rng = np.random.default_rng(2)
    host = (rng.standard_normal(shape) * 50).astype(dtype)
    index = rng.integers(0, shape[axis], 7).astype(np.int32)
    out = selecting.index_select(nc.tensor(host, device=device, dtype=dtype), axis, nc.Tensor.from_host(device, index))
    np.testing.assert_array_equal(out.to_host(), np.take(host, index, axis=axis))


@pytest.mark.parametrize(
    ("shape", "axis", "dtype"),
    [
        ((6, 8), 0, np.float32),  # runs of 8: vectors of 4 summed a work-item
        ((6, 6), 0, np.float32),  # runs of 6: element by element
        ((3, 5, 4), 1, np.float64),  # vectors of 2
        ((5, 3), 0, np.float64),  # runs of 3: element by element
    ],
)
def test_index_select_backward_sums_repeated_rows(device, shape, axis: int, dtype) -> None:
    """The gradient of ``index_select`` adds the rows of repeated indices; against float64 (each sum holds <= 3
    terms of N(0, 1) values: float32 rounding stays within 1e-6 relative)."""
    rng = np.random.default_rng(3)
    index = np.array([1, 4, 1, 0, 4, 4, 1], np.int32) % shape[axis]
    grad_shape = (*shape[:axis], len(index), *shape[axis + 1 :])
    host = rng.standard_normal(grad_shape).astype(dtype)
    got = selecting.index_select_backward(
        nc.tensor(host, device=device, dtype=dtype), axis, nc.Tensor.from_host(device, index), shape
    )
    want = np.zeros(shape)
    np.add.at(np.moveaxis(want, axis, 0), index, np.moveaxis(host.astype(np.float64), axis, 0))
    np.testing.assert_allclose(got.to_host().astype(np.float64), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 4, 32])
def test_rank_kernel_sorts_stably_whatever_its_rows(cl_device, monkeypatch, rows: int) -> None:
    """The rank kernel (``index_select``'s gradient orders the positions by index) gives the stable sort of
    the indices whichever number of positions a work-group takes (GPUs take fewer for short index lists)."""
    monkeypatch.setattr(selecting, "rank_rows", lambda length, local, units: rows)
    index = np.random.default_rng(5).integers(0, 37, 300).astype(np.int32)
    launch, args = selecting._rank_launch(cl_device, "int", len(index))
    perm = nc.Tensor.empty((len(index),), np.int32, cl_device)
    keys = nc.Tensor.empty((len(index),), np.int64, cl_device)
    launch.call(nc.Tensor.from_host(cl_device, index).data, perm.data, keys.data, *args)
    order = np.argsort(index, kind="stable")
    np.testing.assert_array_equal(perm.to_host(), order)
    np.testing.assert_array_equal(keys.to_host(), index[order])


def test_a_planned_index_op_still_reports_a_bad_device_index(cl_device) -> None:
    x = _floats(cl_device, (4, 4), 0)
    good, bad = (nc.Tensor.from_host(cl_device, np.array(v, np.int32)) for v in ([1, 2], [1, 9]))
    selecting.index_select(x, 0, good).to_host()  # makes the plan
    selecting.index_select(x, 0, bad)
    with pytest.raises(IndexError, match="index_select: index value 9"):
        synchronize(cl_device)
    gathering.gather(x, 1, nc.Tensor.from_host(cl_device, np.zeros((4, 4), np.int32))).to_host()
    gathering.gather(x, 1, nc.Tensor.from_host(cl_device, np.full((4, 4), -3, np.int32)))
    with pytest.raises(IndexError, match="gather: index value -3"):
        synchronize(cl_device)


def test_a_capture_records_planned_calls(cl_device) -> None:
    def step(x: nc.Tensor) -> nc.Tensor:
        y = R.softmax(R.transpose(x), -1)
        return indexing.getitem(y, (slice(None), slice(2, 9)))

    step(_floats(cl_device, (6, 40), 0))  # plans made outside the capture
    x = _floats(cl_device, (6, 40), 1)
    graph = Graph()
    with graph.capture(cl_device.queue, inputs=[x]):
        graph.outputs = step(x)
    assert len(graph.launches) == 3
    fresh = _floats(cl_device, (6, 40), 2)
    out = graph.execute(fresh)
    np.testing.assert_allclose(out.to_host(), _softmax64(fresh.to_host().T, -1)[:, 2:9], **TOL)


def test_a_profiler_reports_planned_calls(cl_device) -> None:
    x = _floats(cl_device, (6, 40), 0)
    index = nc.Tensor.from_host(cl_device, np.array([0, 3], np.int32))

    def ops() -> list[nc.Tensor]:
        return [R.softmax(x, -1), R.transpose(x), selecting.index_select(x, 0, index)]

    ops()
    synchronize(cl_device)
    with profile(cl_device) as prof:
        outs = ops()
        synchronize(cl_device)
    names = [e.name for e in prof.events() if e.kind == "kernel"]
    assert names == ["netcl_softmax_rows", "netcl_transpose", "netcl_index_select"]
    np.testing.assert_allclose(outs[1].to_host(), x.to_host().T)


def test_new_sizes_build_no_program(cl_device) -> None:
    """A second size of each op builds nothing and gets its own plan (the values of that size)."""
    index = nc.Tensor.from_host(cl_device, np.array([0, 1], np.int32))

    def ops(rows: int) -> None:
        x = _floats(cl_device, (rows, 40), rows)
        h = x.to_host()
        gidx = np.zeros((rows, 3), np.int32)
        outs = [
            R.softmax(x, -1),
            R.transpose(x),
            indexing.getitem(x, (slice(None), slice(1, 7))),
            selecting.index_select(x, 0, index),
            gathering.gather(x, 1, nc.Tensor.from_host(cl_device, gidx)),
        ]
        expected = [_softmax64(h, -1), h.T, h[:, 1:7], h[[0, 1]], np.take_along_axis(h, gidx, axis=1)]
        for out, ref in zip(outs, expected, strict=True):
            np.testing.assert_allclose(out.to_host(), ref, **TOL)

    ops(6)
    before = program_cache.stats().misses
    for rows in (9, 6, 9):  # new sizes, then both again through their plans
        ops(rows)
    assert program_cache.stats().misses == before


def test_memo_keys_keep_keys_that_hash_alike_apart() -> None:
    assert indexing.memo_key((1, slice(None, 3))) == (1, (None, 3, None))
    for key in (True, np.int64(1), slice(1.0, 3), (0, [1])):
        assert indexing.memo_key(key) is None
    assert indexing.parse_index((4, 5), 1).offset == 5
    with pytest.raises(IndexError, match="not supported"):
        indexing.parse_index((4, 5), True)  # True == 1 and hashes alike: not the memo of key 1
    assert indexing.parse_index((4, 5), np.int64(1)) == indexing.parse_index((4, 5), 1)
    with pytest.raises(IndexError, match="out of bounds"):
        indexing.parse_index((4, 5), 7)
    with pytest.raises(IndexError, match="out of bounds"):
        indexing.parse_index((4, 5), 7)  # a failed parse is not memoized
