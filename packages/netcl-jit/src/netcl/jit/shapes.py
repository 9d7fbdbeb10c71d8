"""Output shapes of the ops a trace runs eagerly (matmul, reductions, layout ops, losses)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.core import Tensor, broadcast_shapes, get_device
from netcl.jit.row_ops import get_row_op


def broadcast_kind(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> str | None:
    """How ``shape`` broadcasts to ``out_shape`` (1s padded on the left): "full" (the same shape),
    "col" (one row of ``out_shape[-1]`` values, a bias), "row" (one value per row); None otherwise."""
    if len(shape) > len(out_shape):
        return None
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    if padded == tuple(out_shape):
        return "full"
    if padded == (1,) * (len(out_shape) - 1) + (out_shape[-1],):
        return "col"
    if padded == (*out_shape[:-1], 1):
        return "row"
    return None


def infer_shape(
    name: str, fn: Callable, inputs: list, layout: list[tuple[str, Any]], attrs: dict
) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a non-fused op's output.

    Row ops (``row_ops``) and the ops of ``_RULES`` use their shape rules (and dtype rules); anything
    else runs ``fn`` once on zero tensors of the input shapes on the NumPy backend (only at trace time).
    """
    shapes = [i.shape for i in inputs]
    dtype = np.result_type(*(i.dtype for i in inputs)) if inputs else np.dtype(np.float32)
    row_op = get_row_op(name)
    rule = row_op.shape if row_op is not None else _RULES.get(name)
    dtype_rule = row_op.dtype if row_op is not None else _DTYPES.get(name)
    if dtype_rule is not None and inputs:
        dtype = dtype_rule([i.dtype for i in inputs])
    if rule is not None:
        return rule(shapes, attrs), dtype
    return _probe(fn, inputs, layout)


def _matmul(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    a, b = shapes
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        raise ValueError(f"matmul shapes {a} and {b} do not align")
    return (*broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1])


def reduction_shape(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    """The shape after reducing ``attrs["axis"]`` (None: every axis), the axes kept as 1s with ``keepdims``."""
    shape = shapes[0]
    axis = attrs.get("axis")
    keepdims = bool(attrs.get("keepdims", False))
    axes = range(len(shape)) if axis is None else [axis] if isinstance(axis, int) else list(axis)
    axes = {a % len(shape) for a in axes} if shape else set()
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes)


def _scalar(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    return ()


def same_shape(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    """The first input's shape."""
    return shapes[0]


def class_loss_shape(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    """cross_entropy / nll_loss: the target's shape (N, d1, ...) for reduction 'none', else 0-d."""
    if attrs.get("reduction", "mean") != "none":
        return ()
    return (shapes[0][0], *shapes[0][2:])


def class_loss_dtype(dtypes: list[np.dtype]) -> np.dtype:
    """cross_entropy / nll_loss: a float loss of integer targets (float64 for float64 scores, else float32)."""
    return np.dtype(np.float64) if dtypes[0] == np.float64 else np.dtype(np.float32)


def _elementwise_loss(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    return shapes[0] if attrs.get("reduction", "mean") == "none" else ()


#: shape rules of the ops that are not row ops (the row ops' are their ``row_ops`` entries')
_RULES: dict[str, Callable[[list[tuple[int, ...]], dict], tuple[int, ...]]] = {
    "matmul": _matmul,
    "prod": reduction_shape,
    "mse_loss": _scalar,
    "nll_loss": class_loss_shape,
    "binary_cross_entropy": _elementwise_loss,
    # ops with state or a costly probe: never run on zeros at trace time (batch_norm would update
    # its running statistics there)
    "batch_norm": same_shape,
    "batch_norm_relu": same_shape,
    "cumsum": same_shape,
    "flip": same_shape,
}
#: dtype rules of the ops that are not row ops (others: NumPy's result type of the inputs)
_DTYPES: dict[str, Callable[[list[np.dtype]], np.dtype]] = {
    "nll_loss": class_loss_dtype,
    # x's dtype (not the result type with the int64 num_batches_tracked, which made it float64 and kept the
    # float32 ReLU after it out of fused groups)
    "batch_norm": lambda dtypes: dtypes[0],
    "batch_norm_relu": lambda dtypes: dtypes[0],
}


def _probe(fn: Callable, inputs: list, layout: list[tuple[str, Any]]) -> tuple[tuple[int, ...], np.dtype]:
    cpu = get_device("cpu")
    values = []
    for kind, item in layout:
        if kind == "node":
            node = inputs[item]
            values.append(Tensor.zeros(node.shape, node.dtype, cpu))
        else:
            values.append(item)
    result = fn(*values)
    return tuple(result.shape), np.dtype(result.dtype)
