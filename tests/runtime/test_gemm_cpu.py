"""float32 products on CPU OpenCL devices run one kernel (``gemm_cpu``), no host BLAS call, vs float64 NumPy: under
the "small" rule only small 2-D ones (bigger ones, two transposed operands and batches keep the host BLAS), under
"all" (and "auto" on a device of 16-wide float vectors) every product but two transposed operands and partly
broadcast batches, batched too; a capture records the kernel.

Tolerance: float32 products summed over K terms are within K * eps32 * sum_k |a_ik b_kj| of the exact
result (any summation order), plus 1e-6 relative.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops
from netcl.runtime.graph import capture_graph
from netcl.runtime.ops import gemm_cpu, linalg
from netcl.runtime.ops.call_plans import clear_plans, plan_cache_info


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


def _batched(device: nc.Device, a_shape: tuple, b_shape: tuple, tb: bool, seed: int) -> None:
    """``a @ b`` (b's last two axes swapped where ``tb``) against float64, broadcasting NumPy's way."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, a_shape).astype(np.float32)
    b = rng.uniform(-1, 1, b_shape).astype(np.float32)
    got = ops.matmul(nc.tensor(a, device=device), nc.tensor(b, device=device), transpose_b=tb).to_host()
    b64 = np.swapaxes(b, -1, -2) if tb else b
    _check(got, a.astype(np.float64), b64.astype(np.float64))


@pytest.mark.parametrize("layout", [(False, False), (True, False), (False, True)], ids=["NN", "TN", "NT"])
@pytest.mark.parametrize("mnk", [(1, 1, 1), (8, 32, 5), (9, 33, 17), (64, 64, 64), (70, 100, 130), (3, 300, 2)])
def test_every_product_runs_a_kernel(cpu_cl: nc.Device, host_calls: list, monkeypatch, layout, mnk) -> None:
    """Under "all": whole and partial row and column blocks of the tile form (8 x 32) and of the dot form, any size."""
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    m, n, k = mnk
    _check(*_product(cpu_cl, m, n, k, *layout, seed=m * n + k))
    assert host_calls == []


@pytest.mark.parametrize(
    "a_shape,b_shape,tb",
    [
        ((3, 9, 20), (3, 20, 40), False),  # both batched
        ((1, 32, 9), (6, 1, 9, 64), False),  # a broadcast whole (a convolution's weights against im2col's columns)
        ((4, 2, 17, 5), (5, 33), False),  # b broadcast whole
        ((5, 16, 40), (5, 9, 40), True),  # the dot form, both batched
        ((2, 3, 8, 24), (1, 11, 24), True),  # the dot form, b broadcast whole
    ],
)
def test_batched_products_run_a_kernel(cpu_cl: nc.Device, host_calls: list, monkeypatch, a_shape, b_shape, tb):
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    _batched(cpu_cl, a_shape, b_shape, tb, seed=len(a_shape) + b_shape[-1])
    assert host_calls == []


def test_under_all_two_transposes_and_partial_broadcasts_keep_the_host_blas(cpu_cl, host_calls, monkeypatch) -> None:
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    _check(*_product(cpu_cl, 6, 7, 8, True, True, seed=5))
    _batched(cpu_cl, (2, 1, 5, 6), (1, 3, 6, 7), False, seed=6)  # each batch broadcast in part
    assert [shapes[0] for shapes in host_calls] == [(8, 6), (2, 1, 5, 6)]


def test_long_reductions_over_more_than_the_cache_keep_the_host_blas(cpu_cl, host_calls, monkeypatch) -> None:
    """K >= LONG_K over operands larger than half the device's cache: the host BLAS (the kernel would stream them from
    memory once per block); one column less of b fits and takes the kernel."""
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    k, half = gemm_cpu.LONG_K, cpu_cl.cl_device.global_mem_cache_size // 2
    n = (half // 4 - k) // k + 1  # a (1, K) @ b (K, n): 4 (K + K n) bytes just above half the cache
    if 4 * k * (n + 1) > 96 << 20:
        pytest.skip("this device's cache would need operands of over 96 MiB")
    rng = np.random.default_rng(9)
    a = rng.uniform(-1, 1, (1, k)).astype(np.float32)
    for columns in (n, n - 1):
        b = rng.uniform(-1, 1, (k, columns)).astype(np.float32)
        got = ops.matmul(nc.tensor(a, device=cpu_cl), nc.tensor(b, device=cpu_cl)).to_host()
        _check(got, a.astype(np.float64), b.astype(np.float64))
    assert [shapes[1] for shapes in host_calls] == [(k, n)]


def test_zero_sizes_under_all(cpu_cl: nc.Device, host_calls: list, monkeypatch) -> None:
    """K == 0 sums nothing (zeros); an empty result or batch launches nothing."""
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    zero_k = ops.matmul(nc.Tensor.empty((3, 5, 0), device=cpu_cl), nc.Tensor.empty((3, 0, 40), device=cpu_cl))
    np.testing.assert_array_equal(zero_k.to_host(), np.zeros((3, 5, 40), np.float32))
    empty = ops.matmul(nc.Tensor.empty((0, 5, 6), device=cpu_cl), nc.Tensor.empty((6, 2), device=cpu_cl))
    assert empty.shape == (0, 5, 2) and host_calls == []


@pytest.mark.parametrize("setting,kernel", [("auto", None), ("off", False), ("small", False), ("all", True)])
def test_the_setting_picks_the_path(cpu_cl: nc.Device, host_calls: list, monkeypatch, setting, kernel) -> None:
    """A batched product above the small forms' sizes: a kernel under "all", the host BLAS under "off" and
    "small", and under "auto" a kernel exactly on a device of 16-wide float vectors."""
    monkeypatch.setenv(gemm_cpu.ENV_VAR, setting)
    _batched(cpu_cl, (4, 64, 96), (4, 96, 128), False, seed=7)
    if kernel is None:
        kernel = cpu_cl.cl_device.preferred_vector_width_float >= gemm_cpu.WIDE_FLOATS
    assert (host_calls == []) is kernel


def test_a_bad_setting_is_refused(cpu_cl: nc.Device, monkeypatch) -> None:
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "fast")
    x = nc.tensor(np.ones((4, 4), np.float32), device=cpu_cl)
    with pytest.raises(ValueError, match="NETCL_CPU_GEMM='fast': expected one of auto, all, small, off"):
        ops.matmul(x, x)


def test_capture_records_the_tile_kernel(cpu_cl: nc.Device, host_calls: list, monkeypatch) -> None:
    """A captured batched product replays the tile kernel on new inputs, with the eager product's bits."""
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    rng = np.random.default_rng(8)
    a, b = rng.uniform(-1, 1, (3, 40, 50)).astype(np.float32), rng.uniform(-1, 1, (50, 70)).astype(np.float32)
    graph = capture_graph(cpu_cl.queue, ops.matmul, nc.tensor(a, device=cpu_cl), nc.tensor(b, device=cpu_cl))
    assert [launch.name for launch in graph.launches] == ["netcl_cpu_gemm_tile"] and host_calls == []
    x2, y2 = nc.tensor(-a, device=cpu_cl), nc.tensor(2 * b, device=cpu_cl)
    np.testing.assert_array_equal(graph.execute(x2, y2).to_host(), ops.matmul(x2, y2).to_host())
    _check(graph.execute(x2, y2).to_host(), -a.astype(np.float64), 2 * b.astype(np.float64))


@pytest.mark.parametrize("tb", [False, True], ids=["tile", "dot"])
@pytest.mark.parametrize("mnk", [(8, 32, 5), (19, 45, 33)])
def test_a_bias_or_an_addend_is_added_in_the_store(cpu_cl: nc.Device, host_calls: list, monkeypatch, tb, mnk) -> None:
    """``matmul(bias=)`` and ``matmul(addend=)`` on a product kernel: the bits of the product followed by an add,
    whole and partial blocks."""
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    m, n, k = mnk
    rng = np.random.default_rng(m + k)
    a = nc.tensor(rng.uniform(-1, 1, (m, k)).astype(np.float32), device=cpu_cl)
    b = nc.tensor(rng.uniform(-1, 1, (n, k) if tb else (k, n)).astype(np.float32), device=cpu_cl)
    bias = nc.tensor(rng.uniform(-1, 1, n).astype(np.float32), device=cpu_cl)
    addend = nc.tensor(rng.uniform(-1, 1, (m, n)).astype(np.float32), device=cpu_cl)
    product = ops.matmul(a, b, transpose_b=tb)
    with_bias = ops.matmul(a, b, transpose_b=tb, bias=bias)
    np.testing.assert_array_equal(with_bias.to_host(), ops.add(product, bias).to_host())
    with_addend = ops.matmul(a, b, transpose_b=tb, addend=addend)
    np.testing.assert_array_equal(with_addend.to_host(), ops.add(product, addend).to_host())
    assert host_calls == []


def test_a_batched_addend_is_added_in_the_store(cpu_cl: nc.Device, host_calls: list, monkeypatch) -> None:
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    rng = np.random.default_rng(10)
    a = nc.tensor(rng.uniform(-1, 1, (3, 9, 20)).astype(np.float32), device=cpu_cl)
    b = nc.tensor(rng.uniform(-1, 1, (20, 40)).astype(np.float32), device=cpu_cl)
    addend = nc.tensor(rng.uniform(-1, 1, (3, 9, 40)).astype(np.float32), device=cpu_cl)
    got = ops.matmul(a, b, addend=addend).to_host()
    np.testing.assert_array_equal(got, ops.add(ops.matmul(a, b), addend).to_host())
    assert host_calls == []


def test_a_convolution_bias_is_added_in_the_product_store(cpu_cl: nc.Device, monkeypatch, launch_counter) -> None:
    """A convolution on im2col + a product kernel (a short reduction: 1 channel, 3 x 3) adds its per-channel bias
    in the product's store: the bits of the unbiased convolution plus the bias, and float64's values."""
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    rng = np.random.default_rng(11)
    x64, w64, b64 = rng.standard_normal((5, 1, 7, 6)), rng.standard_normal((12, 1, 3, 3)), rng.standard_normal(12)
    x, w, b = (nc.tensor(v.astype(np.float32), device=cpu_cl) for v in (x64, w64, b64))
    with launch_counter(cpu_cl.queue) as launches:
        got = ops.conv2d(x, w, b, 1, 1)
    assert "netcl_cpu_gemm_tile" in launches.names and "netcl_ew" not in launches.names
    unbiased = ops.conv2d(x, w, None, 1, 1)
    np.testing.assert_array_equal(got.to_host(), ops.add(unbiased, b.reshape(1, 12, 1, 1)).to_host())
    padded = np.pad(x64, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # (5, 1, 7, 6, 3, 3)
    exact = np.einsum("nchwij,ocij->nohw", windows, w64) + b64.reshape(1, 12, 1, 1)
    np.testing.assert_allclose(got.to_host(), exact, rtol=1e-5, atol=1e-5)  # 9-term sums of float32


def test_a_signature_is_planned_once_and_each_setting_again(cpu_cl: nc.Device, host_calls: list, monkeypatch) -> None:
    """``matmul`` on a CPU device decides a signature's path once (``plan_cache_info``'s "matmul_cpu" counts the
    decisions): a repeated call, with a bias or an addend too, takes the remembered kernel launch with the bits of
    the first call, on new operands of the same shapes and inside a capture; another setting of ``NETCL_CPU_GEMM``
    decides again."""
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "all")
    clear_plans()
    rng = np.random.default_rng(12)

    def operands() -> tuple:
        shapes = ((9, 20), (20, 7), (7,), (9, 7))
        return tuple(nc.tensor(rng.uniform(-1, 1, s).astype(np.float32), device=cpu_cl) for s in shapes)

    a, b, bias, addend = operands()
    firsts = [
        ops.matmul(a, b).to_host(),
        ops.matmul(a, b, bias=bias).to_host(),
        ops.matmul(a, b, addend=addend).to_host(),
    ]
    decided = plan_cache_info()["matmul_cpu"][1]
    again = [
        ops.matmul(a, b).to_host(),
        ops.matmul(a, b, bias=bias).to_host(),
        ops.matmul(a, b, addend=addend).to_host(),
        linalg.product(a, b).to_host(),  # the plain product's own lookup of the kept plan
    ]
    assert plan_cache_info()["matmul_cpu"][1] == decided and host_calls == []
    firsts.append(firsts[0])
    for first, second in zip(firsts, again, strict=True):
        np.testing.assert_array_equal(second, first)
    a2, b2, _, _ = operands()
    _check(ops.matmul(a2, b2).to_host(), a2.to_host().astype(np.float64), b2.to_host().astype(np.float64))
    graph = capture_graph(cpu_cl.queue, ops.matmul, a, b)  # a planned signature inside a capture: its launch recorded
    assert [launch.name for launch in graph.launches] == ["netcl_cpu_gemm_tile"]
    np.testing.assert_array_equal(graph.execute(a2, b2).to_host(), ops.matmul(a2, b2).to_host())
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "off")
    np.testing.assert_allclose(ops.matmul(a, b).to_host(), firsts[0], rtol=1e-6, atol=1e-6)
    assert host_calls == [((9, 20), (20, 7))] and plan_cache_info()["matmul_cpu"][1] == decided + 1
