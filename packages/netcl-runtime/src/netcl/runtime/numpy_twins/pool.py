"""NumPy twins of ``netcl.runtime.ops.pool`` (arguments already checked there)."""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.numpy_twins.conv import window_indices
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops.conv import ConvGeometry, col2im
from netcl.runtime.ops.pool_cpu import tiles


def _windows(x: np.ndarray, geo: ConvGeometry, fill: float) -> np.ndarray:
    """(N, C, KH, KW, OH, OW) window values of x, ``fill`` in the padding."""
    h, w, inside = window_indices(geo)
    return np.where(inside, x[:, :, h, w], fill)


def _maxima(x: Tensor, geo: ConvGeometry) -> tuple[np.ndarray, np.ndarray]:
    """(maxima, first arg-max), each (N, C, OH, OW), of every window: exactly tiling windows read as reshaped
    rows of x, others gathered (padding -inf)."""
    data = np.asarray(x.data)
    if tiles(geo):
        rows = _window_major(data, geo)
    else:
        windows = _windows(data, geo, -np.inf).reshape(geo.N, geo.C, -1, geo.OH, geo.OW)
        rows = np.ascontiguousarray(np.moveaxis(windows, 2, 0)).reshape(geo.KH * geo.KW, -1)
    best, first = _first_maxima(rows)
    shape = (geo.N, geo.C, geo.OH, geo.OW)
    return best.reshape(shape), first.reshape(shape)


def _first_maxima(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(maxima, first arg-max) over the window positions of ``rows`` (one row per position), walking them as the
    kernels walk a window: take a value when the best so far is not NaN and the value is not <= it (the first
    maximum in row-major order, the first NaN winning). The maxima are copies of elements (-0.0 and 0.0 kept
    apart): the selects are bit masks over the float words (``np.where`` and masked copies are element-at-a-time
    loops in NumPy, ~20x slower at these sizes)."""
    count = len(rows)
    words = rows.view(_WORD[rows.itemsize])
    best = words[0].copy()
    first = np.zeros(best.shape, np.min_scalar_type(count - 1))  # a window position: uint8 up to 16 x 16
    for k in range(1, count):
        value, so_far = rows[k], best.view(rows.dtype)
        take = (so_far == so_far) & ~(value <= so_far)
        best ^= (best ^ words[k]) & np.negative(take, dtype=best.dtype)  # all ones where taken
        first ^= (first ^ first.dtype.type(k)) & np.negative(take, dtype=first.dtype)
    return best.view(rows.dtype), first


#: unsigned integer words of a float's size, for bitwise selects
_WORD = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _window_major(x: np.ndarray, geo: ConvGeometry) -> np.ndarray:
    """An exactly tiled x (N, C, KH * OH, KW * OW) as (KH * KW, N * C * OH * OW): one contiguous row per
    window position."""
    blocks = x.reshape(geo.N, geo.C, geo.OH, geo.KH, geo.OW, geo.KW)
    return np.ascontiguousarray(blocks.transpose(3, 5, 0, 1, 2, 4)).reshape(geo.KH * geo.KW, -1)


def _tiles_back(rows: np.ndarray, geo: ConvGeometry) -> np.ndarray:
    """The inverse of ``_window_major``: (KH * KW, N * C * OH * OW) rows as (N, C, H, W)."""
    blocks = rows.reshape(geo.KH, geo.KW, geo.N, geo.C, geo.OH, geo.OW).transpose(2, 3, 4, 0, 5, 1)
    return np.ascontiguousarray(blocks).reshape(geo.N, geo.C, geo.OH * geo.KH, geo.OW * geo.KW)


def _fold(cols: np.ndarray, geo: ConvGeometry, like: Tensor) -> Tensor:
    flat = cols.reshape(geo.N, geo.C * geo.KH * geo.KW, geo.OH * geo.OW)
    return col2im(wrap_numpy(flat, like.device, like.dtype), geo)


def _bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows ``[floor(i*size/out), ceil((i+1)*size/out))`` for i < out."""
    i = np.arange(out)
    return (i * size) // out, ((i + 1) * size + out - 1) // out


def max_pool(x: Tensor, geo: ConvGeometry) -> Tensor:
    return wrap_numpy(_maxima(x, geo)[0], x.device, x.dtype)


def max_pool_backward(grad: Tensor, x: Tensor, geo: ConvGeometry) -> Tensor:
    _, first = _maxima(x, geo)
    compute = float_compute_type(x.dtype)
    if tiles(geo):  # each input element in one window: its gradient or zero, summed from zero as the kernels do
        g = np.ascontiguousarray(grad.data, dtype=compute).reshape(-1)
        words = g.view(_WORD[g.itemsize])
        rows = np.empty((geo.KH * geo.KW, g.size), compute)
        for k in range(geo.KH * geo.KW):  # the gradient's word where k is the window's maximum, else +0.0's
            rows[k].view(words.dtype)[...] = words & np.negative(first.reshape(-1) == k, dtype=words.dtype)
        rows += compute(0)  # from zero: a -0.0 gradient lands as 0.0
        return wrap_numpy(_tiles_back(rows, geo), x.device, x.dtype)
    onehot = np.arange(geo.KH * geo.KW)[None, None, :, None, None] == first[:, :, None]
    # a select, not a product: a NaN gradient reaches only its window's maximum, as in the kernels
    cols = np.where(onehot, np.asarray(grad.data, dtype=compute)[:, :, None], compute(0))
    return _fold(cols, geo, x)


def _divisors(geo: ConvGeometry, count_include_pad: bool) -> np.ndarray:
    """(OH, OW) divisors of the average windows, as the kernel's ``netcl_avg_divisor``."""

    def extent(out: int, size: int, kernel: int, stride: int, pad: int) -> np.ndarray:
        start = np.arange(out) * stride - pad
        end = np.minimum(start + kernel, size + pad)
        if count_include_pad:
            return end - start
        return np.minimum(end, size) - np.maximum(start, 0)

    rows = extent(geo.OH, geo.H, geo.KH, geo.SH, geo.PH)
    cols = extent(geo.OW, geo.W, geo.KW, geo.SW, geo.PW)
    return rows[:, None] * cols[None, :]


def avg_pool(x: Tensor, geo: ConvGeometry, count_include_pad: bool = True) -> Tensor:
    compute = float_compute_type(x.dtype)
    windows = _windows(np.asarray(x.data, dtype=compute), geo, 0.0)
    sums = windows.sum(axis=(2, 3))
    return wrap_numpy(sums / _divisors(geo, count_include_pad).astype(compute), x.device, x.dtype)


def avg_pool_backward(grad: Tensor, out: Tensor, geo: ConvGeometry, count_include_pad: bool = True) -> Tensor:
    compute = float_compute_type(grad.dtype)
    divisors = _divisors(geo, count_include_pad).astype(compute)
    share = (np.asarray(grad.data, dtype=compute) / divisors)[:, :, None, None]
    cols = np.broadcast_to(share, (geo.N, geo.C, geo.KH, geo.KW, geo.OH, geo.OW))
    return _fold(np.ascontiguousarray(cols), geo, out)


def adaptive_avg_pool(x: Tensor, out_h: int, out_w: int) -> Tensor:
    H, W = x.shape[2:]
    data = np.asarray(x.data, dtype=float_compute_type(x.dtype))
    h0, h1 = _bounds(H, out_h)
    w0, w1 = _bounds(W, out_w)
    rows = np.stack([data[:, :, a:b].mean(axis=2) for a, b in zip(h0, h1, strict=True)], axis=2)
    out = np.stack([rows[..., a:b].mean(axis=3) for a, b in zip(w0, w1, strict=True)], axis=3)
    return wrap_numpy(out, x.device, x.dtype)


def adaptive_avg_pool2d_backward(grad: Tensor, x_shape: Any) -> Tensor:
    N, C, H, W = (int(d) for d in x_shape)
    OH, OW = grad.shape[2], grad.shape[3]
    g = np.asarray(grad.data, dtype=float_compute_type(grad.dtype))
    out = np.zeros((N, C, H, W), dtype=g.dtype)
    h0, h1 = _bounds(H, OH)
    w0, w1 = _bounds(W, OW)
    for i in range(OH):  # a loop over output cells (at most OH * OW), each adding a whole window
        for j in range(OW):
            area = g.dtype.type((h1[i] - h0[i]) * (w1[j] - w0[j]))
            out[:, :, h0[i] : h1[i], w0[j] : w1[j]] += (g[:, :, i, j] / area)[:, :, None, None]
    return wrap_numpy(out, grad.device, grad.dtype)
