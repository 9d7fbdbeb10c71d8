"""NumPy twins of ``netcl.runtime.ops.amp_kernels`` (arguments already checked there)."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.ops.amp_kernels import ALWAYS, ZERO_IF_FOUND


def unscale(grad: Tensor, scale: Tensor, found_inf: Tensor) -> Tensor:
    compute = float_compute_type(grad.dtype)
    with np.errstate(all="ignore"):
        inv = compute(np.float32(1.0) / np.asarray(scale.data, np.float32).reshape(-1)[0])
        values = np.asarray(grad.data, compute) * inv
    if not np.all(np.isfinite(values)):
        found_inf.data.reshape(-1)[0] = 1
    grad.data[...] = values.astype(grad.dtype)
    return grad


def unscale_group(grads: list[Tensor], scale: Tensor, found_inf: Tensor) -> list[Tensor]:
    for g in grads:
        unscale(g, scale, found_inf)
    return grads


def copy_where(dst: Tensor, src: Tensor, found_inf: Tensor, mode: int) -> Tensor:
    if mode == ALWAYS or np.asarray(found_inf.data).reshape(-1)[0]:
        dst.data[...] = 0 if mode == ZERO_IF_FOUND else src.data
    return dst


def update_scale(
    scale: Tensor, tracker: Tensor, found_inf: Tensor, growth: float, backoff: float, interval: int
) -> Tensor:
    s, t = scale.data.reshape(-1), tracker.data.reshape(-1)
    if np.asarray(found_inf.data).reshape(-1)[0]:
        s[0], t[0] = s[0] * np.float32(backoff), 0
    else:
        t[0] += 1
        if t[0] == interval:
            s[0], t[0] = s[0] * np.float32(growth), 0
    return scale
