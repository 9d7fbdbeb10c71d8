"""Differentiable ops: each is one ``apply_op`` call named after its JIT primitive.

Forwards run on the runtime's eager kernels (``netcl.runtime.ops``); gradients are built from
the same kernels. Binary ops follow NumPy broadcasting and reduce each input's gradient back to
its shape (``sum_to_shape``). A Python scalar operand selects the ``<op>_scalar_right`` /
``<op>_scalar_left`` variant with the scalar in ``attrs["scalar"]``. Comparisons return 1.0/0.0
and have no gradient. The losses live in ``netcl.autograd.losses`` and are re-exported here.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.autograd import autocast_mode
from netcl.autograd.engine import Node, apply_op
from netcl.core import ShapeError, Tensor, broadcast_shapes
from netcl.runtime import ops as R  # noqa: N812  (R: the runtime op library)

Operand = Any  # Node | Tensor | int | float
Axis = int | tuple[int, ...] | None
_Grads = list[Tensor | None]


def is_scalar(x: Any) -> bool:
    """Whether ``x`` is a Python or NumPy number (as opposed to a Node or Tensor)."""
    return isinstance(x, (int, float, np.number)) and not isinstance(x, np.ndarray)


def _reduce(grad: Tensor | None, like: Any) -> Tensor | None:
    """Sum a gradient back to the shape of the operand ``like`` (None for scalars)."""
    if grad is None or is_scalar(like):
        return None
    return R.sum_to_shape(grad, tuple(like.shape))


# ---- binary ops ------------------------------------------------------------------------------
#: grad rule: (g, a, b, out, need_a, need_b) -> (grad_a, grad_b) before reduction to the shapes.
BinaryGrad = Callable[[Tensor, Any, Any, Tensor, bool, bool], tuple[Tensor | None, Tensor | None]]


def _binary(name: str, forward: Callable[[Any, Any], Tensor], rule: BinaryGrad | None, a: Operand, b: Operand) -> Node:
    """Dispatch a binary op to its tensor-tensor or scalar variant."""
    if is_scalar(a) and is_scalar(b):
        raise TypeError(f"{name}: at least one operand must be a Node or Tensor, got two scalars {a!r}, {b!r}")
    if is_scalar(b):
        grad_right = None if rule is None else _scalar_grad(rule, b, right=True)
        return apply_op(lambda x: forward(x, b), grad_right, a, op_name=f"{name}_scalar_right", attrs={"scalar": b})
    if is_scalar(a):
        grad_left = None if rule is None else _scalar_grad(rule, a, right=False)
        return apply_op(lambda x: forward(a, x), grad_left, b, op_name=f"{name}_scalar_left", attrs={"scalar": a})

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        x, y = values
        ga, gb = rule(g, x, y, out, _needs(a), _needs(b))  # type: ignore[misc]
        return [_reduce(ga, x), _reduce(gb, y)]

    return apply_op(forward, None if rule is None else grad, a, b, op_name=name)


def _needs(x: Any) -> bool:
    return isinstance(x, Node) and x.requires_grad


def _scalar_grad(rule: BinaryGrad, scalar: Any, right: bool) -> Callable[[Tensor, tuple[Any, ...], Tensor], _Grads]:
    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (x,) = values
        if right:
            return [_reduce(rule(g, x, scalar, out, True, False)[0], x)]
        return [_reduce(rule(g, scalar, x, out, False, True)[1], x)]

    return grad


def _add_grad(g: Tensor, a: Any, b: Any, out: Tensor, na: bool, nb: bool) -> tuple[Any, Any]:
    return (g if na else None, g if nb else None)


def _sub_grad(g: Tensor, a: Any, b: Any, out: Tensor, na: bool, nb: bool) -> tuple[Any, Any]:
    return (g if na else None, R.neg(g) if nb else None)


def _mul_grad(g: Tensor, a: Any, b: Any, out: Tensor, na: bool, nb: bool) -> tuple[Any, Any]:
    return (R.mul(g, b) if na else None, R.mul(g, a) if nb else None)


def _div_grad(g: Tensor, a: Any, b: Any, out: Tensor, na: bool, nb: bool) -> tuple[Any, Any]:
    # d(a/b)/db = -a/b^2 = -out/b
    return (R.div(g, b) if na else None, R.neg(R.div(R.mul(g, out), b)) if nb else None)


def _pow_grad(g: Tensor, a: Any, b: Any, out: Tensor, na: bool, nb: bool) -> tuple[Any, Any]:
    # d(a**b)/da = b * a**(b-1), and 0 where b == 0 (a**0 is constant; the product is 0 * inf at a = 0)
    ga = None
    if na and is_scalar(b):
        ga = R.mul(g, 0.0 if b == 0 else R.mul(b, R.pow(a, b - 1.0)))
    elif na:
        ga = R.mul(g, R.where(R.eq(b, 0.0), 0.0, R.mul(b, R.pow(a, R.sub(b, 1.0)))))
    log_a = R.log(a) if not is_scalar(a) else _scalar_log(a)
    gb = R.mul(g, R.mul(out, log_a)) if nb else None
    return ga, gb


def _scalar_log(a: float) -> float:
    """log of a scalar base as the ``log`` kernel and the fused ``LOG`` give it: -inf at 0, NaN below."""
    return math.log(a) if a > 0 else -math.inf if a == 0 else math.nan


def _maximum_grad(g: Tensor, a: Any, b: Any, out: Tensor, na: bool, nb: bool) -> tuple[Any, Any]:
    # ties send the gradient to ``a`` (as the JIT primitive does)
    return (R.mul(g, R.ge(a, b)) if na else None, R.mul(g, R.lt(a, b)) if nb else None)


def _minimum_grad(g: Tensor, a: Any, b: Any, out: Tensor, na: bool, nb: bool) -> tuple[Any, Any]:
    return (R.mul(g, R.le(a, b)) if na else None, R.mul(g, R.gt(a, b)) if nb else None)


def add(a: Operand, b: Operand) -> Node:
    """a + b."""
    return _binary("add", R.add, _add_grad, a, b)


def sub(a: Operand, b: Operand) -> Node:
    """a - b."""
    return _binary("sub", R.sub, _sub_grad, a, b)


def mul(a: Operand, b: Operand) -> Node:
    """a * b."""
    return _binary("mul", R.mul, _mul_grad, a, b)


def div(a: Operand, b: Operand) -> Node:
    """a / b."""
    return _binary("div", R.div, _div_grad, a, b)


def pow(a: Operand, b: Operand) -> Node:
    """a ** b (the gradient w.r.t. ``b`` is ``out * log(a)``: NaN for a <= 0)."""
    return _binary("pow", R.pow, _pow_grad, a, b)


def maximum(a: Operand, b: Operand) -> Node:
    """Elementwise max; at ties the gradient goes to ``a``."""
    return _binary("maximum", R.maximum, _maximum_grad, a, b)


def minimum(a: Operand, b: Operand) -> Node:
    """Elementwise min; at ties the gradient goes to ``a``."""
    return _binary("minimum", R.minimum, _minimum_grad, a, b)


def lt(a: Operand, b: Operand) -> Node:
    """1.0 where a < b else 0.0 (no gradient)."""
    return _binary("lt", R.lt, None, a, b)


def le(a: Operand, b: Operand) -> Node:
    """1.0 where a <= b else 0.0 (no gradient)."""
    return _binary("le", R.le, None, a, b)


def gt(a: Operand, b: Operand) -> Node:
    """1.0 where a > b else 0.0 (no gradient)."""
    return _binary("gt", R.gt, None, a, b)


def ge(a: Operand, b: Operand) -> Node:
    """1.0 where a >= b else 0.0 (no gradient)."""
    return _binary("ge", R.ge, None, a, b)


# ---- unary ops -------------------------------------------------------------------------------
def _unary(
    name: str, forward: Callable[[Tensor], Tensor], rule: Callable[[Tensor, Tensor, Tensor], Tensor]
) -> Callable:
    def op(x: Operand) -> Node:
        return apply_op(forward, lambda g, values, out: [rule(g, values[0], out)], x, op_name=name)

    op.__name__ = name
    return op


neg = _unary("neg", R.neg, lambda g, x, out: R.neg(g))
exp = _unary("exp", R.exp, lambda g, x, out: R.mul(g, out))
log = _unary("log", R.log, lambda g, x, out: R.div(g, x))
sqrt = _unary("sqrt", R.sqrt, lambda g, x, out: R.div(R.mul(g, 0.5), out))
abs = _unary("abs", R.abs, lambda g, x, out: R.mul(g, R.sign(x)))
relu = _unary("relu", R.relu, lambda g, x, out: R.relu_backward(g, x))
gelu = _unary("gelu", R.gelu, lambda g, x, out: R.gelu_backward(g, x))
sigmoid = _unary("sigmoid", R.sigmoid, lambda g, x, out: R.sigmoid_backward(g, out))
tanh = _unary("tanh", R.tanh, lambda g, x, out: R.tanh_backward(g, out))
neg.__doc__ = "-x."
exp.__doc__ = "e ** x."
log.__doc__ = "Natural logarithm."
sqrt.__doc__ = "Square root."
abs.__doc__ = "|x| (gradient sign(x), 0 at 0)."
relu.__doc__ = "max(x, 0) (gradient 0 at 0)."
gelu.__doc__ = "GELU, tanh approximation."
sigmoid.__doc__ = "1 / (1 + e ** -x), overflow-free."
tanh.__doc__ = "Hyperbolic tangent."


# ---- ternary ops -----------------------------------------------------------------------------
def where(cond: Operand, a: Operand, b: Operand) -> Node:
    """``a`` where ``cond != 0`` else ``b``; ``a``/``b`` may be scalars; no gradient for ``cond``.

    With one scalar branch the op is ``where_scalar_right`` / ``where_scalar_left`` (the scalar in
    ``attrs``, the inputs the condition and the tensor branch), so the JIT fuses it.
    """
    if is_scalar(b) and not is_scalar(a) and not is_scalar(cond):

        def grad_right(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
            c, x = values
            return [None, _reduce(R.where(c, g, 0.0), x) if _needs(a) else None]

        return apply_op(
            lambda c, x: R.where(c, x, b), grad_right, cond, a, op_name="where_scalar_right", attrs={"scalar": b}
        )
    if is_scalar(a) and not is_scalar(b) and not is_scalar(cond):

        def grad_left(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
            c, y = values
            return [None, _reduce(R.where(c, 0.0, g), y) if _needs(b) else None]

        return apply_op(
            lambda c, y: R.where(c, a, y), grad_left, cond, b, op_name="where_scalar_left", attrs={"scalar": a}
        )

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        c, x, y = values
        ga = R.where(c, g, 0.0) if _needs(a) else None
        gb = R.where(c, 0.0, g) if _needs(b) else None
        return [None, _reduce(ga, x), _reduce(gb, y)]

    return apply_op(R.where, grad, cond, a, b, op_name="where")


def clamp(x: Operand, lo: Operand | None = None, hi: Operand | None = None) -> Node:
    """min(max(x, lo), hi); a missing bound is unbounded.

    With scalar (or missing) bounds this is op ``clamp_scalar`` (bounds in ``attrs``, missing ones
    as -inf/inf); with a tensor bound it is op ``clamp(x, lo, hi)``. The gradient passes where
    ``lo <= x <= hi``; a tensor ``lo`` gets it where ``x < lo``, a tensor ``hi`` where ``x > hi``.
    """
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    if is_scalar(lo) and is_scalar(hi):

        def grad_scalar(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
            (v,) = values
            return [R.mul(g, R.mul(R.ge(v, lo), R.le(v, hi)))]

        return apply_op(
            lambda v: R.clamp(v, lo, hi), grad_scalar, x, op_name="clamp_scalar", attrs={"lo": lo, "hi": hi}
        )

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        v, low, high = values
        inside = R.mul(R.ge(v, low), R.le(v, high))
        gx = R.mul(g, inside) if _needs(x) else None
        glo = R.mul(g, R.lt(v, low)) if _needs(lo) else None
        ghi = R.mul(g, R.mul(R.ge(v, low), R.gt(v, high))) if _needs(hi) else None
        return [_reduce(gx, v), _reduce(glo, low), _reduce(ghi, high)]

    return apply_op(R.clamp, grad, x, lo, hi, op_name="clamp")


# ---- matmul ----------------------------------------------------------------------------------
def plus(addend: Tensor | None, grad: Tensor | None) -> Tensor | None:
    """``addend + grad`` by an add kernel; ``grad`` itself without an addend, None without a gradient
    (what a folding op returns for an argument, see ``apply_op``'s ``folds_addends``)."""
    if addend is None or grad is None:
        return grad
    return R.add(addend, grad)


def sum_grad(addend: Tensor | None, x: Tensor, axis: Any) -> Tensor:
    """``x`` summed over ``axis`` as a gradient, plus ``addend`` when given: in the sum's last store
    when the addend has the result's dtype, else by an add."""
    if addend is not None and addend.dtype == x.dtype and x.dtype.kind == "f":
        return R.sum(x, axis, addend=addend)
    return plus(addend, R.sum(x, axis))


def product_grad(shape: tuple[int, ...], addend: Tensor | None, a: Tensor, b: Tensor, **kw: Any) -> Tensor:
    """``a @ b`` (``kw``: ``R.matmul``'s options) as the gradient of an operand of ``shape``: summed to
    that shape, plus ``addend`` when given: in the product's store when the product has the shape
    (no broadcast batch to sum) and the addend its dtype, else by an add."""
    rows = a.shape[-1] if kw.get("transpose_a") else a.shape[-2]
    cols = b.shape[-2] if kw.get("transpose_b") else b.shape[-1]
    product_shape = (*broadcast_shapes(a.shape[:-2], b.shape[:-2]), rows, cols)
    result = np.dtype(kw["out_dtype"]) if kw.get("out_dtype") is not None else np.result_type(a.dtype, b.dtype)
    if addend is not None and product_shape == tuple(shape) and addend.dtype == result:
        return R.matmul(a, b, addend=addend, **kw)
    return plus(addend, R.sum_to_shape(R.matmul(a, b, **kw), tuple(shape)))


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
    for operand in (a, b):
        if is_scalar(operand) or not hasattr(operand, "shape") or len(operand.shape) < 1:
            raise ShapeError(
                f"matmul needs operands with at least 1 dimension, got {getattr(operand, 'shape', operand)}"
            )
    if len(a.shape) == 1 or len(b.shape) == 1:
        return _matmul_vector(a, b)
    if (low := autocast_mode.low_dtype_for(a, b)) is not None:  # netcl.amp.autocast
        return autocast_mode.matmul(a, b, low)
    precision = autocast_mode.fallback_precision(a, b)  # autocast on a device without float16

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor, addends: Sequence[Any] = (None, None)) -> _Grads:
        x, y = values
        ga = product_grad(x.shape, addends[0], g, y, transpose_b=True) if _needs(a) else None
        gb = _weight_grad(x, g, y, addends[1]) if _needs(b) else None
        return [ga, gb]

    at = R.at_matmul_precision  # the op's forward and gradient alike
    return apply_op(at(precision, R.matmul), at(precision, grad), a, b, op_name="matmul", folds_addends=True)


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
    """``axis`` (None, int or tuple, negatives allowed) as a sorted tuple of distinct axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    result = set()
    for ax in axes:
        if not -ndim <= ax < builtins.max(ndim, 1):
            raise ShapeError(f"axis {ax} is out of range for a tensor with {ndim} dimensions")
        result.add(int(ax) % builtins.max(ndim, 1))
    return tuple(sorted(result))


def _kept_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _attrs_axis(axis: Axis) -> Any:
    return tuple(axis) if isinstance(axis, (list, tuple)) else axis


def sum(x: Operand, axis: Axis = None, keepdims: bool = False) -> Node:
    """Sum over ``axis`` (all axes when None)."""
    axes = normalize_axes(axis, len(x.shape))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        return [R.broadcast_to(g.reshape(_kept_shape(v.shape, axes)), v.shape)]

    return apply_op(
        lambda v: R.sum(v, axes, keepdims),
        grad,
        x,
        op_name="sum",
        attrs={"axis": _attrs_axis(axis), "keepdims": keepdims},
    )


def mean(x: Operand, axis: Axis = None, keepdims: bool = False) -> Node:
    """Mean over ``axis`` (all axes when None)."""
    axes = normalize_axes(axis, len(x.shape))
    count = math.prod(x.shape[i] for i in axes)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        if count == 0:  # an empty reduced axis: the gradient is empty too (and 1/count undefined)
            return [R.broadcast_to(g.reshape(_kept_shape(v.shape, axes)), v.shape)]
        scaled = R.mul(g.reshape(_kept_shape(v.shape, axes)), 1.0 / count)
        return [R.broadcast_to(scaled, v.shape)]

    return apply_op(
        lambda v: R.mean(v, axes, keepdims),
        grad,
        x,
        op_name="mean",
        attrs={"axis": _attrs_axis(axis), "keepdims": keepdims},
    )


def max(x: Operand, axis: Axis = None, keepdims: bool = False) -> Node:
    """Maximum over ``axis``; the gradient is shared equally among tied maxima."""
    axes = normalize_axes(axis, len(x.shape))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        (v,) = values
        kept = _kept_shape(v.shape, axes)
        mask = R.eq(v, out.reshape(kept))
        count = R.sum(mask, axes, True)
        # where, not mask * share: an element that is not a maximum gets 0 even when the share is NaN
        return [R.where(mask, R.div(g.reshape(kept), count), 0.0)]

    return apply_op(
        lambda v: R.max(v, axes, keepdims),
        grad,
        x,
        op_name="max",
        attrs={"axis": _attrs_axis(axis), "keepdims": keepdims},
    )


# ---- shape ops -------------------------------------------------------------------------------
def reshape(x: Operand, shape: Sequence[int]) -> Node:
    """A view of ``x`` with a new shape (one dimension may be -1)."""
    shape = tuple(shape)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [g.reshape(values[0].shape)]

    return apply_op(lambda v: v.reshape(shape), grad, x, op_name="reshape", attrs={"shape": shape})


def transpose(x: Operand, axes: Sequence[int] | None = None) -> Node:
    """Permute dimensions (reverse them when ``axes`` is None); materialized."""
    ndim = len(x.shape)
    perm = tuple(range(ndim))[::-1] if axes is None else tuple(int(a) % builtins.max(ndim, 1) for a in axes)
    if sorted(perm) != list(range(ndim)):
        raise ShapeError(f"transpose axes {axes} are not a permutation of {ndim} dimensions")
    inverse = tuple(int(i) for i in np.argsort(perm))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [R.transpose(g, inverse)]

    return apply_op(lambda v: R.transpose(v, perm), grad, x, op_name="transpose", attrs={"axes": perm})


def broadcast_to(x: Operand, shape: Sequence[int]) -> Node:
    """Broadcast ``x`` to ``shape`` (materialized); the gradient is summed back."""
    shape = tuple(shape)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [R.sum_to_shape(g, values[0].shape)]

    return apply_op(lambda v: R.broadcast_to(v, shape), grad, x, op_name="broadcast_to", attrs={"shape": shape})


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
