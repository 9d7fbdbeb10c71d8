"""Collation: a list of dataset items -> one batch of NumPy arrays (torch's ``default_collate``, on NumPy).

An item is an array, a number, a netcl ``Tensor``, a string, or a tuple / list / dict of those
(nested). The batch has the item's structure with every array leaf stacked along a new first
axis. float64 leaves (and Python floats) become float32, as ``netcl.core.tensor`` does; other
dtypes are kept. Items whose shapes, dtypes or structure differ raise a ``ValueError`` naming the
dataset index of the first item that differs and of the item it was compared with.

``alloc(shape, dtype)`` gives the array each stacked leaf is written into: the loader passes
pinned host buffers, so the stack is the only copy on the host.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.core import Tensor

Alloc = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def batch_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a leaf of ``dtype`` has in a batch: float64 -> float32, others unchanged."""
    return np.dtype(np.float32) if dtype == np.float64 else np.dtype(dtype)


def empty_host(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


def _leaf(value: Any) -> np.ndarray | None:
    """``value`` as an array when it is an array-like leaf, else None (a container or a string)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Tensor):
        return value.to_host()
    if isinstance(value, (np.generic, numbers.Number)):
        return np.asarray(value)
    return None


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return f"dict with keys {sorted(map(str, value))}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)} fields"
    leaf = _leaf(value)
    if leaf is not None:
        return f"array of shape {leaf.shape} and dtype {leaf.dtype}"
    return type(value).__name__


def _mismatch(indices: Sequence[int], k: int, what: str, first: str, other: str) -> ValueError:
    return ValueError(
        f"cannot batch the item at dataset index {indices[k]}{what}: it is {other}, but the item at dataset "
        f"index {indices[0]} is {first}; every item of a batch needs the same structure, shapes and dtypes "
        "(pass a collate_fn to batch items that differ)"
    )


def collate(items: Sequence[Any], indices: Sequence[int], alloc: Alloc = empty_host, where: str = "") -> Any:
    """Stack ``items`` (the dataset items at ``indices``) into one batch; see the module docstring."""
    first = items[0]
    if isinstance(first, dict):
        keys = list(first)
        for k, item in enumerate(items):
            if not isinstance(item, dict) or set(item) != set(keys):
                raise _mismatch(indices, k, where, _kind(first), _kind(item))
        return {key: collate([item[key] for item in items], indices, alloc, f"{where}[{key!r}]") for key in keys}
    if isinstance(first, (tuple, list)):
        for k, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) != len(first):
                raise _mismatch(indices, k, where, _kind(first), _kind(item))
        fields = [collate([item[f] for item in items], indices, alloc, f"{where}[{f}]") for f in range(len(first))]
        return tuple(fields) if isinstance(first, tuple) else fields
    if isinstance(first, (str, bytes)):
        for k, item in enumerate(items):
            if not isinstance(item, type(first)):
                raise _mismatch(indices, k, where, _kind(first), _kind(item))
        return list(items)
    head = _leaf(first)
    if head is None:
        raise TypeError(
            f"cannot batch the item at dataset index {indices[0]}{where}: a {type(first).__name__}; items must be "
            "NumPy arrays, numbers, netcl Tensors, strings, or tuples / lists / dicts of those (or pass a collate_fn)"
        )
    arrays = [head]
    for k in range(1, len(items)):
        array = _leaf(items[k])
        if array is None or array.shape != head.shape or array.dtype != head.dtype:
            raise _mismatch(indices, k, where, _kind(head), _kind(items[k]))
        arrays.append(array)
    out = alloc((len(arrays), *head.shape), batch_dtype(head.dtype))
    np.stack(arrays, out=out, casting="same_kind")
    return out


def to_batch(value: Any, alloc: Alloc = empty_host) -> Any:
    """A ``collate_fn`` result with every array leaf copied into ``alloc``'s arrays (float64 -> float32)."""
    if isinstance(value, dict):
        return {key: to_batch(v, alloc) for key, v in value.items()}
    if isinstance(value, (tuple, list)):
        if value and all(isinstance(v, (str, bytes)) for v in value):
            return list(value)
        converted = [to_batch(v, alloc) for v in value]
        return tuple(converted) if isinstance(value, tuple) else converted
    if isinstance(value, (str, bytes)):
        return value
    array = _leaf(value)
    if array is None:
        raise TypeError(
            f"collate_fn returned a {type(value).__name__}; a batch must be NumPy arrays, numbers, netcl Tensors, "
            "strings, or tuples / lists / dicts of those"
        )
    out = alloc(array.shape, batch_dtype(array.dtype))
    np.copyto(out, array, casting="same_kind")
    return out


def default_collate(batch: Sequence[Any]) -> Any:
    """torch's ``default_collate`` on NumPy: stack a list of items field by field (see the module docstring)."""
    if len(batch) == 0:
        raise ValueError("default_collate: the batch is empty")
    return collate(batch, list(range(len(batch))))
