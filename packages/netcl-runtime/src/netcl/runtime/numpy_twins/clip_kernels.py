"""NumPy twins of ``netcl.runtime.ops.clip_kernels`` (arguments already checked there): the same formulas
in float64, the norm rounded to float32."""

from __future__ import annotations

import math

import numpy as np

from netcl.core import Device, Tensor
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops.clip_kernels import EPS


def norm_and_factor(grads: list[Tensor], max_norm: float, norm_type: float, device: Device) -> tuple[Tensor, Tensor]:
    flat = [np.abs(np.asarray(g.data, np.float64)).reshape(-1) for g in grads]
    if math.isinf(norm_type):
        total = max((float(f.max()) if f.size else 0.0) for f in flat)
    else:
        total = float(sum(float(np.sum(f**norm_type)) for f in flat)) ** (1.0 / norm_type)
    norm32 = np.float32(total)
    coef = Tensor.from_host(device, np.asarray([min(np.float32(max_norm) / (norm32 + np.float32(EPS)), 1.0)],
                                               np.float32))  # fmt: skip
    return wrap_numpy(np.asarray(norm32, np.float32), device, np.float32), coef


def scale_by_(grads: list[Tensor], coef: Tensor) -> list[Tensor]:
    factor = np.asarray(coef.data, np.float32).reshape(-1)[0]
    for g in grads:
        compute = float_compute_type(g.dtype)
        g.data[...] = (np.asarray(g.data, compute) * compute(factor)).astype(g.dtype)
    return grads
