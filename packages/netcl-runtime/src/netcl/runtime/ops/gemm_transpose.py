"""Products whose kernel reads both operands K-major, of operands stored otherwise: a transpose first.

tf32 and tf32x3 on Hopper's ``wgmma`` multiply tiles that lie K-major in local memory (tf32 ``wgmma`` has no
transpose bits). tf32x3's split transposes the tiles of an A stored K x M (``trans_a``) or a B stored K x N (not
``trans_b``) in the kernel, tf32 of two untransposed operands feeds B^T's fragments from registers
(``MmaConfig.swap``), and tf32 of a transposed A has no wgmma kernel of its own; ``MmaConfig.pre`` asks for the
other way, faster for big products: each such operand first copied, transposed, into a workspace
(``layout.tiled_transpose``, the kernel of ``layout.transpose``'s last two axes), then the
kernel of the K-major problem (``k_major``). The tile search times both, transposes with the product.
"""

from __future__ import annotations

import math
from typing import Any

from netcl.core import Device, Tensor
from netcl.core.dtypes import float32
from netcl.runtime.ops import layout
from netcl.runtime.ops._common import index_type
from netcl.runtime.ops.gemm_plan import Problem


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
    """The transpose of one operand of ``problem`` (``name`` "A" or "B") into a new float32 workspace
    (``layout.tiled_transpose``: each matrix of the batch, at the operand's strides, one after another)."""

    __slots__ = ("device", "shape", "_launch")

    def __init__(self, device: Device, problem: Problem, name: str) -> None:
        p = problem
        rows, cols = p.k, (p.m if name == "A" else p.n)
        ld = p.lda if name == "A" else p.ldb
        dims = [(1, 0, 0)] * (3 - len(p.dims)) + list(p.dims)
        sizes = tuple(d[0] for d in dims)
        strides = tuple(d[1] if name == "A" else d[2] for d in dims)
        extent = rows * ld + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))
        idx = index_type((extent,), (p.batch * rows * cols,))
        self.device = device
        self.shape = (p.batch * rows * cols,)
        launch, arguments = layout.tiled_transpose(device, float32, rows, cols, ld, sizes, strides, idx)
        self._launch = launch.with_trailing(arguments)

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

    def run(self, a: Tensor, b: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """``Plan.run`` of the inner plan (the same further arguments) on the transposed operands."""
        if self._a is not None:
            a = self._a.run(a)
        if self._b is not None:
            b = self._b.run(b)
        return self.inner.run(a, b, *args, **kwargs)

    def new_work(self) -> Tensor | None:
        """The inner plan's split-K workspace (``Plan.new_work``)."""
        return self.inner.new_work()
