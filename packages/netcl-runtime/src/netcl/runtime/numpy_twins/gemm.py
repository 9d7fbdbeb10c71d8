"""NumPy twins of ``netcl.runtime.ops.gemm`` (arguments already checked there), and the epilogue in NumPy."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from netcl.core import Tensor, host_pool
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops._table import numpy_gelu
from netcl.runtime.ops.gemm_source import Epilogue

_ACTIVATIONS: dict[str | None, Callable[[np.ndarray], np.ndarray]] = {
    None: lambda v: v,
    "relu": lambda v: np.maximum(v, 0),
    "gelu": numpy_gelu,
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "tanh": np.tanh,
}


def apply_epilogue(values: np.ndarray, epilogue: Epilogue, bias: np.ndarray | None) -> np.ndarray:
    """``act(values + bias)`` of a GEMM epilogue (bias per column "col" or per row "row")."""
    with np.errstate(all="ignore"):
        if epilogue.bias == "col":
            values = values + bias.reshape(-1).astype(values.dtype)
        elif epilogue.bias == "row":
            values = values + bias.reshape(-1, 1).astype(values.dtype)
        return _ACTIVATIONS[epilogue.activation](values)


def gemm(
    a: Tensor, b: Tensor, trans_a: bool, trans_b: bool, out_dtype: np.dtype, epilogue: Epilogue, bias: Tensor | None
) -> Tensor:
    """``act(op(a) @ op(b) + bias)``, computed in float32 (float64 when the result is float64)."""
    compute = float_compute_type(out_dtype)
    x = np.asarray(a.data, dtype=compute)
    y = np.asarray(b.data, dtype=compute)
    result = host_pool.matmul(np.swapaxes(x, -1, -2) if trans_a else x, np.swapaxes(y, -1, -2) if trans_b else y)
    if not epilogue.is_identity:
        result = apply_epilogue(result, epilogue, None if bias is None else np.asarray(bias.data))
    # the product (and the epilogue's result) is a new array: cast only where the dtype differs
    return wrap_numpy(np.asarray(result).astype(out_dtype, copy=False), a.device, out_dtype)


def product(
    a: Tensor,
    b: Tensor,
    trans_a: bool,
    trans_b: bool,
    m: int,
    n: int,
    k: int,
    batch: tuple[int, ...],
    out_shape: tuple[int, ...],
    result: np.dtype,
    precision: str,
    epilogue: Epilogue,
    bias: Tensor | None,
    epilogue_args: Sequence[Tensor | float],
    key: tuple,
) -> Tensor:
    if epilogue.code:
        raise ValueError("matmul: a code epilogue (C statements) needs an OpenCL device, not the NumPy backend")
    return gemm(a, b, trans_a, trans_b, result, epilogue, bias)
