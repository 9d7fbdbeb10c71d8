"""NumPy twins of ``netcl.runtime.ops.kv_cache`` (arguments already checked there)."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.variable import Variable, value_of


def store_rows(cache: Tensor, new: Tensor, pos: int | Variable) -> None:
    p = value_of(pos)
    cache.data[..., p : p + new.shape[-2], :] = new.data


def load_rows(source: Tensor, pos: int | Variable, count: int, shape: tuple[int, ...]) -> Tensor:
    p = value_of(pos)
    data = np.ascontiguousarray(source.data[..., p : p + count, :])
    return Tensor(data, shape, source.dtype, source.device)


def attend_cache(q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: int | Variable, scale: float) -> Tensor:
    """float32 arithmetic (float64 for float64), keys ``0..pos+i`` for query ``i``."""
    k, v, pos = k_cache, v_cache, value_of(pos)
    ct = float_compute_type(q.dtype)
    L = q.shape[-2]
    keys = pos + L
    qa = np.asarray(q.data, ct)
    ka = np.asarray(k.data, ct)[..., :keys, :]
    va = np.asarray(v.data, ct)[..., :keys, :]
    s = np.matmul(qa, np.swapaxes(ka, -1, -2)) * ct(scale)
    visible = np.arange(keys)[None, :] <= (pos + np.arange(L))[:, None]
    s = np.where(visible, s, ct(-np.inf))
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.matmul(p, va).astype(q.dtype)
    return Tensor(np.ascontiguousarray(out), out.shape, q.dtype, q.device)
