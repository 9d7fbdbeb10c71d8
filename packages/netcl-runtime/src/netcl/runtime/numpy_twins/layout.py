"""NumPy twins of ``netcl.runtime.ops.layout`` (arguments already checked there)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from netcl.core import Tensor
from netcl.core.dtypes import float32
from netcl.runtime.ops._common import wrap_numpy


def convert(x: Tensor, target: np.dtype) -> Tensor:
    with np.errstate(all="ignore"):
        return wrap_numpy(np.asarray(x.data).astype(target), x.device, target)


def broadcast_copy(x: Tensor, target: tuple[int, ...]) -> Tensor:
    return wrap_numpy(np.broadcast_to(x.data, target).copy(order="C"), x.device, x.dtype)


def permute(x: Tensor, perm: tuple[int, ...], axes: Sequence[int] | None, plannable: bool) -> Tensor:
    return wrap_numpy(np.transpose(x.data, perm).copy(order="C"), x.device, x.dtype)


def encode_one_hot(labels: Tensor, num_classes: int) -> Tensor:
    data = np.asarray(labels.data)
    result = (data[..., None] == np.arange(num_classes, dtype=data.dtype)).astype(np.float32)
    return wrap_numpy(result, labels.device, float32)
