"""NumPy twins of ``netcl.runtime.ops.strided`` (arguments already checked there)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from netcl.core import Device, Tensor
from netcl.runtime.ops._grid import prod


def _positions(shape: Sequence[int], strides: Sequence[int], offset: int) -> np.ndarray:
    """Flat source positions of every element of the view."""
    pos = np.full(tuple(shape), offset, dtype=np.int64)
    for axis, (d, s) in enumerate(zip(shape, strides, strict=True)):
        line = np.arange(d, dtype=np.int64) * s
        pos += line.reshape((-1,) + (1,) * (len(shape) - axis - 1))
    return pos


def copy_view(x: Tensor, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Tensor:
    flat = np.asarray(x.data).reshape(-1)
    data = flat[_positions(shape, strides, offset)] if prod(shape) else np.empty(shape, x.dtype)
    return Tensor(np.ascontiguousarray(data, dtype=x.dtype), shape, x.dtype, x.device)


def write_view(dst: Tensor, src: Tensor, strides: tuple[int, ...], offset: int) -> Tensor:
    if not dst.data.flags.c_contiguous:
        raise ValueError("strided_write: destination array is not C-contiguous")
    flat = dst.data.reshape(-1)  # a view of a C-contiguous array
    flat[_positions(src.shape, strides, offset)] = np.asarray(src.data)
    return dst


def filled(shape: Sequence[int], value: float, dtype: np.dtype, device: Device) -> Tensor:
    shape = tuple(int(d) for d in shape)
    return Tensor(np.full(shape, value, dtype=dtype), shape, np.dtype(dtype), device)
