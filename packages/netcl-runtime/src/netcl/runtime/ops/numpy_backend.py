"""Every eager op in NumPy, for the ``cpu`` device (``device.kind == "cpu"``).

Values are computed in the dtype the OpenCL kernels use (float32 for float32/float16 data,
float64 for float64) and returned in the same result dtype, so both backends agree within
float32 rounding. Floating-point warnings (overflow, division by zero) are silenced: the
OpenCL kernels produce inf/nan without warning and so does this backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Tensor, broadcast_shapes
from netcl.core.dtypes import float16, float32
from netcl.runtime.ops._common import wrap_numpy


def _np_compute(dtype: np.dtype) -> np.dtype:
    """The NumPy dtype values of ``dtype`` are computed in (half -> float32, as on OpenCL)."""
    return float32 if dtype == float16 else dtype


def transpose(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    return wrap_numpy(np.transpose(x.data, axes).copy(order="C"), x.device, x.dtype)


def broadcast_to(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    return wrap_numpy(np.broadcast_to(x.data, shape).copy(order="C"), x.device, x.dtype)


def cast(x: Tensor, dtype: np.dtype) -> Tensor:
    with np.errstate(all="ignore"):
        return wrap_numpy(np.asarray(x.data).astype(dtype), x.device, dtype)


def one_hot(labels: Tensor, num_classes: int) -> Tensor:
    data = np.asarray(labels.data)
    result = (data[..., None] == np.arange(num_classes, dtype=data.dtype)).astype(np.float32)
    return wrap_numpy(result, labels.device, float32)


def shape_of(operands: Sequence[Any]) -> tuple[int, ...]:
    return broadcast_shapes(*[v.shape for v in operands if isinstance(v, Tensor)])
