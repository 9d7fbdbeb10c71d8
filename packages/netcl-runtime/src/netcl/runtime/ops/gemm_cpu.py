"""float32 products on CPU OpenCL devices as kernels: no host wait, no map, queued like any other op.

The host BLAS path (``host_blas``) multiplies mapped buffers: it waits for the queue and pays the maps, 150-300 µs
on PoCL even at 64^3 where the pool has no host views. Three kernel forms shaped for CPU devices run products
instead, each summing in a fixed order (the same bits in every run and in a replay, which records the launch):

- "tile" (B untransposed; A in either orientation, read through its two strides): a work-item keeps ``TILE_ROWS``
  rows x ``TILE_COLS`` columns of C in float16 vectors and, for each k, adds B's row segment times A's broadcast
  element to each row: every C element is one fma chain over k in order. Register-blocked for 16-wide float
  vectors (AVX-512: 16 accumulators, 2 loads of B and 8 of A per 16 fmas);
- "axpy": the same with ``ROWS`` rows x 16 columns, for narrower vectors;
- "dot" (A untransposed, B transposed: ``x @ W.T``): a work-item keeps ``DOT_ROWS`` x ``DOT_COLS`` dot products
  along K in float16 vectors, summed across their lanes in a fixed order at the end.

Every form takes a batch (a third grid axis; an operand's batch stride is 0 where it is broadcast whole).

Which products come here (``NETCL_CPU_GEMM``, ``plan``): by default ("auto") every product of >= 2-D float32
operands on a device whose preferred float vector is at least ``WIDE_FLOATS`` wide, except two transposed operands,
batches broadcast in part and long reductions over operands larger than half the device's cache (``LONG_K``): the
tile and dot forms run 1.5-2.5x NumPy's OpenBLAS there (benchmarks/RESULTS.md, "Forty-first session"). Elsewhere
only 2-D products up to ``AXPY_MAX_FLOPS`` / ``DOT_MAX_FLOPS`` come here (where the kernels stopped beating the host
BLAS on narrower vectors: "Small products on a CPU device"). ``small`` keeps that second rule everywhere, ``all``
the first everywhere, ``off`` sends every product to the host BLAS.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float32
from netcl.runtime import results
from netcl.runtime.cache import register_cache
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import get_kernel, remember

ENV_VAR = "NETCL_CPU_GEMM"
MODES = ("auto", "all", "small", "off")
#: rows of C a work-item of the axpy form keeps (16 columns each)
ROWS = 4
#: rows x columns of C a work-item of the tile form keeps (columns: two float16 vectors)
TILE_ROWS, TILE_COLS = 8, 32
#: rows x columns of C a work-item of the dot form keeps
DOT_ROWS, DOT_COLS = 8, 2
#: the largest products (2 m n k) each form takes under the "small" rule: where it stops beating the host BLAS on
#: PoCL with narrower vectors
AXPY_MAX_FLOPS = 2 * 128**3
DOT_MAX_FLOPS = 3_000_000
#: the preferred float vector width (floats) from which "auto" runs every product here
WIDE_FLOATS = 16
#: a reduction this long over operands larger than half the device's cache goes to the host BLAS: each work-item
#: streams its slabs of A and B over all of K, re-read from memory for every row and column block (3x slower than
#: the BLAS at K = 32768 over 40 MiB; see benchmarks/RESULTS.md, "Forty-first session")
LONG_K = 16384

_TEMPLATE = """
// What each stored element of C (row i, column j of batch entry `batch`) gets added (gemm_cpu.EPILOGUES): nothing, E[j]
// (a bias per column), E[i] (a bias per row) or E[batch, i, j] (an addend of C's shape); one rounding, as an add.
#if EPILOGUE == 0
#define PLUS(s, i, j) (s)
#define PLUS16(v, i, j) (v)
#elif EPILOGUE == 1
#define PLUS(s, i, j) ((s) + E[j])
#define PLUS16(v, i, j) ((v) + vload16(0, E + (j)))
#elif EPILOGUE == 2
#define PLUS(s, i, j) ((s) + E[i])
#define PLUS16(v, i, j) ((v) + (float16)(E[i]))
#else
#define PLUS(s, i, j) ((s) + E[(batch * M + (i)) * (long)N + (j)])
#define PLUS16(v, i, j) ((v) + vload16(0, E + (batch * M + (i)) * (long)N + (j)))
#endif

{axpy}
{tile}
__kernel void netcl_cpu_gemm_dot(const int M, const int N, const int K, __global const float* restrict A,
                                 const long sab, __global const float* restrict B, const long sbb,
                                 __global float* restrict C, __global const float* restrict E) {{
    const int j0 = get_global_id(0) * {cols}, i0 = get_global_id(1) * {dot_rows};
    if (j0 >= N || i0 >= M) return;
    const long batch = get_global_id(2);
    A += batch * sab;
    B += batch * sbb;
    C += batch * M * (long)N;
    const int rows = min({dot_rows}, M - i0), cols = min({cols}, N - j0);
    float16 acc[{dot_rows}][{cols}];  // (unrolled loops: the accumulators stay in registers)
    #pragma unroll
    for (int r = 0; r < {dot_rows}; ++r)
        #pragma unroll
        for (int s = 0; s < {cols}; ++s) acc[r][s] = (float16)(0.0f);
    const int whole = K & ~15;
    for (int k = 0; k < whole; k += 16) {{
        float16 b[{cols}];
        #pragma unroll
        for (int s = 0; s < {cols}; ++s) b[s] = vload16(0, B + (long)min(j0 + s, N - 1) * K + k);
        #pragma unroll
        for (int r = 0; r < {dot_rows}; ++r) {{
            const float16 a = vload16(0, A + (long)min(i0 + r, M - 1) * K + k);
            #pragma unroll
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
            C[(long)(i0 + r) * N + j0 + s] = PLUS(sum, i0 + r, j0 + s);
        }}
    }}
}}
"""


def _rows_kernel(name: str, rows: int, vectors: int) -> str:
    """A form of B untransposed: a work-item keeps ``rows`` rows x ``vectors`` float16 vectors of C and, for each k,
    adds B's row segment times A's broadcast element to each row (every C element one fma chain over k in order).
    Rows past M read A's last row (their sums are not stored), columns past N read 0 (a padded copy of B's row
    segment, in the last column block only). The register loops are unrolled (the accumulators stay in registers)."""
    cols = 16 * vectors
    return f"""
__kernel void netcl_cpu_gemm_{name}(const int M, const int N, const int K,
                                  __global const float* restrict A, const int sam, const int sak, const long sab,
                                  __global const float* restrict B, const long sbb, __global float* restrict C,
                                  __global const float* restrict E) {{
    const int j0 = get_global_id(0) * {cols}, i0 = get_global_id(1) * {rows};
    if (j0 >= N || i0 >= M) return;
    const long batch = get_global_id(2);
    A += batch * sab;
    B += batch * sbb + j0;
    C += batch * M * (long)N + j0;
    const int rows = min({rows}, M - i0), cols = min({cols}, N - j0);
    long a_row[{rows}];
    float16 acc[{rows}][{vectors}];
    #pragma unroll
    for (int r = 0; r < {rows}; ++r) {{
        a_row[r] = (long)min(i0 + r, M - 1) * sam;
        #pragma unroll
        for (int v = 0; v < {vectors}; ++v) acc[r][v] = (float16)(0.0f);
    }}
    for (int k = 0; k < K; ++k) {{
        __global const float* bk = B + (long)k * N;
        float16 b[{vectors}];
        if (cols == {cols}) {{
            #pragma unroll
            for (int v = 0; v < {vectors}; ++v) b[v] = vload16(v, bk);
        }} else {{
            float part[{cols}];
            for (int e = 0; e < {cols}; ++e) part[e] = e < cols ? bk[e] : 0.0f;
            #pragma unroll
            for (int v = 0; v < {vectors}; ++v) b[v] = vload16(v, part);
        }}
        const long ak = (long)k * sak;
        #pragma unroll
        for (int r = 0; r < {rows}; ++r) {{
            const float16 a = (float16)(A[a_row[r] + ak]);
            #pragma unroll
            for (int v = 0; v < {vectors}; ++v) acc[r][v] = fma(a, b[v], acc[r][v]);
        }}
    }}
    for (int r = 0; r < rows; ++r) {{
        __global float* c = C + (long)(i0 + r) * N;
        if (cols == {cols}) {{
            #pragma unroll
            for (int v = 0; v < {vectors}; ++v) vstore16(PLUS16(acc[r][v], i0 + r, j0 + 16 * v), v, c);
        }} else {{
            float part[{cols}];
            #pragma unroll
            for (int v = 0; v < {vectors}; ++v) vstore16(acc[r][v], v, part);
            for (int e = 0; e < cols; ++e) c[e] = PLUS(part[e], i0 + r, j0 + e);
        }}
    }}
}}
"""


_SOURCE = _TEMPLATE.format(
    axpy=_rows_kernel("axpy", ROWS, 1),
    tile=_rows_kernel("tile", TILE_ROWS, TILE_COLS // 16),
    dot_rows=DOT_ROWS,
    cols=DOT_COLS,
)
#: what a product's store adds (the kernels' ``EPILOGUE``): nothing, a bias per column (``x @ W.T + b``), a bias
#: per row (a convolution's per-channel bias on ``W @ columns``), an addend of the result's shape (a gradient
#: accumulated in place)
EPILOGUES = {"none": 0, "column": 1, "row": 2, "addend": 3}

_I32, _I64 = np.int32, np.int64


def mode() -> str:
    """``NETCL_CPU_GEMM``: "auto" (unset), "all", "small" or "off" (module docstring); ValueError for another."""
    setting = os.environ.get(ENV_VAR, "").strip().lower() or "auto"
    if setting not in MODES:
        raise ValueError(f"{ENV_VAR}={setting!r}: expected one of {', '.join(MODES)}")
    return setting


@functools.cache
def _cache_bytes(device) -> int:
    """The device's global memory cache (PoCL reports the last-level cache), asked once per device."""
    return int(device.cl_device.global_mem_cache_size)


@functools.cache
def _wide(device) -> bool:
    """Whether ``device`` prefers float vectors of at least ``WIDE_FLOATS`` (asked once per device)."""
    return int(device.cl_device.preferred_vector_width_float) >= WIDE_FLOATS


class Plan(NamedTuple):
    """How ``matmul`` runs a product: the kernel form ("tile", "axpy" or "dot"), the result's batch shape and each
    operand's batch stride in elements (0 for a batch broadcast whole)."""

    form: str
    batch: tuple[int, ...]
    a_stride: int
    b_stride: int


def plan(a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool) -> Plan | None:
    """How ``a @ b`` (float32 operands of a host-memory CPU device, shapes checked by the caller) runs here, or None
    where it does not: it needs operands of at least two dimensions, not both transposed, each batch either the
    result's or broadcast whole, no reduction of ``LONG_K`` or more over operands larger than half the device's cache,
    and under the "small" rule (module docstring) 2-D operands and at most the form's size."""
    if a.dtype != np.float32 or b.dtype != np.float32 or (transpose_a and transpose_b) or a.ndim < 2 or b.ndim < 2:
        return None
    setting = mode()
    if setting == "off":
        return None
    if setting == "all" or (setting == "auto" and _wide(a.device)):
        k = a.shape[-2] if transpose_a else a.shape[-1]
        if k >= LONG_K and 4 * (a.size + b.size) > _cache_bytes(a.device) // 2:
            return None  # streamed once per row or column block from memory: the host BLAS blocks for the cache
        found = _batch_strides(a.shape, b.shape)
        return None if found is None else Plan("dot" if transpose_b else "tile", *found)
    if a.ndim != 2 or b.ndim != 2:
        return None
    m, k = (a.shape[1], a.shape[0]) if transpose_a else a.shape
    n = b.shape[0] if transpose_b else b.shape[1]
    flops = 2 * m * n * k
    if not 0 < flops <= (DOT_MAX_FLOPS if transpose_b else AXPY_MAX_FLOPS):
        return None
    return Plan("dot" if transpose_b else "axpy", (), 0, 0)


def _batch_strides(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[tuple[int, ...], int, int] | None:
    """(the result's batch shape, a's and b's batch strides in elements: 0 for a batch broadcast whole), or None where
    an operand's batch is broadcast only in part (e.g. (2, 1) against (1, 3))."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return (), 0, 0
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    rank = max(len(a_batch), len(b_batch))
    a_full, b_full = (1,) * (rank - len(a_batch)) + a_batch, (1,) * (rank - len(b_batch)) + b_batch
    batch = tuple(x if y == 1 else y for x, y in zip(a_full, b_full, strict=True))  # (shapes checked: x == y or 1)
    strides = []
    for full, shape in ((a_full, a_shape), (b_full, b_shape)):
        if full == batch:
            strides.append(shape[-2] * shape[-1])
        elif all(d == 1 for d in full):
            strides.append(0)
        else:
            return None
    return batch, strides[0], strides[1]


class Product(NamedTuple):
    """One product of fixed operand shapes, planned: ``launch(a, b, out, extra)`` (raw buffers; every size bound, None
    for an empty result) writes the result of ``shape`` (float32, ``nbytes``) into ``out``."""

    launch: Callable[[Any, Any, Any, Any], None] | None
    shape: tuple[int, ...]
    nbytes: int


#: prepared products by (a's shape, b's shape, transposes, plan, epilogue, device)
_PRODUCTS: dict[tuple, Product] = {}
register_cache(_PRODUCTS.clear)


def prepare(a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool, how: Plan, epilogue: str = "none") -> Product:
    """The ``Product`` of ``a @ b`` (either operand's last two axes swapped where asked) as ``plan`` said (``how``), its
    store adding the extra operand as ``epilogue`` says (``EPILOGUES``); it depends on the operands' shapes and device
    only, so a caller may keep it for later products of the same signature (``run``). Made once per signature."""
    signature = (a.shape, b.shape, transpose_a, transpose_b, how, epilogue, a.device)
    product = _PRODUCTS.get(signature)
    if product is None:
        product = remember(
            _PRODUCTS, signature, _prepared(a.shape, b.shape, transpose_a, transpose_b, how, epilogue, a.device)
        )
    return product


def _prepared(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    transpose_a: bool,
    transpose_b: bool,
    how: Plan,
    epilogue: str,
    device: Device,
) -> Product:
    m, k = (a_shape[-1], a_shape[-2]) if transpose_a else a_shape[-2:]
    n = b_shape[-2] if transpose_b else b_shape[-1]
    shape = (*how.batch, m, n)
    count = math.prod(shape)
    if count == 0:
        return Product(None, shape, 0)
    form, code = how.form, EPILOGUES[epilogue]
    key = ("cpu_gemm", form, code, ROWS, TILE_ROWS, DOT_ROWS, DOT_COLS)  # (one kernel a key: the memo keys by it)
    sizes = {0: _I32(m), 1: _I32(n), 2: _I32(k)}
    batches = (_I64(how.a_stride), _I64(how.b_stride))
    if form == "dot":  # (m, n, k, A, a's batch stride, B, b's batch stride, C, E)
        types = [_I32] * 3 + [None, _I64, None, _I64, None, None]
        grid = (-(-n // DOT_COLS), -(-m // DOT_ROWS), count // (m * n))
        bound = {**sizes, 4: batches[0], 6: batches[1]}
    else:  # (m, n, k, A, A's two strides, a's batch stride, B, b's batch stride, C, E)
        types = [_I32] * 3 + [None, _I32, _I32, _I64, None, _I64, None, None]
        strides = (_I32(1), _I32(m)) if transpose_a else (_I32(k), _I32(1))  # A[i, k] at i * sam + k * sak
        width, rows = (TILE_COLS, TILE_ROWS) if form == "tile" else (16, ROWS)
        grid = (-(-n // width), -(-m // rows), count // (m * n))
        bound = {**sizes, 4: strides[0], 5: strides[1], 6: batches[0], 8: batches[1]}
    # (the source is made at the kernel's first build only)
    resolved = get_kernel(key, device, lambda: f"#define EPILOGUE {code}\n{_SOURCE}", f"netcl_cpu_gemm_{form}", types)
    launch = PreparedLaunch.binding(resolved.kernel, grid, None, bound, device.queue)
    return Product(launch.call, shape, 4 * count)


def run(product: Product, a: Tensor, b: Tensor, extra: Tensor | None = None) -> Tensor:
    """``product`` of ``a`` and ``b`` (of the signature it was prepared for), ``extra`` added in its store as its
    epilogue says: a new float32 tensor."""
    device = a.device
    out = results.tensor(device.allocator(device, product.nbytes), product.shape, float32, device)
    if product.launch is not None:
        product.launch(a.data, b.data, out.data, a.data if extra is None else extra.data)  # (no epilogue: E unread)
    return out


def matmul(
    a: Tensor,
    b: Tensor,
    transpose_a: bool,
    transpose_b: bool,
    how: Plan,
    extra: Tensor | None = None,
    epilogue: str = "none",
) -> Tensor:
    """``a @ b`` (either operand's last two axes swapped where asked) as ``plan`` said (``how``), plus ``extra`` in
    the store as ``epilogue`` says (``EPILOGUES``; the caller checked its shape and dtype: float32, (N,) for
    "column", (M,) for "row", the result's shape for "addend")."""
    return run(prepare(a, b, transpose_a, transpose_b, how, epilogue), a, b, extra)
