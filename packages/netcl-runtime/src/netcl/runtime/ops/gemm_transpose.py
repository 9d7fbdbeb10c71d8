"""Products whose kernel reads both operands K-major, of operands stored otherwise: a transpose first.

tf32x3 on Hopper's ``wgmma`` (``gemm_mma_source``'s split stages) multiplies tiles that lie K-major in
local memory (tf32 ``wgmma`` has no transpose bits). Its split transposes the tiles of an A stored K x M
(``trans_a``) or a B stored K x N (not ``trans_b``) in the kernel; ``MmaConfig.pre`` asks for the other
way, faster for big products: each such operand first copied, transposed, into a workspace
(``netcl_gemm_transpose``: 32 x 32 tiles through local memory, reads and writes along rows), then the
kernel of the K-major problem (``k_major``). The tile search times both, transposes with the product.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float32
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import get_kernel
from netcl.runtime.ops.gemm_plan import Problem

_I32, _I64 = np.dtype(np.int32), np.dtype(np.int64)
#: (source, destination, R, C, ld, n1, n2, s0, s1, s2)
_ARG_DTYPES = [None, None, _I32, _I32, _I32, _I32, _I32, _I64, _I64, _I64]
_TILE, _ROWS = 32, 8

_SOURCE = f"""#define T {_TILE}
__kernel __attribute__((reqd_work_group_size(T, {_ROWS}, 1)))
void netcl_gemm_transpose(__global const float* S, __global float* D, const int R, const int C, const int ld,
                          const int n1, const int n2, const long s0, const long s1, const long s2) {{
    /* matrix z (batch dims n0 x n1 x n2, strides s0, s1, s2) of R x C at row stride ld -> D[z] as C x R */
    const int z = get_group_id(2);
    const int z2 = z % n2, z1 = (z / n2) % n1, z0 = z / (n2 * n1);
    __global const float* src = S + z0 * s0 + z1 * s1 + z2 * s2;
    __global float* dst = D + (long)z * R * C;
    __local float tile[T][T + 1];
    const int c0 = get_group_id(0) * T, r0 = get_group_id(1) * T;
    const int tx = get_local_id(0), ty = get_local_id(1);
    for (int j = ty; j < T; j += {_ROWS}) {{
        const int r = r0 + j, c = c0 + tx;
        if (r < R && c < C) tile[j][tx] = src[(long)r * ld + c];
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int j = ty; j < T; j += {_ROWS}) {{
        const int c = c0 + j, r = r0 + tx;
        if (r < R && c < C) dst[(long)c * R + r] = tile[tx][j];
    }}
}}
"""


def k_major(problem: Problem) -> Problem:
    """``problem`` with A untransposed and B transposed: each operand stored otherwise becomes a dense workspace
    of its batch's matrices one after another (M x K for A, N x K for B)."""
    p = problem
    sizes = [d[0] for d in p.dims]
    dims = []
    for i, (size, a_stride, b_stride) in enumerate(p.dims):
        inner = math.prod(sizes[i + 1 :])
        dims.append((size, inner * p.m * p.k if p.trans_a else a_stride, b_stride if p.trans_b else inner * p.n * p.k))
    return Problem(p.m, p.n, p.k, False, True, tuple(dims))


class OperandTranspose:
    """The transpose of one operand of ``problem`` (``name`` "A" or "B") into a new float32 workspace."""

    __slots__ = ("device", "shape", "_launch")

    def __init__(self, device: Device, problem: Problem, name: str) -> None:
        p = problem
        rows, cols = p.k, (p.m if name == "A" else p.n)
        ld = p.lda if name == "A" else p.ldb
        dims = [(1, 0, 0)] * (3 - len(p.dims)) + list(p.dims)
        strides = [d[1] if name == "A" else d[2] for d in dims]
        kernel = get_kernel(("gemm-transpose",), device, lambda: _SOURCE, "netcl_gemm_transpose", _ARG_DTYPES).kernel
        gsize = (-(-cols // _TILE) * _TILE, -(-rows // _TILE) * _ROWS, p.batch)
        scalars = dict(enumerate([rows, cols, ld, dims[1][0], dims[2][0], *strides], start=2))
        self.device = device
        self.shape = (p.batch * rows * cols,)
        self._launch = PreparedLaunch.binding(kernel, gsize, (_TILE, _ROWS, 1), scalars, device.queue)

    def run(self, x: Tensor) -> Tensor:
        out = Tensor.empty(self.shape, float32, self.device)
        self._launch.call(x.data, out.data)
        return out


class TransposedPlan:
    """A product planned on ``k_major(problem)``: ``inner`` (a ``gemm_plan.Plan``) after the transposes of the
    operands stored otherwise (``OperandTranspose``, made here). Runs as ``Plan.run`` does."""

    __slots__ = ("inner", "out_shape", "_a", "_b")

    def __init__(self, device: Device, problem: Problem, inner: Any) -> None:
        self.inner, self.out_shape = inner, inner.out_shape
        self._a = OperandTranspose(device, problem, "A") if problem.trans_a else None
        self._b = None if problem.trans_b else OperandTranspose(device, problem, "B")

    def run(
        self, a: Tensor, b: Tensor, bias: Tensor | None = None, out: Tensor | None = None, extras: Sequence = ()
    ) -> Tensor:
        if self._a is not None:
            a = self._a.run(a)
        if self._b is not None:
            b = self._b.run(b)
        return self.inner.run(a, b, bias, out, extras)
