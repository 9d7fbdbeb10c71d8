"""NumPy twins of ``netcl.runtime.ops.reduce`` (arguments already checked there)."""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import compute_dtype
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops.pointwise import add


def reduce(op: str, x: Tensor, axes: tuple[int, ...], keepdims: bool, out_dtype: np.dtype, acc: np.dtype) -> Tensor:
    """``sum``/``mean``/``max``/``min``/``prod`` of x over ``axes`` (already normalized), computed in ``acc``."""
    data = np.asarray(x.data).astype(compute_dtype(acc), copy=False)
    with np.errstate(all="ignore"):
        if op == "sum":
            result = np.sum(data, axis=axes, keepdims=keepdims, dtype=data.dtype)
        elif op == "mean":
            result = np.mean(data, axis=axes, keepdims=keepdims, dtype=data.dtype)
        elif op == "prod":
            result = np.prod(data, axis=axes, keepdims=keepdims, dtype=data.dtype)
        elif op == "min":
            result = np.min(data, axis=axes, keepdims=keepdims)
        else:
            result = np.max(data, axis=axes, keepdims=keepdims)
    return wrap_numpy(np.asarray(result).astype(out_dtype), x.device, out_dtype)


def reduce_nonempty(
    op: str,
    x: Tensor,
    axis: Any,
    axes: tuple[int, ...],
    keepdims: bool,
    out_shape: tuple[int, ...],
    out_dtype: np.dtype,
    acc: np.dtype,
    addend: Tensor | None,
) -> Tensor:
    result = reduce(op, x, axes, keepdims, out_dtype, acc)
    return result if addend is None else add(addend, result)
