"""NumPy twins of ``netcl.runtime.ops.scan`` (arguments already checked there)."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.core.dtypes import int64
from netcl.runtime.ops import _rows
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.variable import Variable, value_of


def cumsum_along(x: Tensor, ax: int, reverse: bool, out_dtype: np.dtype) -> Tensor:
    acc = _rows.acc_dtype(x.dtype) if x.dtype.kind == "f" else int64
    v = np.asarray(x.data).astype(acc).reshape(x.shape or (1,))
    with np.errstate(all="ignore"):
        if reverse:
            result = np.flip(np.cumsum(np.flip(v, ax), axis=ax, dtype=acc), ax)
        else:
            result = np.cumsum(v, axis=ax, dtype=acc)
    return wrap_numpy(result.reshape(x.shape), x.device, out_dtype)


def arg_best(kind: str, x: Tensor, ax: int | None, out_shape: tuple[int, ...], split: tuple[int, int, int]) -> Tensor:
    v = np.asarray(x.data)
    fn = np.argmax if kind == "argmax" else np.argmin
    result = fn(v.reshape(-1)) if ax is None else fn(v.reshape(x.shape or (1,)), axis=ax)
    return wrap_numpy(np.asarray(result, dtype=np.int64).reshape(out_shape), x.device, int64)


def store_argmax(x: Tensor, ids: Tensor, table: Tensor, pos: int | Variable) -> None:
    best = np.argmax(np.asarray(x.data).reshape(x.shape), axis=1).astype(np.int32)
    ids.data.reshape(ids.shape)[:, 0] = best
    table.data.reshape(table.shape)[:, value_of(pos)] = best
