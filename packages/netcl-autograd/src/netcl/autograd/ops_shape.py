"""Differentiable shape ops: indexing, concat/stack/split, pad, squeeze/unsqueeze, flatten, permute.

Forwards are the runtime's strided copies (``netcl.runtime.ops.strided``/``shape``/``indexing``);
gradients scatter back into zeros or copy the matching region. ``x[key]`` launches nothing: a view of x
sharing its memory when the selection is one contiguous block of it (``x[0]``, ``x[1:3]``, ``x[None]``,
``x[..., :]``; on OpenCL a sub-buffer, when the block's start is suitably aligned), otherwise a read-only
``StridedView`` that each op reading it gathers (``netcl.runtime.ops.views``); one integer-array index in
the key selects through ``index_select`` (a copy). ``squeeze``, ``unsqueeze`` and ``flatten`` are reshapes
(views; of a ``StridedView``, a gathered copy); ``permute`` is ``transpose``'s view.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op, forward_only, untracked
from netcl.autograd.ops import reshape, transpose
from netcl.autograd.ops_index import index_select
from netcl.core import ShapeError, Tensor
from netcl.runtime.ops import indexing, layout, views
from netcl.runtime.ops._common import DEVICE_CONSTANTS, remember
from netcl.runtime.ops.shape import concat as device_concat
from netcl.runtime.ops.shape import concat_shape, normalize_axis, pad_backward, pad_widths
from netcl.runtime.ops.shape import pad as device_pad
from netcl.runtime.ops.strided import region_layout, strided_copy

Operand = Any  # Node | Tensor
_Grads = list[Tensor | None]


def _shape(x: Operand, op: str, arg: str = "x") -> tuple[int, ...]:
    kind = type(x)
    if kind is Node or kind is Tensor:
        return tuple(x.value.shape if kind is Node else x.shape)
    if not hasattr(x, "shape"):
        raise TypeError(f"{op}: {arg} must be a Node or Tensor, got {type(x).__name__}")
    return tuple(x.shape)


def getitem(x: Operand, key: Any) -> Node:
    """``x[key]`` with ints, slices (any step, negative indices), ``None`` and ``...`` (NumPy basic
    indexing), plus at most one integer array (a list, NumPy array, int Tensor or Node), which
    selects along its axis as ``index_select`` does, its dimensions taking that axis's place.
    """
    shape = _shape(x, "getitem")
    memo = indexing.memo_key(key)
    if memo is None:  # not only Python ints, int slices, None and ...: maybe an integer array
        items = list(key) if isinstance(key, tuple) else [key]
        arrays = [k for k, item in enumerate(items) if _is_array_index(item)]
        if len(arrays) > 1:
            raise IndexError(f"getitem: at most one integer-array index is supported, got {len(arrays)}")
        if arrays:
            return _array_getitem(x, shape, items, arrays[0])
    indexing.parse_index(shape, key, memo)  # IndexError / ValueError before anything runs (memoized per key)
    if forward_only():  # what apply_op would do: the forward, a bare Node
        return untracked(views.getitem_view(x.value if isinstance(x, Node) else x, key, memo), "getitem")
    return apply_op(
        lambda v: views.getitem_view(v, key, memo),
        _GetitemGrad(key),
        x,
        op_name="getitem",
        attrs={"key": key},
        takes_views=True,
    )


class _GetitemGrad:
    """The gradient of ``x[key]``: the upstream gradient written into zeros of x's shape."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __call__(self, g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [indexing.getitem_backward(g, values[0].shape, self.key)]


def _is_array_index(item: Any) -> bool:
    return isinstance(item, (list, np.ndarray, Tensor, Node))


def _array_getitem(x: Operand, shape: tuple[int, ...], items: list[Any], at: int) -> Node:
    """``x[items]`` where ``items[at]`` is an integer array: basic indexing, then ``index_select``."""
    index = items[at]
    index_shape = tuple(np.shape(index.value if isinstance(index, Node) else index))
    if isinstance(index, (list, np.ndarray)) and np.asarray(index).dtype.kind == "b":
        raise IndexError("getitem: boolean-mask indices are not supported; use where() or an integer index")
    advanced = [k for k, item in enumerate(items) if k == at or indexing.is_int_index(item)]
    if advanced != list(range(advanced[0], advanced[-1] + 1)):
        raise IndexError(
            "getitem: an integer-array index combined with integer indices that a slice, None or ... "
            "separates from it is not supported (NumPy would move the selected axes to the front); "
            "index in two steps"
        )
    basic = [*items[:at], slice(None), *items[at + 1 :]]
    view = indexing.parse_index(shape, tuple(basic))  # validates the rest of the key
    consumed = builtins.sum(1 for item in basic if item is not None and item is not Ellipsis)
    axis = 0
    for item in items[:at]:
        if item is Ellipsis:
            axis += len(shape) - consumed
        elif item is None or isinstance(item, slice):
            axis += 1
    if isinstance(index, (list, np.ndarray)):
        index = np.asarray(index) if np.size(index) else np.zeros(np.shape(index), np.int64)  # x[[]] is empty
        if index.size and index.dtype.kind in "iu":
            index = np.where(index < 0, index + view.shape[axis], index)  # negative indices count from the end
        indexing.check_index_range(index, view.shape[axis], "getitem", "index", axis)  # before any launch
    picked = getitem(x, tuple(basic)) if basic != [slice(None)] * len(basic) else x
    flat = index.reshape(-1) if isinstance(index, np.ndarray) else index
    if isinstance(flat, Node):
        flat = flat.value
    if isinstance(flat, Tensor) and flat.ndim != 1:
        flat = flat.reshape(flat.size)
    selected = index_select(picked, axis, flat)
    out_shape = (*view.shape[:axis], *index_shape, *view.shape[axis + 1 :])
    return selected if selected.shape == out_shape else reshape(selected, out_shape)


def concat(xs: Sequence[Operand], axis: int = 0) -> Node:
    """The operands joined along ``axis``; all other dimensions must match."""
    xs = list(xs) if isinstance(xs, (list, tuple)) else None
    if xs is None:
        raise TypeError("concat: expected a list or tuple of Nodes/Tensors")
    shapes = [_shape(x, "concat", f"item {k}") for k, x in enumerate(xs)]
    ax, _ = concat_shape(shapes, [x.dtype for x in xs], axis)
    starts = np.cumsum([0] + [s[ax] for s in shapes[:-1]]).tolist()

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        grads: _Grads = []
        for x, shape, start in zip(xs, shapes, starts, strict=True):
            if not (isinstance(x, Node) and x.requires_grad):
                grads.append(None)
                continue
            begin = [0] * len(shape)
            begin[ax] = start
            grads.append(strided_copy(g, *region_layout(g.shape, begin, shape)))
        return grads

    return apply_op(lambda *vs: device_concat(vs, ax), grad, *xs, op_name="concat", attrs={"axis": ax})


cat = concat


def stack(xs: Sequence[Operand], axis: int = 0) -> Node:
    """The operands (all of one shape) stacked along a new ``axis``."""
    if not isinstance(xs, (list, tuple)) or not xs:
        raise ValueError("stack: expected a non-empty list or tuple of Nodes/Tensors")
    shapes = [_shape(x, "stack", f"item {k}") for k, x in enumerate(xs)]
    for k, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise ShapeError(f"stack: item {k} has shape {shape} but item 0 has {shapes[0]}: all must match")
    ax = _new_axis(axis, len(shapes[0]), "stack")
    return concat([unsqueeze(x, ax) for x in xs], ax)


def split(x: Operand, split_size_or_sections: int | Sequence[int], axis: int = 0) -> tuple[Node, ...]:
    """Pieces of x along ``axis``: equal chunks of ``split_size`` (the last may be smaller) or the given sizes."""
    shape = _shape(x, "split")
    if not shape:
        raise ShapeError("split: x must have at least one dimension, got a 0-d tensor")
    ax = normalize_axis(axis, len(shape), "split")
    size = shape[ax]
    spec = split_size_or_sections
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        if spec <= 0:
            raise ValueError(f"split: split_size must be positive, got {spec}")
        sizes = [builtins.min(int(spec), size - s) for s in range(0, size, int(spec))] or [0]
    elif isinstance(spec, (list, tuple)) and all(isinstance(s, (int, np.integer)) and s >= 0 for s in spec):
        sizes = [int(s) for s in spec]
        if builtins.sum(sizes) != size:
            raise ValueError(
                f"split: sections {tuple(sizes)} sum to {builtins.sum(sizes)}, "
                f"but axis {ax} of shape {shape} has size {size}"
            )
    else:
        raise ValueError(f"split: split_size_or_sections must be a positive int or a list of sizes, got {spec!r}")
    pieces = []
    start = 0
    for n in sizes:
        key = (slice(None),) * ax + (slice(start, start + n),)
        pieces.append(getitem(x, key))
        start += n
    return tuple(pieces)


def pad(x: Operand, pad: Sequence[int], value: float = 0.0, *, mode: str = "constant") -> Node:
    """Padding in torch ``F.pad`` order: (left, right) of the last axis, then the one before, ...

    ``mode`` "constant" fills with ``value`` (negative widths crop); "reflect" mirrors without repeating the
    edge (widths below the axis length), "replicate" repeats the edge, "circular" wraps around (widths up to
    the length): those three are one ``index_select`` per padded axis, as torch pads the last 1-3 axes of a
    2-d to 5-d input.
    """
    shape = _shape(x, "pad")
    if mode != "constant":
        return _indexed_pad(x, shape, pad, mode)
    pad_widths(shape, pad)
    widths = tuple(int(p) for p in pad)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [pad_backward(g, values[0].shape, widths)]

    return apply_op(
        lambda v: device_pad(v, widths, value), grad, x, op_name="pad", attrs={"pad": widths, "value": value}
    )


#: (device, axis length, left, right, mode) -> the index Tensor of one padded axis
_PAD_INDICES: dict[tuple, Tensor] = {}


def _indexed_pad(x: Operand, shape: tuple[int, ...], pad: Sequence[int], mode: str) -> Node:
    """``pad`` in the modes that copy x's own values: one ``index_select`` per padded axis, indices from torch's
    definition of the mode."""
    if mode not in ("reflect", "replicate", "circular"):
        raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    widths = list(pad) if isinstance(pad, (tuple, list)) else None
    if widths is None or len(widths) % 2 or not all(isinstance(w, (int, np.integer)) for w in widths):
        raise ValueError(f"pad: pad must be a sequence of (left, right) int pairs, got {pad!r}")
    axes = len(widths) // 2
    if not 2 <= len(shape) <= 5 or not 1 <= axes <= min(3, len(shape) - 1):
        raise ValueError(
            f"pad: mode {mode!r} pads the last 1-3 axes of a 2-d to 5-d input; got {axes} axis pair(s) "
            f"for shape {shape}"
        )
    out: Any = x
    for k in range(axes):
        axis, (left, right) = len(shape) - 1 - k, (int(widths[2 * k]), int(widths[2 * k + 1]))
        if left < 0 or right < 0:
            raise ValueError(f"pad: mode {mode!r} takes widths >= 0, got {pad!r}")
        if not left and not right:
            continue
        length = shape[axis]
        limit = length - 1 if mode == "reflect" else length
        if max(left, right) > limit or length == 0:
            raise ValueError(
                f"pad: mode {mode!r} needs widths {'below' if mode == 'reflect' else 'at most'} the padded axis "
                f"length {length}, got ({left}, {right}) for axis {axis} of shape {shape}"
            )
        key = (x.device, length, left, right, mode)
        index = _PAD_INDICES.get(key)
        if index is None:
            source = np.arange(-left, length + right)
            if mode == "reflect":
                period = 2 * (length - 1)
                folded = np.mod(source, period) if period else np.zeros_like(source)
                source = np.where(folded < length, folded, period - folded)
            elif mode == "replicate":
                source = np.clip(source, 0, length - 1)
            else:
                source = np.mod(source, length)
            index = remember(_PAD_INDICES, key, Tensor.from_host(x.device, source.astype(np.int32)), DEVICE_CONSTANTS)
        out = index_select(out, axis, index)
    return out if isinstance(out, Node) else untracked(out, "pad")


def cast(x: Operand, dtype: Any) -> Node:
    """``x``'s values as ``dtype`` (torch's ``x.to(dtype)``; C conversions: floats truncate toward zero into ints).
    ``x`` itself when it already has that dtype. Between floating dtypes the gradient is cast back to ``x``'s
    dtype; a non-floating result gets none (as torch's)."""
    _shape(x, "cast")
    target, source = np.dtype(dtype), np.dtype(x.dtype)
    if target == source:
        return x if isinstance(x, Node) else untracked(x, "cast")

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        return [layout.cast(g, values[0].dtype)]

    differentiable = target.kind == "f" and source.kind == "f"
    return apply_op(
        lambda v: layout.cast(v, target), grad if differentiable else None, x, op_name="cast", attrs={"dtype": target}
    )


def squeeze(x: Operand, axis: int | Sequence[int] | None = None) -> Node:
    """x without size-1 dimensions (all of them, or those of ``axis``; a listed axis of size > 1 stays, as torch)."""
    shape = _shape(x, "squeeze")
    if axis is None:
        drop = {i for i, d in enumerate(shape) if d == 1}
    else:
        items = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
        ndim = builtins.max(len(shape), 1)
        drop = {normalize_axis(a, ndim, "squeeze") for a in items}
        drop = {a for a in drop if a < len(shape) and shape[a] == 1}
    return reshape(x, tuple(d for i, d in enumerate(shape) if i not in drop))


def _new_axis(axis: Any, ndim: int, op: str) -> int:
    """Where a new axis goes in an ``ndim``-d tensor: ``-ndim - 1 <= axis <= ndim``."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -ndim - 1 <= int(axis) <= ndim:
        raise np.exceptions.AxisError(
            f"{op}: axis {axis} is out of range for a new axis of a {ndim}-d tensor "
            f"(expected {-ndim - 1} <= axis <= {ndim})"
        )
    return int(axis) % (ndim + 1)


def unsqueeze(x: Operand, axis: int) -> Node:
    """x with a new size-1 dimension at ``axis`` (``-1`` appends)."""
    shape = _shape(x, "unsqueeze")
    ax = _new_axis(axis, len(shape), "unsqueeze")
    return reshape(x, (*shape[:ax], 1, *shape[ax:]))


def flatten(x: Operand, start_axis: int = 0, end_axis: int = -1) -> Node:
    """x with dimensions ``start_axis..end_axis`` merged into one (a 0-d x becomes shape (1,))."""
    shape = _shape(x, "flatten")
    if not shape:
        return reshape(x, (1,))
    start = normalize_axis(start_axis, len(shape), "flatten", "start_axis")
    end = normalize_axis(end_axis, len(shape), "flatten", "end_axis")
    if start > end:
        raise ValueError(f"flatten: start_axis {start_axis} comes after end_axis {end_axis} for shape {shape}")
    merged = int(np.prod(shape[start : end + 1], dtype=np.int64))
    return reshape(x, (*shape[:start], merged, *shape[end + 1 :]))


def permute(x: Operand, axes: Sequence[int]) -> Node:
    """x with its dimensions reordered: result axis i is x's axis ``axes[i]`` (materialized)."""
    shape = _shape(x, "permute")
    items = list(axes)
    ndim = len(shape)
    if len(items) != ndim or not all(
        isinstance(a, (int, np.integer)) and -ndim <= a < builtins.max(ndim, 1) for a in items
    ):
        raise ValueError(f"permute: axes {tuple(items)} are not a permutation of the {ndim} axes of shape {shape}")
    perm = [int(a) % builtins.max(ndim, 1) for a in items]
    if sorted(perm) != list(range(ndim)):
        raise ValueError(f"permute: axes {tuple(items)} are not a permutation of the {ndim} axes of shape {shape}")
    return transpose(x, perm)


__all__ = ["cast", "cat", "concat", "flatten", "getitem", "pad", "permute", "split", "squeeze", "stack", "unsqueeze"]
