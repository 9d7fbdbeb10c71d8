"""Small float32 products on CPU OpenCL devices run one kernel (``gemm_cpu``), no host BLAS call, vs float64
NumPy; bigger ones, two transposed operands and batches keep the host BLAS; a capture records the kernel.

Tolerance: float32 products summed over K terms are within K * eps32 * sum_k |a_ik b_kj| of the exact
result (any summation order), plus 1e-6 relative.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops
from netcl.runtime.graph import capture_graph
from netcl.runtime.ops import gemm_cpu


def _product(device: nc.Device, m: int, n: int, k: int, ta: bool, tb: bool, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (k, m) if ta else (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, k) if tb else (k, n)).astype(np.float32)
    got = ops.matmul(nc.tensor(a, device=device), nc.tensor(b, device=device), transpose_a=ta, transpose_b=tb)
    return got.to_host(), (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)


def _check(got: np.ndarray, a64: np.ndarray, b64: np.ndarray) -> None:
    want = a64 @ b64
    bound = a64.shape[-1] * np.finfo(np.float32).eps * (np.abs(a64) @ np.abs(b64)) + 1e-6 * np.abs(want)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) - bound)


@pytest.mark.parametrize("layout", [(False, False), (True, False), (False, True)], ids=["NN", "TN", "NT"])
@pytest.mark.parametrize("mnk", [(1, 1, 1), (7, 5, 3), (17, 33, 20), (64, 64, 64), (128, 10, 512), (5, 16, 31)])
def test_small_products_run_the_kernel(cpu_cl: nc.Device, host_calls: list, layout, mnk) -> None:
    """Every layout but TT, partial row blocks and column blocks (and K past a multiple of 16 in the dot form)."""
    m, n, k = mnk
    if 2 * m * n * k > (gemm_cpu.DOT_MAX_FLOPS if layout[1] else gemm_cpu.AXPY_MAX_FLOPS):
        pytest.skip("above the form's size")
    _check(*_product(cpu_cl, m, n, k, *layout, seed=m + n + k))
    assert host_calls == []


def test_the_rest_keeps_the_host_blas(cpu_cl: nc.Device, host_calls: list) -> None:
    """Two transposed operands, a batch and a product above the size take the host BLAS."""
    _check(*_product(cpu_cl, 6, 7, 8, True, True, seed=1))
    big = round((gemm_cpu.AXPY_MAX_FLOPS / 2) ** (1 / 3)) + 8
    _check(*_product(cpu_cl, big, big, big, False, False, seed=2))
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, (2, 3, 4)).astype(np.float32), rng.uniform(-1, 1, (2, 4, 5)).astype(np.float32)
    ops.matmul(nc.tensor(a, device=cpu_cl), nc.tensor(b, device=cpu_cl))
    assert [shapes[0] for shapes in host_calls] == [(8, 6), (big, big), (2, 3, 4)]


def test_capture_records_the_kernel(cpu_cl: nc.Device, host_calls: list) -> None:
    """A captured small product replays its kernel on new inputs, with the eager product's bits."""
    rng = np.random.default_rng(4)
    a, b = rng.uniform(-1, 1, (9, 20)).astype(np.float32), rng.uniform(-1, 1, (11, 20)).astype(np.float32)
    x, y = nc.tensor(a, device=cpu_cl), nc.tensor(b, device=cpu_cl)
    graph = capture_graph(cpu_cl.queue, lambda p, q: ops.matmul(p, q, transpose_b=True), x, y)
    assert [launch.name for launch in graph.launches] == ["netcl_cpu_gemm_dot"] and host_calls == []
    a2, b2 = 2 * a, b[::-1].copy()
    x2, y2 = nc.tensor(a2, device=cpu_cl), nc.tensor(b2, device=cpu_cl)
    np.testing.assert_array_equal(graph.execute(x2, y2).to_host(), ops.matmul(x2, y2, transpose_b=True).to_host())
    _check(graph.execute(x2, y2).to_host(), a2.astype(np.float64), b2.T.astype(np.float64))
