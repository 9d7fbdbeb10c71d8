"""NumPy twins of ``netcl.runtime.ops.recurrent_cells``: the same formulas, in the kernels' compute type."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import float_compute_type


def _sig(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def _pre(xg: Tensor, hg: Tensor | None, blocks: int) -> tuple[list[np.ndarray], type]:
    """The gate pre-activations, block by block (``xg + hg``), in the compute type."""
    compute = float_compute_type(xg.dtype)
    pre = np.asarray(xg.data, compute)
    if hg is not None:
        pre = pre + np.asarray(hg.data, compute)
    return np.split(pre, blocks, axis=1), compute


def _out(values: np.ndarray, like: Tensor) -> Tensor:
    return Tensor.from_host(like.device, values.astype(like.dtype), like.dtype)


def lstm_cell(xg: Tensor, hg: Tensor | None, hc: Tensor | None) -> Tensor:
    (pi, pf, pg, po), compute = _pre(xg, hg, 4)
    i, f, g, o = _sig(pi), _sig(pf), np.tanh(pg), _sig(po)
    cn = i * g if hc is None else f * np.asarray(hc.data, compute)[1] + i * g
    return _out(np.stack([o * np.tanh(cn), cn]), xg)


def lstm_cell_backward(
    xg: Tensor, hg: Tensor | None, hc: Tensor | None, hc_new: Tensor, dhc: Tensor
) -> tuple[Tensor, Tensor]:
    (pi, pf, pg, po), compute = _pre(xg, hg, 4)
    i, f, g, o = _sig(pi), _sig(pf), np.tanh(pg), _sig(po)
    tc = np.tanh(np.asarray(hc_new.data, compute)[1])
    d_h, d_c = np.asarray(dhc.data, compute)
    dct = d_c + d_h * o * (1 - tc * tc)
    prev = np.zeros_like(tc) if hc is None else np.asarray(hc.data, compute)[1]
    dgates = np.concatenate(
        [dct * g * i * (1 - i), dct * prev * f * (1 - f), dct * i * (1 - g * g), d_h * tc * o * (1 - o)], axis=1
    )
    return _out(dgates, xg), _out(np.stack([np.zeros_like(dct), dct * f]), xg)


def gru_cell(xg: Tensor, hg: Tensor | None, h: Tensor | None) -> Tensor:
    (pr, pz, _), compute = _pre(xg, hg, 3)
    r, z = _sig(pr), _sig(pz)
    xn = np.split(np.asarray(xg.data, compute), 3, axis=1)[2]
    hn = 0 if hg is None else np.split(np.asarray(hg.data, compute), 3, axis=1)[2]
    n = np.tanh(xn + r * hn)
    out = n - z * n if h is None else n + z * (np.asarray(h.data, compute) - n)
    return _out(out, xg)


def gru_cell_backward(xg: Tensor, hg: Tensor | None, h: Tensor | None, dh_new: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    (pr, pz, _), compute = _pre(xg, hg, 3)
    r, z = _sig(pr), _sig(pz)
    xn = np.split(np.asarray(xg.data, compute), 3, axis=1)[2]
    hn = np.zeros_like(xn) if hg is None else np.split(np.asarray(hg.data, compute), 3, axis=1)[2]
    n = np.tanh(xn + r * hn)
    d = np.asarray(dh_new.data, compute)
    prev = np.zeros_like(n) if h is None else np.asarray(h.data, compute)
    dpre_n = d * (1 - z) * (1 - n * n)
    dpre_z = d * (prev - n) * z * (1 - z)
    dpre_r = dpre_n * hn * r * (1 - r)
    dxg = np.concatenate([dpre_r, dpre_z, dpre_n], axis=1)
    dhg = np.concatenate([dpre_r, dpre_z, dpre_n * r], axis=1)
    return _out(dxg, xg), _out(dhg, xg), _out(d * z, xg)
