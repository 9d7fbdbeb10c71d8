"""NumPy twins of ``netcl.runtime.ops.pointwise`` (arguments already checked there)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.runtime.numpy_twins import _values
from netcl.runtime.ops._common import wrap_numpy


def elementwise(
    fn: Callable[..., Any],
    operands: Sequence[Any],
    value_dtypes: Sequence[np.dtype],
    out_shape: tuple[int, ...],
    out_dtype: np.dtype,
    device: Device,
) -> Tensor:
    """``fn`` applied to the operands converted to ``value_dtypes``; result cast to ``out_dtype``."""
    with np.errstate(all="ignore"):
        args = [_values.value(v, d) for v, d in zip(operands, value_dtypes, strict=True)]
        result = np.asarray(fn(*args))
        result = np.broadcast_to(result, out_shape).astype(out_dtype)
    return wrap_numpy(result, device, out_dtype)


def apply_plan(op: Any, plan: Any, dtypes: tuple[np.dtype, ...], operands: Sequence[Any], device: Device) -> Tensor:
    return elementwise(op.numpy_fn, operands, dtypes, plan.out_shape, plan.out_dtype, device)


def add_into(dst: Tensor, src: Any, compute: np.dtype, device: Device) -> Tensor:
    with np.errstate(all="ignore"):
        total = _values.value(dst, compute) + _values.value(src, compute)
    return _values.assign(dst, total)


def fill_into(dst: Tensor, value: Any, device: Device) -> Tensor:
    return _values.assign(dst, _values.value(value, dst.dtype))
