"""Shape and index ops (indexing, concat/stack/split, pad, squeeze/unsqueeze/flatten/permute,
embedding/gather/index_select) vs NumPy, one ``check`` line per case.

These ops only move values, so forwards are exact (atol 0 would do; the default 1e-5 is kept);
gradients are sums of at most a few float32 terms against float64 finite differences (1e-4).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc

S3 = (2, 3, 4)

KEYS = [
    1,
    -1,
    (slice(1, 3),),
    (slice(None), slice(None, None, 2)),
    (Ellipsis, -1),
    (None, 0, Ellipsis, slice(3, 0, -2)),
    (1, 2),
    (slice(None), 1, None, slice(1, 4)),
    (slice(None, None, -1), slice(-2, None)),
    Ellipsis,
    (slice(0, 0),),
]


# ---- indexing --------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", KEYS, ids=[repr(k) for k in KEYS])
def test_getitem(check, key):
    check([S3], lambda x: x[key], lambda x: x[key], gradcheck=False)


ARRAY_KEYS = [
    [1, 0, 1],
    (slice(None), [2, 0, 2]),
    (Ellipsis, np.array([[3, 0], [1, 1]])),
    (0, [-1, 1]),
    (slice(None), 1, [0, 3]),
    (None, [1], 2, slice(1, 3)),
]


@pytest.mark.parametrize("key", ARRAY_KEYS, ids=[repr(k) for k in ARRAY_KEYS])
def test_getitem_integer_array(check, key):
    # repeated array entries: their gradients add up
    check([S3], lambda x: x[key], lambda x: x[key], gradcheck=False)


def test_getitem_tensor_index(check, device):
    index = nc.tensor(np.array([[2, 0], [1, 2]], dtype=np.int32), device=device)
    check([S3], lambda x: x[:, [[2, 0], [1, 2]]], lambda x: x[:, index])


def test_getitem_gradcheck_and_repeated_use(check):
    # two overlapping selections of one input: their gradients add up
    check([S3], lambda x: x[:, 1:] * x[:, :2], lambda x: x[:, 1:] * x[:, :2])


def test_getitem_contiguous_is_a_view(device):
    x = ag.tensor(np.arange(2 * 64, dtype=np.float32).reshape(2, 64), device=device)
    root = x.value
    for key, shared in [((None,), True), ((Ellipsis,), True), ((1,), True), ((slice(None), 3), False)]:
        y = x[key]
        np.testing.assert_array_equal(y.to_host(), x.to_host()[key])
        assert y.value.base is root or y.value.data is root.data, key  # no copy: x's memory, read later
        if device.kind == "cpu" or key != (1,):  # OpenCL: a sub-buffer only at an aligned offset
            assert y.value.strided == (not shared), key  # else a StridedView, gathered when an op reads it
    if device.kind == "opencl":
        align = device.cl_device.mem_base_addr_align // 8
        n = align // 4  # float32 elements per alignment unit
        z = ag.tensor(np.arange(3 * n, dtype=np.float32).reshape(3, n), device=device)
        view = z[1]
        assert view.value.base is z.value
        np.testing.assert_array_equal(view.to_host(), np.arange(n, 2 * n))
    else:
        z = ag.tensor(np.arange(3 * 64, dtype=np.float32).reshape(3, 64), device=device)
        view, n = z[1], 64
    del z
    gc.collect()
    junk = [nc.tensor(np.full((3, n), -1.0, np.float32), device=device) for _ in range(4)]  # reuses freed blocks
    np.testing.assert_array_equal(view.to_host(), np.arange(n, 2 * n))  # the view keeps its base alive
    assert len(junk) == 4


# ---- concat / stack / split --------------------------------------------------------------------------
def test_concat(check):
    check(
        [(2, 3), (2, 1), (2, 4)], lambda a, b, c: np.concatenate([a, b, c], 1), lambda a, b, c: ag.concat([a, b, c], 1)
    )


def test_cat_axis0_negative_axis(check):
    check([(1, 3), (2, 3)], lambda a, b: np.concatenate([a, b], -2), lambda a, b: ag.cat((a, b), axis=-2))


def test_concat_constant_operand(check, device):
    const = np.arange(6, dtype=np.float32).reshape(2, 3)
    c = nc.tensor(const, device=device)
    check([(2, 3)], lambda a: np.concatenate([const, a], 0), lambda a: ag.concat([c, a]))


def test_stack(check):
    check([(2, 3), (2, 3)], lambda a, b: np.stack([a, b], 1), lambda a, b: ag.stack([a, b], axis=1))


def test_stack_last_axis(check):
    check([(3,), (3,), (3,)], lambda a, b, c: np.stack([a, b, c], -1), lambda a, b, c: ag.stack([a, b, c], -1))


def test_split_sizes_roundtrip(check):
    check(
        [(2, 5)],
        lambda x: np.concatenate([x[:, 3:], x[:, :1] * 2, x[:, 1:3]], 1),
        lambda x: (lambda p: ag.concat([p[2], p[0] * 2, p[1]], 1))(ag.split(x, [1, 2, 2], axis=1)),
    )


def test_split_chunks(check):
    # torch semantics: chunks of 2 along axis 0 of size 5 -> 2, 2, 1
    check([(5, 2)], lambda x: x[4:] * 3.0, lambda x: ag.split(x, 2)[2] * 3.0)


def test_split_piece_counts(device):
    x = ag.tensor(np.zeros((5, 2), np.float32), device=device)
    assert [p.shape for p in ag.split(x, 2)] == [(2, 2), (2, 2), (1, 2)]
    assert [p.shape for p in ag.split(x, [0, 5], axis=0)] == [(0, 2), (5, 2)]


# ---- pad -------------------------------------------------------------------------------------------
def test_pad_last_axis(check):
    check([S3], lambda x: np.pad(x, ((0, 0), (0, 0), (1, 2))), lambda x: ag.pad(x, (1, 2)))


def test_pad_two_axes_value(check):
    check(
        [S3],
        lambda x: np.pad(x, ((0, 0), (2, 1), (1, 0)), constant_values=-1.5),
        lambda x: ag.pad(x, (1, 0, 2, 1), value=-1.5),
    )


def test_pad_negative_crops(check):
    check([S3], lambda x: np.pad(x[:, :2, 1:], ((1, 0), (0, 0), (0, 2))), lambda x: ag.pad(x, (-1, 2, 0, -1, 1, 0)))


# ---- squeeze / unsqueeze / flatten / permute ---------------------------------------------------------
def test_squeeze_all(check):
    check([(1, 3, 1, 2)], np.squeeze, ag.squeeze)


def test_squeeze_axis_keeps_non_unit(check):
    check([(1, 3, 1, 2)], lambda x: x.reshape(3, 1, 2), lambda x: x.squeeze((0, 1)))


def test_unsqueeze(check):
    check([S3], lambda x: x[:, :, None, :], lambda x: x.unsqueeze(-2))


def test_flatten(check):
    check([(2, 3, 2, 2)], lambda x: x.reshape(2, 12), lambda x: x.flatten(1))


def test_flatten_middle(check):
    check([(2, 3, 2, 2)], lambda x: x.reshape(2, 6, 2), lambda x: ag.flatten(x, 1, 2))


def test_permute(check):
    check([S3], lambda x: x.transpose(2, 0, 1), lambda x: x.permute(2, 0, 1))


def test_permute_tuple(check):
    check([(2, 3, 2, 2)], lambda x: x.transpose(0, 3, 1, 2), lambda x: ag.permute(x, (0, -1, 1, 2)))


# ---- embedding / gather / index_select ----------------------------------------------------------------
IDS = np.array([[1, 4, 1], [0, 4, 4]])


def test_embedding_numpy_ids(check):
    # repeated ids: their gradients add up in the table row
    check([(5, 3)], lambda t: t[IDS], lambda t: ag.embedding(IDS, t))


def test_embedding_tensor_ids(check, device):
    ids = nc.tensor(IDS.astype(np.int64), device=device)
    check([(5, 3)], lambda t: t[IDS], lambda t: ag.embedding(ids, t))


def test_embedding_int_node_ids(check, device):
    ids = ag.tensor(IDS[0].astype(np.int32), device=device)
    check([(5, 2)], lambda t: t[IDS[0]], lambda t: ag.embedding(ids, t), gradcheck=False)


GATHER_INDEX = np.array([[[0, 2, 2, 1], [1, 1, 0, 0]], [[2, 2, 2, 2], [0, 1, 2, 0]]])


def test_gather(check):
    check([S3], lambda x: np.take_along_axis(x, GATHER_INDEX[:, :, :], 1), lambda x: ag.gather(x, 1, GATHER_INDEX))


def test_gather_smaller_index(check):
    index = np.array([[[3, 0], [1, 1]]])  # index.shape (1, 2, 2) <= x.shape (2, 3, 4) off the axis
    check([S3], lambda x: np.take_along_axis(x[:1, :2, :], index, 2), lambda x: ag.gather(x, -1, index))


def test_index_select(check):
    index = np.array([3, 0, 3, 3])
    check([S3], lambda x: np.take(x, index, 2), lambda x: ag.index_select(x, 2, index))


def test_index_select_axis0_tensor_index(check, device):
    index = nc.tensor(np.array([1, 1, 0], dtype=np.int32), device=device)
    check([S3], lambda x: x[[1, 1, 0]], lambda x: ag.index_select(x, 0, index), gradcheck=False)


def test_index_select_large_repeats(device):
    """Counting-sort ranking with many repeats: every row's gradient is the count of its index."""
    index = np.random.default_rng(0).integers(0, 7, size=300)
    x = ag.tensor(np.zeros((7, 2), np.float32), requires_grad=True, device=device)
    with ag.Tape() as tape:
        y = ag.index_select(x, 0, index)
    tape.backward(ag.sum(y))
    expected = np.bincount(index, minlength=7)[:, None] * np.ones((1, 2))
    np.testing.assert_array_equal(x.grad.to_host(), expected)


def test_index_select_backward_sums_each_row_in_index_order(device):
    """Ranking a long index (several work-groups and staged tiles, a ragged last one): each row's gradient
    is the float32 sum of its positions' gradients taken in index order, bit for bit (no atomics)."""
    rng = np.random.default_rng(1)
    index = rng.integers(0, 37, size=1003).astype(np.int32)
    grad = rng.standard_normal((1003, 3)).astype(np.float32)
    x = ag.tensor(np.zeros((37, 3), np.float32), requires_grad=True, device=device)
    with ag.Tape() as tape:
        y = ag.index_select(x, 0, nc.tensor(index, device=device))
    tape.backward(y, ag.tensor(grad, device=device))
    expected = np.zeros((37, 3), np.float32)
    for position, row in enumerate(index):
        expected[row] += grad[position]
    np.testing.assert_array_equal(x.grad.to_host(), expected)
