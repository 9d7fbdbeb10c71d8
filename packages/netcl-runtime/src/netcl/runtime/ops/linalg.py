"""``matmul``: (M, K) @ (K, N) and batched (..., M, K) @ (..., K, N) with broadcast batch dims.

The OpenCL kernel is tiled in local memory: a 16x16 work-group loads a 16x16 tile of A and
of B per step along K and each thread accumulates one output. Tiles past the matrix edges
are zero-padded, so any M, N, K work. 1-D operands follow NumPy (a vector on the left is a
row, on the right a column, and that dimension is dropped from the result).
"""

from __future__ import annotations

import math

import numpy as np

from netcl.core import Tensor, broadcast_index_lines, broadcast_shapes
from netcl.core.errors import ShapeError
from netcl.runtime.launch import launch
from netcl.runtime.ops import numpy_backend
from netcl.runtime.ops._common import (
    compute_ctype,
    device_of,
    float_dtype,
    get_kernel,
    index_type,
    pragmas,
    promote,
    round_up,
    storage_ctype,
)
from netcl.runtime.ops.pointwise import fill_

TILE = 16


def matmul_shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[tuple, tuple, tuple, tuple]:
    """(a as >= 2-D, b as >= 2-D, batch shape, result shape) for ``a @ b``; ShapeError if they do not fit."""
    if not a_shape or not b_shape:
        raise ShapeError(f"matmul: operands must be at least 1-D, got shapes {a_shape} and {b_shape}")
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    if a2[-1] != b2[-2]:
        raise ShapeError(
            f"matmul: shapes {a_shape} and {b_shape} do not fit: inner dimensions {a2[-1]} and {b2[-2]} differ"
        )
    try:
        batch = broadcast_shapes(a2[:-2], b2[:-2])
    except ShapeError as exc:
        raise ShapeError(f"matmul: batch dimensions of {a_shape} and {b_shape} do not broadcast ({exc})") from None
    out = (*batch, a2[-2], b2[-1])
    if len(a_shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b_shape) == 1:
        out = out[:-1]
    return a2, b2, batch, out


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product with NumPy's ``matmul`` semantics; float result (float32 for integer inputs)."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected two Tensors, got {type(a).__name__} and {type(b).__name__}")
    device = device_of((a, b), "matmul")
    a2, b2, batch, out_shape = matmul_shapes(a.shape, b.shape)
    result = float_dtype(promote((a, b)))
    device.check_dtype(result)
    if device.kind == "cpu":
        return numpy_backend.matmul(a, b, result)
    out = Tensor.empty(out_shape, result, device)
    M, K, N = a2[-2], a2[-1], b2[-1]
    if out.size == 0:
        return out
    if K == 0:
        return fill_(out, 0)
    key = ("matmul", a2, b2, a.dtype.str, b.dtype.str, result.str)

    def source() -> str:
        return _source(a2, b2, batch, a.dtype, b.dtype, result)

    resolved = get_kernel(key, device, source, "netcl_matmul", [None, None, None])
    gsize = (round_up(N, TILE), round_up(M, TILE), math.prod(batch))
    launch(resolved.kernel, gsize, (TILE, TILE, 1), a.data, b.data, out.data, queue=device.queue)
    return out


def _source(
    a2: tuple[int, ...],
    b2: tuple[int, ...],
    batch: tuple[int, ...],
    a_dtype: np.dtype,
    b_dtype: np.dtype,
    out_dtype: np.dtype,
) -> str:
    M, K, N = a2[-2], a2[-1], b2[-1]
    idx = index_type(a2, b2, (*batch, M, N))
    ct = compute_ctype(out_dtype)
    lines = [
        *broadcast_index_lines(a2[:-2], batch, "bi", "ab", idx),
        *broadcast_index_lines(b2[:-2], batch, "bi", "bb", idx),
    ]
    batch_lines = "\n    ".join(lines)
    return (
        f"{pragmas([a_dtype, b_dtype, out_dtype])}"
        f"#define TS {TILE}\n"
        "__kernel __attribute__((reqd_work_group_size(TS, TS, 1)))\n"
        f"void netcl_matmul(__global const {storage_ctype(a_dtype)}* A, __global const {storage_ctype(b_dtype)}* B,"
        f" __global {storage_ctype(out_dtype)}* C) {{\n"
        f"    __local {ct} As[TS][TS];\n"
        f"    __local {ct} Bs[TS][TS];\n"
        "    const int lc = get_local_id(0);\n"
        "    const int lr = get_local_id(1);\n"
        f"    const {idx} col = ({idx})get_global_id(0);\n"
        f"    const {idx} row = ({idx})get_global_id(1);\n"
        f"    const {idx} bi = ({idx})get_global_id(2);\n"
        f"    {batch_lines}\n"
        f"    const {idx} a_off = ab * {M * K};\n"
        f"    const {idx} b_off = bb * {K * N};\n"
        f"    {ct} acc = 0;\n"
        f"    for (int t = 0; t < {K}; t += TS) {{\n"
        "        const int ka = t + lc;\n"
        "        const int kb = t + lr;\n"
        f"        As[lr][lc] = (row < {M} && ka < {K}) ? ({ct})A[a_off + row * {K} + ka] : ({ct})0;\n"
        f"        Bs[lr][lc] = (kb < {K} && col < {N}) ? ({ct})B[b_off + ({idx})kb * {N} + col] : ({ct})0;\n"
        "        barrier(CLK_LOCAL_MEM_FENCE);\n"
        "        for (int k = 0; k < TS; ++k) { acc += As[lr][k] * Bs[k][lc]; }\n"
        "        barrier(CLK_LOCAL_MEM_FENCE);\n"
        "    }\n"
        f"    if (row < {M} && col < {N}) {{ C[bi * {M * N} + row * {N} + col] = ({storage_ctype(out_dtype)})acc; }}\n"
        "}\n"
    )
