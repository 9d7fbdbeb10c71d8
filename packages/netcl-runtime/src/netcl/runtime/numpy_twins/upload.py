"""NumPy twins of ``netcl.runtime.ops.upload`` (arguments already checked there)."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor


def write_host(dst: Tensor, host: np.ndarray) -> Tensor:
    dst.data[...] = host
    return dst


def copy_buffer(dst: Tensor, src: Tensor) -> Tensor:
    dst.data[...] = src.data
    return dst
