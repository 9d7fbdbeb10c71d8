"""Loads and stores of the storage-only dtypes (``netcl.core.dtypes.STORAGE_ONLY``) in generated OpenCL C.

A kernel that only loads and stores float16 or bfloat16 computes in float32: float16 through core
OpenCL's ``vload_half`` / ``vstore_half_rte``; bfloat16 as 16-bit words, loaded as the high half of a
float32 (exact) and stored rounded to nearest even with NaN kept a quiet NaN of the same sign, bit for
bit ml_dtypes' float32 -> bfloat16 conversion (a float64 value is rounded to float32 first, as
ml_dtypes does). Every other dtype is read and written as an array element. The ops build their
kernels from ``load_c`` / ``store_c`` so one place knows each format; ``helpers_c`` is the C text a
kernel touching bfloat16 needs (``ops._common.storage_pragmas`` includes it).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from netcl.core.dtypes import C_TYPES, as_dtype, bfloat16, float16

#: The bfloat16 type and conversions; guarded, so a kernel may include it more than once.
BF16_HELPERS = """#ifndef NETCL_BF16_HELPERS
#define NETCL_BF16_HELPERS
typedef ushort netcl_bf16;
inline float netcl_bf16_load(const ushort w) { return as_float((uint)w << 16); }
inline ushort netcl_bf16_round(const float f) {
    const uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)(((u >> 16) & 0x8000u) | 0x7fc0u);
    return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#endif
"""


def helpers_c(dtypes: Iterable[np.dtype]) -> str:
    """The helper C text a kernel touching ``dtypes`` needs (empty without bfloat16)."""
    return BF16_HELPERS if any(as_dtype(d) == bfloat16 for d in dtypes) else ""


def load_c(dtype: np.dtype, ptr: str, index: str) -> str:
    """C expression of element ``index`` of ``ptr`` (a ``dtype`` array) as a value to compute with:
    float for the storage-only dtypes, the element itself otherwise."""
    if dtype == float16:
        return f"vload_half({index}, {ptr})"
    if dtype == bfloat16:
        return f"netcl_bf16_load({ptr}[{index}])"
    return f"{ptr}[{index}]"


def vload_c(dtype: np.dtype, vec: int, ptr: str) -> str:
    """C expression of the ``vec`` consecutive elements at ``ptr`` of a storage-only ``dtype`` as a
    float vector (``vload_half{vec}``; bfloat16: the words widened and shifted into float32s)."""
    if dtype == float16:
        return f"vload_half{vec}(0, {ptr})"
    if dtype == bfloat16:
        return f"as_float{vec}(convert_uint{vec}(vload{vec}(0, {ptr})) << (uint)16)"
    raise ValueError(f"vload_c: {dtype} is not a storage-only dtype")


def store_c(dtype: np.dtype, ptr: str, index: str, value: str, wide: str = "float") -> str:
    """C statement (no semicolon) writing ``value`` to element ``index`` of ``ptr`` (a ``dtype``
    array), rounded to nearest even for the storage-only dtypes. ``wide``: the C type ``value`` is
    converted to first for float16 (``double`` rounds a float64 value once; bfloat16 always goes
    through float, as ml_dtypes does)."""
    if dtype == float16:
        return f"vstore_half_rte(({wide})({value}), {index}, {ptr})"
    if dtype == bfloat16:
        return f"{ptr}[{index}] = netcl_bf16_round((float)({value}))"
    return f"{ptr}[{index}] = ({C_TYPES[as_dtype(dtype)]})({value})"


def load_macro(dtype: np.dtype, compute: str) -> str:
    """Body of a ``LD(p, i)`` style macro over parameters ``p`` and ``i`` (``compute``: the C type of
    the computed value for the other dtypes)."""
    if dtype in (float16, bfloat16):
        return load_c(dtype, "(p)", "(i)")
    return f"(({compute})(p)[i])"


def store_macro(dtype: np.dtype, compute: str) -> str:
    """Body of an ``ST(p, i, v)`` style macro over ``p``, ``i`` and ``v``."""
    if dtype in (float16, bfloat16):
        return f"({store_c(dtype, '(p)', '(i)', f'({compute})(v)')})"
    return f"((p)[i] = ({C_TYPES[as_dtype(dtype)]})(v))"


def bits_ctype(dtype: np.dtype) -> str:
    """The C type of a kernel that only moves ``dtype``'s values: the 16 bits of a storage-only dtype
    (so the move needs no extension and no helpers), else the storage type."""
    return "ushort" if dtype in (float16, bfloat16) else C_TYPES[as_dtype(dtype)]
