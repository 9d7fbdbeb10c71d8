"""Views without a launch: transposes and basic indexing as ``netcl.core.strided_view.StridedView``, and the
gather that reads one.

``transpose_view`` and ``getitem_view`` are what ``netcl.autograd``'s ``transpose`` / ``permute`` / ``x.T``
and ``x[key]`` run: where the result is one contiguous block of the source it shares the source's memory as
a plain ``Tensor`` (a reshape, a sub-buffer, a NumPy slice: ``indexing.contiguous_view``), else it is a
``StridedView``; a view of a view is composed from the first one's layout. ``gather`` (installed as
``netcl.core.strided_view.GATHER``) materializes a view: a permutation of its whole source by
``layout.permute`` (the tiled transpose where the last two axes swap), any other layout by the strided copy,
each through its backend (``backend_op``). ``netcl.runtime.ops.transpose`` and ``getitem`` keep
returning new tensors: the kernels of other ops call them for operands they read at once.
"""

from __future__ import annotations

from typing import Any

from netcl.core import Tensor, contiguous_strides
from netcl.core.strided_view import GATHER, StridedView
from netcl.runtime.cache import register_cache
from netcl.runtime.ops._common import remember
from netcl.runtime.ops._grid import prod
from netcl.runtime.ops.indexing import (
    BasicIndex,
    IndexKey,
    contiguous_view,
    memo_key,
    one_run,
    parse_index,
    parse_strided_index,
    planned_view,
    remember_view,
    view_key,
)
from netcl.runtime.ops.layout import moves_only_unit_axes, permute
from netcl.runtime.ops.strided import copy_view

_UNSET: Any = object()


def make_view(source: Tensor, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Tensor:
    """``source``'s elements at ``(shape, strides, offset)`` of its C-contiguous memory, with no launch: a
    plain Tensor sharing the memory where the layout is one block the device can address, else a
    ``StridedView``."""
    if (shape, strides) in _SCATTERED:  # not one run of memory, whatever the offset or device
        return StridedView(source, shape, strides, offset)
    view = BasicIndex(shape, strides, offset)
    shared = contiguous_view(source, view)
    if shared is not None:
        return shared
    if not one_run(view, prod(shape)):
        remember(_SCATTERED, (shape, strides), True)
    return StridedView(source, shape, strides, offset)


def transpose_view(x: Tensor, perm: tuple[int, ...]) -> Tensor:
    """x's axes in the order ``perm`` (a valid permutation), with no launch."""
    if not x.strided:
        planned = _TRANSPOSED.get((x.shape, perm))
        if planned is None:
            shape = tuple(x.shape[a] for a in perm)
            steps = contiguous_strides(x.shape)
            reshape = moves_only_unit_axes(x.shape, perm)
            planned = remember(_TRANSPOSED, (x.shape, perm), (shape, tuple(steps[a] for a in perm), reshape))
        shape, strides, reshape = planned
        return x.reshape(shape) if reshape else make_view(x, shape, strides, 0)
    source, strides, offset = x.source, x.strides, x.offset  # type: ignore[attr-defined]
    return make_view(source, tuple(x.shape[a] for a in perm), tuple(strides[a] for a in perm), offset)


def getitem_view(x: Tensor, key: IndexKey, memo: tuple | None = _UNSET) -> Tensor:  # type: ignore[assignment]
    """``x[key]`` for basic keys (ints, slices, None, ...), with no launch (``memo``: ``memo_key(key)`` when the
    caller has it)."""
    if not x.strided:
        if memo is _UNSET:
            memo = memo_key(key)
        if type(x) is not Tensor:
            memo = None
        if memo is not None:
            kind = view_key(x, memo)
            shared = planned_view(x, kind)
            if shared is not None:  # a view of x's memory made for this shape and key before
                return shared
            layout = _STRIDED_ITEMS.get(kind)
            if layout is not None:  # a strided view for this shape, key, device and kind of x before
                return StridedView(x, *layout)
        view = parse_index(x.shape, key, memo)
        result = make_view(x, view.shape, view.strides, view.offset)
        if not result.strided:
            remember_view(x, memo, view, result)
        elif memo is not None:  # a scattered layout, or one block the device cannot address as a sub-buffer
            remember(_STRIDED_ITEMS, kind, (view.shape, view.strides, view.offset))
        return result
    view = parse_strided_index(x.shape, key, x.strides, x.offset)  # type: ignore[attr-defined]
    return make_view(x.source, view.shape, view.strides, view.offset)  # type: ignore[attr-defined]


def swapped_source(x: Tensor) -> Tensor | None:
    """The plain tensor ``s`` when ``x`` is all of ``s`` with its last two axes swapped (``s.T`` of a matrix,
    ``s.transpose(-2, -1)`` of a batch), which a product reads in place (``transpose_a`` / ``transpose_b``); else
    None."""
    if not x.strided or x.ndim < 2 or x.offset:  # type: ignore[attr-defined]
        return None
    source = x.source  # type: ignore[attr-defined]
    key = (source.shape, x.shape, x.strides)  # type: ignore[attr-defined]
    swapped = _SWAPPED.get(key)
    if swapped is None:
        swapped = remember(_SWAPPED, key, _is_swap(*key))
    return source if swapped else None


def _is_swap(source: tuple[int, ...], shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether ``(shape, strides)`` is all of a C-contiguous ``source`` with its last two axes swapped."""
    if len(source) != len(shape) or shape != (*source[:-2], source[-1], source[-2]):
        return False
    steps = contiguous_strides(source)
    swapped = (*steps[:-2], steps[-1], steps[-2])
    return all(d == 1 or s == t for d, s, t in zip(shape, strides, swapped, strict=True))


def gather(view: StridedView) -> Tensor:
    """A new C-contiguous tensor of ``view``'s elements (``netcl.core.strided_view.GATHER``)."""
    source = view.source
    key = (source.shape, view.shape, view.strides, view.offset)
    perm = _PERMUTATIONS.get(key, _UNKNOWN)
    if perm is _UNKNOWN:
        perm = remember(_PERMUTATIONS, key, _permutation(source.shape, view.shape, view.strides, view.offset))
    if perm is not None:
        return permute(source, perm, None, False)
    return copy_view(source, view.shape, view.strides, view.offset)


def _permutation(
    source: tuple[int, ...], shape: tuple[int, ...], strides: tuple[int, ...], offset: int
) -> tuple[int, ...] | None:
    """The permutation ``perm`` with ``shape == source[perm]`` and ``strides`` the source's C strides in that
    order, where the view is all of the source permuted (None otherwise)."""
    if offset or len(shape) != len(source):
        return None
    steps = contiguous_strides(source)
    perm: list[int] = []
    for dim, stride in zip(shape, strides, strict=True):
        match = next(
            (a for a in range(len(source)) if a not in perm and source[a] == dim and (dim == 1 or steps[a] == stride)),
            None,
        )
        if match is None:
            return None
        perm.append(match)
    return tuple(perm)


#: (source shape, view shape, view strides) -> ``_is_swap``'s answer
_SWAPPED: dict[tuple, bool] = {}
register_cache(_SWAPPED.clear)
#: (x's shape, permutation) -> (the transpose's shape, its strides in x, whether it is a reshape)
_TRANSPOSED: dict[tuple, tuple] = {}
register_cache(_TRANSPOSED.clear)
#: (x's shape, dtype, memo_key(key), device, x shares its root's buffer) -> (shape, strides, offset) of an x[key]
#: that was a ``StridedView`` (the dtype decides whether a block's start meets the sub-buffer alignment)
_STRIDED_ITEMS: dict[tuple, tuple] = {}
register_cache(_STRIDED_ITEMS.clear)
#: (shape, strides) of layouts that are not one run of memory (always a ``StridedView``)
_SCATTERED: dict[tuple, bool] = {}
register_cache(_SCATTERED.clear)
#: (source shape, view shape, strides, offset) -> ``_permutation``'s answer
_PERMUTATIONS: dict[tuple, tuple[int, ...] | None] = {}
_UNKNOWN = object()
register_cache(_PERMUTATIONS.clear)

GATHER[:] = [gather]
