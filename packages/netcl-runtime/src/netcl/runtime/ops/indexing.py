"""Basic indexing ``x[key]`` (views where the layout allows) and the index checks of the index ops.

``getitem`` takes ints, slices (any step, negative indices), ``None`` and ``...``. The result is a
view sharing x's memory when it is one contiguous block of x (a reshape; on the NumPy backend a
NumPy view; on OpenCL a sub-buffer when the block starts at a multiple of the device's base
address alignment), otherwise a copy through the strided-copy kernel. ``getitem_backward``
scatters a gradient into zeros of x's shape (each position written once: no accumulation).

Integer indices (``gather``, ``index_select``, ``embedding``: modules ``gather`` and
``index_select``) given on the host are checked here before any launch (``IndexError``); an index
Tensor on an OpenCL device is checked by the kernel that reads it (an out-of-range index reads as 0,
sends no gradient, and the host raises ``IndexError`` at its next wait: ``netcl.core.device_errors``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor, contiguous_strides
from netcl.core.device_errors import index_error_code, index_error_message
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime import results
from netcl.runtime.cache import register_cache
from netcl.runtime.ops._grid import prod
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.strided import collapse, filled, prepare_launch, strided_copy, strided_write

_TWINS = "netcl.runtime.numpy_twins.indexing"

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


def memo_key(key: IndexKey) -> tuple | None:
    """A hashable stand-in for a basic ``key`` made only of Python ints, slices of Python ints / None,
    None and Ellipsis (two keys get the same one only when they select the same view); None for any
    other key (NumPy integers, bools, arrays, ...), which is parsed every time."""
    items = key if type(key) is tuple else (key,)
    out = []
    for item in items:
        kind = type(item)
        if kind is slice:
            start, stop, step = item.start, item.stop, item.step
            if not (
                (start is None or type(start) is int)
                and (stop is None or type(stop) is int)
                and (step is None or type(step) is int)
            ):
                return None
            out.append((start, stop, step))
        elif kind is int or item is None or item is Ellipsis:
            out.append(item)
        else:
            return None
    return tuple(out)


#: (shape, memo_key(key)) -> the BasicIndex ``parse_index`` found (valid keys only)
_PARSED: dict[tuple, BasicIndex] = {}
_MAX_PARSED = 4096
_UNSET: Any = object()


def parse_index(shape: Sequence[int], key: IndexKey, memo: tuple | None = _UNSET) -> BasicIndex:  # type: ignore[assignment]
    """The view ``key`` (ints, slices, None, Ellipsis) selects from a C-contiguous tensor of ``shape``.
    Keys of Python ints, int slices, None and ``...`` are parsed once per shape (``memo_key``; a caller
    that computed ``memo_key(key)`` already passes it as ``memo``)."""
    shape = tuple(int(d) for d in shape) if type(shape) is not tuple else shape
    if memo is _UNSET:
        memo = memo_key(key)
    if memo is None:
        return parse_strided_index(shape, key)
    parsed = _PARSED.get((shape, memo))
    if parsed is None:
        parsed = parse_strided_index(tuple(int(d) for d in shape), key)
        if len(_PARSED) >= _MAX_PARSED:
            _PARSED.clear()
        _PARSED[(shape, memo)] = parsed
    return parsed


def parse_strided_index(
    shape: tuple[int, ...], key: IndexKey, strides: Sequence[int] | None = None, offset: int = 0
) -> BasicIndex:
    """``parse_index`` (not memoized) of a tensor whose elements lie at ``strides`` from ``offset`` of its memory
    (default: C-contiguous), the result in that memory too."""
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
    if strides is None:
        strides = contiguous_strides(shape)
    out_shape: list[int] = []
    out_strides: list[int] = []
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


def view_key(x: Tensor, memo: tuple) -> tuple:
    """What decides how ``x[key]`` is a view (``memo``: ``memo_key(key)``): x's shape, dtype and device, the key,
    and whether x shares its root's buffer (OpenCL has no sub-buffers of sub-buffers)."""
    return (x.shape, x.dtype, memo, x.device, x.base is None or x.data is x.base.data)


def planned_view(x: Tensor, key: tuple) -> Tensor | None:
    """``x[key]`` (``key``: ``view_key`` of x, a plain Tensor, and the index key) sharing x's memory as a getitem
    found it before (``_VIEW_PLANS``: the whole buffer or one sub-buffer); None when none did."""
    plan = _VIEW_PLANS.get(key)
    if plan is None:
        return None
    device = x.device
    kind, shape, start, nbytes = plan
    root = x.base if x.base is not None else x
    if kind is _WHOLE:  # the whole of x: a reshape, no launch
        return Tensor(x.data, shape, x.dtype, device, base=root)
    # one aligned block of x's buffer: a sub-buffer, no launch
    return Tensor(x.data.get_sub_region(start, nbytes, _READ_WRITE), shape, x.dtype, device, base=root)


def remember_view(x: Tensor, memo: tuple | None, view: BasicIndex, result: Tensor) -> None:
    """Keep how ``result``, the view sharing x's memory that ``contiguous_view`` made for ``view`` (the key's
    ``memo_key``: ``memo``), was made: ``planned_view`` then repeats it without parsing (OpenCL only, keys of
    ``memo_key`` only)."""
    if memo is not None and x.device.is_opencl and result.size:
        _remember_view(x, memo, view, result)


def getitem(x: Tensor, key: IndexKey) -> Tensor:
    """``x[key]`` for basic keys: a view when the selection is one contiguous block, else a copy (of a strided
    view: of its gathered copy, read once)."""
    if getattr(x, "strided", False):
        x = x.contiguous()
    memo = memo_key(key) if type(x) is Tensor else None
    if memo is not None:
        device = x.device
        shared = planned_view(x, view_key(x, memo))
        if shared is not None:  # OpenCL: a shape and key seen before on a tensor of this kind (root or not)
            return shared
        if x.base is None:
            plan = _GETITEM_PLANS.get((x.shape, x.dtype, memo, x.device))
            if plan is not None:  # OpenCL, a root tensor's shape and a key that needed a copy before
                shape, nbytes, prepared = plan
                out = results.tensor(device.allocator(device, nbytes), shape, x.dtype, device)
                prepared.call(x.data, out.data)
                return out
    if not isinstance(x, Tensor):
        raise TypeError(f"getitem: expected a Tensor, got {type(x).__name__}")
    view = parse_index(x.shape, key)
    result = contiguous_view(x, view)
    if result is not None:
        remember_view(x, memo, view, result)
        return result
    out = strided_copy(x, view.shape, view.strides, view.offset)
    if memo is not None and x.base is None and x.device.is_opencl and out.size:  # a prepared launch to keep
        prepared, values = prepare_launch(x, out, view.shape, view.strides, view.offset, write=False)
        if len(_GETITEM_PLANS) >= _MAX_PARSED:
            _GETITEM_PLANS.clear()
        _GETITEM_PLANS[(x.shape, x.dtype, memo, x.device)] = (out.shape, out.nbytes, prepared.with_trailing(values))
    return out


def _remember_view(x: Tensor, memo: tuple, view: BasicIndex, result: Tensor) -> None:
    """Keep how ``contiguous_view`` made ``result`` (the whole buffer, or a sub-buffer of it) for the next
    getitem of x's shape, dtype, device and kind (root or sharing its root's buffer) with this key."""
    key = view_key(x, memo)
    direct = key[-1]
    if result.data is x.data:
        plan = (_WHOLE, view.shape, 0, 0)
    elif direct:
        itemsize = x.dtype.itemsize
        plan = (_BLOCK, view.shape, view.offset * itemsize, result.size * itemsize)
    else:
        return
    if len(_VIEW_PLANS) >= _MAX_PARSED:
        _VIEW_PLANS.clear()
    _VIEW_PLANS[key] = plan


#: (shape, dtype, memo_key(key), device) -> (out shape, out bytes, prepared copy with its sizes set) of an
#: OpenCL getitem of a root tensor (``base`` None) that is a strided copy: the parse and layout done once
_GETITEM_PLANS: dict[tuple, tuple] = {}
#: (shape, dtype, memo_key(key), device, x shares its root's buffer) -> (kind, out shape, start byte, bytes)
#: of an OpenCL getitem that was a view: ``_WHOLE`` (x's buffer under a new shape) or ``_BLOCK`` (a sub-buffer)
_VIEW_PLANS: dict[tuple, tuple] = {}
_WHOLE, _BLOCK = "whole", "block"
_READ_WRITE = cl.mem_flags.READ_WRITE
register_cache(_GETITEM_PLANS.clear)
register_cache(_VIEW_PLANS.clear)


def contiguous_view(x: Tensor, view: BasicIndex) -> Tensor | None:
    """``view`` of x as a Tensor sharing x's memory, or None when the layout does not allow it."""
    n = prod(view.shape)
    if n == 0:
        return Tensor.empty(view.shape, x.dtype, x.device)
    if not one_run(view, n):
        return None
    root = x.base if x.base is not None else x
    if n == x.size:
        return x.reshape(view.shape)
    return block_view(x, view, n, root)


#: device -> its sub-buffer origin alignment in bytes (a driver query, read once)
_ALIGN: dict[Device, int] = {}


@backend_op(_TWINS)
def block_view(x: Tensor, view: BasicIndex, n: int, root: Tensor) -> Tensor | None:
    """``contiguous_view`` of a view that is one block of ``n`` < x.size elements: a Tensor of ``view.shape``
    on x's memory from ``view.offset`` (its base ``root``), or None when the device cannot address it."""
    if x.data is not root.data:  # x is itself a sub-buffer: OpenCL has no sub-buffers of sub-buffers
        return None
    itemsize = x.dtype.itemsize
    align = _ALIGN.get(x.device)
    if align is None:
        align = _ALIGN[x.device] = max(x.device.cl_device.mem_base_addr_align // 8, 1)
    if (view.offset * itemsize) % align:
        return None
    data = x.data.get_sub_region(view.offset * itemsize, n * itemsize, _READ_WRITE)
    return Tensor(data, view.shape, x.dtype, x.device, base=root)


def leading_views(x: Tensor) -> list[Tensor] | None:
    """``x[0], x[1], ...`` as Tensors sharing x's memory (no launch), or None where some block cannot be one
    (on OpenCL a sub-buffer starts at the device's base address alignment; x must be a root tensor)."""
    views = []
    for j in range(x.shape[0]):
        view = contiguous_view(x, parse_index(x.shape, j))
        if view is None:
            return None
        views.append(view)
    return views


def getitem_backward(grad: Tensor, shape: Sequence[int], key: IndexKey) -> Tensor:
    """The gradient of ``x[key]`` w.r.t. x: ``grad`` written into zeros of ``shape``; ``grad`` itself under
    x's shape (no launch) where the key selects all of x in order (``x[:n]`` of n rows)."""
    view = parse_index(shape, key)
    if tuple(grad.shape) != view.shape:
        raise ShapeError(f"getitem_backward: gradient shape {grad.shape} differs from the selection {view.shape}")
    if _selects_all_in_order(view, shape):
        return grad.reshape(tuple(shape))
    out = filled(shape, 0, grad.dtype, grad.device)
    return strided_write(out, grad, view.strides, view.offset)


def _selects_all_in_order(view: BasicIndex, shape: Sequence[int]) -> bool:
    """Whether ``view`` of a tensor of ``shape`` is every element of it in memory order."""
    n = prod(view.shape)
    return n > 0 and n == prod(shape) and one_run(view, n)


def one_run(view: BasicIndex, n: int) -> bool:
    """Whether the ``n`` > 0 elements of ``view`` are one run of neighbouring elements, in memory order."""
    dims, steps = collapse(view.shape, view.strides)
    return n == 1 or (len(dims) == 1 and steps[0] == 1)


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
    """IndexError when some value of a host ``index`` (NumPy, or a NumPy-backend Tensor) is outside ``[0, size)``.

    An index Tensor on an OpenCL device is not read here (no synchronization): the kernel that takes it
    checks every value against the error word (``index_error_args``) and the host raises at its next wait.
    """
    if index.size == 0:
        return
    if isinstance(index, np.ndarray):
        host = index
    elif index.device.is_opencl:  # checked by the kernel that takes it
        return
    else:
        host = np.asarray(index.data)
    low, high = int(host.min()), int(host.max())
    if low < 0 or high >= size:
        bad = low if low < 0 else high
        raise IndexError(index_error_message(index_error_code(op, arg, axis), bad, size))


def index_error_args(device: Device, op: str, arg: str = "index", axis: int | None = None) -> tuple[Any, np.int32]:
    """The two kernel arguments of an index check (``INDEX_CHECK_C``): ``device``'s error word and the code."""
    return device.error_word.buffer(device.queue), np.int32(index_error_code(op, arg, axis))


def check_axis(axis: Any, ndim: int, op: str) -> int:
    """``axis`` of an ``ndim``-d tensor as a non-negative int (AxisError naming ``op`` otherwise)."""
    if not is_int_index(axis):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -ndim <= int(axis) < max(ndim, 1):
        raise np.exceptions.AxisError(f"{op}: axis {axis} is out of range for a {ndim}-d tensor")
    return int(axis) % max(ndim, 1)


def split3(shape: Sequence[int], axis: int) -> tuple[int, int, int]:
    """(elements before ``axis``, its size, elements after it) of a C-contiguous ``shape``."""
    return prod(shape[:axis]), int(shape[axis]) if shape else 1, prod(shape[axis + 1 :])
