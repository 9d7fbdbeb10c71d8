"""NumPy twins of ``netcl.runtime.ops.scalar_log`` (arguments checked there): the kernel's float32 arithmetic."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor


def append(log: Tensor, position: Tensor, value: Tensor, divisor: Tensor, weight: float, advance: bool) -> None:
    pos = int(np.asarray(position.data).reshape(-1)[0])
    if 0 <= pos < log.shape[0]:
        v = np.float32(np.asarray(value.data).reshape(-1)[0])
        d = np.float32(np.asarray(divisor.data).reshape(-1)[0])
        log.data[pos] = np.float32(log.data[pos] + v / d * np.float32(weight))
    if advance:
        position.data.reshape(-1)[0] = pos + 1
