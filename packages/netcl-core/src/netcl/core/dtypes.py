"""The dtypes netcl supports, their OpenCL C names, and what a device must offer for each."""

from __future__ import annotations

import numpy as np

from netcl.core.errors import DTypeError

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)

#: numpy dtype -> OpenCL C type name. bool is stored as one byte (uchar).
C_TYPES: dict[np.dtype, str] = {
    float32: "float",
    float16: "half",
    float64: "double",
    int32: "int",
    int64: "long",
    uint8: "uchar",
    bool_: "uchar",
}

#: dtypes whose arithmetic needs a device extension on OpenCL.
REQUIRED_EXTENSION: dict[np.dtype, str] = {
    float16: "cl_khr_fp16",
    float64: "cl_khr_fp64",
}
#: dtypes a device without their extension still stores: OpenCL C's ``half`` is a storage format
#: there (``vload_half`` / ``vstore_half`` are core), so such tensors are copied and moved (slices,
#: concat, pad, flip, broadcast, transposes: raw 16-bit words), filled with a value, cast to and
#: from other dtypes, taken by elementwise ops, reductions and the row kernels (softmax, norms,
#: cross-entropy; computed in float32) and multiplied (``matmul`` computes in float32 or on tensor
#: cores), nothing else.
STORAGE_ONLY: frozenset[np.dtype] = frozenset({float16})


def storage_only_message(dtype: np.dtype, device_name: str) -> str:
    """Why a kernel computing in ``dtype`` cannot run on a device that only stores it."""
    return (
        f"{dtype} arithmetic needs {REQUIRED_EXTENSION[dtype]}, which device {device_name!r} lacks: {dtype} "
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
