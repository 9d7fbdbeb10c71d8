"""Output shapes of the ops a trace runs eagerly (matmul, reductions, layout ops, losses)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.core import Tensor, broadcast_shapes, get_device


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

    Known ops use shape rules; anything else runs ``fn`` once on zero tensors of the input
    shapes on the NumPy backend (only at trace time).
    """
    shapes = [i.shape for i in inputs]
    dtype = np.result_type(*(i.dtype for i in inputs)) if inputs else np.dtype(np.float32)
    rule = _RULES.get(name)
    if name in ("cross_entropy", "nll_loss") and inputs:  # float losses of integer targets
        dtype = np.dtype(np.float64) if inputs[0].dtype == np.float64 else np.dtype(np.float32)
    if rule is not None:
        return rule(shapes, attrs), dtype
    return _probe(fn, inputs, layout)


def _matmul(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    a, b = shapes
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        raise ValueError(f"matmul shapes {a} and {b} do not align")
    return (*broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1])


def _reduction(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    shape = shapes[0]
    axis = attrs.get("axis")
    keepdims = bool(attrs.get("keepdims", False))
    axes = range(len(shape)) if axis is None else [axis] if isinstance(axis, int) else list(axis)
    axes = {a % len(shape) for a in axes} if shape else set()
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes)


def _scalar(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    return ()


def _same(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    return shapes[0]


def _class_loss(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    """cross_entropy / nll_loss: the target's shape (N, d1, ...) for reduction 'none', else 0-d."""
    if attrs.get("reduction", "mean") != "none":
        return ()
    return (shapes[0][0], *shapes[0][2:])


def _elementwise_loss(shapes: list[tuple[int, ...]], attrs: dict) -> tuple[int, ...]:
    return shapes[0] if attrs.get("reduction", "mean") == "none" else ()


_RULES: dict[str, Callable[[list[tuple[int, ...]], dict], tuple[int, ...]]] = {
    "matmul": _matmul,
    "sum": _reduction,
    "mean": _reduction,
    "max": _reduction,
    "min": _reduction,
    "prod": _reduction,
    "var": _reduction,
    "std": _reduction,
    "logsumexp": _reduction,
    "mse_loss": _scalar,
    "cross_entropy": _class_loss,
    "nll_loss": _class_loss,
    "binary_cross_entropy": _elementwise_loss,
    # ops with state or a costly probe: never run on zeros at trace time (batch_norm would update
    # its running statistics there)
    "softmax": _same,
    "log_softmax": _same,
    "layer_norm": _same,
    "rms_norm": _same,
    "batch_norm": _same,
    "cumsum": _same,
    "flip": _same,
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
