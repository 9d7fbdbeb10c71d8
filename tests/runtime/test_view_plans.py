"""Metadata-only views and the per-signature fast paths of issue 33 (eager host cost), held to what they promise:
a transpose that only moves length-1 axes and a getitem of one contiguous block launch no kernel (counted by
the profiler) and share the input's memory (a write into the input shows through), on their first call and on
the repeats that replay the plan; a reduction done in one stage replays that stage's prepared launch (one
kernel, the float64 NumPy values); an elementwise op under ``no_grad`` records nothing. Values are compared
with NumPy on every call, so a plan that bound a stale buffer or size would differ."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.runtime.ops as R
from netcl.profiler import profile
from netcl.runtime import synchronize
from netcl.runtime.memory import memory_stats
from netcl.runtime.ops import indexing, pointwise

# sums of <= 40 float32 values against float64 NumPy: a few ulps of the largest partial sum; moves are exact
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _floats(device: nc.Device, shape: tuple[int, ...], seed: int) -> nc.Tensor:
    return nc.Tensor.from_host(device, np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _kernels(device: nc.Device, fn) -> tuple[list[str], object]:
    """The names of the kernels ``fn()`` launches (OpenCL), and its result."""
    synchronize(device)
    with profile(device) as prof:
        result = fn()
        synchronize(device)
    return [e.name for e in prof.events() if e.kind == "kernel"], result


UNIT_TRANSPOSES = [((1, 40), None), ((40, 1), None), ((3, 1, 5), (1, 0, 2)), ((3, 1, 5), (0, 2, 1)), ((7,), None)]


@pytest.mark.parametrize("shape, axes", UNIT_TRANSPOSES, ids=[f"{s}-{a}" for s, a in UNIT_TRANSPOSES])
def test_transpose_moving_only_unit_axes_is_a_view(device, shape, axes) -> None:
    for seed in range(3):  # the first call makes the plan, the later ones replay it
        x = _floats(device, shape, seed)
        out = R.transpose(x, axes)
        np.testing.assert_array_equal(out.to_host(), np.transpose(x.to_host(), axes))
        assert out.base is x  # a reshape of x: its memory
        pointwise.fill_(x, float(seed + 2))
        np.testing.assert_array_equal(out.to_host(), np.full(out.shape, seed + 2, np.float32))


def test_unit_axis_transpose_launches_no_kernel_and_a_real_one_launches_one(cl_device) -> None:
    for seed in range(3):
        x = _floats(cl_device, (1, 40), seed)
        names, out = _kernels(cl_device, lambda x=x: R.transpose(x))
        assert names == []
        np.testing.assert_array_equal(out.to_host(), x.to_host().T)
        square = _floats(cl_device, (6, 40), seed)
        names, out = _kernels(cl_device, lambda square=square: R.transpose(square))
        assert names == ["netcl_transpose"]
        np.testing.assert_array_equal(out.to_host(), square.to_host().T)


def test_bad_transpose_axes_still_raise_before_a_launch(cl_device) -> None:
    x = _floats(cl_device, (1, 40), 0)
    R.transpose(x)  # a plan for axes None
    with pytest.raises(ValueError, match="not a permutation"):
        R.transpose(x, (0, 0))
    with pytest.raises(nc.ShapeError, match="not a permutation"):
        ag.transpose(ag.tensor(x), (1, 1))


def _block_is_aligned(device: nc.Device, start: int) -> bool:
    return (start * 4) % max(device.cl_device.mem_base_addr_align // 8, 1) == 0


# (name, key, reference, flat start of the block) on a (32, 32) float32 tensor
BLOCKS = [
    ("rows", slice(2, 10), lambda h: h[2:10], 64),
    ("row", 4, lambda h: h[4], 128),
    ("whole", (Ellipsis, slice(None)), lambda h: h[..., :], 0),
    ("new axis", (None, slice(0, 8)), lambda h: h[None, 0:8], 0),
]


@pytest.mark.parametrize("name, key, reference, start", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_getitem_of_a_block_launches_no_kernel_and_shares_memory(cl_device, name, key, reference, start) -> None:
    view = start == 0 or _block_is_aligned(cl_device, start)  # else the device cannot address it: a copy
    for seed in range(3):
        x = _floats(cl_device, (32, 32), seed)
        names, out = _kernels(cl_device, lambda x=x: indexing.getitem(x, key))
        np.testing.assert_array_equal(out.to_host(), reference(x.to_host()))
        assert names == ([] if view else ["netcl_strided"])
        if view:
            assert out.base is x
            pointwise.fill_(x, float(seed + 5))
            np.testing.assert_array_equal(out.to_host(), np.full(out.shape, seed + 5, np.float32))


def test_getitem_of_a_sub_buffer_copies_and_of_a_reshape_views(cl_device) -> None:
    """A view of a sub-buffer cannot be a sub-buffer (OpenCL has none of those): its plan is kept apart from
    the root's; a reshape of the root shares the root's buffer and gets the root's view."""
    for seed in range(3):
        x = _floats(cl_device, (32, 32), seed)
        host = x.to_host()
        rows = indexing.getitem(x, slice(2, 10))
        inner = indexing.getitem(rows, slice(2, 6))
        np.testing.assert_array_equal(inner.to_host(), host[2:10][2:6])
        flat = x.reshape(1024).reshape(32, 32)
        again = indexing.getitem(flat, slice(2, 10))
        np.testing.assert_array_equal(again.to_host(), host[2:10])
        if _block_is_aligned(cl_device, 64):
            assert inner.base is None and again.base is x


def test_numpy_backend_getitem_views() -> None:
    x = _floats(nc.get_device("cpu"), (32, 32), 0)
    out = indexing.getitem(x, slice(2, 10))
    pointwise.fill_(x, 3.0)
    np.testing.assert_array_equal(out.to_host(), np.full((8, 32), 3, np.float32))


# (op, reference, input shape): one stage each on a 32 x 32 input; (2, 100000) sums in two stages
REDUCTIONS = [
    (lambda x: R.sum(x, 1), lambda h: h.sum(1), (32, 32)),
    (lambda x: R.max(x, 1), lambda h: h.max(1), (32, 32)),
    (lambda x: R.mean(x), lambda h: h.mean(), (32, 32)),
    (lambda x: R.sum(x, 0), lambda h: h.sum(0), (32, 32)),
    (lambda x: R.sum(x, 1), lambda h: h.sum(1), (2, 100000)),
]


@pytest.mark.parametrize("op, reference, shape", REDUCTIONS, ids=["sum1", "max1", "mean", "sum0", "two-stage"])
def test_planned_reductions_match_numpy(device, op, reference, shape) -> None:
    tol = TOL if shape[1] <= 32 else {"rtol": 1e-4, "atol": 1e-3}  # 1e5 terms: float32 partial sums
    for seed in range(3):
        x = _floats(device, shape, seed)
        np.testing.assert_allclose(op(x).to_host(), reference(x.to_host().astype(np.float64)), **tol)


def test_a_planned_one_stage_reduction_launches_one_kernel(cl_device) -> None:
    R.sum(_floats(cl_device, (32, 32), 0), 1)
    for seed in range(1, 3):
        x = _floats(cl_device, (32, 32), seed)
        names, out = _kernels(cl_device, lambda x=x: R.sum(x, 1))
        assert len(names) == 1
        np.testing.assert_allclose(out.to_host(), x.to_host().astype(np.float64).sum(1), **TOL)


def test_elementwise_under_no_grad_records_nothing(device) -> None:
    x = ag.tensor(_floats(device, (4, 5), 0).to_host(), device=device, requires_grad=True)
    y = ag.tensor(_floats(device, (4, 5), 1).to_host(), device=device, requires_grad=True)
    with ag.Tape() as tape, ag.no_grad():
        outs = [ag.add(x, y), ag.mul(x, 2.0), ag.sub(1.5, y), ag.exp(x)]
    assert tape.nodes == []
    assert all(not o.requires_grad and o.grad_fn is None for o in outs)
    hx, hy = x.to_host(), y.to_host()
    for out, ref in zip(outs, [hx + hy, hx * 2.0, 1.5 - hy, np.exp(hx.astype(np.float64))], strict=True):
        np.testing.assert_allclose(out.to_host(), ref, rtol=1e-6, atol=1e-6)


def test_unit_axis_transpose_gradient(device) -> None:
    x = ag.tensor(_floats(device, (1, 6), 0).to_host(), device=device, requires_grad=True)
    w = _floats(device, (6, 1), 1)
    with ag.Tape() as tape:
        loss = ag.sum(ag.mul(ag.transpose(x), w))
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), w.to_host().T)


# (op of (float tensor x, float tensor y, int32 tensor k), float64 reference of the host values, result dtype)
POINTWISE = [
    ("two tensors", lambda x, y, k: pointwise.add(x, y), lambda x, y, k: x + y, np.float32),
    ("broadcast", None, None, np.float32),
    ("tensor, float", lambda x, y, k: pointwise.sub(x, 1.5), lambda x, y, k: x - 1.5, np.float32),
    ("float, tensor", lambda x, y, k: pointwise.sub(1.5, x), lambda x, y, k: 1.5 - x, np.float32),
    ("int tensor, int", lambda x, y, k: pointwise.mul(k, 3), lambda x, y, k: k * 3, np.int32),
    ("int tensor, float", lambda x, y, k: pointwise.mul(k, 2.5), lambda x, y, k: k * 2.5, np.float32),
    ("int tensor, bool", lambda x, y, k: pointwise.add(k, True), lambda x, y, k: k + 1, np.int32),
    ("unary", lambda x, y, k: pointwise.exp(x), lambda x, y, k: np.exp(x), np.float32),
]


def test_repeated_pointwise_signatures_match_numpy(device) -> None:
    """Each signature (operand shapes, dtypes, scalar types, device) replays its own prepared launch: run all of
    them three times, interleaved, on fresh values (an int and a float scalar of one op stay apart)."""
    for seed in range(3):
        x, y = _floats(device, (4, 5), seed), _floats(device, (4, 5), seed + 10)
        k = nc.Tensor.from_host(device, np.arange(20, dtype=np.int32).reshape(4, 5) - seed)
        hx, hy, hk = x.to_host().astype(np.float64), y.to_host().astype(np.float64), k.to_host()
        for name, op, reference, dtype in POINTWISE:
            if name == "broadcast":
                y1 = indexing.getitem(y, slice(0, 1))
                out, ref = pointwise.mul(x, y1), hx * hy[:1]
            else:
                out, ref = op(x, y, k), reference(hx, hy, hk)
            assert out.dtype == np.dtype(dtype), name
            np.testing.assert_allclose(out.to_host(), ref, rtol=1e-6, atol=1e-6, err_msg=name)


def test_a_replayed_pointwise_launch_is_one_kernel_and_still_checks_devices(cl_device) -> None:
    x, y = _floats(cl_device, (4, 5), 0), _floats(cl_device, (4, 5), 1)
    pointwise.add(x, y)
    names, out = _kernels(cl_device, lambda: pointwise.add(x, y))
    assert names == ["netcl_ew"]
    np.testing.assert_allclose(out.to_host(), x.to_host() + y.to_host(), rtol=1e-6)
    elsewhere = _floats(nc.get_device("cpu"), (4, 5), 2)
    with pytest.raises(nc.DeviceError):
        pointwise.add(x, elsewhere)
    with pytest.raises(TypeError, match="neither a netcl Tensor nor a real scalar"):
        pointwise.add(x, "1.0")


def test_scalar_variants_record_their_gradients(device) -> None:
    x = ag.tensor(_floats(device, (3, 4), 0).to_host(), device=device, requires_grad=True)
    for _ in range(2):  # the second pass replays the launches of the first
        x.grad = None
        with ag.Tape() as tape:
            loss = ag.sum(ag.add(ag.mul(x, 2.0), ag.sub(1.5, x)))
        tape.backward(loss)
        np.testing.assert_array_equal(x.grad.to_host(), np.ones((3, 4), np.float32))
        np.testing.assert_allclose(loss.item(), (x.to_host().astype(np.float64) + 1.5).sum(), rtol=1e-5)


def _requests(device: nc.Device) -> int:
    stats = memory_stats(device)
    return stats.served_from_pool + stats.fresh_allocations


def test_softmax_allocates_only_its_output(cl_device) -> None:
    """A planned softmax asks the allocator for its output alone: the runtime op, the autograd op under no_grad,
    and one that records (its backward reads the output only); that gradient is right."""
    x = _floats(cl_device, (6, 40), 0)
    R.softmax(x, -1)
    node = ag.tensor(x.to_host(), device=cl_device, requires_grad=True)
    with ag.no_grad():
        ag.softmax(node, axis=-1)
    for seed in range(1, 3):
        x = _floats(cl_device, (6, 40), seed)
        before = _requests(cl_device)
        out = R.softmax(x, -1)
        assert _requests(cl_device) - before == 1
        np.testing.assert_allclose(out.to_host(), _softmax64(x.to_host()), rtol=1e-5, atol=1e-6)
        node = ag.tensor(x.to_host(), device=cl_device, requires_grad=True)
        before = _requests(cl_device)
        with ag.no_grad():
            plain = ag.softmax(node, axis=-1)
        assert _requests(cl_device) - before == 1
        np.testing.assert_allclose(plain.to_host(), _softmax64(x.to_host()), rtol=1e-5, atol=1e-6)
        w = _floats(cl_device, (6, 40), seed + 10)
        with ag.Tape() as tape:
            before = _requests(cl_device)
            probs = ag.softmax(node, axis=-1)
            assert _requests(cl_device) - before == 1
            loss = ag.sum(ag.mul(probs, w))
        tape.backward(loss)
        s, hw = _softmax64(x.to_host()), w.to_host().astype(np.float64)
        expected = s * (hw - (s * hw).sum(axis=-1, keepdims=True))
        np.testing.assert_allclose(node.grad.to_host(), expected, rtol=1e-4, atol=1e-6)


def _softmax64(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)


def test_reduction_axes_kept_per_signature_do_not_serve_keys_that_only_compare_equal(device) -> None:
    x = ag.tensor(_floats(device, (2, 3), 0).to_host(), device=device)
    np.testing.assert_allclose(ag.sum(x, axis=1).to_host(), x.to_host().astype(np.float64).sum(1), rtol=1e-6)
    with pytest.raises(TypeError):
        ag.sum(x, axis=1.0)  # equal to 1 and hashes alike: not the entry of axis 1
    with pytest.raises(nc.ShapeError, match="out of range"):
        ag.sum(x, axis=(1, 5))


@pytest.mark.parametrize(
    "key, grad_launches",
    [((slice(None, 40),), []), ((None, Ellipsis), []), ((slice(None, None, -1),), None), ((slice(0, 31),), None)],
    ids=["all rows", "new axis", "reversed", "a block"],
)
def test_getitem_backward_of_the_whole_tensor_launches_nothing(cl_device, key, grad_launches) -> None:
    """The gradient of a key that selects all of x in order is the upstream gradient under x's shape (no zeros,
    no scatter); any other key scatters into zeros. Values against NumPy either way."""
    x = _floats(cl_device, (32, 8), 1)
    g = _floats(cl_device, x.to_host()[key].shape, 2)
    names, out = _kernels(cl_device, lambda: indexing.getitem_backward(g, x.shape, key))
    want = np.zeros(x.shape, np.float32)
    want[key] = g.to_host()
    np.testing.assert_array_equal(out.to_host(), want)
    if grad_launches is not None:
        assert names == grad_launches
    else:
        assert "netcl_strided" in names
