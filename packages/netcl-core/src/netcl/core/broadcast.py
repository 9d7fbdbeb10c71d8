"""NumPy broadcasting rules, and the C index lines a kernel uses to read a broadcast input."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence

from netcl.core.errors import ShapeError

Shape = tuple[int, ...]
_INT = frozenset({int})


def normalize_shape(shape: int | Iterable[int]) -> Shape:
    """Turn an int or iterable of ints into a shape tuple, rejecting negatives and non-integers."""
    if type(shape) is tuple and {*map(type, shape)} <= _INT and min(shape, default=0) >= 0:
        return shape  # already a shape: plain ints >= 0 (no bools, no NumPy ints)
    if hasattr(shape, "__index__") or isinstance(shape, str) or not isinstance(shape, Iterable):
        dims: tuple[object, ...] = (shape,)  # one dimension; a bad one is reported below
    else:
        dims = tuple(shape)
    result = []
    for dim in dims:
        if isinstance(dim, bool) or not hasattr(dim, "__index__"):
            raise ShapeError(f"shape {tuple(dims)!r} has non-integer dimension {dim!r}; expected ints >= 0")
        value = operator.index(dim)
        if value < 0:
            raise ShapeError(f"shape {tuple(dims)!r} has negative dimension {value}; expected ints >= 0")
        result.append(value)
    return tuple(result)


def broadcast_shapes(*shapes: int | Sequence[int]) -> Shape:
    """The shape NumPy broadcasting gives ``shapes``; ``ShapeError`` if they cannot broadcast."""
    shapes = tuple(s if type(s) is tuple else normalize_shape(s) for s in shapes)
    result = _broadcast(shapes)
    if any(type(d) is not int or d < 0 for d in result):  # rare: NumPy ints or bad dims in tuples
        result = _broadcast(tuple(normalize_shape(s) for s in shapes))
    return result


def _broadcast(shapes: tuple[tuple[int, ...], ...]) -> Shape:
    if shapes and all(s == shapes[0] for s in shapes):  # the common case: nothing to broadcast
        return shapes[0]
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(-ndim, 0):
        dims = {s[axis] for s in shapes if len(s) >= -axis}
        non_one = dims - {1}
        if len(non_one) > 1:
            listed = ", ".join(str(tuple(s)) for s in shapes)
            raise ShapeError(f"shapes {listed} cannot broadcast: axis {axis} has sizes {sorted(dims)}")
        result.append(non_one.pop() if non_one else 1)
    return tuple(result)


def contiguous_strides(shape: Sequence[int]) -> Shape:
    """Row-major element strides of ``shape``."""
    strides = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def needs_64bit_index(*shapes: Sequence[int]) -> bool:
    """True when any shape has 2**31 elements or more (32-bit C ``int`` would overflow)."""
    return any(math.prod(s) >= 2**31 for s in shapes)


def broadcast_index_lines(
    in_shape: Sequence[int], out_shape: Sequence[int], index_var: str, result_var: str, index_type: str = "int"
) -> list[str]:
    """C statements that set ``result_var`` to the flat index of ``in_shape`` read at ``index_var``.

    ``index_var`` is the flat row-major index into ``out_shape``; ``in_shape`` must broadcast
    to ``out_shape``. An input of the output's own shape reads at the same index, a scalar-like
    input (every dim 1) at index 0; otherwise each output coordinate is peeled off with ``/``
    and ``%`` and only the dims where the input is not 1 contribute.
    """
    in_shape, out_shape = tuple(in_shape), tuple(out_shape)
    if broadcast_shapes(in_shape, out_shape) != out_shape:
        raise ShapeError(f"input shape {in_shape} does not broadcast to output shape {out_shape}")
    if math.prod(in_shape) == math.prod(out_shape):
        return [f"{index_type} {result_var} = {index_var};"]
    if math.prod(in_shape) == 1:
        return [f"{index_type} {result_var} = 0;"]
    padded = (1,) * (len(out_shape) - len(in_shape)) + in_shape
    in_strides = contiguous_strides(padded)
    out_strides = contiguous_strides(out_shape)
    terms = []
    for axis, (in_dim, out_dim) in enumerate(zip(padded, out_shape, strict=True)):
        if in_dim == 1:
            continue
        coord = f"({index_var} / {out_strides[axis]})" if out_strides[axis] != 1 else f"{index_var}"
        if axis > 0:
            coord = f"({coord} % {out_dim})"
        terms.append(coord if in_strides[axis] == 1 else f"{coord} * {in_strides[axis]}")
    return [f"{index_type} {result_var} = {' + '.join(terms)};"]
