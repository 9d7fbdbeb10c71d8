"""NumPy twins of ``netcl.runtime.ops.batchnorm`` (arguments already checked there)."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops._table import numpy_relu


def _np(t: Tensor, dtype: np.dtype) -> np.ndarray:
    return np.asarray(t.data, dtype=dtype)


def _channel(ndim: int, channels: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (1, channels) + (1,) * (ndim - 2), (0, *range(2, ndim))


def batch_norm_apply(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    num_batches_tracked: Tensor | None,
    residual: Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
    sizes: tuple[int, int, int],
    acc: str,
    stat: np.dtype,
    relu: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    momentum, eps = float(momentum), float(eps)
    if num_batches_tracked is not None:
        num_batches_tracked.data[...] += 1
    C = x.shape[1]
    shape, axes = _channel(x.ndim, C)
    v = _np(x, stat)
    with np.errstate(all="ignore"):
        if training:
            mu = v.mean(axis=axes)
            var = ((v - mu.reshape(shape)) ** 2).mean(axis=axes)
            if running_mean is not None:
                count, m = x.size // C, stat.type(momentum)
                rm, rv = _np(running_mean, stat), _np(running_var, stat)
                running_mean.data[...] = ((1 - m) * rm + m * mu).astype(running_mean.dtype)
                running_var.data[...] = ((1 - m) * rv + m * var * stat.type(count / (count - 1))).astype(
                    running_var.dtype
                )
        else:
            mu, var = _np(running_mean, stat), _np(running_var, stat)
        rstd = (1 / np.sqrt(var + stat.type(eps))).astype(stat)
        y = (v - mu.reshape(shape)) * rstd.reshape(shape)
        if weight is not None:
            y = y * _np(weight, stat).reshape(shape)
        if bias is not None:
            y = y + _np(bias, stat).reshape(shape)
        if relu:  # the epilogue on the output as x's dtype stores it (add and ReLU exact)
            y = y.astype(x.dtype).astype(stat)
            if residual is not None:
                y = y + _np(residual, stat)
            y = numpy_relu(y)
    device = x.device
    return wrap_numpy(y, device, x.dtype), wrap_numpy(mu.astype(stat), device, stat), wrap_numpy(rstd, device, stat)


def batch_norm_grads(
    g: Tensor,
    x: Tensor,
    out: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
    training: bool,
    needs: tuple[bool, bool, bool, bool],
    sizes: tuple[int, int, int],
    acc: str,
    stat: np.dtype,
    w_dtype: np.dtype,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    C = x.shape[1]
    shape, axes = _channel(x.ndim, C)
    with np.errstate(all="ignore"):
        v, gv = _np(x, stat), _np(g, stat)
        if out is not None:  # the ReLU epilogue's mask (exact products)
            gv = gv * (_np(out, stat) > 0).astype(stat)
        rs = _np(rstd, stat).reshape(shape)
        xh = (v - _np(mean, stat).reshape(shape)) * rs
        w = _np(weight, stat).reshape(shape) if weight is not None else stat.type(1)
        sum_g, sum_gx = gv.sum(axis=axes), (gv * xh).sum(axis=axes)
        gx = None
        if needs[0]:
            if training:
                count = stat.type(x.size // C)
                gx = w * rs * (gv - sum_g.reshape(shape) / count - xh * sum_gx.reshape(shape) / count)
            else:
                gx = gv * w * rs
    device = x.device
    return (
        None if gx is None else wrap_numpy(gx, device, g.dtype),
        wrap_numpy(sum_gx, device, w_dtype) if needs[1] else None,
        wrap_numpy(sum_g, device, w_dtype) if needs[2] else None,
        wrap_numpy(gv, device, g.dtype) if needs[3] else None,
    )
