"""Node's operators and op methods, installed on ``Node`` at import (JAX's ``array_methods`` pattern).

``engine`` defines ``Node`` without importing a single op; this module, which sits above the op modules,
sets ``Node.__add__``, ``Node.reshape``, ``Node.T``, ``Node.__getitem__``, ... to the differentiable ops.
``netcl.autograd`` imports it, so every ``Node`` has them once any ``netcl.autograd`` module is imported.
Each method is a thin call of the op of the same meaning.

The methods a torch port calls on tensors are here with torch's meaning where it is unambiguous: ``view``,
``contiguous`` / ``is_contiguous``, ``abs`` / ``exp`` / ``log`` / ``sqrt`` / ``sigmoid`` / ``tanh`` / ``relu``,
``softmax(dim)``, ``log_softmax(dim)``, ``clamp(min, max)``, ``matmul``, ``pow``, ``argmax`` / ``argmin(dim, keepdim)``,
``expand``, ``masked_fill``, ``chunk``, ``split``, ``gather``, ``index_select``, ``eq`` / ``ne`` / ``lt`` / ``le`` /
``gt`` / ``ge``, ``dim()``, ``numel()``, ``tolist()``, ``float()`` / ``double()`` / ``half()`` / ``int()`` /
``long()`` and ``to(device, dtype)`` (through ``ops_shape.cast``); ``sum`` / ``mean`` take ``dim`` / ``keepdim`` as
well as ``axis`` / ``keepdims``, and ``transpose(dim0, dim1)`` swaps two axes as torch's does (one sequence, or none, is
NumPy's permutation). Where torch and NumPy disagree, netcl keeps NumPy's meaning and says so: ``x.max(1)`` is the
maximum values (torch returns values and indices), ``size`` is the element count (torch's ``size()`` is the shape:
use ``shape``), and ``==`` on Nodes is Python's identity (use ``eq``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.autograd import ops, ops_activation, ops_index, ops_reduce, ops_shape, ops_softmax
from netcl.autograd.engine import Node, names_dtype


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


def _axis(op: str, axis: Any, dim: Any) -> Any:
    """The reduced axes of a call that may name them ``axis`` (NumPy) or ``dim`` (torch), not both."""
    if dim is not None:
        if axis is not None:
            raise TypeError(f"{op}: give axis or dim, not both")
        return dim
    return axis


def sum(
    self: Node, axis: int | tuple[int, ...] | None = None, keepdims: bool = False, *, dim: Any = None,
    keepdim: bool = False,
) -> Node:  # fmt: skip
    """``ops.sum`` over ``axis`` (or torch's ``dim``; all axes when None), ``keepdims`` or ``keepdim``."""
    return ops.sum(self, _axis("sum", axis, dim), keepdims or keepdim)


def mean(
    self: Node, axis: int | tuple[int, ...] | None = None, keepdims: bool = False, *, dim: Any = None,
    keepdim: bool = False,
) -> Node:  # fmt: skip
    """``ops.mean`` over ``axis`` (or torch's ``dim``; all axes when None), ``keepdims`` or ``keepdim``."""
    return ops.mean(self, _axis("mean", axis, dim), keepdims or keepdim)


def max(self: Node, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Node:
    """``ops.max`` over ``axis`` (all axes when None)."""
    return ops.max(self, axis, keepdims)


def transpose(self: Node, *dims: Any, axes: Sequence[int] | None = None) -> Node:
    """``ops.transpose``: no argument reverses the axes, one sequence (or ``axes=``) permutes them (NumPy's), two
    ints swap those two axes (torch's ``transpose(dim0, dim1)``)."""
    if axes is not None:
        if dims:
            raise TypeError(f"transpose: give axes= or positional dims, not both (got {dims!r} and axes={axes!r})")
        return ops.transpose(self, axes)
    axes = dims
    if len(axes) == 2 and all(isinstance(a, int) and not isinstance(a, bool) for a in axes):
        ndim = len(self.shape)
        for a in axes:
            if not -ndim <= a < ndim:
                raise IndexError(f"transpose: dim {a} is out of range for a {ndim}-d Node of shape {self.shape}")
        order = list(range(ndim))
        first, second = axes[0] % ndim, axes[1] % ndim
        order[first], order[second] = order[second], order[first]
        return ops.transpose(self, tuple(order))
    if len(axes) > 1:
        raise TypeError(f"transpose: takes no axes, one sequence of axes or two dims to swap, got {axes!r}")
    return ops.transpose(self, axes[0] if axes else None)


def _t(self: Node) -> Node:
    """The axes reversed (``ops.transpose`` without axes)."""
    return ops.transpose(self)


def getitem(self: Node, key: Any) -> Node:
    """Basic indexing (ints, slices, None, ...): a view with no launch (``ops_shape.getitem``)."""
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


def view(self: Node, *shape: int | tuple[int, ...]) -> Node:
    """torch's ``view``: ``reshape`` (of a C-contiguous value, a view sharing its memory; of a strided view such as
    ``x.T``, where torch's ``view`` may refuse, a gathered copy)."""
    return ops.reshape(self, _dims(shape))


def contiguous(self: Node) -> Node:
    """The Node itself when its value is C-contiguous; for a strided view (``x.T``, ``x[:, 0]``) a Node of the
    gathered copy, its gradient passed through unchanged."""
    if not getattr(self.value, "strided", False):  # a C-contiguous value (or a traced one)
        return self
    return ops.apply_op(_gathered, _passed_through, self, op_name="contiguous")


def _gathered(v: Any) -> Any:
    return v.contiguous()


def _passed_through(g: Any, values: tuple[Any, ...], out: Any) -> list[Any]:
    return [g]


def is_contiguous(self: Node) -> bool:
    """Whether the value is C-contiguous (False for a strided view such as ``x.T``)."""
    return not getattr(self.value, "strided", False)


def softmax(self: Node, dim: int) -> Node:
    """softmax along ``dim``."""
    return ops_softmax.softmax(self, dim)


def log_softmax(self: Node, dim: int) -> Node:
    """log_softmax along ``dim``."""
    return ops_softmax.log_softmax(self, dim)


def clamp(self: Node, min: Any = None, max: Any = None) -> Node:
    """Values below ``min`` / above ``max`` (numbers or Nodes; None: no bound) replaced by the bound."""
    return ops.clamp(self, min, max)


def matmul(self: Node, other: Any) -> Node:
    """``self @ other``."""
    return ops.matmul(self, other)


def pow(self: Node, exponent: Any) -> Node:
    """``self ** exponent``."""
    return ops.pow(self, exponent)


def argmax(self: Node, dim: int | None = None, keepdim: bool = False) -> Node:
    """Index of the maximum along ``dim`` (of the flattened Node when None)."""
    return ops_reduce.argmax(self, dim, keepdim)


def argmin(self: Node, dim: int | None = None, keepdim: bool = False) -> Node:
    """Index of the minimum along ``dim`` (of the flattened Node when None)."""
    return ops_reduce.argmin(self, dim, keepdim)


def expand(self: Node, *sizes: int | tuple[int, ...]) -> Node:
    """torch's ``expand``: broadcast to ``sizes``, where -1 keeps that (aligned from the right) axis's length."""
    target = _dims(sizes)
    shape = tuple(self.shape)
    offset = len(target) - len(shape)
    if offset < 0:
        raise ValueError(f"expand: {len(target)} sizes for a {len(shape)}-d Node of shape {shape}")
    resolved = []
    for i, size in enumerate(target):
        if size == -1:
            if i < offset:
                raise ValueError(f"expand: -1 is not allowed for the new leading axis {i}, got sizes {target}")
            size = shape[i - offset]
        resolved.append(size)
    return ops.broadcast_to(self, tuple(resolved))


def masked_fill(self: Node, mask: Any, value: float) -> Node:
    """``value`` where ``mask`` is non-zero, else the Node's values (no gradient where filled)."""
    return ops.where(mask, value, self)


def chunk(self: Node, chunks: int, dim: int = 0) -> tuple[Node, ...]:
    """torch's ``chunk``: pieces of ``ceil(length / chunks)`` along ``dim`` (the last may be smaller; fewer pieces
    when the length does not need them all)."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    length = tuple(self.shape)[dim]
    return ops_shape.split(self, -(-length // chunks) or 1, dim)


def split(self: Node, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Node, ...]:
    """Pieces along ``dim``: equal ones of ``split_size`` (the last may be smaller) or the given sizes."""
    return ops_shape.split(self, split_size_or_sections, dim)


def gather(self: Node, dim: int, index: Any) -> Node:
    """``out[..., i, ...] = self[..., index[..., i, ...], ...]`` along ``dim``."""
    return ops_index.gather(self, dim, index)


def index_select(self: Node, dim: int, index: Any) -> Node:
    """The entries at ``index`` (1-d) along ``dim``."""
    return ops_index.index_select(self, dim, index)


_MOVE = Node.to  # the engine's: a copy to another device whose gradient flows back


def to(self: Node, *args: Any, device: Any = None, dtype: Any = None) -> Node:
    """torch's ``to``: ``to(device)``, ``to(dtype)``, ``to(device, dtype)`` or by keyword; the Node itself when
    nothing changes. A device is a ``Device`` or a spec string (``"cpu"``, ``"opencl:0"``), a dtype anything
    NumPy reads as one (``nc.float16``, ``"float32"``); the gradient flows back through both."""
    for arg in args:
        if names_dtype(arg):
            if dtype is not None:
                raise TypeError(f"to: two dtypes given ({dtype!r} and {arg!r})")
            dtype = arg
        else:
            if device is not None:
                raise TypeError(f"to: two devices given ({device!r} and {arg!r})")
            device = arg
    out = self if dtype is None else ops_shape.cast(self, dtype)
    return out if device is None else _MOVE(out, device)


def _cast_method(dtype: Any, name: str) -> Callable[[Node], Node]:
    def method(self: Node) -> Node:
        return ops_shape.cast(self, dtype)

    method.__name__, method.__qualname__ = name, f"Node.{name}"
    method.__doc__ = f"The values as {np.dtype(dtype).name} (the Node itself when they are)."
    return method


def cuda(self: Node, device: int | None = None) -> Node:
    """torch's ``cuda()``: the Node on OpenCL GPU ``device`` (default 0; the spec "cuda[:index]")."""
    return _MOVE(self, "cuda" if device is None else f"cuda:{device}")


def cpu(self: Node) -> Node:
    """torch's ``cpu()``: the Node on the NumPy backend, the host's device (the device spec "cpu")."""
    return _MOVE(self, "cpu")


def dim(self: Node) -> int:
    """The number of axes (torch's ``dim()``, NumPy's ``ndim``)."""
    return len(self.shape)


def numel(self: Node) -> int:
    """The number of elements."""
    return self.size


def tolist(self: Node) -> Any:
    """The values as (nested) Python lists, read back from the device."""
    return self.to_host().tolist()


def _unary_method(op: Callable[[Any], Node], name: str) -> Callable[[Node], Node]:
    def method(self: Node) -> Node:
        return op(self)

    method.__name__, method.__qualname__ = name, f"Node.{name}"
    method.__doc__ = f"``{name}`` of every element."
    return method


_SYMBOLS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _compare_method(op: Callable[[Any, Any], Node], name: str) -> Callable[[Node, Any], Node]:
    def method(self: Node, other: Any) -> Node:
        return op(self, other)

    method.__name__, method.__qualname__ = name, f"Node.{name}"
    method.__doc__ = f"1.0 where ``self {_SYMBOLS[name]} other`` elementwise, else 0.0 (no gradient)."
    return method


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
    methods = (reshape, sum, mean, max, transpose, flatten, permute, unsqueeze, squeeze, view, contiguous,
               is_contiguous, softmax, log_softmax, clamp, matmul, pow, argmax, argmin, expand, masked_fill, chunk,
               split, gather, index_select, dim, numel, tolist, cuda, cpu)  # fmt: skip
    for method in methods:
        setattr(cls, method.__name__, method)
    unary = {"abs": ops.abs, "exp": ops.exp, "log": ops.log, "sqrt": ops.sqrt, "sigmoid": ops.sigmoid,
             "tanh": ops.tanh, "relu": ops.relu}  # fmt: skip
    for name, op in unary.items():
        setattr(cls, name, _unary_method(op, name))
    compare = {"eq": ops_activation.eq, "ne": ops_activation.ne, "lt": ops.lt, "le": ops.le, "gt": ops.gt,
               "ge": ops.ge}  # fmt: skip
    for name, op in compare.items():
        setattr(cls, name, _compare_method(op, name))
    casts = {"float": np.float32, "double": np.float64, "half": np.float16, "int": np.int32, "long": np.int64}
    for name, dtype in casts.items():
        setattr(cls, name, _cast_method(dtype, name))
    cls.to = to


install_node_methods()
