"""NumPy twins of ``netcl.runtime.ops.selecting`` (arguments already checked there)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.ops._common import wrap_numpy


def select_along(
    x: Tensor, ax: int, index: Tensor, reported_as: tuple[str, str, int | None], plan_key: tuple | None = None
) -> Tensor:
    data = np.take(np.asarray(x.data), np.asarray(index.data).reshape(-1).astype(np.int64), axis=ax)
    return wrap_numpy(data, x.device, x.dtype)


def index_select_backward(grad: Tensor, axis: int, index: Tensor, shape: Sequence[int]) -> Tensor:
    shape = tuple(int(d) for d in shape)
    ax = axis % len(shape)
    gx = np.zeros(shape, dtype=float_compute_type(grad.dtype))
    where = (slice(None),) * ax + (np.asarray(index.data).reshape(-1).astype(np.int64),)
    np.add.at(gx, where, np.asarray(grad.data, dtype=gx.dtype))
    return wrap_numpy(gx, grad.device, grad.dtype)
