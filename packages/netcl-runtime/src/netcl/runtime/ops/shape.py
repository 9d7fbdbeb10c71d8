"""Shape ops built on the strided copies: ``concat``, ``narrow``, ``pad`` (torch ``F.pad``, constant mode).

Each is a handful of strided-copy launches (one per input of ``concat``), never a loop over
elements; the same functions serve both backends through ``strided``'s NumPy twins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Tensor, contiguous_strides
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime.ops._common import device_of
from netcl.runtime.ops.strided import filled, region_layout, strided_copy, strided_write


def normalize_axis(axis: Any, ndim: int, op: str, arg: str = "axis") -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int (AxisError naming the op otherwise)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: {arg} must be an int, got {axis!r}")
    if not -ndim <= int(axis) < ndim:
        raise np.exceptions.AxisError(
            f"{op}: {arg} {axis} is out of range for a {ndim}-d tensor (expected -{ndim} <= {arg} < {ndim})"
        )
    return int(axis) % ndim


# ---- concat / narrow -------------------------------------------------------------------------------
def concat_shape(
    shapes: Sequence[Sequence[int]], dtypes: Sequence[Any], axis: Any, op: str = "concat"
) -> tuple[int, tuple[int, ...]]:
    """Validate ``concat`` operands by shape and dtype; returns (axis, output shape)."""
    if not shapes:
        raise ValueError(f"{op}: expected a non-empty sequence of tensors")
    first = tuple(shapes[0])
    if not first:
        raise ShapeError(f"{op}: zero-dimensional tensors cannot be concatenated")
    ax = normalize_axis(axis, len(first), op)
    for k, shape in enumerate(shapes):
        shape = tuple(shape)
        if len(shape) != len(first) or any(
            d != e for i, (d, e) in enumerate(zip(shape, first, strict=False)) if i != ax
        ):
            raise ShapeError(
                f"{op}: tensor {k} has shape {shape} but tensor 0 has {first}: shapes must match except along axis {ax}"
            )
    if len({np.dtype(d) for d in dtypes}) > 1:
        raise DTypeError(f"{op}: tensors have different dtypes {[str(np.dtype(d)) for d in dtypes]}")
    total = sum(int(s[ax]) for s in shapes)
    return ax, (*first[:ax], total, *first[ax + 1 :])


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """The tensors joined along ``axis`` (all other dimensions equal)."""
    tensors = list(tensors)
    for k, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"concat: item {k} is a {type(t).__name__}, expected a Tensor")
    ax, out_shape = concat_shape([t.shape for t in tensors], [t.dtype for t in tensors], axis)
    device = device_of(tensors, "concat")
    out = Tensor.empty(out_shape, tensors[0].dtype, device)
    strides = contiguous_strides(out_shape)
    start = 0
    for t in tensors:
        strided_write(out, t, strides, start * strides[ax])
        start += t.shape[ax]
    return out


def narrow(x: Tensor, axis: int, start: int, length: int) -> Tensor:
    """A copy of ``x`` restricted to ``[start, start + length)`` along ``axis``."""
    ax = normalize_axis(axis, x.ndim, "narrow")
    if start < 0 or length < 0 or start + length > x.shape[ax]:
        raise IndexError(f"narrow: [{start}, {start + length}) is outside axis {ax} of size {x.shape[ax]}")
    starts = [0] * x.ndim
    sizes = list(x.shape)
    starts[ax], sizes[ax] = start, length
    return strided_copy(x, *region_layout(x.shape, starts, sizes))


# ---- pad --------------------------------------------------------------------------------------------
def pad_widths(shape: Sequence[int], pad: Any, op: str = "pad") -> list[tuple[int, int]]:
    """Per-axis (before, after) from a torch-order pad tuple (last axis first); ValueError on a bad tuple."""
    shape = tuple(shape)
    if not isinstance(pad, (tuple, list)) or not all(
        isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in pad
    ):
        raise ValueError(f"{op}: pad must be a tuple of ints, got {pad!r}")
    if len(pad) % 2 or len(pad) // 2 > len(shape):
        raise ValueError(
            f"{op}: pad {tuple(pad)} must have an even length of at most 2 * ndim = {2 * len(shape)} "
            f"for x shape {shape} (pairs (before, after), last axis first)"
        )
    widths = [(0, 0)] * len(shape)
    for k in range(len(pad) // 2):
        axis = len(shape) - 1 - k
        widths[axis] = (int(pad[2 * k]), int(pad[2 * k + 1]))
        if shape[axis] + widths[axis][0] + widths[axis][1] < 0:
            raise ShapeError(f"{op}: padding {widths[axis]} of axis {axis} (size {shape[axis]}) gives a negative size")
    return widths


def _overlap(shape: Sequence[int], widths: Sequence[tuple[int, int]]) -> tuple[list[int], list[int], list[int]]:
    """(source starts in x, destination starts in the padded result, sizes) of the copied box."""
    src, dst, sizes = [], [], []
    for d, (before, after) in zip(shape, widths, strict=True):
        src.append(max(0, -before))
        dst.append(max(0, before))
        sizes.append(max(0, d - max(0, -before) - max(0, -after)))
    return src, dst, sizes


def pad(x: Tensor, pad: Sequence[int], value: float = 0.0) -> Tensor:
    """x padded with ``value`` (negative widths crop), torch ``F.pad`` order: (left, right, top, bottom, ...)."""
    widths = pad_widths(x.shape, pad)
    out_shape = tuple(d + b + a for d, (b, a) in zip(x.shape, widths, strict=True))
    out = filled(out_shape, value, x.dtype, x.device)
    src, dst, sizes = _overlap(x.shape, widths)
    if 0 in sizes:
        return out
    piece = x if list(sizes) == list(x.shape) else strided_copy(x, *region_layout(x.shape, src, sizes))
    _, strides, offset = region_layout(out_shape, dst, sizes)
    return strided_write(out, piece, strides, offset)


def pad_backward(grad: Tensor, x_shape: Sequence[int], pad: Sequence[int]) -> Tensor:
    """d pad / d x: the padded gradient's inner box (zeros where the forward cropped)."""
    x_shape = tuple(int(d) for d in x_shape)
    widths = pad_widths(x_shape, pad)
    src, dst, sizes = _overlap(x_shape, widths)
    if 0 in sizes:
        return filled(x_shape, 0, grad.dtype, grad.device)
    inner = strided_copy(grad, *region_layout(grad.shape, dst, sizes))
    if list(sizes) == list(x_shape):
        return inner
    out = filled(x_shape, 0, grad.dtype, grad.device)
    _, strides, offset = region_layout(x_shape, src, sizes)
    return strided_write(out, inner, strides, offset)
