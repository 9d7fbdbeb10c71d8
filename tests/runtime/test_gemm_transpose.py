"""Products planned on their K-major problem after operand transposes (``gemm_transpose``), on every device."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime.ops import gemm, gemm_plan
from netcl.runtime.ops.gemm_transpose import OperandTranspose, TransposedPlan, k_major

F32 = np.dtype(np.float32)


def _batched(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape).astype(np.float32)


@pytest.mark.parametrize(("ta", "tb"), list(itertools.product((False, True), (False, True))))
def test_transposed_plan_is_the_product(cl_device, ta, tb):
    """The operands stored M/N-major (A transposed, B untransposed) are copied K-major and the K-major problem's
    plan multiplies them: the product of the original operands (batch dims with their own strides, a broadcast
    B, partial 32 x 32 tiles), within fp32's bound of the float64 product."""
    m, n, k = 37, 45, 70
    a = _batched((2, 3, k, m) if ta else (2, 3, m, k), 0)
    b = _batched((k, n) if not tb else (n, k), 1)  # one B for every matrix of the batch: stride 0
    problem = gemm_plan.Problem(m, n, k, ta, tb, ((2, 3 * m * k, 0), (3, m * k, 0)))
    inner = k_major(problem)
    assert (inner.trans_a, inner.trans_b) == (False, True)
    plan = TransposedPlan(
        cl_device,
        problem,
        gemm_plan.make_plan(cl_device, F32, F32, (2, 3, m, n), inner, cfg=gemm.portable_config(cl_device, inner, F32)),
    )
    got = plan.run(nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)).to_host()
    x = np.swapaxes(a, 2, 3) if ta else a
    expected = x.astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    # fp32 accumulation of k products of |x| <= 1 (test_ops_matmul's bound)
    np.testing.assert_allclose(got, expected, rtol=0, atol=4 * k * float(np.finfo(np.float32).eps))


def test_operand_transpose_copies_exactly(cl_device):
    """Each matrix of the batch, transposed, one after another: exact copies, strides of the source kept."""
    m, n, k = 33, 65, 40
    a = _batched((4, k, m), 2)
    problem = gemm_plan.Problem(m, n, k, True, True, ((4, k * m, 0),))
    got = OperandTranspose(cl_device, problem, "A").run(nc.tensor(a, device=cl_device)).to_host()
    assert np.array_equal(got.reshape(4, m, k), np.swapaxes(a, 1, 2))
    assert k_major(problem).dims == ((4, m * k, 0),)
