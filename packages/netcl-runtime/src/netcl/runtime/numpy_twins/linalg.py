"""NumPy twins of ``netcl.runtime.ops.linalg`` (arguments already checked there)."""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.ops.linalg import matmul
from netcl.runtime.ops.pointwise import add


def add_product(
    a: Tensor,
    b: Tensor,
    addend: Tensor,
    transpose_a: bool,
    transpose_b: bool,
    precision: str | None,
    out_dtype: np.dtype | None,
    result: np.dtype,
    a2: tuple[int, ...],
) -> Tensor:
    return add(
        matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b, precision=precision, out_dtype=out_dtype),
        addend,
    )
