"""NumPy twins of ``netcl.runtime.ops.rowwise`` (arguments already checked there)."""

from __future__ import annotations

import math

import numpy as np

from netcl.core import Tensor
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops.rowwise import LAYER, LOG_SOFTMAX, LOGSUMEXP, stats_dtype


def softmax_rows(
    x: Tensor, axes: tuple[int, ...], mode: int, flat: Tensor, perm: tuple[int, ...], rows: int, cols: int
) -> tuple[Tensor, Tensor, Tensor]:
    sd = stats_dtype(x.dtype)
    data = np.asarray(flat.data, dtype=sd)
    m = np.max(data, axis=1, keepdims=True) if cols else np.full((rows, 1), -np.inf, sd)
    shift = np.where(np.isinf(m), 0, m).astype(sd)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.exp(data - shift)
        s = e.sum(axis=1, keepdims=True)
        if mode == LOGSUMEXP:
            res = (shift + np.log(s))[:, 0]
        elif mode == LOG_SOFTMAX:
            res = (data - shift) - np.log(s)
        else:
            res = e / s
    out = wrap_numpy(res, x.device, x.dtype)
    stats = [wrap_numpy(a[:, 0], x.device, sd) for a in (shift, s)]
    return out, stats[0], stats[1]


def softmax_rows_backward(
    x: Tensor, flat: Tensor, gflat: Tensor, rowmax: Tensor, rowsum: Tensor, rows: int, cols: int, mode: int
) -> Tensor:
    sd = stats_dtype(x.dtype)
    data = np.asarray(flat.data, dtype=sd)
    gd = np.asarray(gflat.data, dtype=sd)
    y = np.exp(data - np.asarray(rowmax.data)[:, None]) / np.asarray(rowsum.data)[:, None]
    if mode == LOGSUMEXP:
        res = gd[:, None] * y
    elif mode == LOG_SOFTMAX:
        res = gd - y * gd.sum(axis=1, keepdims=True)
    else:
        res = y * (gd - (gd * y).sum(axis=1, keepdims=True))
    return wrap_numpy(res, x.device, x.dtype)


def softmax_rows_backward_out(flat: Tensor, gflat: Tensor, rows: int, cols: int, mode: int) -> Tensor:
    sd = stats_dtype(flat.dtype)
    y = np.asarray(flat.data, dtype=sd)
    gd = np.asarray(gflat.data, dtype=sd)
    if mode == LOG_SOFTMAX:
        res = gd - np.exp(y) * gd.sum(axis=1, keepdims=True)
    else:
        res = y * (gd - (gd * y).sum(axis=1, keepdims=True))
    return wrap_numpy(res, flat.device, flat.dtype)


def norm_forward(
    x: Tensor, axes: tuple[int, ...], weight: Tensor | None, bias: Tensor | None, eps: float, mode: int
) -> tuple[Tensor, Tensor, Tensor]:
    rows = math.prod(x.shape[: axes[0]])
    C = math.prod(x.shape[axes[0] :])
    sd = stats_dtype(x.dtype)
    data = np.asarray(x.data, dtype=sd).reshape(rows, C)
    mu = data.mean(axis=1, keepdims=True) if mode == LAYER else np.zeros((rows, 1), sd)
    r = (1.0 / np.sqrt(((data - mu) ** 2).mean(axis=1, keepdims=True) + eps)).astype(sd)
    y = (data - mu) * r
    if weight is not None:
        y = y * np.asarray(weight.data, dtype=sd).reshape(1, C)
    if bias is not None:
        y = y + np.asarray(bias.data, dtype=sd).reshape(1, C)
    out = wrap_numpy(y.reshape(x.shape), x.device, x.dtype)
    mean = wrap_numpy(mu[:, 0], x.device, sd)
    rstd = wrap_numpy(r[:, 0], x.device, sd)
    return out, mean, rstd


def norm_backward(
    g: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor, rstd: Tensor, axes: tuple[int, ...], mode: int
) -> Tensor:
    rows = math.prod(x.shape[: axes[0]])
    C = math.prod(x.shape[axes[0] :])
    sd = stats_dtype(x.dtype)
    data = np.asarray(x.data, dtype=sd).reshape(rows, C)
    gy = np.asarray(g.data, dtype=sd).reshape(rows, C)
    if weight is not None:
        gy = gy * np.asarray(weight.data, dtype=sd).reshape(1, C)
    mu, r = np.asarray(mean.data)[:, None], np.asarray(rstd.data)[:, None]
    xhat = (data - mu) * r
    a = gy.mean(axis=1, keepdims=True) if mode == LAYER else 0.0
    res = r * (gy - a - xhat * (gy * xhat).mean(axis=1, keepdims=True))
    return wrap_numpy(res.reshape(x.shape), x.device, x.dtype)


def norm_param_grads(
    g: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, axes: tuple[int, ...], want_w: bool, want_b: bool
) -> tuple[Tensor | None, Tensor | None]:
    rows = math.prod(x.shape[: axes[0]])
    C = math.prod(x.shape[axes[0] :])
    sd = stats_dtype(x.dtype)
    gy = np.asarray(g.data, dtype=sd).reshape(rows, C)
    data = np.asarray(x.data, dtype=sd).reshape(rows, C)
    xhat = (data - np.asarray(mean.data)[:, None]) * np.asarray(rstd.data)[:, None]
    gw = wrap_numpy((gy * xhat).sum(axis=0, dtype=sd), x.device, sd) if want_w else None
    gb = wrap_numpy(gy.sum(axis=0, dtype=sd), x.device, sd) if want_b else None
    return gw, gb
