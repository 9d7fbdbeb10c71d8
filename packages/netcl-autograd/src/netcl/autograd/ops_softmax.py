"""Differentiable ``softmax``, ``log_softmax`` and ``logsumexp`` (kernels in ``netcl.runtime.ops.rowwise``).

Each forward is one row-wise kernel over the reduced axes moved last. The backward of softmax and
log_softmax is one kernel over the output alone (torch's rule: nothing else is kept); logsumexp keeps
the per-row max and sum of exponentials and recomputes from them (from the input when the forward was
re-run by a tracer on other values). Float16 inputs are computed
in float32 inside the kernels; the result keeps the input's dtype.
"""

from __future__ import annotations

from typing import Any

from netcl.autograd import grad_mode
from netcl.autograd.engine import Node, _local, apply_op, forward_only, record_one, untracked
from netcl.autograd.row_hook import declined, provided
from netcl.core import Tensor
from netcl.runtime.ops import rowwise

Operand = Any  # Node | Tensor
_Grads = list[Tensor | None]


def value_of(x: Any, op: str, arg: str = "x") -> Tensor:
    """The Tensor behind a Node or Tensor argument (TypeError for anything else). A Node whose value
    is a tracer's (inside ``jit_compile``) is returned itself: the checks read only its shape, ndim
    and dtype, so the op is traced instead of making the whole function fall back to eager."""
    if isinstance(x, Node) and not isinstance(x.value, Tensor):
        return x  # type: ignore[return-value]
    v = x.value if isinstance(x, Node) else x
    if not isinstance(v, Tensor):
        raise TypeError(f"{op}: {arg} must be a Node or Tensor, got {type(x).__name__}")
    return v


def _family(x: Operand, axes: tuple[int, ...], mode: int, out_shape: tuple[int, ...] | None, attrs: dict) -> Node:
    if forward_only():  # what apply_op would do: the forward (no statistics kept), a bare Node
        out = rowwise.softmax_forward(x.value if isinstance(x, Node) else x, axes, mode, keep_stats=False)[0]
        return untracked(out if out_shape is None else out.reshape(out_shape), rowwise.MODE_NAMES[mode])
    if mode != rowwise.LOGSUMEXP:  # the backward reads the output alone: nothing else is kept
        forward, grad_from_output = _from_output(axes, mode)
        return apply_op(forward, grad_from_output, x, op_name=rowwise.MODE_NAMES[mode], attrs=attrs)
    saved: dict[str, Any] = {}

    def forward(v: Tensor) -> Tensor:
        keep = grad_mode.grad_enabled  # under no_grad nothing takes the gradient: the statistics are dropped
        out, rowmax, rowsum = rowwise.softmax_forward(v, axes, mode, keep_stats=keep)
        if out_shape is not None:
            out = out.reshape(out_shape)
        if keep:
            saved.update(out=out, rowmax=rowmax, rowsum=rowsum)
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        if saved.get("out") is out:
            rowmax, rowsum = saved["rowmax"], saved["rowsum"]
        else:
            _, rowmax, rowsum = rowwise.softmax_forward(v, axes, mode)
        return [rowwise.softmax_backward(g, v, rowmax, rowsum, axes, mode)]

    return apply_op(forward, grad, x, op_name=rowwise.MODE_NAMES[mode], attrs=attrs)


class _Forward:
    """softmax / log_softmax over ``axes`` without statistics (one object per (axes, mode), shared by its calls)."""

    __slots__ = ("axes", "mode")

    def __init__(self, axes: tuple[int, ...], mode: int) -> None:
        self.axes, self.mode = axes, mode

    def __call__(self, v: Tensor) -> Tensor:
        return rowwise.softmax_forward(v, self.axes, self.mode, keep_stats=False)[0]


class _GradFromOutput:
    """Their gradient from the output alone (torch's rule; ``rowwise.softmax_backward_from_output``)."""

    __slots__ = ("axes", "mode")

    def __init__(self, axes: tuple[int, ...], mode: int) -> None:
        self.axes, self.mode = axes, mode

    def __call__(self, g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [rowwise.softmax_backward_from_output(g, out, self.axes, self.mode)]


#: (axes, mode) -> the (forward, gradient) pair of softmax / log_softmax over those axes
_FROM_OUTPUT: dict[tuple, tuple[_Forward, _GradFromOutput]] = {}


def _from_output(axes: tuple[int, ...], mode: int) -> tuple[_Forward, _GradFromOutput]:
    """The (forward, gradient) pair of softmax / log_softmax over ``axes``, made once per (axes, mode)."""
    rules = _FROM_OUTPUT.get((axes, mode))
    if rules is None:
        rules = _FROM_OUTPUT[(axes, mode)] = (_Forward(axes, mode), _GradFromOutput(axes, mode))
    return rules


def _planned(x: Operand, axis: int, mode: int) -> Node | None:
    """softmax / log_softmax on a shape, dtype and axis planned before, with no tracer and no row provider that
    would take the call (none installed, or one that declines the signature: ``row_hook.declined``): under no_grad
    the planned launch alone, else the op recorded as ``_family`` records it, with none of the checks again; None
    where that does not apply (the caller then checks everything and asks the provider)."""
    if type(x) is not Node or _local.tracer is not None:
        return None
    value = x.value
    found = rowwise.softmax_plan(value, axis, mode)
    name = rowwise.MODE_NAMES[mode]
    if found is None or not declined(name, value):
        return None
    axes, plan = found
    out = rowwise.planned_softmax_output(value, plan)
    if not grad_mode.grad_enabled:
        return untracked(out, name)
    # _family's record (apply_op's with no tracer), with the plan found here (no second lookup)
    return record_one(out, x, value, _from_output(axes, mode)[1], name)


def softmax(x: Operand, axis: int = -1) -> Node:
    """exp(x - max) / sum(exp(x - max)) along ``axis`` (any axis; others go through a transpose)."""
    fast = _planned(x, axis, rowwise.SOFTMAX)
    if fast is not None:
        return fast
    axes = rowwise.one_axis(value_of(x, "softmax"), axis, "softmax")
    fused = provided("softmax", (x,), {"axis": axes[0]})
    if fused is not None:
        return fused
    return _family(x, axes, rowwise.SOFTMAX, None, {"axis": axis})


def log_softmax(x: Operand, axis: int = -1) -> Node:
    """x - max - log(sum(exp(x - max))) along ``axis``: finite for logits of any magnitude."""
    fast = _planned(x, axis, rowwise.LOG_SOFTMAX)
    if fast is not None:
        return fast
    axes = rowwise.one_axis(value_of(x, "log_softmax"), axis, "log_softmax")
    fused = provided("log_softmax", (x,), {"axis": axes[0]})
    if fused is not None:
        return fused
    return _family(x, axes, rowwise.LOG_SOFTMAX, None, {"axis": axis})


def logsumexp(x: Operand, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Node:
    """log(sum(exp(x))) over ``axis`` (None: all axes), max-subtracted; gradient softmax(x) * g."""
    v = value_of(x, "logsumexp")
    axes = rowwise.logsumexp_axes(v, axis)
    shape = rowwise.logsumexp_shape(v.shape, axes, keepdims)
    attrs = {"axis": tuple(axis) if isinstance(axis, (list, tuple)) else axis, "keepdims": keepdims}
    return _family(x, axes, rowwise.LOGSUMEXP, shape, attrs)


__all__ = ["log_softmax", "logsumexp", "softmax", "value_of"]
