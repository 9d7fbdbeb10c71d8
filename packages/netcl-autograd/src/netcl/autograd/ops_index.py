"""Differentiable integer-index ops: ``embedding``, ``gather``, ``index_select``.

Indices are integer Tensors, integer Nodes or NumPy integer arrays (copied to the operand's
device). They get no gradient. The operand's gradient is a deterministic scatter-add (see
``netcl.runtime.ops.indexing``: no atomics, repeated indices summed in index order).
Out-of-range indices raise ``IndexError`` before any launch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op
from netcl.core import DTypeError, ShapeError, Tensor, get_device
from netcl.runtime.ops import indexing as RI  # noqa: N812

Operand = Any  # Node | Tensor
_Grads = list[Tensor | None]


def _index_tensor(index: Any, like: Any, size: int, op: str, arg: str, axis: int | None = None) -> Tensor:
    """``index`` as an integer Tensor on ``like``'s device; NumPy indices are range-checked here."""
    if isinstance(index, Node):
        index = index.value
    if isinstance(index, Tensor):
        RI.check_index_tensor(index, op, arg)
        return index
    host = np.asarray(index)
    if host.dtype.kind not in "iu":
        raise DTypeError(f"{op}: {arg} must hold integers (an int Tensor or NumPy int array), got dtype {host.dtype}")
    RI.check_index_range(host, size, op, arg, axis)
    device = getattr(getattr(like, "value", like), "device", None) or get_device()
    small = host.size == 0 or (host.min() >= -(2**31) and host.max() < 2**31)
    return Tensor.from_host(device, host.astype(np.int32 if small else np.int64))


def _shape(x: Any, op: str, arg: str) -> tuple[int, ...]:
    if not hasattr(x, "shape"):
        raise TypeError(f"{op}: {arg} must be a Node or Tensor, got {type(x).__name__}")
    return tuple(x.shape)


def embedding(ids: Any, table: Operand) -> Node:
    """Rows of ``table`` (num_embeddings, dim) at ``ids`` (any shape): shape ``ids.shape + (dim,)``."""
    shape = _shape(table, "embedding", "table")
    if len(shape) != 2:
        raise ShapeError(f"embedding: table must be 2-d (num_embeddings, embedding_dim), got shape {shape}")
    index = _index_tensor(ids, table, shape[0], "embedding", "ids")
    flat = index.reshape(index.size)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        rows = g.reshape(flat.size, shape[1])
        return [RI.index_select_backward(rows, 0, flat, values[0].shape), None]

    return apply_op(lambda t, i: RI.embedding(i, t), grad, table, index, op_name="embedding")


def gather(x: Operand, axis: int, index: Any) -> Node:
    """``torch.gather``: ``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along ``axis``; shape of index."""
    shape = _shape(x, "gather", "x")
    index_shape = np.shape(index.value if isinstance(index, Node) else index)
    ax = RI.check_gather_shapes(shape, axis, index_shape)
    index = _index_tensor(index, x, shape[ax] if shape else 1, "gather", "index", ax)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [RI.gather_backward(g, ax, index, values[0].shape), None]

    return apply_op(lambda v, i: RI.gather(v, ax, i), grad, x, index, op_name="gather", attrs={"axis": ax})


def index_select(x: Operand, axis: int, index: Any) -> Node:
    """``torch.index_select``: x's entries at the 1-d ``index`` along ``axis``."""
    shape = _shape(x, "index_select", "x")
    index_shape = np.shape(index.value if isinstance(index, Node) else index)
    ax = RI.check_index_select_shapes(shape, axis, index_shape)
    index = _index_tensor(index, x, shape[ax], "index_select", "index", ax)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [RI.index_select_backward(g, ax, index, values[0].shape), None]

    return apply_op(lambda v, i: RI.index_select(v, ax, i), grad, x, index, op_name="index_select", attrs={"axis": ax})


__all__ = ["embedding", "gather", "index_select"]
