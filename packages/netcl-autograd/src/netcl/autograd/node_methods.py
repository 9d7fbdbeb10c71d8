"""Node's operators and op methods, installed on ``Node`` at import (JAX's ``array_methods`` pattern).

``engine`` defines ``Node`` without importing a single op; this module, which sits above ``ops`` and
``ops_shape``, sets ``Node.__add__``, ``Node.reshape``, ``Node.T``, ``Node.__getitem__``, ... to the
differentiable ops. ``netcl.autograd`` imports it, so every ``Node`` has them once any
``netcl.autograd`` module is imported. Each method is a thin call of the op of the same meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from netcl.autograd import ops, ops_shape
from netcl.autograd.engine import Node


def _binary(op: Callable[[Any, Any], Node], name: str) -> tuple[Callable[..., Node], Callable[..., Node]]:
    """``node <op> other`` and its reflected form ``other <op> node``, both calling ``op``."""

    def forward(self: Node, other: Any) -> Node:
        return op(self, other)

    def reflected(self: Node, other: Any) -> Node:
        return op(other, self)

    forward.__name__, reflected.__name__ = f"__{name}__", f"__r{name}__"
    forward.__qualname__, reflected.__qualname__ = f"Node.__{name}__", f"Node.__r{name}__"
    return forward, reflected


def _compare(op: Callable[[Any, Any], Node], name: str) -> Callable[..., Node]:
    """``node <cmp> other``: a 0/1 Node from ``op`` (Python reflects comparisons by itself)."""

    def compare(self: Node, other: Any) -> Node:
        return op(self, other)

    compare.__name__ = f"__{name}__"
    compare.__qualname__ = f"Node.__{name}__"
    return compare


def _neg(self: Node) -> Node:
    return ops.neg(self)


def _matmul(self: Node, other: Any) -> Node:
    return ops.matmul(self, other)


def _dims(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """``f(2, 3)`` and ``f((2, 3))`` read alike: the one sequence argument, else the arguments."""
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape


def reshape(self: Node, *shape: int | tuple[int, ...]) -> Node:
    """``ops.reshape`` with the shape as one tuple or as separate ints."""
    return ops.reshape(self, _dims(shape))


def sum(self: Node, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Node:
    """``ops.sum`` over ``axis`` (all axes when None)."""
    return ops.sum(self, axis, keepdims)


def mean(self: Node, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Node:
    """``ops.mean`` over ``axis`` (all axes when None)."""
    return ops.mean(self, axis, keepdims)


def max(self: Node, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Node:
    """``ops.max`` over ``axis`` (all axes when None)."""
    return ops.max(self, axis, keepdims)


def transpose(self: Node, axes: Sequence[int] | None = None) -> Node:
    """``ops.transpose``: the axes reversed, or permuted as ``axes``."""
    return ops.transpose(self, axes)


def _t(self: Node) -> Node:
    """The axes reversed (``ops.transpose`` without axes)."""
    return ops.transpose(self)


def getitem(self: Node, key: Any) -> Node:
    """Basic indexing (ints, slices, None, ...): a view when the selection is contiguous, else a copy."""
    return ops_shape.getitem(self, key)


def flatten(self: Node, start_axis: int = 0, end_axis: int = -1) -> Node:
    """``ops_shape.flatten`` of axes ``start_axis`` .. ``end_axis`` into one."""
    return ops_shape.flatten(self, start_axis, end_axis)


def permute(self: Node, *axes: int | Sequence[int]) -> Node:
    """``ops_shape.permute`` with the axes as one sequence or as separate ints."""
    return ops_shape.permute(self, _dims(axes))


def unsqueeze(self: Node, axis: int) -> Node:
    """``ops_shape.unsqueeze``: a new axis of length 1 at ``axis``."""
    return ops_shape.unsqueeze(self, axis)


def squeeze(self: Node, axis: int | Sequence[int] | None = None) -> Node:
    """``ops_shape.squeeze``: drop the length-1 axes (or only ``axis``)."""
    return ops_shape.squeeze(self, axis)


def install_node_methods(cls: type = Node) -> None:
    """Set the operators and op methods on ``cls`` (``Node``); idempotent."""
    for name, op in (("add", ops.add), ("sub", ops.sub), ("mul", ops.mul), ("truediv", ops.div), ("pow", ops.pow)):
        forward, reflected = _binary(op, name)
        setattr(cls, f"__{name}__", forward)
        setattr(cls, f"__r{name}__", reflected)
    for name, op in (("lt", ops.lt), ("le", ops.le), ("gt", ops.gt), ("ge", ops.ge)):
        setattr(cls, f"__{name}__", _compare(op, name))
    cls.__neg__ = _neg
    cls.__matmul__ = _matmul
    cls.__getitem__ = getitem
    cls.T = property(_t)
    for method in (reshape, sum, mean, max, transpose, flatten, permute, unsqueeze, squeeze):
        setattr(cls, method.__name__, method)


install_node_methods()
