"""Small float32 products on CPU OpenCL devices: one kernel each, no host wait.

The host BLAS path (``host_blas``) multiplies mapped buffers: it waits for the queue and pays three maps
and unmaps, 150-300 µs on PoCL even at 64^3. Below a size a kernel shaped for CPU devices is faster, and
it queues like any other op:

- "axpy" form (B untransposed; A in either orientation, read through its two strides): a work-item keeps
  ``ROWS`` rows x 16 columns of C in float16 vectors; each k loads B's 16-column segment once and adds it,
  times A's element broadcast, to each row;
- "dot" form (A untransposed, B transposed: ``x @ W.T``): a work-item keeps ``DOT_ROWS`` x ``DOT_COLS``
  dot products along K in float16 vectors, summed across their lanes in a fixed order at the end.

Both sum in a fixed order: the same bits in every run and in a replay (which records the launch). Two
transposed operands, batches, 1-D operands and products above ``AXPY_MAX_FLOPS`` / ``DOT_MAX_FLOPS``
keep the host BLAS (see benchmarks/RESULTS.md, "Small products on a CPU device").
"""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.ops._common import get_kernel
from netcl.runtime.ops._grid import launch_prepared

#: rows of C a work-item of the axpy form keeps (16 columns each)
ROWS = 4
#: rows x columns of C a work-item of the dot form keeps
DOT_ROWS, DOT_COLS = 8, 2
#: the largest products (2 m n k) each form takes: where it stops beating the host BLAS on PoCL
AXPY_MAX_FLOPS = 2 * 128**3
DOT_MAX_FLOPS = 3_000_000

_TEMPLATE = """
__kernel void netcl_cpu_gemm_axpy(const int M, const int N, const int K,
                                  __global const float* restrict A, const int sam, const int sak,
                                  __global const float* restrict B, __global float* restrict C) {{
    const int j0 = get_global_id(0) * 16, i0 = get_global_id(1) * {rows};
    if (j0 >= N || i0 >= M) return;
    const int rows = min({rows}, M - i0), cols = min(16, N - j0);
    float16 acc[{rows}];
    for (int r = 0; r < {rows}; ++r) acc[r] = (float16)(0.0f);
    for (int k = 0; k < K; ++k) {{
        __global const float* bk = B + (long)k * N + j0;
        float16 b;
        if (cols == 16) {{
            b = vload16(0, bk);
        }} else {{
            float part[16];
            for (int e = 0; e < 16; ++e) part[e] = e < cols ? bk[e] : 0.0f;
            b = vload16(0, part);
        }}
        #pragma unroll
        for (int r = 0; r < {rows}; ++r) {{
            const float a = r < rows ? A[(long)(i0 + r) * sam + (long)k * sak] : 0.0f;
            acc[r] = fma((float16)(a), b, acc[r]);
        }}
    }}
    for (int r = 0; r < rows; ++r) {{
        __global float* c = C + (long)(i0 + r) * N + j0;
        if (cols == 16) {{
            vstore16(acc[r], 0, c);
        }} else {{
            float part[16];
            vstore16(acc[r], 0, part);
            for (int e = 0; e < cols; ++e) c[e] = part[e];
        }}
    }}
}}

__kernel void netcl_cpu_gemm_dot(const int M, const int N, const int K, __global const float* restrict A,
                                 __global const float* restrict B, __global float* restrict C) {{
    const int j0 = get_global_id(0) * {cols}, i0 = get_global_id(1) * {dot_rows};
    if (j0 >= N || i0 >= M) return;
    const int rows = min({dot_rows}, M - i0), cols = min({cols}, N - j0);
    float16 acc[{dot_rows}][{cols}];
    for (int r = 0; r < {dot_rows}; ++r)
        for (int s = 0; s < {cols}; ++s) acc[r][s] = (float16)(0.0f);
    const int whole = K & ~15;
    for (int k = 0; k < whole; k += 16) {{
        float16 b[{cols}];
        for (int s = 0; s < {cols}; ++s) b[s] = vload16(0, B + (long)min(j0 + s, N - 1) * K + k);
        for (int r = 0; r < {dot_rows}; ++r) {{
            const float16 a = vload16(0, A + (long)min(i0 + r, M - 1) * K + k);
            for (int s = 0; s < {cols}; ++s) acc[r][s] = fma(a, b[s], acc[r][s]);
        }}
    }}
    for (int r = 0; r < rows; ++r) {{
        for (int s = 0; s < cols; ++s) {{
            const float16 v = acc[r][s];
            const float8 h8 = v.lo + v.hi;
            const float4 h4 = h8.lo + h8.hi;
            const float2 h2 = h4.lo + h4.hi;
            float sum = h2.x + h2.y;
            for (int k = whole; k < K; ++k) sum = fma(A[(long)(i0 + r) * K + k], B[(long)(j0 + s) * K + k], sum);
            C[(long)(i0 + r) * N + j0 + s] = sum;
        }}
    }}
}}
"""
_SOURCE = _TEMPLATE.format(rows=ROWS, dot_rows=DOT_ROWS, cols=DOT_COLS)

_I32 = np.int32


def applies(a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool) -> bool:
    """Whether the product of two float32 matrices (a host-memory CPU device's, shapes checked by the caller)
    runs here: 2-D operands, not both transposed, and at most the form's size."""
    if a.ndim != 2 or b.ndim != 2 or a.dtype != np.float32 or b.dtype != np.float32 or (transpose_a and transpose_b):
        return False
    m, k = (a.shape[1], a.shape[0]) if transpose_a else a.shape
    n = b.shape[0] if transpose_b else b.shape[1]
    flops = 2 * m * n * k
    return 0 < flops <= (DOT_MAX_FLOPS if transpose_b else AXPY_MAX_FLOPS)


def matmul(a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool) -> Tensor:
    """``a @ b`` (either operand's two axes swapped where asked) of a call ``applies`` accepted."""
    device = a.device
    m, k = (a.shape[1], a.shape[0]) if transpose_a else a.shape
    n = b.shape[0] if transpose_b else b.shape[1]
    out = Tensor.empty((m, n), np.float32, device)
    form = "dot" if transpose_b else "axpy"
    key = ("cpu_gemm", form, ROWS, DOT_ROWS, DOT_COLS)  # (one kernel a key: the memo keys kernels by it)
    sizes = [_I32(m), _I32(n), _I32(k)]
    if transpose_b:
        types = [_I32] * 3 + [None] * 3
        grid, args = (-(-n // DOT_COLS), -(-m // DOT_ROWS)), [*sizes, a, b, out]
    else:
        types = [_I32] * 3 + [None, _I32, _I32, None, None]
        strides = (_I32(1), _I32(m)) if transpose_a else (_I32(k), _I32(1))  # A[i, k] at i * sam + k * sak
        grid, args = (-(-n // 16), -(-m // ROWS)), [*sizes, a, *strides, b, out]
    kernel = get_kernel(key, device, lambda: _SOURCE, f"netcl_cpu_gemm_{form}", types).kernel
    launch_prepared(key, device, kernel, grid, None, args)
    return out
