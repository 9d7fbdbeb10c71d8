"""Strided reads and writes: the copy kernels behind slicing, narrow, concat, split and pad.

A strided view of a C-contiguous tensor ``x`` is ``(shape, strides, offset)`` in elements:
element ``(i0, ..., ik)`` is ``x.flat[offset + i0 * strides[0] + ... + ik * strides[k]]``
(strides may be negative or zero). ``strided_copy`` materializes such a view as a new tensor;
``strided_write`` writes a tensor into such a view of ``dst`` in place. Adjacent dimensions that
are contiguous with each other are merged first, so most calls run at rank 1-3. The kernels are
specialized on the rank and the element width only (values are moved as raw 1/2/4/8-byte words);
sizes, strides and the offset are kernel arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor, contiguous_strides
from netcl.runtime.cache import register_cache
from netcl.runtime.launch import PreparedLaunch, enqueue_fill
from netcl.runtime.ops._common import remember
from netcl.runtime.ops._grid import index_ctype, params, prepare_1d, prod, scalars
from netcl.runtime.ops.backend import backend_op

_TWINS = "netcl.runtime.numpy_twins.strided"

WORD = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}

Layout = tuple[tuple[int, ...], tuple[int, ...], int]


def collapse(shape: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[int]]:
    """Drop size-1 dims and merge neighbours whose strides chain; at least one dim remains."""
    dims: list[int] = []
    steps: list[int] = []
    for d, s in zip(shape, strides, strict=True):
        if d == 1:
            continue
        if dims and steps[-1] == s * d:
            dims[-1] *= d
            steps[-1] = s
        else:
            dims.append(int(d))
            steps.append(int(s))
    return (dims, steps) if dims else ([1], [1])


def extent(shape: Sequence[int], strides: Sequence[int], offset: int) -> tuple[int, int]:
    """Smallest and largest flat position a non-empty view touches."""
    low = high = offset
    for d, s in zip(shape, strides, strict=True):
        reach = (d - 1) * s
        low, high = low + min(reach, 0), high + max(reach, 0)
    return low, high


#: (size, shape, strides, offset) of views ``_check_bounds`` passed: a repeated view is not walked again
_IN_BOUNDS: dict[tuple, bool] = {}
register_cache(_IN_BOUNDS.clear)
#: (device, src shape, dst shape, word bytes, view shape, strides, offset, write) -> ``prepare_launch``'s result
_LAUNCHES: dict[tuple, tuple[PreparedLaunch, list[Any]]] = {}
register_cache(_LAUNCHES.clear)


def _check_bounds(op: str, size: int, shape: Sequence[int], strides: Sequence[int], offset: int) -> None:
    key = (size, shape, strides, offset)
    if key in _IN_BOUNDS:
        return
    if prod(shape) == 0:
        return
    low, high = extent(shape, strides, offset)
    if low >= 0 and high < size:
        remember(_IN_BOUNDS, key, True)
    else:
        raise IndexError(
            f"{op}: view (shape {tuple(shape)}, strides {tuple(strides)}, offset {offset}) reaches flat "
            f"positions [{low}, {high}] outside a tensor of {size} elements"
        )


def _source(rank: int, word: str, idx: str, write: bool) -> str:
    names = [f"d{k}" for k in range(1, rank)] + [f"s{k}" for k in range(rank)]
    lines = [f"{idx} rest = gid;", f"{idx} pos = offset;"]
    for k in range(rank - 1, 0, -1):
        lines += [f"pos += (rest % d{k}) * s{k};", f"rest /= d{k};"]
    lines.append("pos += rest * s0;")
    move = "dst[pos] = src[gid];" if write else "dst[gid] = src[pos];"
    body = "\n    ".join(lines)
    return f"""
__kernel void netcl_strided(__global const {word}* src, __global {word}* dst, const {idx} n,
                            const {idx} offset, {params(idx, names)}) {{
    const {idx} gid = ({idx})get_global_id(0);
    if (gid >= n) return;
    {body}
    {move}
}}
"""


def _launch(src: Tensor, dst: Tensor, shape: Sequence[int], strides: Sequence[int], offset: int, write: bool) -> None:
    key = (src.device, src.shape, dst.shape, src.dtype.itemsize, shape, strides, offset, write)
    planned = _LAUNCHES.get(key)
    if planned is None:
        planned = remember(_LAUNCHES, key, prepare_launch(src, dst, shape, strides, offset, write))
    prepared, values = planned
    prepared.call(src.data, dst.data, *values)


def prepare_launch(
    src: Tensor, dst: Tensor, shape: Sequence[int], strides: Sequence[int], offset: int, write: bool
) -> tuple[PreparedLaunch, list[Any]]:
    """The copy kernel's launch for a non-empty view and its size arguments: ``prepared.call(src.data,
    dst.data, *values)`` runs it (for ``src`` and ``dst`` of the same sizes and dtype, on the same device)."""
    dims, steps = collapse(shape, strides)
    n = prod(dims)
    low, high = extent(dims, steps, offset)
    idx = index_ctype(n, low, high, max(src.size, dst.size))
    word = WORD[src.dtype.itemsize]
    rank = len(dims)
    key = ("strided", "write" if write else "read", rank, word, idx)
    arg_types = [None, None] + [np.dtype(np.int64 if idx == "long" else np.int32)] * (2 * rank + 1)
    values = scalars(idx, [n, offset, *dims[1:], *steps])
    prepared = prepare_1d(key, src.device, lambda: _source(rank, word, idx, write), "netcl_strided", arg_types, n)
    return prepared, values


def strided_copy(x: Tensor, shape: Sequence[int], strides: Sequence[int], offset: int = 0) -> Tensor:
    """A new C-contiguous tensor holding the strided view ``(shape, strides, offset)`` of ``x``."""
    shape = tuple(int(d) for d in shape)
    strides = tuple(int(s) for s in strides)
    _check_bounds("strided_copy", x.size, shape, strides, offset)
    return copy_view(x, shape, strides, offset)


@backend_op(_TWINS)
def copy_view(x: Tensor, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Tensor:
    """``strided_copy`` of a checked call."""
    out = Tensor.empty(shape, x.dtype, x.device)
    if out.size:
        _launch(x, out, shape, strides, offset, write=False)
    return out


def strided_write(dst: Tensor, src: Tensor, strides: Sequence[int], offset: int = 0) -> Tensor:
    """Write ``src`` into the strided view ``(src.shape, strides, offset)`` of ``dst``, in place.

    The view must not touch one position twice (basic slices never do); returns ``dst``.
    """
    if src.dtype != dst.dtype:
        raise TypeError(f"strided_write: source dtype {src.dtype} differs from destination dtype {dst.dtype}")
    strides = tuple(int(s) for s in strides)
    _check_bounds("strided_write", dst.size, src.shape, strides, offset)
    if src.size == 0:
        return dst
    return write_view(dst, src, strides, offset)


@backend_op(_TWINS)
def write_view(dst: Tensor, src: Tensor, strides: tuple[int, ...], offset: int) -> Tensor:
    """``strided_write`` of a checked call with a non-empty ``src``."""
    _launch(src, dst, src.shape, strides, offset, write=True)
    return dst


@backend_op(_TWINS, device_arg="device")
def filled(shape: Sequence[int], value: float, dtype: np.dtype, device: Device) -> Tensor:
    """A new tensor of ``shape`` set to ``value`` by a fill command (no shape-specialized kernel)."""
    shape = tuple(int(d) for d in shape)
    out = Tensor.empty(shape, dtype, device)
    if out.nbytes:
        enqueue_fill(device.queue, out, value, dtype)
    return out


def region_layout(shape: Sequence[int], starts: Sequence[int], sizes: Sequence[int]) -> Layout:
    """The strided layout of the box ``[starts, starts + sizes)`` of a C-contiguous ``shape``."""
    strides = contiguous_strides(tuple(shape))
    offset = sum(int(a) * int(s) for a, s in zip(starts, strides, strict=True))
    return tuple(int(d) for d in sizes), tuple(strides), offset
