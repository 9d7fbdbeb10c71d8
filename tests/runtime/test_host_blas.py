"""matmul through the host BLAS on CPU OpenCL devices (zero-copy mapped buffers), vs float64 NumPy;
and inside a capture, where the GEMM kernel is recorded instead so the graph can replay it.

Tolerance: float32 products summed over K terms are within K * eps32 * sum_k |a_ik b_kj| of the
exact result (any summation order); the tests allow that bound plus 1e-6 relative.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops as rops
from netcl.runtime.graph import capture_graph
from netcl.runtime.ops import gemm_cpu, host_blas


@pytest.fixture(autouse=True)
def _host_blas_for_small_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small products take the host BLAS here too, not the small-product kernel (test_gemm_cpu.py)."""
    monkeypatch.setattr(gemm_cpu, "AXPY_MAX_FLOPS", 0)
    monkeypatch.setattr(gemm_cpu, "DOT_MAX_FLOPS", 0)


def _check(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.matmul(a64, b64)
    k = a.shape[-1] if a.ndim else 1
    bound = k * np.finfo(np.float32).eps * np.matmul(np.abs(a64), np.abs(b64)) + 1e-6 * np.abs(want)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) - bound)


CASES = [
    ((7, 5), (5, 3)),  # plain 2-D, odd sizes
    ((130, 67), (67, 129)),  # past the 64-wide GEMM blocks
    ((3, 4, 5), (3, 5, 2)),  # batched
    ((2, 1, 3, 4), (5, 4, 6)),  # broadcast batch dims
    ((4,), (4, 3)),  # 1-D on the left
    ((2, 3, 4), (4,)),  # 1-D on the right
    ((4,), (4,)),  # dot product (0-d result)
]


@pytest.mark.parametrize(("a_shape", "b_shape"), CASES)
def test_host_blas_matches_float64(cpu_cl: nc.Device, host_calls: list, a_shape, b_shape) -> None:
    rng = np.random.default_rng(len(a_shape) * 10 + len(b_shape))
    a = rng.uniform(-1, 1, a_shape).astype(np.float32)
    b = rng.uniform(-1, 1, b_shape).astype(np.float32)
    got = rops.matmul(nc.tensor(a, device=cpu_cl), nc.tensor(b, device=cpu_cl))
    assert host_calls == [(a_shape, b_shape)]
    _check(got.to_host(), a, b)


def test_transposed_operands_and_queued_producers(cpu_cl: nc.Device, host_calls: list) -> None:
    """Operands written by kernels still queued (a transpose, an add) are read after they finish,
    and a kernel queued after the matmul reads its result."""
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (6, 9)).astype(np.float32)
    b = rng.uniform(-1, 1, (6, 4)).astype(np.float32)
    ta, tb = nc.tensor(a, device=cpu_cl), nc.tensor(b, device=cpu_cl)
    at = rops.transpose(ta, (1, 0))  # (9, 6), produced by a kernel
    bb = rops.add(tb, tb)
    product = rops.matmul(at, bb)
    after = rops.add(product, product).to_host()
    assert len(host_calls) == 1
    _check(product.to_host(), a.T.copy(), 2 * b)
    np.testing.assert_array_equal(after, 2 * product.to_host())


def test_empty_and_zero_k(cpu_cl: nc.Device, host_calls: list) -> None:
    zero_k = rops.matmul(nc.Tensor.empty((3, 0), device=cpu_cl), nc.Tensor.empty((0, 4), device=cpu_cl))
    np.testing.assert_array_equal(zero_k.to_host(), np.zeros((3, 4), np.float32))
    empty = rops.matmul(nc.Tensor.empty((0, 5), device=cpu_cl), nc.Tensor.empty((5, 2), device=cpu_cl))
    assert empty.shape == (0, 2)


def test_other_dtypes_and_switch_off_use_the_kernel(cpu_cl: nc.Device, host_calls: list, monkeypatch) -> None:
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = rops.matmul(nc.tensor(a, device=cpu_cl), nc.tensor(a.T.copy(), device=cpu_cl))
    np.testing.assert_array_equal(got.to_host(), (a @ a.T).astype(np.float32))  # exact: small integers
    monkeypatch.setenv(host_blas.ENV_VAR, "0")
    f = a.astype(np.float32)
    np.testing.assert_allclose(
        rops.matmul(nc.tensor(f, device=cpu_cl), nc.tensor(f.T.copy(), device=cpu_cl)).to_host(), f @ f.T
    )
    assert host_calls == []


def test_capture_records_the_host_product_and_replays_it(cpu_cl: nc.Device, host_calls: list) -> None:
    """Under capture the host BLAS product is a graph command: a replay multiplies the new inputs."""
    rng = np.random.default_rng(9)
    a, b = (rng.uniform(-1, 1, (5, 8)).astype(np.float32), rng.uniform(-1, 1, (8, 3)).astype(np.float32))
    ta, tb = nc.tensor(a, device=cpu_cl), nc.tensor(b, device=cpu_cl)
    graph = capture_graph(cpu_cl.queue, lambda x, y: rops.relu(rops.matmul(x, y)), ta, tb)
    assert len(host_calls) == 1 and graph.launches and all(launch.name != "netcl_gemm" for launch in graph.launches)
    assert graph.steps[0].name == "host_matmul"
    np.testing.assert_allclose(graph.outputs.to_host(), np.maximum(a.astype(np.float64) @ b, 0), rtol=1e-5, atol=1e-6)
    a2 = rng.uniform(-1, 1, (5, 8)).astype(np.float32)
    b2 = rng.uniform(-1, 1, (8, 3)).astype(np.float32)
    out = graph.execute(nc.tensor(a2, device=cpu_cl), nc.tensor(b2, device=cpu_cl))
    np.testing.assert_allclose(out.to_host(), np.maximum(a2.astype(np.float64) @ b2, 0), rtol=1e-5, atol=1e-6)
    assert len(host_calls) == 1  # the replay ran the recorded command, not ops.matmul
    tb_t = nc.tensor(b.T.copy(), device=cpu_cl)
    transposed = capture_graph(cpu_cl.queue, lambda x, y: rops.matmul(x, y, transpose_b=True), ta, tb_t)
    np.testing.assert_allclose(transposed.outputs.to_host(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)
