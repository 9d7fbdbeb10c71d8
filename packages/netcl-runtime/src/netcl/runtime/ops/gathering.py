"""``gather`` (torch.gather) and its deterministic scatter-add backward.

``gather_backward`` gives each input element one work-item that sums, over the index's ``axis``,
the gradient entries whose index points at it (no atomics; cost ``x.size * index.shape[axis]``).
An index smaller than x off the axis (allowed, as in PyTorch) reads x cut to the index's extent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Tensor, contiguous_strides
from netcl.core.device_errors import INDEX_CHECK_C
from netcl.core.dtypes import C_TYPES
from netcl.core.errors import ShapeError
from netcl.runtime import results
from netcl.runtime.cache import register_cache
from netcl.runtime.ops._common import compute_ctype, device_of, pragmas, remember, storage_ctype
from netcl.runtime.ops._grid import index_ctype, index_dtype, params, prepare_1d, run_1d, scalars
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.indexing import check_axis, check_index_range, check_index_tensor, index_error_args, split3
from netcl.runtime.ops.strided import WORD, filled, strided_copy, strided_write

_TWINS = "netcl.runtime.numpy_twins.gathering"


# ---- gather ----------------------------------------------------------------------------------------
def check_gather_shapes(x_shape: Sequence[int], axis: Any, index_shape: Sequence[int]) -> int:
    """Validate ``gather`` by shapes; returns the normalized axis."""
    x_shape, index_shape = tuple(x_shape), tuple(index_shape)
    ax = check_axis(axis, len(x_shape), "gather")
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


_GATHER = """{check}
__kernel void netcl_gather(__global const {word}* x, __global const {it}* index, __global {word}* out,
                           __global int* err, const int code, {sizes}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    const long v = (long)index[gid];
    const {idx} o = gid / (J * I);
    const {idx} i = gid % I;
    if (v >= 0 && v < A) {{
        out[gid] = x[(o * A + ({idx})v) * I + i];
    }} else {{
        netcl_index_error(err, code, v, A);
        out[gid] = ({word})0;
    }}
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
    plan_key = None
    if type(x) is Tensor and type(index) is Tensor and type(axis) is int and index.device is x.device:
        plan_key = (x.shape, x.dtype, axis, index.shape, index.dtype, x.device)
        plan = _PLANS.get(plan_key)
        if plan is not None:  # OpenCL, shapes, dtypes and axis checked before, nothing to narrow
            nbytes, prepared = plan
            device = x.device
            out = results.tensor(device.allocator(device, nbytes), index.shape, x.dtype, device)
            prepared.call(x.data, index.data, out.data)
            return out
    ax, index = check_gather(x, axis, index)
    check_index_range(index, x.shape[ax], "gather", axis=ax)
    return gather_narrowed(x, _narrowed(x, ax, index.shape), ax, index, plan_key)


@backend_op(_TWINS)
def gather_narrowed(x: Tensor, xs: Tensor, ax: int, index: Tensor, plan_key: tuple | None) -> Tensor:
    """``gather`` after its checks, from ``xs`` (x cut to index's shape on every axis but ``ax``); an OpenCL
    launch keeps its plan under ``plan_key`` when nothing was cut."""
    out = Tensor.empty(index.shape, x.dtype, x.device)
    _, A, inner = split3(xs.shape, ax)
    J = index.shape[ax] if index.ndim else 1
    idx = index_ctype(out.size, xs.size)
    word, it = WORD[x.dtype.itemsize], C_TYPES[index.dtype]
    names = ["n", "A", "J", "I"]

    def source() -> str:
        return _GATHER.format(check=INDEX_CHECK_C, word=word, it=it, idx=idx, sizes=params(idx, names))

    types = [None, None, None, None, np.int32] + [index_dtype(idx)] * 4
    if out.size == 0:
        return out
    prepared = prepare_1d(("gather", word, it, idx), x.device, source, "netcl_gather", types, out.size)
    tail = (*index_error_args(x.device, "gather", axis=ax), *scalars(idx, [out.size, A, J, inner]))
    prepared.call(xs.data, index.data, out.data, *tail)
    if plan_key is not None and xs is x:
        remember(_PLANS, plan_key, (out.nbytes, prepared.with_trailing(tail)))
    return out


#: (x shape, x dtype, axis as given, index shape, index dtype, device) -> (out bytes, prepared launch with
#: its error word, code and sizes set) of an OpenCL ``gather`` whose checks passed once and that cut nothing from x
_PLANS: dict[tuple, tuple] = {}
register_cache(_PLANS.clear)


def gather_backward(grad: Tensor, axis: int, index: Tensor, shape: Sequence[int]) -> Tensor:
    """The gradient of ``gather(x, axis, index)`` w.r.t. x of ``shape``: a deterministic scatter-add."""
    shape = tuple(int(d) for d in shape)
    ax = axis % max(len(shape), 1)
    sizes = tuple(shape[d] if d == ax else index.shape[d] for d in range(len(shape)))
    narrow = gather_backward_narrow(grad, ax, index, sizes)
    if sizes == shape:
        return narrow
    out = filled(shape, 0, grad.dtype, grad.device)
    return strided_write(out, narrow, contiguous_strides(shape), 0)


@backend_op(_TWINS)
def gather_backward_narrow(grad: Tensor, ax: int, index: Tensor, sizes: tuple[int, ...]) -> Tensor:
    """``gather_backward`` on the part of x that ``gather`` read: ``sizes`` (index's shape but along ``ax``)."""
    narrow = Tensor.empty(sizes, grad.dtype, grad.device)
    _, A, inner = split3(sizes, ax)
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
    return narrow
