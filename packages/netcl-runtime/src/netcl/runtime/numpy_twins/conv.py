"""NumPy twins of ``netcl.runtime.ops.conv`` (arguments already checked there)."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops.conv import ConvGeometry


def window_indices(geo: ConvGeometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row h index, column w index, inside mask) of every (ki, kj, oh, ow)."""
    ki = np.arange(geo.KH)[:, None, None, None]
    kj = np.arange(geo.KW)[None, :, None, None]
    oh = np.arange(geo.OH)[None, None, :, None]
    ow = np.arange(geo.OW)[None, None, None, :]
    h = oh * geo.SH - geo.PH + ki * geo.DH
    w = ow * geo.SW - geo.PW + kj * geo.DW
    inside = (h >= 0) & (h < geo.H) & (w >= 0) & (w < geo.W)
    return np.clip(h, 0, geo.H - 1), np.clip(w, 0, geo.W - 1), inside


def im2col(x: Tensor, geo: ConvGeometry) -> Tensor:
    shape = (geo.N, geo.C * geo.KH * geo.KW, geo.OH * geo.OW)
    h, w, inside = window_indices(geo)
    data = np.asarray(x.data)[:, :, h, w] * inside  # (N, C, KH, KW, OH, OW)
    return wrap_numpy(data.reshape(shape), x.device, x.dtype)


def col2im(cols: Tensor, geo: ConvGeometry) -> Tensor:
    compute = float_compute_type(cols.dtype)
    data = np.asarray(cols.data, dtype=compute).reshape(geo.N, geo.C, geo.KH, geo.KW, geo.OH, geo.OW)
    padded = np.zeros((geo.N, geo.C, geo.H + 2 * geo.PH + geo.SH, geo.W + 2 * geo.PW + geo.SW), dtype=compute)
    for ki in range(geo.KH):  # a loop over kernel offsets; each adds a whole strided plane
        for kj in range(geo.KW):
            h0, w0 = ki * geo.DH, kj * geo.DW
            padded[:, :, h0 : h0 + geo.SH * geo.OH : geo.SH, w0 : w0 + geo.SW * geo.OW : geo.SW] += data[:, :, ki, kj]
    out = padded[:, :, geo.PH : geo.PH + geo.H, geo.PW : geo.PW + geo.W]
    return wrap_numpy(out, cols.device, cols.dtype)
