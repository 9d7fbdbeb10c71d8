"""NumPy twins of ``netcl.runtime.ops.indexing`` (arguments already checked there)."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.ops.indexing import BasicIndex


def block_view(x: Tensor, view: BasicIndex, n: int, root: Tensor) -> Tensor | None:
    data = np.asarray(x.data).reshape(-1)[view.offset : view.offset + n].reshape(view.shape)
    return Tensor(data, view.shape, x.dtype, x.device, base=root)
