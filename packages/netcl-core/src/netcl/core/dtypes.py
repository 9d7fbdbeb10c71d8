"""The dtypes netcl supports, their OpenCL C names, and what a device must offer for each."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from netcl.core.errors import DTypeError

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)
#: bfloat16 (8-bit exponent like float32, 8-bit significand): ml_dtypes' NumPy dtype, as JAX uses. Its
#: NumPy ``kind`` is "V", not "f": ask ``is_floating`` whether a dtype is a float type.
bfloat16 = np.dtype(ml_dtypes.bfloat16)

#: numpy dtype -> OpenCL C type name. bool is stored as one byte (uchar).
C_TYPES: dict[np.dtype, str] = {
    float32: "float",
    float16: "half",
    float64: "double",
    int32: "int",
    int64: "long",
    uint8: "uchar",
    bool_: "uchar",
    # 16-bit words, a type only the bfloat16 helpers define (``netcl.runtime.ops.storage_io``): a kernel
    # that would compute in it without loading through them fails to build rather than computing in ushort
    bfloat16: "netcl_bf16",
}

#: dtypes whose arithmetic needs a device extension on OpenCL.
REQUIRED_EXTENSION: dict[np.dtype, str] = {
    float16: "cl_khr_fp16",
    float64: "cl_khr_fp64",
    # no OpenCL device computes in bfloat16: a name no device lists, so ``Device.computes`` is False on
    # every OpenCL device and a kernel enabling it (``ops._common.pragmas``) is refused before its build
    bfloat16: "netcl_bfloat16_arithmetic",
}
#: dtypes a device without their extension still stores: OpenCL C's ``half`` is a storage format
#: there (``vload_half`` / ``vstore_half`` are core), so such tensors are copied and moved (slices,
#: concat, pad, flip, broadcast, transposes: raw 16-bit words), filled with a value, cast to and
#: from other dtypes, taken by elementwise ops, reductions and the row kernels (softmax, norms,
#: cross-entropy; computed in float32) and multiplied (``matmul`` computes in float32 or on tensor
#: cores), nothing else.
#: bfloat16 is storage-only on every OpenCL device the same way (16-bit words loaded as the high half of
#: a float32, stored rounded to nearest even), taken by the same kernels.
STORAGE_ONLY: frozenset[np.dtype] = frozenset({float16, bfloat16})

#: The float dtypes (``is_floating``), bfloat16 included.
FLOATING: frozenset[np.dtype] = frozenset({float16, bfloat16, float32, float64})


def is_floating(dtype: object) -> bool:
    """Whether ``dtype`` is a floating-point dtype (NumPy's ``kind == "f"`` misses bfloat16)."""
    return np.dtype(dtype) in FLOATING  # type: ignore[call-overload]


def refuse_bfloat16(op: str, dtype: object) -> None:
    """Raise ``DTypeError`` naming ``op`` when ``dtype`` is bfloat16, which ``op`` does not take (the ops
    that do are ``STORAGE_ONLY``'s list); called before anything is built or launched."""
    if isinstance(dtype, np.dtype) and dtype == bfloat16:
        raise DTypeError(
            f"{op}: bfloat16 tensors are not supported (bfloat16 is storage-only: copies, moves, fills, casts, "
            f"elementwise ops, reductions, softmax, norms, cross-entropy and matmul take it); cast to float32 first"
        )


def storage_only_message(dtype: np.dtype, device_name: str) -> str:
    """Why a kernel computing in ``dtype`` cannot run on a device that only stores it."""
    needs = (
        f"an OpenCL device that computes in it (none does, {device_name!r} neither)"
        if dtype == bfloat16
        else f"{REQUIRED_EXTENSION[dtype]}, which device {device_name!r} lacks"
    )
    return (
        f"{dtype} arithmetic needs {needs}: {dtype} "
        f"tensors there are storage-only (copies, moves, fills, casts, elementwise ops, reductions, softmax, "
        f"norms and matmul take them); cast to float32 first (ops.cast(x, float32))"
    )


def as_dtype(dtype: object) -> np.dtype:
    """Normalize ``dtype`` (numpy dtype, type, or name) to a supported numpy dtype."""
    try:
        result = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as exc:
        raise DTypeError(f"unknown dtype {dtype!r}; expected one of {supported_names()}") from exc
    if result not in C_TYPES:
        raise DTypeError(f"unsupported dtype {result}; expected one of {supported_names()}")
    return result


def c_type(dtype: object) -> str:
    """The OpenCL C type name for ``dtype``."""
    return C_TYPES[as_dtype(dtype)]


def supported_names() -> list[str]:
    return sorted({str(d) for d in C_TYPES})
