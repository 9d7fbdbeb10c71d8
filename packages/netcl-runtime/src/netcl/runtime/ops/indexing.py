"""Indexing: basic ``x[key]`` (views where the layout allows), ``gather``, ``index_select``, ``embedding``.

``getitem`` takes ints, slices (any step, negative indices), ``None`` and ``...``. The result is a
view sharing x's memory when it is one contiguous block of x (a reshape; on the NumPy backend a
NumPy view; on OpenCL a sub-buffer when the block starts at a multiple of the device's base
address alignment), otherwise a copy through the strided-copy kernel. ``getitem_backward``
scatters a gradient into zeros of x's shape (each position written once: no accumulation).

``gather``/``index_select`` follow ``torch.gather``/``torch.index_select``. Their backwards are
deterministic scatter-adds without atomics: ``gather_backward`` gives each input element one
work-item that sums over the index's ``axis`` (cost ``x.size * index.shape[axis]``);
``index_select_backward`` ranks the index values (a stable counting sort, ``J**2`` integer
compares for an index of length ``J``) and then sums each row's own positions in index order
(cost ``x.size * log J`` plus the gradient's size). Indices are checked on the host before any
launch (``IndexError``); for an index Tensor on an OpenCL device that reads it back, except while
a capture records (then an out-of-range index reads as 0 and sends no gradient).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Tensor, contiguous_strides
from netcl.core.dtypes import C_TYPES
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime.capture import is_recording
from netcl.runtime.ops._common import compute_ctype, device_of, pragmas, storage_ctype, wrap_numpy
from netcl.runtime.ops._grid import index_ctype, index_dtype, params, prod, run_1d, scalars
from netcl.runtime.ops.strided import _WORD, collapse, filled, strided_copy, strided_write

IndexKey = Any


# ---- basic indexing ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BasicIndex:
    """What ``x[key]`` selects: the strided view ``(shape, strides, offset)`` of C-contiguous x."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


def is_int_index(item: Any) -> bool:
    """A Python or NumPy integer (not a bool): an index that removes its axis."""
    return isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_))


def parse_index(shape: Sequence[int], key: IndexKey) -> BasicIndex:
    """The view ``key`` (ints, slices, None, Ellipsis) selects from a C-contiguous tensor of ``shape``."""
    shape = tuple(int(d) for d in shape)
    items = list(key) if isinstance(key, tuple) else [key]
    for item in items:
        if not (is_int_index(item) or item is None or item is Ellipsis or isinstance(item, slice)):
            raise IndexError(
                f"index {item!r} of type {type(item).__name__} is not supported: use ints, slices, None and ...; "
                "select with an integer array through gather / index_select / embedding"
            )
    if sum(item is Ellipsis for item in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for item in items if item is not None and item is not Ellipsis)
    if consumed > len(shape):
        raise IndexError(f"too many indices for a tensor of shape {shape}: {consumed} indexed dimensions")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(shape) - consumed)
    else:
        items += [slice(None)] * (len(shape) - consumed)
    strides = contiguous_strides(shape)
    out_shape: list[int] = []
    out_strides: list[int] = []
    offset = 0
    axis = 0
    for item in items:
        if item is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        size, stride = shape[axis], strides[axis]
        if is_int_index(item):
            value = int(item)
            if not -size <= value < size:
                raise IndexError(f"index {value} is out of bounds for axis {axis} with size {size}")
            offset += (value % size) * stride
        else:
            if item.step is not None and int(item.step) == 0:
                raise ValueError(f"slice step cannot be zero (axis {axis})")
            start, stop, step = item.indices(size)
            length = len(range(start, stop, step))
            if length:
                offset += start * stride
            out_shape.append(length)
            out_strides.append(stride * step)
        axis += 1
    return BasicIndex(tuple(out_shape), tuple(out_strides), offset if prod(out_shape) else 0)


def getitem(x: Tensor, key: IndexKey) -> Tensor:
    """``x[key]`` for basic keys: a view when the selection is one contiguous block, else a copy."""
    if not isinstance(x, Tensor):
        raise TypeError(f"getitem: expected a Tensor, got {type(x).__name__}")
    view = parse_index(x.shape, key)
    return contiguous_view(x, view) or strided_copy(x, view.shape, view.strides, view.offset)


def contiguous_view(x: Tensor, view: BasicIndex) -> Tensor | None:
    """``view`` of x as a Tensor sharing x's memory, or None when the layout does not allow it."""
    n = prod(view.shape)
    if n == 0:
        return Tensor.empty(view.shape, x.dtype, x.device)
    dims, steps = collapse(view.shape, view.strides)
    if not (n == 1 or (len(dims) == 1 and steps[0] == 1)):
        return None
    root = x.base if x.base is not None else x
    if n == x.size:
        return x.reshape(view.shape)
    if x.device.kind == "cpu":
        data = np.asarray(x.data).reshape(-1)[view.offset : view.offset + n].reshape(view.shape)
        return Tensor(data, view.shape, x.dtype, x.device, base=root)
    if x.data is not root.data:  # x is itself a sub-buffer: OpenCL has no sub-buffers of sub-buffers
        return None
    itemsize = x.dtype.itemsize
    align = max(x.device.cl_device.mem_base_addr_align // 8, 1)
    if (view.offset * itemsize) % align:
        return None
    data = x.data.get_sub_region(view.offset * itemsize, n * itemsize, cl.mem_flags.READ_WRITE)
    return Tensor(data, view.shape, x.dtype, x.device, base=root)


def getitem_backward(grad: Tensor, shape: Sequence[int], key: IndexKey) -> Tensor:
    """The gradient of ``x[key]`` w.r.t. x: ``grad`` written into zeros of ``shape``."""
    view = parse_index(shape, key)
    if tuple(grad.shape) != view.shape:
        raise ShapeError(f"getitem_backward: gradient shape {grad.shape} differs from the selection {view.shape}")
    out = filled(shape, 0, grad.dtype, grad.device)
    return strided_write(out, grad, view.strides, view.offset)


# ---- index validation ------------------------------------------------------------------------------
def check_index_tensor(index: Any, op: str, arg: str = "index") -> Tensor:
    """``index`` must be an integer Tensor."""
    if not isinstance(index, Tensor):
        raise TypeError(f"{op}: {arg} must be an integer Tensor, got {type(index).__name__}")
    if index.dtype.kind not in "iu":
        raise DTypeError(f"{op}: {arg} must be an integer tensor (int32/int64), got dtype {index.dtype}")
    return index


def check_index_range(
    index: Tensor | np.ndarray, size: int, op: str, arg: str = "index", axis: int | None = None
) -> None:
    """IndexError when some value of ``index`` is outside ``[0, size)``.

    Reads an OpenCL index back to the host (a synchronization point), except while a capture
    records on its queue: then the kernels' own guard applies (an out-of-range index reads 0).
    """
    if index.size == 0:
        return
    if isinstance(index, np.ndarray):
        host = index
    elif index.device.kind != "cpu" and is_recording(index.device.queue):
        return
    else:
        host = np.asarray(index.data) if index.device.kind == "cpu" else index.to_host()
    low, high = int(host.min()), int(host.max())
    if low < 0 or high >= size:
        bad = low if low < 0 else high
        where = f" along axis {axis}" if axis is not None else ""
        raise IndexError(f"{op}: {arg} value {bad} is out of range{where}: expected 0 <= {arg} < {size}")


def _axis(axis: Any, ndim: int, op: str) -> int:
    if not is_int_index(axis):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -ndim <= int(axis) < max(ndim, 1):
        raise np.exceptions.AxisError(f"{op}: axis {axis} is out of range for a {ndim}-d tensor")
    return int(axis) % max(ndim, 1)


def _split3(shape: Sequence[int], axis: int) -> tuple[int, int, int]:
    return prod(shape[:axis]), int(shape[axis]) if shape else 1, prod(shape[axis + 1 :])


# ---- gather ----------------------------------------------------------------------------------------
def check_gather_shapes(x_shape: Sequence[int], axis: Any, index_shape: Sequence[int]) -> int:
    """Validate ``gather`` by shapes; returns the normalized axis."""
    x_shape, index_shape = tuple(x_shape), tuple(index_shape)
    ax = _axis(axis, len(x_shape), "gather")
    if len(index_shape) != len(x_shape):
        raise ShapeError(
            f"gather: index must have as many dimensions as x ({len(x_shape)}), got index shape {index_shape}"
        )
    for d in range(len(x_shape)):
        if d != ax and index_shape[d] > x_shape[d]:
            raise ShapeError(
                f"gather: index shape {index_shape} exceeds x shape {x_shape} at axis {d} "
                f"(expected index.shape[d] <= x.shape[d] for every d != axis {ax})"
            )
    return ax


def check_gather(x: Tensor, axis: Any, index: Any) -> tuple[int, Tensor]:
    """Validate ``gather(x, axis, index)``; returns the normalized axis and the index."""
    index = check_index_tensor(index, "gather")
    device_of((x, index), "gather")
    return check_gather_shapes(x.shape, axis, index.shape), index


def _narrowed(x: Tensor, axis: int, index_shape: Sequence[int]) -> Tensor:
    """x cut to index_shape on every axis but ``axis`` (x itself when nothing is cut)."""
    sizes = tuple(x.shape[d] if d == axis else int(index_shape[d]) for d in range(x.ndim))
    if sizes == x.shape:
        return x
    return strided_copy(x, sizes, contiguous_strides(x.shape), 0)


_GATHER = """
__kernel void netcl_gather(__global const {word}* x, __global const {it}* index, __global {word}* out,
                           {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const long v = (long)index[gid];
    const {idx} o = gid / (J * I);
    const {idx} i = gid % I;
    out[gid] = (v >= 0 && v < A) ? x[(o * A + ({idx})v) * I + i] : ({word})0;
}}
"""

_GATHER_BACKWARD = """{pragmas}
__kernel void netcl_gather_backward(__global const {st}* g, __global const {it}* index, __global {st}* gx,
                                    {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} o = gid / (A * I);
    const {idx} a = (gid / I) % A;
    const {idx} i = gid % I;
    {ct} acc = 0;
    for ({idx} j = 0; j < J; ++j) {{
        const {idx} at = (o * J + j) * I + i;
        if ((long)index[at] == (long)a) acc += ({ct})g[at];
    }}
    gx[gid] = ({st})acc;
}}
"""


def gather(x: Tensor, axis: int, index: Tensor) -> Tensor:
    """``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along ``axis`` (torch.gather); shape of index."""
    ax, index = check_gather(x, axis, index)
    check_index_range(index, x.shape[ax], "gather", axis=ax)
    xs = _narrowed(x, ax, index.shape)
    if x.device.kind == "cpu":
        data = np.take_along_axis(np.asarray(xs.data), np.asarray(index.data).astype(np.int64), axis=ax)
        return wrap_numpy(data, x.device, x.dtype)
    out = Tensor.empty(index.shape, x.dtype, x.device)
    _, A, inner = _split3(xs.shape, ax)
    J = index.shape[ax] if index.ndim else 1
    idx = index_ctype(out.size, xs.size)
    word, it = _WORD[x.dtype.itemsize], C_TYPES[index.dtype]
    names = ["n", "A", "J", "I"]

    def source() -> str:
        return _GATHER.format(word=word, it=it, idx=idx, sizes=params(idx, names))

    types = [None, None, None] + [index_dtype(idx)] * 4
    run_1d(
        ("gather", word, it, idx),
        x.device,
        source,
        "netcl_gather",
        types,
        out.size,
        xs,
        index,
        out,
        *scalars(idx, [out.size, A, J, inner]),
    )
    return out


def gather_backward(grad: Tensor, axis: int, index: Tensor, shape: Sequence[int]) -> Tensor:
    """The gradient of ``gather(x, axis, index)`` w.r.t. x of ``shape``: a deterministic scatter-add."""
    shape = tuple(int(d) for d in shape)
    ax = axis % max(len(shape), 1)
    sizes = tuple(shape[d] if d == ax else index.shape[d] for d in range(len(shape)))
    if grad.device.kind == "cpu":
        gx = np.zeros(sizes, dtype=np.float64 if grad.dtype == np.float64 else np.float32)
        idx_host = np.asarray(index.data).astype(np.int64)
        coords = list(np.indices(index.shape, sparse=True))
        coords[ax] = idx_host
        np.add.at(gx, tuple(coords), np.asarray(grad.data, dtype=gx.dtype))
        narrow = wrap_numpy(gx, grad.device, grad.dtype)
    else:
        narrow = Tensor.empty(sizes, grad.dtype, grad.device)
        _, A, inner = _split3(sizes, ax)
        J = index.shape[ax] if index.ndim else 1
        idx = index_ctype(narrow.size, grad.size)
        st, ct, it = storage_ctype(grad.dtype), compute_ctype(grad.dtype), C_TYPES[index.dtype]
        names = ["n", "A", "J", "I"]

        def source() -> str:
            return _GATHER_BACKWARD.format(
                pragmas=pragmas([grad.dtype]), st=st, ct=ct, it=it, idx=idx, sizes=params(idx, names)
            )

        types = [None, None, None] + [index_dtype(idx)] * 4
        run_1d(
            ("gather_backward", st, it, idx),
            grad.device,
            source,
            "netcl_gather_backward",
            types,
            narrow.size,
            grad,
            index,
            narrow,
            *scalars(idx, [narrow.size, A, J, inner]),
        )
    if sizes == shape:
        return narrow
    out = filled(shape, 0, grad.dtype, grad.device)
    return strided_write(out, narrow, contiguous_strides(shape), 0)


# ---- index_select and embedding ------------------------------------------------------------------------
_INDEX_SELECT = """
__kernel void netcl_index_select(__global const {word}* x, __global const {it}* index, __global {word}* out,
                                 {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const {idx} i = gid % I;
    const {idx} j = (gid / I) % J;
    const {idx} o = gid / (J * I);
    const long v = (long)index[j];
    out[gid] = (v >= 0 && v < A) ? x[(o * A + ({idx})v) * I + i] : ({word})0;
}}
"""

_RANK = """
__kernel void netcl_rank_index(__global const {it}* index, __global int* perm, __global long* keys, const int J) {{
    const int j = get_global_id(0);
    if (j >= J) return;
    const long key = (long)index[j];
    int r = 0;
    for (int k = 0; k < J; ++k) {{
        const long other = (long)index[k];
        r += (other < key) || (other == key && k < j);
    }}
    perm[r] = j;
    keys[r] = key;
}}
"""

_INDEX_ADD = """{pragmas}
__kernel void netcl_index_add(__global const {st}* g, __global const int* perm, __global const long* keys,
                              __global {st}* gx, {sizes}) {{
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
    {ct} acc = 0;
    for (int r = lo; r < (int)J && keys[r] == (long)a; ++r) {{
        acc += ({ct})g[(o * J + perm[r]) * I + i];
    }}
    gx[gid] = ({st})acc;
}}
"""


def check_index_select_shapes(x_shape: Sequence[int], axis: Any, index_shape: Sequence[int]) -> int:
    """Validate ``index_select`` by shapes; returns the normalized axis."""
    if not len(x_shape):
        raise ShapeError("index_select: x must have at least one dimension, got a 0-d tensor")
    ax = _axis(axis, len(x_shape), "index_select")
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
    ax, index = check_index_select(x, axis, index)
    check_index_range(index, x.shape[ax], "index_select", axis=ax)
    J = index.size
    out_shape = (*x.shape[:ax], J, *x.shape[ax + 1 :])
    if x.device.kind == "cpu":
        data = np.take(np.asarray(x.data), np.asarray(index.data).reshape(-1).astype(np.int64), axis=ax)
        return wrap_numpy(data, x.device, x.dtype)
    out = Tensor.empty(out_shape, x.dtype, x.device)
    _, A, inner = _split3(x.shape, ax)
    idx = index_ctype(out.size, x.size)
    word, it = _WORD[x.dtype.itemsize], C_TYPES[index.dtype]

    def source() -> str:
        return _INDEX_SELECT.format(word=word, it=it, idx=idx, sizes=params(idx, ["n", "A", "J", "I"]))

    types = [None, None, None] + [index_dtype(idx)] * 4
    run_1d(
        ("index_select", word, it, idx),
        x.device,
        source,
        "netcl_index_select",
        types,
        out.size,
        x,
        index,
        out,
        *scalars(idx, [out.size, A, J, inner]),
    )
    return out


def index_select_backward(grad: Tensor, axis: int, index: Tensor, shape: Sequence[int]) -> Tensor:
    """The gradient of ``index_select(x, axis, index)`` w.r.t. x of ``shape``: repeated indices add up."""
    shape = tuple(int(d) for d in shape)
    ax = axis % len(shape)
    if grad.device.kind == "cpu":
        gx = np.zeros(shape, dtype=np.float64 if grad.dtype == np.float64 else np.float32)
        where = (slice(None),) * ax + (np.asarray(index.data).reshape(-1).astype(np.int64),)
        np.add.at(gx, where, np.asarray(grad.data, dtype=gx.dtype))
        return wrap_numpy(gx, grad.device, grad.dtype)
    out = Tensor.empty(shape, grad.dtype, grad.device)
    J = index.size
    if J == 0:
        return filled(shape, 0, grad.dtype, grad.device)
    _, A, inner = _split3(shape, ax)
    device = grad.device
    perm = Tensor.empty((J,), np.int32, device)
    keys = Tensor.empty((J,), np.int64, device)
    it = C_TYPES[index.dtype]
    run_1d(
        ("rank_index", it),
        device,
        lambda: _RANK.format(it=it),
        "netcl_rank_index",
        [None, None, None, np.int32],
        J,
        index,
        perm,
        keys,
        np.int32(J),
    )
    idx = index_ctype(out.size, grad.size)
    st, ct = storage_ctype(grad.dtype), compute_ctype(grad.dtype)

    def source() -> str:
        return _INDEX_ADD.format(
            pragmas=pragmas([grad.dtype]), st=st, ct=ct, idx=idx, sizes=params(idx, ["n", "A", "J", "I"])
        )

    types = [None, None, None, None] + [index_dtype(idx)] * 4
    run_1d(
        ("index_add", st, idx),
        device,
        source,
        "netcl_index_add",
        types,
        out.size,
        grad,
        perm,
        keys,
        out,
        *scalars(idx, [out.size, A, J, inner]),
    )
    return out


def check_embedding(ids: Any, table: Tensor) -> Tensor:
    """Validate ``embedding(ids, table)``: a 2-d table and integer ids on its device."""
    ids = check_index_tensor(ids, "embedding", "ids")
    if not isinstance(table, Tensor) or table.ndim != 2:
        got = table.shape if isinstance(table, Tensor) else type(table).__name__
        raise ShapeError(f"embedding: table must be 2-d (num_embeddings, embedding_dim), got {got}")
    device_of((ids, table), "embedding")
    return ids


def embedding(ids: Tensor, table: Tensor) -> Tensor:
    """Rows of ``table`` (V, D) at ``ids`` (any shape): shape ``ids.shape + (D,)``."""
    ids = check_embedding(ids, table)
    check_index_range(ids, table.shape[0], "embedding", "ids")
    rows = index_select(table, 0, ids.reshape(ids.size))
    return rows.reshape(*ids.shape, table.shape[1])
