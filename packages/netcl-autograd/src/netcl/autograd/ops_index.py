"""Differentiable integer-index ops: ``embedding``, ``gather``, ``index_select``.

Indices are integer Tensors, integer Nodes or NumPy integer arrays (copied to the operand's
device). They get no gradient. The operand's gradient is a deterministic scatter-add (see
``netcl.runtime.ops.indexing``: no atomics, repeated indices summed in index order).
Out-of-range host indices raise ``IndexError`` before any launch; an OpenCL index Tensor is checked by
the kernel that reads it, and ``IndexError`` is raised at the host's next wait (``netcl.core.device_errors``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, _local, apply_op, forward_only, record_one, untracked
from netcl.core import DTypeError, ShapeError, Tensor
from netcl.runtime.ops import gathering, indexing, layout, pointwise, selecting

Operand = Any  # Node | Tensor
_Grads = list[Tensor | None]


class _Index:
    """An index as given: a Tensor (used as is) or a host array, copied once per device it meets."""

    def __init__(self, index: Any, size: int, op: str, arg: str, axis: int | None = None) -> None:
        self.tensor: Tensor | None = None
        self.copies: dict[Any, Tensor] = {}
        #: a traced index (inside jit_compile / fuse_graph): passed to the op as an argument
        self.traced: Node | None = None
        if isinstance(index, Node) and not isinstance(index.value, Tensor):
            if np.dtype(index.dtype).kind not in "iu":
                raise DTypeError(f"{op}: {arg} must be an integer tensor (int32/int64), got dtype {index.dtype}")
            self.traced, self.shape = index, tuple(index.shape)
            return
        if isinstance(index, Node):
            index = index.value
        if isinstance(index, Tensor):
            self.tensor = indexing.check_index_tensor(index, op, arg)
            self.shape = index.shape
            return
        host = np.asarray(index)
        if host.dtype.kind not in "iu":
            raise DTypeError(
                f"{op}: {arg} must hold integers (an int Tensor or NumPy int array), got dtype {host.dtype}"
            )
        indexing.check_index_range(host, size, op, arg, axis)
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


def _indexed(
    op: Callable[[Tensor, Tensor], Tensor],
    grad: Callable[[Tensor, Tensor, Tensor], Tensor],
    x: Operand,
    index: _Index,
    op_name: str,
    attrs: dict[str, Any] | None = None,
) -> Node:
    """``op(x, index)`` through ``apply_op``, ``grad(g, x, index)`` its gradient w.r.t. x (the index gets none).

    A traced index is an argument of the op (a trace sees it as an input); any other index is a constant
    of the op, copied to x's device once."""
    if index.traced is not None:
        return apply_op(
            op, lambda g, values, out: [grad(g, values[0], values[1]), None], x, index.traced,
            op_name=op_name, attrs=attrs,
        )  # fmt: skip
    return apply_op(
        lambda v: op(v, index.on(v.device)),
        lambda g, values, out: [grad(g, values[0], index.on(g.device))],
        x,
        op_name=op_name,
        attrs=attrs,
    )


class _AlongForward:
    """``op(v, axis, index)``: gather / index_select of one call with a constant index Tensor."""

    __slots__ = ("op", "axis", "index")

    def __init__(self, op: Callable[[Tensor, int, Tensor], Tensor], axis: int, index: Tensor) -> None:
        self.op, self.axis, self.index = op, axis, index

    def __call__(self, v: Tensor) -> Tensor:
        return self.op(v, self.axis, self.index)


class _AlongGrad:
    """The gradient of an ``_AlongForward`` w.r.t. its operand: ``backward(g, axis, index, operand shape)``."""

    __slots__ = ("backward", "axis", "index")

    def __init__(self, backward: Callable[..., Tensor], axis: int, index: Tensor) -> None:
        self.backward, self.axis, self.index = backward, axis, index

    def __call__(self, g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [self.backward(g, self.axis, self.index, values[0].shape)]


def _recorded_along(
    forward: Callable[..., Tensor], backward: Callable[..., Tensor], x: Operand, axis: int, index: Tensor, op_name: str
) -> Node:
    """``forward(x, axis, index)`` recorded with the gradient ``backward`` (grad mode on or a tracer installed):
    a Node x with a Tensor value and no tracer straight through ``record_one``, anything else through
    ``apply_op`` (a tracer takes the call; a strided view is gathered there)."""
    grad = _AlongGrad(backward, axis, index)
    if type(x) is Node and _local.tracer is None and type(x.value) is Tensor:
        value = x.value
        return record_one(forward(value, axis, index), x, value, grad, op_name)
    return apply_op(_AlongForward(forward, axis, index), grad, x, op_name=op_name, attrs={"axis": axis})


#: (op, x shape, axis: an exact int, index shape, index dtype) -> the normalized axis of a gather /
#: index_select by an index Tensor whose checks passed (they read nothing else)
_CHECKED: dict[tuple, int] = {}


def _checked_axis(op: str, check_shapes: Any, shape: tuple[int, ...], axis: Any, index: Tensor) -> int:
    """The normalized ``axis`` of ``op`` on x of ``shape`` with the index Tensor ``index``: ``check_shapes``
    and the index's dtype check run once per (shape, int axis, index shape and dtype), then remembered."""
    key = (op, shape, axis, index.shape, index.dtype) if type(axis) is int else None
    ax = _CHECKED.get(key) if key is not None else None
    if ax is None:
        ax = check_shapes(shape, axis, index.shape)
        indexing.check_index_tensor(index, op)
        if key is not None:
            if len(_CHECKED) >= 4096:
                _CHECKED.clear()
            _CHECKED[key] = ax
    return ax


def _forward_only_of_tensors(x: Any, index: Any) -> bool:
    """Whether an index op of ``x`` (a Tensor or a Node of one) with index Tensor ``index`` runs its forward alone
    (``forward_only``): then its front returns the runtime op's result in a bare Node, as ``apply_op`` would."""
    return type(index) is Tensor and type(x.value if type(x) is Node else x) is Tensor and forward_only()


def _shape(x: Any, op: str, arg: str) -> tuple[int, ...]:
    kind = type(x)
    if kind is Node or kind is Tensor:
        return tuple(x.value.shape if kind is Node else x.shape)
    if not hasattr(x, "shape"):
        raise TypeError(f"{op}: {arg} must be a Node or Tensor, got {type(x).__name__}")
    return tuple(x.shape)


def embedding(ids: Any, table: Operand, padding_idx: int | None = None) -> Node:
    """Rows of ``table`` (num_embeddings, dim) at ``ids`` (any shape): shape ``ids.shape + (dim,)``.

    ``padding_idx`` (torch's): the row at that id (negative: counted from the end) gets no gradient."""
    shape = _shape(table, "embedding", "table")
    if len(shape) != 2:
        raise ShapeError(f"embedding: table must be 2-d (num_embeddings, embedding_dim), got shape {shape}")
    pad = padding_row(padding_idx, shape[0], "embedding")
    index = _Index(ids, shape[0], "embedding", "ids")

    def grad(g: Tensor, t: Tensor, ids: Tensor) -> Tensor:
        flat = ids.reshape(ids.size)
        rows = g.reshape(flat.size, shape[1])
        if pad is not None:  # the padding id's rows of g contribute nothing
            kept = pointwise.ne(flat, pad)
            rows = pointwise.mul(
                rows, (kept if kept.dtype == rows.dtype else layout.cast(kept, rows.dtype)).reshape(flat.size, 1)
            )
        return selecting.index_select_backward(rows, 0, flat, t.shape)

    attrs = None if pad is None else {"padding_idx": pad}
    return _indexed(lambda t, ids: selecting.embedding(ids, t), grad, table, index, "embedding", attrs)


def padding_row(padding_idx: Any, rows: int, op: str) -> int | None:
    """``padding_idx`` as a row of a table of ``rows`` rows (None stays None); ValueError outside [-rows, rows)."""
    if padding_idx is None:
        return None
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)):
        raise TypeError(f"{op}: padding_idx must be an int or None, got {padding_idx!r}")
    if not -rows <= padding_idx < rows:
        raise ValueError(
            f"{op}: padding_idx must be within num_embeddings ({rows}): in [-{rows}, {rows}), got {padding_idx}"
        )
    return int(padding_idx) % rows


def gather(x: Operand, axis: int, index: Any) -> Node:
    """``torch.gather``: ``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along ``axis``; shape of index."""
    given = index.value if type(index) is Node else index
    if _forward_only_of_tensors(x, given):  # the runtime op checks the shapes, axis and dtypes itself
        return untracked(gathering.gather(x.value if type(x) is Node else x, axis, given), "gather")
    shape = _shape(x, "gather", "x")
    if type(given) is Tensor:  # an index Tensor (or a Node's): a constant of the op, checked by its shapes
        ax = _checked_axis("gather", gathering.check_gather_shapes, shape, axis, given)
        if forward_only():  # what apply_op would do: the forward, a bare Node
            return untracked(gathering.gather(x.value if isinstance(x, Node) else x, ax, given), "gather")
        return _recorded_along(gathering.gather, gathering.gather_backward, x, ax, given, "gather")
    index_shape = np.shape(given)
    ax = gathering.check_gather_shapes(shape, axis, index_shape)
    index = _Index(index, shape[ax] if shape else 1, "gather", "index", ax)

    def grad(g: Tensor, v: Tensor, i: Tensor) -> Tensor:
        return gathering.gather_backward(g, ax, i, v.shape)

    return _indexed(lambda v, i: gathering.gather(v, ax, i), grad, x, index, "gather", {"axis": ax})


def index_select(x: Operand, axis: int, index: Any) -> Node:
    """``torch.index_select``: x's entries at the 1-d ``index`` along ``axis``."""
    given = index.value if type(index) is Node else index
    if _forward_only_of_tensors(x, given):  # the runtime op checks the shapes, axis and dtypes itself
        return untracked(selecting.index_select(x.value if type(x) is Node else x, axis, given), "index_select")
    shape = _shape(x, "index_select", "x")
    if type(given) is Tensor:  # an index Tensor (or a Node's): a constant of the op, checked by its shapes
        ax = _checked_axis("index_select", selecting.check_index_select_shapes, shape, axis, given)
        if forward_only():  # what apply_op would do: the forward, a bare Node
            value = x.value if isinstance(x, Node) else x
            return untracked(selecting.index_select(value, ax, given), "index_select")
        return _recorded_along(selecting.index_select, selecting.index_select_backward, x, ax, given, "index_select")
    index_shape = np.shape(given)
    ax = selecting.check_index_select_shapes(shape, axis, index_shape)
    index = _Index(index, shape[ax], "index_select", "index", ax)

    def grad(g: Tensor, v: Tensor, i: Tensor) -> Tensor:
        return selecting.index_select_backward(g, ax, i, v.shape)

    return _indexed(lambda v, i: selecting.index_select(v, ax, i), grad, x, index, "index_select", {"axis": ax})


__all__ = ["embedding", "gather", "index_select"]
