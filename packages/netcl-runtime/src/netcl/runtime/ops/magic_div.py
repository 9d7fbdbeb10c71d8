"""Division by a size that is a kernel argument, as a multiply and a shift (for CPU OpenCL kernels).

A CPU OpenCL compiler vectorizes the loop over a work-group's work-items, but a vector has no integer
division: each ``n / d`` by a runtime ``d`` becomes one scalar division per lane, which dominated the
CNN layer kernels on PoCL (im2col measured 7x faster with its divisors as constants). Passing each
divisor's ``magic`` pair instead keeps the size a kernel argument (one program for every size) and
divides with a 64-bit multiply and a shift, which vectorize.

``NETCL_DIV(n, d)`` in a kernel divides ``0 <= n < 2**31`` by the divisor whose pair arrived as the
arguments ``d_M`` (ulong) and ``d_S`` (int); with 64-bit indices it is a plain division.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def magic(divisor: int) -> tuple[int, int]:
    """(M, S) with ``n * M >> S == n // divisor`` for every 0 <= n < 2**31 (the product in 64 bits):
    S = 31 + ceil(log2 divisor), M = ceil(2**S / divisor) (Granlund and Montgomery's round-up method;
    M < 2**32, so n * M < 2**63)."""
    divisor = int(divisor)
    if divisor < 1:
        raise ValueError(f"magic: divisor must be positive, got {divisor}")
    shift = 31 + (divisor - 1).bit_length()
    return -(-(1 << shift) // divisor), shift


def macro(idx: str) -> str:
    """The ``NETCL_DIV`` definition for a kernel of index type ``idx`` (``int`` or ``long``)."""
    if idx == "long":
        return "#define NETCL_DIV(n, d) ((n) / (d))\n"
    return "#define NETCL_DIV(n, d) ((int)(((ulong)(n) * d##_M) >> d##_S))\n"


def params(divisors: Sequence[str]) -> str:
    """The kernel parameters of the divisors' pairs: ``const ulong W_M, const int W_S, ...``."""
    return ", ".join(f"const ulong {d}_M, const int {d}_S" for d in divisors)


def arg_types(divisors: Sequence[str]) -> list[type]:
    """The scalar argument types of ``params(divisors)``."""
    return [np.uint64, np.int32] * len(divisors)


def values(divisors: Sequence[int]) -> list[int]:
    """The argument values of ``params`` for these divisor values."""
    return [v for d in divisors for v in magic(d)]
