"""Autograd ops generated from the elementwise definitions (``netcl.runtime.ops.elementwise_defs``).

``apply_elementwise(name, inputs, attrs)`` is the whole op: its forward is the definition's eager
kernel, its gradient for each input that needs one is the definition's derivative template run
as ONE fused kernel (``pointwise.derivative``; ``{g}`` alone is ``g`` itself, no kernel), summed back
to the input's shape when the input was broadcast. ``op_name`` and ``attrs`` are the definition's
name and attributes: the JIT primitive of the same name (generated from the same entry) traces it.
``unary`` / ``binary`` build the public functions (a Python number on one side of a binary op
selects its ``_scalar_right`` / ``_scalar_left`` variant, the number in ``attrs["scalar"]``).
``fronts`` builds one for every defined op without attributes: ``netcl.autograd`` exports those
that have no hand-written front, so a new op needs only its definition.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from netcl.autograd import grad_mode
from netcl.autograd.engine import Node, _local, apply_op, gathered, untracked
from netcl.autograd.saved_values import check_unmodified
from netcl.core import Tensor, writes
from netcl.core.dtypes import FLOATING
from netcl.core.strided_view import StridedView
from netcl.runtime.ops import layout
from netcl.runtime.ops.elementwise_defs import ALL, DEFS, OPDEFS, PLACEHOLDER, ZERO, forward_operands
from netcl.runtime.ops.pointwise import apply, derivative

Operand = Any  # Node | Tensor | int | float
_Grads = list[Tensor | None]


#: what ``is_scalar`` accepts (none of them is an ndarray)
_NUMBERS = (int, float, np.number)


def is_scalar(x: Any) -> bool:
    """Whether ``x`` is a Python or NumPy number (as opposed to a Node or Tensor)."""
    return isinstance(x, (int, float, np.number)) and not isinstance(x, np.ndarray)


def needs_grad(x: Any) -> bool:
    """Whether ``x`` is a Node that requires a gradient."""
    return isinstance(x, Node) and x.requires_grad


class _Entry:
    """What ``apply_elementwise`` reads per call of one op, resolved once per name (the definitions
    never change after import); ``forward`` is the op's forward when its operands are its inputs."""

    __slots__ = ("d", "kernel", "differentiable", "forward", "scalar_slot", "reads")

    def __init__(self, name: str) -> None:
        d = self.d = ALL[name]
        kernel = self.kernel = OPDEFS[d.base or d.name]
        self.differentiable = d.differentiable
        #: the inputs (by position) and the output (-1) its derivatives read: what a backward checks for writes
        self.reads = saved_reads(d)
        self.forward: Callable[..., Tensor] | None = None
        #: a one-input variant whose kernel takes (input, scalar) or (scalar, input): where the scalar goes
        self.scalar_slot: int | None = None
        one = d.attrs == ("scalar",) and len(d.inputs) == 1
        probe = forward_operands(d, ("input",), {"scalar": "scalar"}) if one else None
        if probe in (("input", "scalar"), ("scalar", "input")):
            self.scalar_slot = probe.index("scalar")
        if not d.attrs and not d.base:  # no attributes, not a variant: the inputs are the kernel's operands

            def forward(*values: Any) -> Tensor:
                return apply(kernel, values)

            self.forward = forward

    def scalar_operands(self, value: Any, scalar: Any) -> tuple[Any, Any]:
        """The kernel's operands of a scalar variant (``scalar_slot`` set): the scalar on its side of the input."""
        return (value, scalar) if self.scalar_slot else (scalar, value)


_ENTRIES: dict[str, _Entry] = {}


def saved_reads(d: Any) -> tuple[int, ...]:
    """The positions of the inputs that ``d``'s non-zero derivative templates name, and -1 if they name ``{out}``."""
    names = {name for grad in d.grads if grad != ZERO for name in PLACEHOLDER.findall(grad)}
    return (*(i for i, name in enumerate(d.inputs) if name in names), *((-1,) if "out" in names else ()))


class _Grad:
    """The gradient of one call of an elementwise op: each input that needs one gets the definition's
    derivative template as one fused kernel, summed back to the input's shape where it was broadcast."""

    __slots__ = ("name", "d", "inputs", "attrs")

    def __init__(self, name: str, d: Any, inputs: Sequence[Operand], attrs: dict[str, Any]) -> None:
        self.name, self.d, self.inputs, self.attrs = name, d, inputs, attrs

    def __call__(self, g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        d = self.d
        named = {**dict(zip(d.inputs, values, strict=True)), "g": g, "out": out, **self.attrs}
        grads: _Grads = []
        for index, (operand, value) in enumerate(zip(self.inputs, values, strict=True)):
            if d.grads[index] == ZERO or not needs_grad(operand):
                grads.append(None)
                continue
            full = derivative(self.name, index, named)
            grads.append(
                full if tuple(full.shape) == tuple(value.shape) else layout.sum_to_shape(full, tuple(value.shape))
            )
        return grads


class _Recorded(_Grad):
    """A recorded call's ``Node.grad_fn``: its ``_Grad`` bound to the call's values and output, one
    gradient per Node input (what ``apply_op``'s bound form returns), built without ``apply_op``."""

    __slots__ = ("values", "out", "index", "reads", "written")

    def __init__(
        self,
        name: str,
        d: Any,
        inputs: Sequence[Operand],
        attrs: dict[str, Any],
        values: tuple[Any, ...],
        out: Tensor,
        index: list[int],
        reads: tuple[int, ...],
    ) -> None:
        self.name, self.d, self.inputs, self.attrs = name, d, inputs, attrs
        self.values, self.out, self.index, self.reads = values, out, index, reads
        #: the in-place writes clock when the op ran (``saved_values``)
        self.written = writes.clock

    def check_unmodified(self) -> None:
        """``ModifiedInPlaceError`` if a value the derivatives read was written in place since the op ran."""
        check_unmodified(self.name, self.values, self.out, self.written, self.reads)

    def __call__(self, g: Tensor) -> _Grads:  # type: ignore[override]
        grads = _Grad.__call__(self, g, self.values, self.out)
        return [grads[i] for i in self.index]


def apply_elementwise(name: str, inputs: Sequence[Operand], attrs: Mapping[str, Any] | None = None) -> Node:
    """Op ``name`` of ``elementwise_defs.ALL`` on ``inputs`` (Nodes, Tensors or scalars) with
    attribute values ``attrs`` (one per ``attrs`` name of the definition).

    Without a tracer this is ``apply_op``'s work written out for the op: the forward, then a bare
    Node (grad mode off, no input that requires grad, a disabled tape, a non-float result) or a Node
    whose ``grad_fn`` is a ``_Recorded``, appended to the enabled tape in scope. A tracer gets the call
    through ``apply_op``."""
    entry = _ENTRIES.get(name)
    if entry is None:
        entry = _ENTRIES[name] = _Entry(name)  # KeyError for an unknown name, as ALL[name]
    if _local.tracer is not None:
        return _through_apply_op(entry, name, inputs, attrs)
    count = len(inputs)
    # a strided view is read in place by the kernel, or gathered once here where the backward reads it
    if count == 1:  # no comprehension frame for the common arities
        (first,) = inputs
        values: tuple[Any, ...] = (first.value if isinstance(first, Node) else first,)
        if type(values[0]) is StridedView:
            values = _views_read(entry, inputs, values)
    elif count == 2:
        first, second = inputs
        values = (
            first.value if isinstance(first, Node) else first,
            second.value if isinstance(second, Node) else second,
        )
        if type(values[0]) is StridedView or type(values[1]) is StridedView:
            values = _views_read(entry, inputs, values)
    else:
        values = tuple([a.value if isinstance(a, Node) else a for a in inputs])
        if StridedView in map(type, values):
            values = _views_read(entry, inputs, values)
    if entry.forward is not None:  # the inputs are the kernel's operands
        out = apply(entry.kernel, values)
    elif entry.scalar_slot is not None:
        scalar = attrs["scalar"]  # type: ignore[index]  # ``entry.scalar_operands`` without its call:
        out = apply(entry.kernel, (values[0], scalar) if entry.scalar_slot else (scalar, values[0]))
    else:
        out = apply(entry.kernel, forward_operands(entry.d, values, attrs or {}))
    if not grad_mode.grad_enabled:
        return untracked(out, name)
    tape = _local.tape
    node = None
    if entry.differentiable and (tape is None or tape.enabled) and out.dtype in FLOATING:
        index: list[int]
        parents: list[Node]
        if count == 2 and type(first) is Node and type(second) is Node:  # the common calls: no loop
            index, parents, wanted = [0, 1], [first, second], first.requires_grad or second.requires_grad
        elif count == 1 and type(first) is Node:
            index, parents, wanted = [0], [first], first.requires_grad
        else:
            index, parents, wanted = [], [], False
            for i, a in enumerate(inputs):
                if isinstance(a, Node):
                    index.append(i)
                    parents.append(a)
                    wanted = wanted or a.requires_grad
        if wanted:
            grad = _Recorded(name, entry.d, inputs, dict(attrs) if attrs else {}, values, out, index, entry.reads)
            trace = traceback.format_stack()[:-1] if grad_mode.anomaly_enabled else None
            node = Node(out, grad, parents, None, True, trace, name)
    if node is None:
        node = untracked(out, name)
    if tape is not None and tape.enabled:
        tape.nodes.append(node)
    return node


def _views_read(entry: _Entry, inputs: Sequence[Operand], values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` with the strided views at positions the op's derivatives read gathered when a backward may run
    (grad mode on and an input that requires grad; one copy of a view given twice), so that the forward and the
    backward read one copy. The kernel reads the others through their strides (every input is an operand of its
    kernel, ``forward_operands``), as torch's kernels read a non-contiguous tensor."""
    if not (grad_mode.grad_enabled and entry.differentiable and entry.reads and any(map(needs_grad, inputs))):
        return values  # no backward will read an input (or none may run): every view read in place
    read = [i for i in entry.reads if i >= 0]  # the inputs (not the output, -1) the derivatives read
    if not any(type(values[i]) is StridedView for i in read):
        return values
    copies = dict(zip(read, gathered(tuple(values[i] for i in read)), strict=True))
    return tuple(copies.get(i, v) for i, v in enumerate(values))


def _through_apply_op(entry: _Entry, name: str, inputs: Sequence[Operand], attrs: Mapping[str, Any] | None) -> Node:
    """The call through ``apply_op`` (a tracer is installed: it takes the op, its forward and its gradient)."""
    d = entry.d
    attrs = dict(attrs) if attrs else {}
    forward = entry.forward
    if forward is None:
        kernel = entry.kernel
        if entry.scalar_slot is not None:
            scalar = attrs["scalar"]

            def forward(v: Any) -> Tensor:
                return apply(kernel, entry.scalar_operands(v, scalar))

        else:

            def forward(*values: Any) -> Tensor:
                return apply(kernel, forward_operands(d, values, attrs))

    grad = _Grad(name, d, inputs, attrs) if entry.differentiable else None
    return apply_op(forward, grad, *inputs, op_name=name, attrs=attrs if d.attrs else None)


def unary(name: str) -> Callable[[Operand], Node]:
    """The autograd function of unary op ``name`` (no attributes), named and documented from its definition."""

    def op(x: Operand) -> Node:
        return apply_elementwise(name, (x,))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = ALL[name].doc
    return op


def binary(name: str) -> Callable[[Operand, Operand], Node]:
    """The autograd function of binary op ``name``: two operands, at most one of them a Python number."""

    right, left = f"{name}_scalar_right", f"{name}_scalar_left"

    def op(a: Operand, b: Operand) -> Node:
        a_number, b_number = isinstance(a, _NUMBERS), isinstance(b, _NUMBERS)  # is_scalar, without its calls
        if not a_number and not b_number:  # two Nodes/Tensors: the common call
            return apply_elementwise(name, (a, b))
        if a_number and b_number:
            raise TypeError(f"{name}: at least one operand must be a Node or Tensor, got two scalars {a!r}, {b!r}")
        if b_number:
            return apply_elementwise(right, (a,), {"scalar": b})
        return apply_elementwise(left, (b,), {"scalar": a})

    op.__name__ = op.__qualname__ = name
    op.__doc__ = ALL[name].doc
    return op


def fronts() -> dict[str, Callable[..., Node]]:
    """The public function of every defined op without attributes, one or two inputs (``unary`` /
    ``binary``): what ``netcl.autograd`` exports for an op that has no hand-written front."""
    found: dict[str, Callable[..., Node]] = {}
    for d in DEFS:
        if not d.attrs and len(d.inputs) in (1, 2):
            found[d.name] = unary(d.name) if len(d.inputs) == 1 else binary(d.name)
    return found
