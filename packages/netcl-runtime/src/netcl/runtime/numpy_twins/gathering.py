"""NumPy twins of ``netcl.runtime.ops.gathering`` (arguments already checked there)."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.ops._common import wrap_numpy


def gather_narrowed(x: Tensor, xs: Tensor, ax: int, index: Tensor, plan_key: tuple | None) -> Tensor:
    data = np.take_along_axis(np.asarray(xs.data), np.asarray(index.data).astype(np.int64), axis=ax)
    return wrap_numpy(data, x.device, x.dtype)


def gather_backward_narrow(grad: Tensor, ax: int, index: Tensor, sizes: tuple[int, ...]) -> Tensor:
    gx = np.zeros(sizes, dtype=float_compute_type(grad.dtype))
    idx_host = np.asarray(index.data).astype(np.int64)
    coords = list(np.indices(index.shape, sparse=True))
    coords[ax] = idx_host
    np.add.at(gx, tuple(coords), np.asarray(grad.data, dtype=gx.dtype))
    return wrap_numpy(gx, grad.device, grad.dtype)
