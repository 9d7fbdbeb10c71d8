"""``matmul``: (M, K) @ (K, N) and batched (..., M, K) @ (..., K, N) with broadcast batch dims.

The OpenCL kernel is tiled in local memory: a 16x16 work-group computes a 64x64 block of C;
per step along K it loads a 64x16 tile of A and a 16x64 tile of B into local memory and each
thread accumulates a 4x4 register block (rows ty + 16i, columns tx + 16j, so loads from local
memory and stores to C stay contiguous across a row of threads). Tiles past the matrix edges
are zero-padded, so any M, N, K work. 1-D operands follow NumPy (a vector on the left is a
row, on the right a column, and that dimension is dropped from the result).
"""

from __future__ import annotations

import math

import numpy as np

from netcl.core import Tensor, broadcast_index_lines, broadcast_shapes
from netcl.core.errors import ShapeError
from netcl.runtime.launch import launch
from netcl.runtime.ops import host_blas, numpy_backend
from netcl.runtime.ops._common import (
    compute_ctype,
    device_of,
    float_dtype,
    get_kernel,
    index_type,
    pragmas,
    promote,
    storage_ctype,
)
from netcl.runtime.ops.layout import transpose
from netcl.runtime.ops.pointwise import fill_
from netcl.runtime.ops.reduce import sum as reduce_sum

TILE = 16  # BK: the K-depth of one step
BLOCK = 64  # BM = BN: the output block of one work-group
THREADS = 16  # a 16 x 16 work-group; each thread accumulates a 4 x 4 sub-block
#: A 2-D product with at most this many output blocks and K >= SPLIT_MIN_K is split along K
#: (a weight gradient x.T @ g has a small output and a huge K: on an H200 (64 x 262144) @
#: (262144 x 256) took 21.9 ms as 4 work-groups).
SPLIT_MAX_BLOCKS = 64
SPLIT_MIN_K = 8192


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
    if host_blas.applies(device, a, b, result):  # CPU OpenCL: NumPy's BLAS on the mapped buffers
        return host_blas.matmul(a, b, out_shape, result)
    out = Tensor.empty(out_shape, result, device)
    M, K, N = a2[-2], a2[-1], b2[-1]
    if out.size == 0:
        return out
    if K == 0:
        return fill_(out, 0)
    splits = _k_splits(M, N, K, batch, (a.dtype, b.dtype, result))
    if splits > 1:
        return _split_k_matmul(a, b, splits, out_shape)
    key = ("matmul", a2, b2, a.dtype.str, b.dtype.str, result.str)

    def source() -> str:
        return _source(a2, b2, batch, a.dtype, b.dtype, result)

    resolved = get_kernel(key, device, source, "netcl_matmul", [None, None, None])
    gsize = (-(-N // BLOCK) * THREADS, -(-M // BLOCK) * THREADS, math.prod(batch))
    launch(resolved.kernel, gsize, (THREADS, THREADS, 1), a.data, b.data, out.data, queue=device.queue)
    return out


def _k_splits(rows: int, cols: int, inner: int, batch: tuple[int, ...], dtypes: tuple) -> int:
    """How many K-chunks a 2-D float32 (rows x inner) @ (inner x cols) is split into (1: none)."""
    blocks = -(-rows // BLOCK) * -(-cols // BLOCK)
    if batch or inner < SPLIT_MIN_K or blocks > SPLIT_MAX_BLOCKS or any(d != np.float32 for d in dtypes):
        return 1
    for splits in (64, 32, 16, 8, 4, 2):
        if inner % splits == 0 and inner // splits >= 1024 and blocks * splits <= 8 * SPLIT_MAX_BLOCKS:
            return splits
    return 1


def _split_k_matmul(a: Tensor, b: Tensor, splits: int, out_shape: tuple[int, ...]) -> Tensor:
    """``a @ b`` as ``splits`` partial products over K-chunks (one batched launch), then their sum."""
    M, K = a.shape[-2], a.shape[-1]
    chunk = K // splits
    a_chunks = transpose(a.reshape(M, splits, chunk), (1, 0, 2))  # (splits, M, chunk)
    b_chunks = b.reshape(splits, chunk, b.shape[-1])  # (splits, chunk, N): a view
    return reduce_sum(matmul(a_chunks, b_chunks), axis=0).reshape(out_shape)


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
    return f"""{pragmas([a_dtype, b_dtype, out_dtype])}
#define BM {BLOCK}
#define BN {BLOCK}
#define BK {TILE}
#define T {THREADS}
#define W {BLOCK // THREADS}
__kernel __attribute__((reqd_work_group_size(T, T, 1)))
void netcl_matmul(__global const {storage_ctype(a_dtype)}* A, __global const {storage_ctype(b_dtype)}* B,
                  __global {storage_ctype(out_dtype)}* C) {{
    __local {ct} As[BK][BM + 1];
    __local {ct} Bs[BK][BN];
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int tid = ty * T + tx;
    const {idx} col0 = ({idx})get_group_id(0) * BN;
    const {idx} row0 = ({idx})get_group_id(1) * BM;
    const {idx} bi = ({idx})get_global_id(2);
    {batch_lines}
    const {idx} a_off = ab * {M * K};
    const {idx} b_off = bb * {K * N};
    {ct} acc[W][W];
    for (int i = 0; i < W; ++i) {{ for (int j = 0; j < W; ++j) {{ acc[i][j] = 0; }} }}
    for (int t = 0; t < {K}; t += BK) {{
        for (int i = 0; i < (BM * BK) / (T * T); ++i) {{
            const int e = tid + i * T * T;
            const int m = e / BK, k = e % BK;
            const {idx} r = row0 + m;
            As[k][m] = (r < {M} && t + k < {K}) ? ({ct})A[a_off + r * {K} + t + k] : ({ct})0;
            const int kb = e / BN, n = e % BN;
            const {idx} c = col0 + n;
            Bs[kb][n] = (t + kb < {K} && c < {N}) ? ({ct})B[b_off + ({idx})(t + kb) * {N} + c] : ({ct})0;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < BK; ++k) {{
            {ct} a[W], b[W];
            for (int i = 0; i < W; ++i) {{ a[i] = As[k][ty + T * i]; }}
            for (int j = 0; j < W; ++j) {{ b[j] = Bs[k][tx + T * j]; }}
            for (int i = 0; i < W; ++i) {{ for (int j = 0; j < W; ++j) {{ acc[i][j] += a[i] * b[j]; }} }}
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    for (int i = 0; i < W; ++i) {{
        const {idx} r = row0 + ty + T * i;
        for (int j = 0; j < W; ++j) {{
            const {idx} c = col0 + tx + T * j;
            if (r < {M} && c < {N}) {{ C[bi * {M * N} + r * {N} + c] = ({storage_ctype(out_dtype)})acc[i][j]; }}
        }}
    }}
}}
"""
