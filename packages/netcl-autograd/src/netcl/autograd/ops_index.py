"""Differentiable integer-index ops: ``embedding``, ``gather``, ``index_select``.

Indices are integer Tensors, integer Nodes or NumPy integer arrays (copied to the operand's
device). They get no gradient. The operand's gradient is a deterministic scatter-add (see
``netcl.runtime.ops.indexing``: no atomics, repeated indices summed in index order).
Out-of-range host indices raise ``IndexError`` before any launch; an OpenCL index Tensor is checked by
the kernel that reads it, and ``IndexError`` is raised at the host's next wait (``netcl.core.device_errors``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op
from netcl.core import DTypeError, ShapeError, Tensor
from netcl.runtime.ops import gathering as RG  # noqa: N812
from netcl.runtime.ops import indexing as RI  # noqa: N812
from netcl.runtime.ops import selecting as RS  # noqa: N812

Operand = Any  # Node | Tensor
_Grads = list[Tensor | None]


class _Index:
    """An index as given: a Tensor (used as is) or a host array, copied once per device it meets."""

    def __init__(self, index: Any, size: int, op: str, arg: str, axis: int | None = None) -> None:
        if isinstance(index, Node):
            index = index.value
        self.tensor: Tensor | None = None
        self.copies: dict[Any, Tensor] = {}
        if isinstance(index, Tensor):
            self.tensor = RI.check_index_tensor(index, op, arg)
            self.shape = index.shape
            return
        host = np.asarray(index)
        if host.dtype.kind not in "iu":
            raise DTypeError(
                f"{op}: {arg} must hold integers (an int Tensor or NumPy int array), got dtype {host.dtype}"
            )
        RI.check_index_range(host, size, op, arg, axis)
        small = host.size == 0 or (host.min() >= -(2**31) and host.max() < 2**31)
        self.host = host.astype(np.int32 if small else np.int64)
        self.shape = self.host.shape

    def on(self, device: Any) -> Tensor:
        """The index as a Tensor on ``device`` (a host index is copied there on first use)."""
        if self.tensor is not None:
            return self.tensor
        copy = self.copies.get(device)
        if copy is None:
            copy = self.copies[device] = Tensor.from_host(device, self.host)
        return copy


def _shape(x: Any, op: str, arg: str) -> tuple[int, ...]:
    if not hasattr(x, "shape"):
        raise TypeError(f"{op}: {arg} must be a Node or Tensor, got {type(x).__name__}")
    return tuple(x.shape)


def embedding(ids: Any, table: Operand) -> Node:
    """Rows of ``table`` (num_embeddings, dim) at ``ids`` (any shape): shape ``ids.shape + (dim,)``."""
    shape = _shape(table, "embedding", "table")
    if len(shape) != 2:
        raise ShapeError(f"embedding: table must be 2-d (num_embeddings, embedding_dim), got shape {shape}")
    index = _Index(ids, shape[0], "embedding", "ids")

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        flat = index.on(g.device)
        flat = flat.reshape(flat.size)
        return [RS.index_select_backward(g.reshape(flat.size, shape[1]), 0, flat, values[0].shape)]

    return apply_op(lambda t: RS.embedding(index.on(t.device), t), grad, table, op_name="embedding")


def gather(x: Operand, axis: int, index: Any) -> Node:
    """``torch.gather``: ``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along ``axis``; shape of index."""
    shape = _shape(x, "gather", "x")
    index_shape = np.shape(index.value if isinstance(index, Node) else index)
    ax = RG.check_gather_shapes(shape, axis, index_shape)
    index = _Index(index, shape[ax] if shape else 1, "gather", "index", ax)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [RG.gather_backward(g, ax, index.on(g.device), values[0].shape)]

    return apply_op(lambda v: RG.gather(v, ax, index.on(v.device)), grad, x, op_name="gather", attrs={"axis": ax})


def index_select(x: Operand, axis: int, index: Any) -> Node:
    """``torch.index_select``: x's entries at the 1-d ``index`` along ``axis``."""
    shape = _shape(x, "index_select", "x")
    index_shape = np.shape(index.value if isinstance(index, Node) else index)
    ax = RS.check_index_select_shapes(shape, axis, index_shape)
    index = _Index(index, shape[ax], "index_select", "index", ax)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [RS.index_select_backward(g, ax, index.on(g.device), values[0].shape)]

    return apply_op(
        lambda v: RS.index_select(v, ax, index.on(v.device)), grad, x, op_name="index_select", attrs={"axis": ax}
    )


__all__ = ["embedding", "gather", "index_select"]
