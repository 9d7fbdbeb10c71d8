"""``autocast``: mixed precision for the matrix-product ops (matmul, linear, conv2d)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from types import TracebackType
from typing import Any

import numpy as np

from netcl.autograd.autocast_mode import set_autocast_dtype
from netcl.core.dtypes import bfloat16, float16

SUPPORTED = {"float16": float16, "half": float16, "bfloat16": bfloat16}


class autocast:  # noqa: N801 - torch's name
    """Within the block, matmul / ``nn.Linear`` / conv2d of float32 operands read them as float16 and
    accumulate in float32 (float32 results and gradients); reductions, norms, losses and elementwise
    ops stay float32. On a device without ``cl_khr_fp16`` whose tensor cores take float16 or tf32
    (NVIDIA's OpenCL) those ops run on the float32 tensors at matmul precision "fp16" (matmul,
    linear) or "high" (conv2d); on any other device without it autocast does nothing and warns once.
    Also usable as a decorator. ``enabled=False`` turns autocast off inside an enclosing block.
    ``dtype=bfloat16`` (or "bfloat16") reads the operands as bfloat16 instead (``autocast_mode``).
    """

    def __init__(self, enabled: bool = True, dtype: Any = "float16") -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast: enabled must be a bool, got {enabled!r}")
        key = dtype if isinstance(dtype, str) else str(np.dtype(dtype))
        if key not in SUPPORTED:
            raise ValueError(f"autocast: dtype must be 'float16' or 'bfloat16', got {dtype!r}")
        self.enabled = enabled
        self.dtype = SUPPORTED[key]
        self._previous: list[Any] = []

    def __enter__(self) -> autocast:
        self._previous.append(set_autocast_dtype(self.dtype if self.enabled else None))
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        set_autocast_dtype(self._previous.pop())

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.enabled, self.dtype):
                return fn(*args, **kwargs)

        return wrapper
