"""Operand values the NumPy twins compute with, in the dtype the OpenCL kernels compute in.

Values are computed in float32 for float16 and bfloat16 data (as on OpenCL; stored rounded by
NumPy's / ml_dtypes' ``astype``) and in the data's own dtype
otherwise. Floating-point warnings (overflow, division by zero) are silenced where the twins
compute: the OpenCL kernels produce inf/nan without warning and so does this backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.core.dtypes import STORAGE_ONLY, float32


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The NumPy dtype values of ``dtype`` are computed in (half, bfloat16 -> float32, as on OpenCL)."""
    return float32 if dtype in STORAGE_ONLY else dtype


def float_compute_type(dtype: Any) -> type:
    """The NumPy float type a kernel of float data of ``dtype`` computes in: float64 stays, every other
    float dtype (float16, bfloat16, float32) computes in float32."""
    return np.float64 if dtype == np.float64 else np.float32


def value(operand: Any, dtype: np.dtype) -> Any:
    """A Tensor's array or a scalar, converted to the compute dtype of ``dtype``."""
    if isinstance(operand, Tensor):
        return np.asarray(operand.data, dtype=compute_dtype(dtype))
    raw = operand.item() if isinstance(operand, (np.ndarray, np.generic)) else operand
    return np.asarray(raw).astype(compute_dtype(dtype))[()]


def assign(dst: Tensor, values: np.ndarray) -> Tensor:
    """Write ``values`` (broadcast to dst's shape) into dst's array in place."""
    with np.errstate(all="ignore"):
        dst.data[...] = np.broadcast_to(np.asarray(values).astype(dst.dtype), dst.shape)
    return dst
