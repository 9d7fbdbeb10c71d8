"""``index_select`` (torch.index_select), ``embedding``, and their deterministic scatter-add backward.

``index_select_backward`` ranks the index values (a stable counting sort: ``J**2`` integer
compares for an index of length ``J``; a work-group of up to 256 work-items ranks 32 positions, each
work-item comparing against a slice of the index) and then gives each element of the input gradient
one work-item that sums its own positions in index order (binary search in the sorted keys: cost
``x.size * log J`` plus the gradient's size). No atomics, so results repeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.device_errors import INDEX_CHECK_C
from netcl.core.dtypes import C_TYPES
from netcl.core.errors import ShapeError
from netcl.runtime import results
from netcl.runtime.cache import register_cache
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import (
    compute_ctype,
    device_of,
    get_kernel,
    pow2_floor,
    pragmas,
    remember,
    storage_ctype,
)
from netcl.runtime.ops._grid import index_ctype, index_dtype, params, prepare_1d, prepared_for, scalars
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.indexing import check_axis, check_index_range, check_index_tensor, index_error_args, split3
from netcl.runtime.ops.strided import WORD, filled

_TWINS = "netcl.runtime.numpy_twins.selecting"

# ---- index_select and embedding ------------------------------------------------------------------------
#: ``wide`` (uniform): the sizes count vectors of ``COPY_BYTES`` (``{vector}``), each work-item copying one, else
#: elements (see ``select_along``)
_INDEX_SELECT = """{check}
__kernel void netcl_index_select(__global const {word}* x, __global const {it}* index, __global {word}* out,
                                 __global int* err, const int code, {sizes}, const int wide) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} i = gid % I;
    const {idx} j = (gid / I) % J;
    const {idx} o = gid / (J * I);
    const long v = (long)index[j];
    const int inside = v >= 0 && v < A;
    if (!inside && gid % I == 0 && o == 0) netcl_index_error(err, code, v, A);
    const {idx} from = (o * A + ({idx})(inside ? v : 0)) * I + i;
    if (wide) {{
        ((__global {vector}*)out)[gid] = inside ? ((__global const {vector}*)x)[from] : ({vector})0;
    }} else {{
        out[gid] = inside ? x[from] : ({word})0;
    }}
}}
"""

#: bytes one work-item of ``index_select`` copies where every selected run of elements holds whole vectors of them
#: (one vector load and store; the buffers' bases are aligned to it), else one element
COPY_BYTES = 16


def vector_run(itemsize: int, inner: int, vectors: bool = True) -> tuple[int, int]:
    """(elements in a ``COPY_BYTES`` vector, elements a work-item takes): the vector where ``vectors`` and
    every selected run of ``inner`` elements holds whole ones, else one element."""
    per_vector = COPY_BYTES // itemsize
    return per_vector, per_vector if vectors and inner % per_vector == 0 else 1


_RANK = """
__kernel void netcl_rank_index(__global const {it}* index, __global int* perm, __global long* keys, const int J,
                               const int rows) {{
    /* A work-group ranks ``rows`` positions; its L work-items split each staged tile of L index values
       into L / rows slices, one slice a work-item, and the slices' counts are summed at the end. */
    __local long tile[RANK_LOCAL];
    __local int counts[RANK_LOCAL];
    const int t = get_local_id(0), L = get_local_size(0);
    const int row = t % rows, slice = t / rows, per_slice = rows;
    const int j = get_group_id(0) * rows + row;
    const long key = j < J ? (long)index[j] : 0;
    int r = 0;
    for (int base = 0; base < J; base += L) {{
        tile[t] = base + t < J ? (long)index[base + t] : 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        const int end = min(slice * per_slice + per_slice, J - base);
        for (int c = slice * per_slice; c < end; ++c) {{
            const long other = tile[c];
            r += (other < key) || (other == key && base + c < j);
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    counts[t] = r;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (slice == 0 && j < J) {{
        int rank = 0;
        for (int s = 0; s < L / rows; ++s) rank += counts[s * rows + row];
        perm[rank] = j;
        keys[rank] = key;
    }}
}}
"""
#: work-items of a rank work-group (at most) and the most positions one work-group ranks
RANK_LOCAL, RANK_ROWS = 256, 32


def rank_rows(length: int, local: int, compute_units: int) -> int:
    """Positions a rank work-group takes: ``RANK_ROWS``, fewer (a power of two, at least 1) where that
    would leave fewer than two work-groups a compute unit (each still scans every index; the ranks are
    integers, the same whatever the split)."""
    return min(RANK_ROWS, local, pow2_floor(length // (2 * compute_units)))


#: ``wide`` (uniform; float32 and float64 only): the sizes count vectors of ``COPY_BYTES`` (``{vector}``), a
#: work-item summing one (each lane in the order an element's sum takes), else elements
_INDEX_ADD = """{pragmas}
__kernel void netcl_index_add(__global const {st}* g, __global const int* perm, __global const long* keys,
                              __global {st}* gx, {sizes}, const int wide) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} i = gid % I;
    const {idx} a = (gid / I) % A;
    const {idx} o = gid / (A * I);
    int lo = 0, hi = (int)J;
    while (lo < hi) {{
        const int mid = (lo + hi) / 2;
        if (keys[mid] < (long)a) lo = mid + 1; else hi = mid;
    }}
    {wide_sum}
    {ct} acc = 0;
    for (int r = lo; r < (int)J && keys[r] == (long)a; ++r) {{
        acc += ({ct})g[(o * J + perm[r]) * I + i];
    }}
    gx[gid] = ({st})acc;
}}
"""
_INDEX_ADD_WIDE = """if (wide) {{
        {vector} acc = 0;
        for (int r = lo; r < (int)J && keys[r] == (long)a; ++r) {{
            acc += ((__global const {vector}*)g)[(o * J + perm[r]) * I + i];
        }}
        ((__global {vector}*)gx)[gid] = acc;
        return;
    }}"""


def check_index_select_shapes(x_shape: Sequence[int], axis: Any, index_shape: Sequence[int]) -> int:
    """Validate ``index_select`` by shapes; returns the normalized axis."""
    if not len(x_shape):
        raise ShapeError("index_select: x must have at least one dimension, got a 0-d tensor")
    ax = check_axis(axis, len(x_shape), "index_select")
    if len(index_shape) > 1:
        raise ShapeError(f"index_select: index must be 0-d or 1-d, got shape {tuple(index_shape)}")
    return ax


def check_index_select(x: Tensor, axis: Any, index: Any) -> tuple[int, Tensor]:
    """Validate ``index_select(x, axis, index)``; returns the normalized axis and the index."""
    index = check_index_tensor(index, "index_select")
    device_of((x, index), "index_select")
    return check_index_select_shapes(x.shape, axis, index.shape), index


def index_select(x: Tensor, axis: int, index: Tensor) -> Tensor:
    """x's entries at positions ``index`` (1-d) along ``axis`` (torch.index_select)."""
    if type(x) is Tensor and type(index) is Tensor and type(axis) is int and index.device is x.device:
        plan = _PLANS.get((x.shape, x.dtype, axis, index.shape, index.dtype, x.device))
        if plan is not None:  # OpenCL, shapes, dtypes and axis checked before: no host check left
            out_shape, nbytes, prepared = plan
            device = x.device
            out = results.tensor(device.allocator(device, nbytes), out_shape, x.dtype, device)
            prepared.call(x.data, index.data, out.data)
            return out
    ax, index = check_index_select(x, axis, index)
    check_index_range(index, x.shape[ax], "index_select", axis=ax)
    plan_key = None
    if type(x) is Tensor and type(index) is Tensor and type(axis) is int:
        plan_key = (x.shape, x.dtype, axis, index.shape, index.dtype, x.device)
    return select_along(x, ax, index, ("index_select", "index", ax), plan_key)


@backend_op(_TWINS)
def select_along(
    x: Tensor, ax: int, index: Tensor, reported_as: tuple[str, str, int | None], plan_key: tuple | None = None
) -> Tensor:
    """``index_select`` after its checks; an out-of-range index is reported as (op, arg, axis) says.
    ``plan_key``: where an OpenCL launch keeps its plan for ``index_select``'s next call of these shapes."""
    J = index.size
    out_shape = (*x.shape[:ax], J, *x.shape[ax + 1 :])
    out = Tensor.empty(out_shape, x.dtype, x.device)
    _, A, inner = split3(x.shape, ax)
    idx = index_ctype(out.size, x.size)
    word, it = WORD[x.dtype.itemsize], C_TYPES[index.dtype]
    per_vector, width = vector_run(x.dtype.itemsize, inner)  # width: elements a work-item copies

    def source() -> str:
        return _INDEX_SELECT.format(check=INDEX_CHECK_C, word=word, vector=f"{word}{per_vector}", it=it, idx=idx,
                                    sizes=params(idx, ["n", "A", "J", "I"]))  # fmt: skip

    types = [None, None, None, None, np.int32] + [index_dtype(idx)] * 4 + [np.int32]
    if out.size == 0:
        return out
    prepared = prepare_1d(
        ("index_select", word, it, idx), x.device, source, "netcl_index_select", types, out.size // width
    )
    sizes = scalars(idx, [out.size // width, A, J, inner // width])
    tail = (*index_error_args(x.device, *reported_as), *sizes, np.int32(width > 1))
    prepared.call(x.data, index.data, out.data, *tail)
    if plan_key is not None:
        remember(_PLANS, plan_key, (out.shape, out.nbytes, prepared.with_trailing(tail)))
    return out


#: (x shape, x dtype, axis as given, index shape, index dtype, device) -> (out shape, out bytes, prepared
#: launch with its error word, code and sizes set) of an OpenCL ``index_select`` whose checks passed once
_PLANS: dict[tuple, tuple] = {}
register_cache(_PLANS.clear)


@backend_op(_TWINS)
def index_select_backward(grad: Tensor, axis: int, index: Tensor, shape: Sequence[int]) -> Tensor:
    """The gradient of ``index_select(x, axis, index)`` w.r.t. x of ``shape``: repeated indices add up.

    A repeated signature (shapes, dtypes, axis, device) reuses its two prepared launches and sizes."""
    device = grad.device
    key = (device, grad.shape, grad.dtype, axis, index.shape, index.dtype, tuple(shape))
    plan = _BACKWARD_PLANS.get(key)
    if plan is not None:
        out_shape, nbytes, J, rank, add = plan
        allocate = device.allocator
        out = results.tensor(allocate(device, nbytes), out_shape, grad.dtype, device)
        perm = results.tensor(allocate(device, 4 * J), (J,), _INT32, device)
        keys = results.tensor(allocate(device, 8 * J), (J,), _INT64, device)
        rank.call(index.data, perm.data, keys.data)
        add.call(grad.data, perm.data, keys.data, out.data)
        return out
    shape = tuple(int(d) for d in shape)
    ax = axis % len(shape)
    out = Tensor.empty(shape, grad.dtype, grad.device)
    J = index.size
    if J == 0:
        return filled(shape, 0, grad.dtype, grad.device)
    _, A, inner = split3(shape, ax)
    perm = Tensor.empty((J,), np.int32, device)
    keys = Tensor.empty((J,), np.int64, device)
    it = C_TYPES[index.dtype]
    rank, rank_tail = _rank_launch(device, it, J)
    rank.call(index.data, perm.data, keys.data, *rank_tail)
    idx = index_ctype(out.size, grad.size)
    st, ct = storage_ctype(grad.dtype), compute_ctype(grad.dtype)
    vectors = st == ct  # sums in the storage type (float32, float64): a vector of it holds the sums
    per_vector, width = vector_run(grad.dtype.itemsize, inner, vectors)  # width: elements a work-item sums

    def source() -> str:
        wide_sum = _INDEX_ADD_WIDE.format(vector=f"{st}{per_vector}") if vectors else ""
        return _INDEX_ADD.format(pragmas=pragmas([grad.dtype]), st=st, ct=ct, idx=idx, wide_sum=wide_sum,
                                 sizes=params(idx, ["n", "A", "J", "I"]))  # fmt: skip

    types = [None, None, None, None] + [index_dtype(idx)] * 4 + [np.int32]
    if out.size == 0:
        return out
    add = prepare_1d(("index_add", st, idx), device, source, "netcl_index_add", types, out.size // width)
    add_tail = (*scalars(idx, [out.size // width, A, J, inner // width]), np.int32(width > 1))
    add.call(grad.data, perm.data, keys.data, out.data, *add_tail)
    remember(_BACKWARD_PLANS, key, (shape, out.nbytes, J, rank.with_trailing(rank_tail), add.with_trailing(add_tail)))
    return out


def _rank_launch(device: Device, it: str, length: int) -> tuple[PreparedLaunch, tuple]:
    """The rank kernel's launch over ``length`` positions and its scalar arguments (length, rows a work-group)."""
    resolved = get_kernel(
        ("layers", "rank_index", it),
        device,
        lambda: f"#define RANK_LOCAL {RANK_LOCAL}\n" + _RANK.format(it=it),
        "netcl_rank_index",
        [None, None, None, np.int32, np.int32],
    )
    local = min(RANK_LOCAL, resolved.max_local)
    rows = rank_rows(length, local, device.cl_device.max_compute_units)
    groups = -(-length // rows)
    launch = prepared_for(("layers", "rank_index", it), device, resolved.kernel, (groups * local,), (local,))
    return launch, (np.int32(length), np.int32(rows))


_INT32, _INT64 = np.dtype(np.int32), np.dtype(np.int64)
#: (device, grad shape, grad dtype, axis, index shape, index dtype, x shape) -> (x shape, its bytes, index
#: count, the rank launch and the index-add launch, each with its scalar arguments set) of a backward
_BACKWARD_PLANS: dict[tuple, tuple] = {}
register_cache(_BACKWARD_PLANS.clear)


def check_embedding(ids: Any, table: Tensor) -> Tensor:
    """Validate ``embedding(ids, table)``: a 2-d table and integer ids on its device."""
    ids = check_index_tensor(ids, "embedding", "ids")
    if not isinstance(table, Tensor) or table.ndim != 2:
        got = table.shape if isinstance(table, Tensor) else type(table).__name__
        raise ShapeError(f"embedding: table must be 2-d (num_embeddings, embedding_dim), got {got}")
    device_of((ids, table), "embedding")
    return ids


def embedding(ids: Tensor, table: Tensor) -> Tensor:
    """Rows of ``table`` (V, D) at ``ids`` (any shape): shape ``ids.shape + (D,)``.

    On OpenCL a repeated signature (shapes, dtypes, device) launches its prepared kernel: an id out of
    range is still reported by the kernel, at the next wait (``netcl.core.device_errors``)."""
    plan_key = None
    if type(ids) is Tensor and type(table) is Tensor and ids.device is table.device:
        plan_key = ("embedding", table.shape, table.dtype, ids.shape, ids.dtype, table.device)
        plan = _PLANS.get(plan_key)
        if plan is not None:
            _, nbytes, prepared = plan
            device = table.device
            out = results.tensor(device.allocator(device, nbytes), (*ids.shape, table.shape[1]), table.dtype, device)
            prepared.call(table.data, ids.data, out.data)
            return out
    ids = check_embedding(ids, table)
    check_index_range(ids, table.shape[0], "embedding", "ids")
    rows = select_along(table, 0, ids.reshape(ids.size), ("embedding", "ids", None), plan_key)
    return rows.reshape(*ids.shape, table.shape[1])
