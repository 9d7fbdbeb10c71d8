"""Differentiable ops: each is one ``apply_op`` call named after its JIT primitive.

Forwards run on the runtime's eager kernels (``netcl.runtime.ops``); gradients are built from
the same kernels. The elementwise ops are generated from their one definition each
(``netcl.runtime.ops.elementwise_defs``, see ``netcl.autograd.elementwise``): binary ones follow
NumPy broadcasting and reduce each input's gradient back to its shape (``sum_to_shape``); a
Python scalar operand selects the ``<op>_scalar_right`` / ``<op>_scalar_left`` variant with the
scalar in ``attrs["scalar"]``; comparisons return 1.0/0.0 and have no gradient. The losses live
in ``netcl.autograd.losses`` and are re-exported here.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.autograd import autocast_mode
from netcl.autograd.elementwise import apply_elementwise, binary, is_scalar, needs_grad, unary
from netcl.autograd.engine import Node, _local, apply_op, forward_only, record_one, untracked
from netcl.core import ShapeError, Tensor, broadcast_shapes
from netcl.core.dtypes import is_floating
from netcl.runtime.ops import layout, linalg, pointwise, reduce, views
from netcl.runtime.ops.precision import at_matmul_precision

Operand = Any  # Node | Tensor | int | float
Axis = int | tuple[int, ...] | None
_Grads = list[Tensor | None]


# ---- elementwise ops: generated from their definitions (netcl.runtime.ops.elementwise_defs) ----
add = binary("add")
sub = binary("sub")
mul = binary("mul")
div = binary("div")
pow = binary("pow")
maximum = binary("maximum")
minimum = binary("minimum")
lt = binary("lt")
le = binary("le")
gt = binary("gt")
ge = binary("ge")
neg = unary("neg")
exp = unary("exp")
log = unary("log")
sqrt = unary("sqrt")
abs = unary("abs")
relu = unary("relu")
_gelu_tanh = unary("gelu")
gelu_erf = unary("gelu_erf")
sigmoid = unary("sigmoid")
tanh = unary("tanh")


#: GELU's ``approximate`` values (torch's names) -> the op
_GELUS = {"tanh": _gelu_tanh, "none": gelu_erf}


def gelu(x: Operand, approximate: str = "tanh") -> Node:
    """GELU: ``approximate="tanh"`` (the default, as ``jax.nn.gelu``'s) 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
    ``"none"`` the exact x * Phi(x) (``torch.nn.functional.gelu``'s default; also ``gelu_erf``)."""
    op = _GELUS.get(approximate) if isinstance(approximate, str) else None
    if op is None:
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    return op(x)


def where(cond: Operand, a: Operand, b: Operand) -> Node:
    """``a`` where ``cond != 0`` else ``b``; ``a``/``b`` may be scalars; no gradient for ``cond``.

    With one scalar branch the op is ``where_scalar_right`` / ``where_scalar_left`` (the scalar in
    ``attrs``, the inputs the condition and the tensor branch), so the JIT fuses it.
    """
    if is_scalar(b) and not is_scalar(a) and not is_scalar(cond):
        return apply_elementwise("where_scalar_right", (cond, a), {"scalar": b})
    if is_scalar(a) and not is_scalar(b) and not is_scalar(cond):
        return apply_elementwise("where_scalar_left", (cond, b), {"scalar": a})
    return apply_elementwise("where", (cond, a, b))


def clamp(x: Operand, lo: Operand | None = None, hi: Operand | None = None) -> Node:
    """min(max(x, lo), hi); a missing bound is unbounded.

    With scalar (or missing) bounds this is op ``clamp_scalar`` (bounds in ``attrs``, missing ones
    as -inf/inf); with a tensor bound it is op ``clamp(x, lo, hi)``. The gradient passes where
    ``lo <= x <= hi``; a tensor ``lo`` gets it where ``x < lo``, a tensor ``hi`` where ``x > hi``.
    """
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    if is_scalar(lo) and is_scalar(hi):
        return apply_elementwise("clamp_scalar", (x,), {"lo": lo, "hi": hi})
    return apply_elementwise("clamp", (x, lo, hi))


# ---- matmul ----------------------------------------------------------------------------------
def plus(addend: Tensor | None, grad: Tensor | None) -> Tensor | None:
    """``addend + grad`` by an add kernel; ``grad`` itself without an addend, None without a gradient
    (what a folding op returns for an argument, see ``apply_op``'s ``folds_addends``)."""
    if addend is None or grad is None:
        return grad
    return pointwise.add(addend, grad)


def sum_grad(addend: Tensor | None, x: Tensor, axis: Any) -> Tensor:
    """``x`` summed over ``axis`` as a gradient, plus ``addend`` when given: in the sum's last store
    when the addend has the result's dtype, else by an add."""
    if addend is not None and addend.dtype == x.dtype and is_floating(x.dtype):
        return reduce.sum(x, axis, addend=addend)
    return plus(addend, reduce.sum(x, axis))


def product_grad(shape: tuple[int, ...], addend: Tensor | None, a: Tensor, b: Tensor, **kw: Any) -> Tensor:
    """``a @ b`` (``kw``: ``linalg.matmul``'s options) as the gradient of an operand of ``shape``: summed to
    that shape, plus ``addend`` when given: in the product's store when the product has the shape
    (no broadcast batch to sum) and the addend its dtype, else by an add."""
    rows = a.shape[-1] if kw.get("transpose_a") else a.shape[-2]
    cols = b.shape[-2] if kw.get("transpose_b") else b.shape[-1]
    batch = () if len(a.shape) == 2 == len(b.shape) else broadcast_shapes(a.shape[:-2], b.shape[:-2])
    product_shape = (*batch, rows, cols)
    if kw.get("out_dtype") is not None:
        result = np.dtype(kw["out_dtype"])
    else:  # NumPy's promotion, skipped for the common operands of one dtype
        result = a.dtype if a.dtype == b.dtype else np.result_type(a.dtype, b.dtype)
    if addend is not None and product_shape == tuple(shape) and addend.dtype == result:
        return linalg.matmul(a, b, addend=addend, **kw)
    return plus(addend, layout.sum_to_shape(linalg.matmul(a, b, **kw), tuple(shape)))


def _weight_grad(x: Tensor, g: Tensor, y: Tensor, addend: Tensor | None = None) -> Tensor:
    """x.T @ g (+ addend), read in place (no transpose kernel); a 2-D ``y`` shared by a batched ``x``
    gets its gradient as ONE (K, rows) @ (rows, N) product over the flattened batch, not a batched
    product and a sum."""
    if y.ndim == 2 and x.ndim > 2:
        rows = x.size // x.shape[-1]
        x, g = x.reshape(rows, x.shape[-1]), g.reshape(rows, g.shape[-1])
    return product_grad(y.shape, addend, x, g, transpose_a=True)


def matmul(a: Operand, b: Operand) -> Node:
    """(M, K) @ (K, N), batched (..., M, K) @ (..., K, N) with broadcast batch dims, and 1-D operands
    as NumPy does: (K,) @ (K,) is a dot product (0-d), (..., M, K) @ (K,) a matrix-vector product and
    (K,) @ (..., K, N) a vector-matrix product (the 1-D side is a row/column reshaped in and out)."""
    va = a.value if isinstance(a, Node) else a
    vb = b.value if isinstance(b, Node) else b
    if (
        isinstance(va, Tensor)
        and isinstance(vb, Tensor)
        and len(va.shape) > 1
        and len(vb.shape) > 1
        and autocast_mode.autocast_dtype() is None
    ):  # the common calls (no vector, no autocast): the checks of the other cases skipped
        if type(va) is Tensor and type(vb) is Tensor:
            if forward_only():  # what apply_op would do: the forward, a bare Node
                return untracked(linalg.product(va, vb), "matmul")
        elif (read_in_place := _transposed_operands(va, vb)) is not None:
            return _matmul_in_place(a, b, read_in_place, None)
        # the general path's checks all pass here (precision None): its product, views gathered by apply_op
        return apply_op(linalg.matmul, _matmul_grad(a, b), a, b, op_name="matmul", folds_addends=True)
    for operand in (a, b):
        if is_scalar(operand) or not hasattr(operand, "shape") or len(operand.shape) < 1:
            raise ShapeError(
                f"matmul needs operands with at least 1 dimension, got {getattr(operand, 'shape', operand)}"
            )
    if len(a.shape) == 1 or len(b.shape) == 1:
        return _matmul_vector(a, b)
    precision = None
    if autocast_mode.autocast_dtype() is not None:  # netcl.amp.autocast
        if (low := autocast_mode.low_dtype_for(a, b)) is not None:
            return autocast_mode.matmul(a, b, low)
        precision = autocast_mode.fallback_precision(a, b)  # autocast on a device without float16
    if (read_in_place := _transposed_operands(va, vb)) is not None:
        return _matmul_in_place(a, b, read_in_place, precision)
    at = at_matmul_precision  # the op's forward and gradient alike
    return apply_op(
        at(precision, linalg.matmul), at(precision, _matmul_grad(a, b)), a, b, op_name="matmul", folds_addends=True
    )


def _matmul_grad(a: Operand, b: Operand) -> Any:
    """The gradient function of ``a @ b`` over its values (``apply_op``'s ``grad_fn``, folding addends)."""

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor, addends: Sequence[Any] = (None, None)) -> _Grads:
        x, y = values
        ga = product_grad(x.shape, addends[0], g, y, transpose_b=True) if needs_grad(a) else None
        gb = _weight_grad(x, g, y, addends[1]) if needs_grad(b) else None
        return [ga, gb]

    return grad


def _transposed_operands(va: Any, vb: Any) -> tuple[Tensor, bool, Tensor, bool] | None:
    """(what the product reads for value a, whether transposed, the same for b) where an operand is a transposed
    view (``x.T``, ``x.transpose(-2, -1)``: ``views.swapped_source``) and the other a C-contiguous tensor or one
    too, both of one rank; None otherwise (the product gathers views as any op does)."""
    if not (getattr(va, "strided", False) or getattr(vb, "strided", False)) or va.ndim != vb.ndim:
        return None  # no view (a traced operand has none either)
    sa, sb = views.swapped_source(va), views.swapped_source(vb)
    if (va.strided and sa is None) or (vb.strided and sb is None):
        return None
    return (va if sa is None else sa, sa is not None, vb if sb is None else sb, sb is not None)


def _matmul_in_place(a: Operand, b: Operand, read: tuple[Tensor, bool, Tensor, bool], precision: Any) -> Node:
    """``a @ b`` reading a transposed view's source in place (no gather), forward and backward: for ``op(s)``
    the operand as the product reads it, the gradient of a is ``g @ b.T`` and of b ``a.T @ g``, each again a
    product of sources with transpose flags."""
    sa, ta, sb, tb = read
    if forward_only() and precision is None:  # what apply_op would do: the forward, a bare Node
        return untracked(linalg.matmul(sa, sb, transpose_a=ta, transpose_b=tb), "matmul")

    def forward(va: Tensor, vb: Tensor) -> Tensor:
        return linalg.matmul(sa, sb, transpose_a=ta, transpose_b=tb)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor, addends: Sequence[Any] = (None, None)) -> _Grads:
        va, vb = values
        ga = product_grad(va.shape, addends[0], g, sb, transpose_b=not tb) if needs_grad(a) else None
        gb = product_grad(vb.shape, addends[1], sa, g, transpose_a=not ta) if needs_grad(b) else None
        return [ga, gb]

    at = at_matmul_precision
    return apply_op(
        at(precision, forward), at(precision, grad), a, b, op_name="matmul", folds_addends=True, takes_views=True
    )


def _matmul_vector(a: Operand, b: Operand) -> Node:
    """matmul with a 1-D side: (K,) as (1, K) on the left or (K, 1) on the right, the added axis dropped."""
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)
    left = reshape(a, (1, a_shape[0])) if len(a_shape) == 1 else a
    right = reshape(b, (b_shape[0], 1)) if len(b_shape) == 1 else b
    if left.shape[-1] != right.shape[-2]:
        raise ShapeError(f"matmul: shapes {a_shape} and {b_shape} do not align: {left.shape[-1]} != {right.shape[-2]}")
    product = matmul(left, right)
    shape = tuple(product.shape)
    if len(b_shape) == 1:
        shape = shape[:-1]
    if len(a_shape) == 1:
        shape = shape[:-2] + shape[-1:] if len(b_shape) > 1 else shape[:-1]
    return reshape(product, shape)


# ---- reductions ------------------------------------------------------------------------------
def normalize_axes(axis: Axis, ndim: int) -> tuple[int, ...]:
    """``axis`` (None, int or tuple, negatives allowed) as a sorted tuple of distinct axes (None, a Python int or
    a tuple of Python ints is normalized once per ``ndim``; keys that only compare equal, such as ``1.0`` or
    ``True`` for ``1``, are checked every time)."""
    kind = type(axis)
    if axis is None or kind is int or (kind is tuple and all([type(a) is int for a in axis])):
        known = _AXES.get((axis, ndim))
        if known is None:
            known = _normalize_axes(axis, ndim)
            if len(_AXES) >= 4096:
                _AXES.clear()
            _AXES[(axis, ndim)] = known
        return known
    return _normalize_axes(axis, ndim)


#: (axis as given: None, an int or a tuple of ints, ndim) -> the normalized axes of a valid reduction
_AXES: dict[tuple, tuple[int, ...]] = {}


def _normalize_axes(axis: Axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    result = set()
    for ax in axes:
        if not -ndim <= ax < builtins.max(ndim, 1):
            raise ShapeError(f"axis {ax} is out of range for a tensor with {ndim} dimensions")
        result.add(int(ax) % builtins.max(ndim, 1))
    return tuple(sorted(result))


def kept_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def attrs_axis(axis: Axis) -> Any:
    return tuple(axis) if isinstance(axis, (list, tuple)) else axis


def sum(x: Operand, axis: Axis = None, keepdims: bool = False) -> Node:
    """Sum over ``axis`` (all axes when None)."""
    axes = normalize_axes(axis, len(x.shape))
    if forward_only():  # what apply_op would do: the forward, a bare Node
        return untracked(reduce.sum(x.value if isinstance(x, Node) else x, axes, keepdims), "sum")

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        return [layout.broadcast_to(g.reshape(kept_shape(v.shape, axes)), v.shape)]

    return apply_op(
        lambda v: reduce.sum(v, axes, keepdims),
        grad,
        x,
        op_name="sum",
        attrs={"axis": attrs_axis(axis), "keepdims": keepdims},
    )


def mean(x: Operand, axis: Axis = None, keepdims: bool = False) -> Node:
    """Mean over ``axis`` (all axes when None)."""
    axes = normalize_axes(axis, len(x.shape))
    if forward_only():  # what apply_op would do: the forward, a bare Node
        return untracked(reduce.mean(x.value if isinstance(x, Node) else x, axes, keepdims), "mean")

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        count = math.prod(v.shape[i] for i in axes)
        if count == 0:  # an empty reduced axis: the gradient is empty too (and 1/count undefined)
            return [layout.broadcast_to(g.reshape(kept_shape(v.shape, axes)), v.shape)]
        scaled = pointwise.mul(g.reshape(kept_shape(v.shape, axes)), 1.0 / count)
        return [layout.broadcast_to(scaled, v.shape)]

    return apply_op(
        lambda v: reduce.mean(v, axes, keepdims),
        grad,
        x,
        op_name="mean",
        attrs={"axis": attrs_axis(axis), "keepdims": keepdims},
    )


def max(x: Operand, axis: Axis = None, keepdims: bool = False) -> Node:
    """Maximum over ``axis``; the gradient is shared equally among tied maxima."""
    axes = normalize_axes(axis, len(x.shape))
    if forward_only():  # what apply_op would do: the forward, a bare Node
        return untracked(reduce.max(x.value if isinstance(x, Node) else x, axes, keepdims), "max")

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        kept = kept_shape(v.shape, axes)
        mask = pointwise.eq(v, out.reshape(kept))
        count = reduce.sum(mask, axes, True)
        # where, not mask * share: an element that is not a maximum gets 0 even when the share is NaN
        return [pointwise.where(mask, pointwise.div(g.reshape(kept), count), 0.0)]

    return apply_op(
        lambda v: reduce.max(v, axes, keepdims),
        grad,
        x,
        op_name="max",
        attrs={"axis": attrs_axis(axis), "keepdims": keepdims},
    )


# ---- shape ops -------------------------------------------------------------------------------
def reshape(x: Operand, shape: Sequence[int]) -> Node:
    """A view of ``x`` with a new shape (one dimension may be -1)."""
    shape = tuple(shape)
    if forward_only() and type(x) is Node and type(x.value) is Tensor:  # what apply_op would return, directly
        return untracked(x.value.reshape(shape), "reshape")
    return apply_op(_Reshape(shape), _reshape_grad, x, op_name="reshape", attrs={"shape": shape})


class _Reshape:
    """reshape's forward for one target shape (an object, not a closure: no cell per call)."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def __call__(self, v: Tensor) -> Tensor:
        return v.reshape(self.shape)


def _reshape_grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
    return [g.reshape(values[0].shape)]


def transpose(x: Operand, axes: Sequence[int] | None = None) -> Node:
    """Permute dimensions (reverse them when ``axes`` is None): a view with no launch (``views.transpose_view``:
    x's memory under the new shape where only length-1 axes move, else a read-only ``StridedView``)."""
    ndim = len(x.shape)
    key = (ndim, axes) if axes is None or type(axes) is tuple else None
    entry = _TRANSPOSES.get(key) if key is not None else None
    if entry is None:
        perm = tuple(range(ndim))[::-1] if axes is None else tuple(int(a) % builtins.max(ndim, 1) for a in axes)
        if sorted(perm) != list(range(ndim)):
            raise ShapeError(f"transpose axes {axes} are not a permutation of {ndim} dimensions")
        entry = (perm, _TransposeForward(perm), _TransposeGrad(perm))
        if key is not None:
            if len(_TRANSPOSES) >= 1024:
                _TRANSPOSES.clear()
            _TRANSPOSES[key] = entry
    perm, forward, grad = entry
    if forward_only():  # what apply_op would do: the forward, a bare Node
        return untracked(forward(x.value if isinstance(x, Node) else x), "transpose")
    if type(x) is Node and _local.tracer is None:  # apply_op's record (x's value as it is: a view composes)
        value = x.value
        return record_one(forward(value), x, value, grad, "transpose")
    return apply_op(forward, grad, x, op_name="transpose", attrs={"axes": perm}, takes_views=True)


class _TransposeForward:
    """``layout.transpose`` by one permutation (one object per permutation, shared by its calls)."""

    __slots__ = ("perm",)

    def __init__(self, perm: tuple[int, ...]) -> None:
        self.perm = perm

    def __call__(self, v: Tensor) -> Tensor:
        return views.transpose_view(v, self.perm)


class _TransposeGrad:
    """The gradient of a transpose by ``perm``: the upstream gradient transposed by the inverse permutation
    (stateless: one object per permutation, shared by its calls)."""

    __slots__ = ("inverse",)

    def __init__(self, perm: tuple[int, ...]) -> None:
        inverse = [0] * len(perm)
        for position, axis in enumerate(perm):
            inverse[axis] = position
        self.inverse = tuple(inverse)

    def __call__(self, g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [layout.transpose(g, self.inverse)]


#: (ndim, axes as given: None or a tuple) -> (permutation, forward, gradient) of a valid transpose
_TRANSPOSES: dict[tuple, tuple] = {}


def broadcast_to(x: Operand, shape: Sequence[int]) -> Node:
    """Broadcast ``x`` to ``shape`` (materialized); the gradient is summed back."""
    shape = tuple(shape)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [layout.sum_to_shape(g, values[0].shape)]

    return apply_op(lambda v: layout.broadcast_to(v, shape), grad, x, op_name="broadcast_to", attrs={"shape": shape})


from netcl.autograd.losses import (  # noqa: E402  (re-export; losses does not import this module)
    bce_with_logits,
    binary_cross_entropy,
    cross_entropy,
    mse_loss,
    nll_loss,
    smooth_l1,
    weighted_bce,
    weighted_smooth_l1,
)

__all__ = [
    "abs",
    "add",
    "bce_with_logits",
    "binary_cross_entropy",
    "broadcast_to",
    "clamp",
    "cross_entropy",
    "div",
    "exp",
    "ge",
    "gelu",
    "gelu_erf",
    "gt",
    "is_scalar",
    "le",
    "log",
    "lt",
    "matmul",
    "max",
    "maximum",
    "mean",
    "minimum",
    "mse_loss",
    "mul",
    "neg",
    "nll_loss",
    "normalize_axes",
    "pow",
    "relu",
    "reshape",
    "sigmoid",
    "smooth_l1",
    "sqrt",
    "sub",
    "sum",
    "tanh",
    "transpose",
    "weighted_bce",
    "weighted_smooth_l1",
    "where",
]
