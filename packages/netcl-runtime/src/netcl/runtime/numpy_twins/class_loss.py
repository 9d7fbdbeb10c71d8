"""NumPy twins of ``netcl.runtime.ops.class_loss`` (arguments already checked there)."""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.core.device_errors import index_error_message
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops.class_loss import MEAN, REDUCTIONS, target_error_code
from netcl.runtime.ops.rowwise import stats_dtype


def _host(a: Any, dtype: np.dtype) -> np.ndarray:
    return np.asarray(a.data, dtype=dtype)


def check_targets(t: Tensor, classes: int, ignore_index: int, op: str) -> None:
    """The targets are on the host: an out-of-range one raises here."""
    if t.size == 0:
        return
    host = np.asarray(t.data)
    bad = host[(host != ignore_index) & ((host < 0) | (host >= classes))]
    if bad.size:
        raise IndexError(index_error_message(target_error_code(op, ignore_index), int(bad[0]), classes))


def class_loss_forward(
    x: Tensor, t: Tensor, ignore_index: int, smoothing: float, op: str = "cross_entropy"
) -> tuple[Tensor, Tensor, Tensor]:
    rows, C = x.shape
    sd = stats_dtype(x.dtype)
    check_targets(t, C, ignore_index, op)
    data, target = _host(x, sd), np.asarray(t.data).astype(np.int64)
    m = data.max(axis=1) if C else np.full(rows, -np.inf, sd)
    shift = np.where(np.isinf(m), 0, m).astype(sd)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s = np.exp(data - shift[:, None]).sum(axis=1)
        kept = target != ignore_index
        picked = data[np.arange(rows), np.where(kept, target, 0)] if C else np.zeros(rows, sd)
        loss = (shift + np.log(s)) - sd.type(1.0 - smoothing) * picked
        if smoothing:
            loss = loss - sd.type(smoothing / C) * data.sum(axis=1)
        loss = np.where(kept, loss, 0).astype(sd)
    return tuple(wrap_numpy(a, x.device, sd) for a in (loss, shift, s))  # type: ignore[return-value]


def class_loss_reduce(loss: Tensor, t: Tensor, ignore_index: int, mean: bool) -> tuple[Tensor, Tensor]:
    sd = loss.dtype
    count = np.count_nonzero(np.asarray(t.data) != ignore_index)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.sum(_host(loss, sd))
        value = total / sd.type(count) if mean else total
    return wrap_numpy(np.asarray(value, sd), loss.device, sd), wrap_numpy(np.asarray(count, sd), loss.device, sd)


def class_loss_backward(
    g: Tensor,
    x: Tensor,
    t: Tensor,
    rowmax: Tensor,
    rowsum: Tensor,
    count: Tensor,
    ignore_index: int,
    smoothing: float,
    reduction: str,
) -> Tensor:
    rows, C = x.shape
    sd = stats_dtype(x.dtype)
    mode = REDUCTIONS[reduction]
    data, target = _host(x, sd), np.asarray(t.data).astype(np.int64)
    kept = target != ignore_index
    up = _host(g, sd)
    if mode == MEAN:
        up = up / max(_host(count, sd).item(), sd.type(1))
    scale = np.where(kept, up, 0).astype(sd)
    q = np.full((rows, C), smoothing / C, sd) if C else np.zeros((rows, 0), sd)
    q[np.arange(rows)[kept], target[kept]] += sd.type(1.0 - smoothing)
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.exp(data - _host(rowmax, sd)[:, None]) / _host(rowsum, sd)[:, None]
        res = scale[:, None] * (p - q)
    return wrap_numpy(res, x.device, x.dtype)
