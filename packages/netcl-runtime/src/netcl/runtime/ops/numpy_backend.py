"""NumPy bodies of ``ops.layout``'s ops (cast, broadcast_to, transpose, one_hot), until layout's own
conversion to backend ops moves them into ``netcl.runtime.numpy_twins.layout``.

Every other op's NumPy code lives in ``netcl.runtime.numpy_twins`` (dispatched by ``ops.backend``).
"""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.core.dtypes import float32
from netcl.runtime.ops._common import wrap_numpy


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
