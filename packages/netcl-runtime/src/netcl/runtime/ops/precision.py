"""Matrix-product precision of float32 operands, as torch's ``set_float32_matmul_precision``.

"highest": fp32 multiply-add (the portable kernel, every device). "tf32x3" (netcl's addition,
XLA's ``TF32_TF32_F32_X3``): each operand split into two tf32 parts, x = hi + lo, and the product
summed as lo*hi + hi*lo + hi*hi on tf32 tensor cores, each k-step's sum added to the accumulator
with an IEEE fp32 add (the mma's own accumulation truncates): fp32's accuracy or better (see
benchmarks/RESULTS.md, "Measurements moved out of source docstrings", precision.py) at tensor-core
speed. "bf16x3" (netcl's addition; the form torch's "high" names beside tf32: "each float32 number as
the sum of two bfloat16 numbers"): the same with bf16 parts, about 16 of the 24 bits (a product off by
<= 3 * 2**-16 relative, 20x under tf32's rounding), on bf16 tensor cores at half tf32x3's tensor-core
work; a kernel without a bf16x3 form (attention) runs tf32x3. "high": operands rounded to tf32 (10-bit
mantissa, round to nearest, ties away) on tensor cores, fp32 accumulation.
"medium": operands rounded to bf16 (7-bit mantissa, ties to even), fp32 accumulation. "fp16"
(netcl's addition; autocast's matrix products where float16 is storage-only): operands rounded to
float16 (10-bit mantissa, 5-bit exponent, ties to even: the numbers of float16 operands) as the
kernel loads them, fp32 accumulation. A device without tensor cores (PoCL, the NumPy backend)
computes "tf32x3", "bf16x3", "high", "medium" and "fp16" in fp32 (more accurate, never an error).
``round_tf32`` / ``round_bf16`` reproduce the tensor cores' operand rounding on the host (the
tests' and benchmarks' reference for those modes; fp16's is NumPy's ``astype(float16)``).

float16 operands always multiply as fp16 with fp32 accumulation (tensor cores where present).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

PRECISIONS = ("highest", "tf32x3", "bf16x3", "high", "medium", "fp16")
T = TypeVar("T")


class _State(threading.local):
    """This thread's ``matmul_precision`` block value; the class attribute is the default, so a thread that
    never entered a block reads None without the failed instance lookup a bare ``threading.local`` pays."""

    value: str | None = None


_state = _State()
_default = ["highest"]


def _check(value: str) -> str:
    if value not in PRECISIONS:
        raise ValueError(f"matmul precision must be one of {PRECISIONS}, got {value!r}")
    return value


def set_float32_matmul_precision(precision: str) -> None:
    """Process-wide precision of float32 matrix products (one of ``PRECISIONS``)."""
    _default[0] = _check(precision)


def get_float32_matmul_precision() -> str:
    """The precision in effect here (a ``matmul_precision`` block, else the process-wide one)."""
    return _state.value or _default[0]


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """Within the block (this thread), float32 products use ``precision``; amp uses this."""
    previous = _state.value
    _state.value = _check(precision)
    try:
        yield
    finally:
        _state.value = previous


def at_matmul_precision(precision: str | None, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` with its float32 products at ``precision`` (each call inside ``matmul_precision``);
    ``fn`` itself when ``precision`` is None."""
    if precision is None:
        return fn
    _check(precision)

    def wrapped(*args: Any, **kwargs: Any) -> T:  # ``matmul_precision(precision)`` without a generator per call
        previous = getattr(_state, "value", None)
        _state.value = precision
        try:
            return fn(*args, **kwargs)
        finally:
            _state.value = previous

    return wrapped


def resolve_precision(precision: str | None) -> str:
    """``precision`` checked against ``PRECISIONS``, or the current matmul precision for None."""
    return get_float32_matmul_precision() if precision is None else _check(precision)


def round_tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to tf32 (``cvt.rna.tf32.f32``: nearest, ties away from zero)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    finite = np.isfinite(x)
    rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(finite, rounded, x).astype(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (``cvt.rn.bf16x2.f32``: nearest, ties to even)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    finite = np.isfinite(x)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(finite, rounded, x).astype(np.float32)
