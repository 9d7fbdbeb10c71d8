"""Runtime test fixtures: test_ops_matmul.py tests the GEMM kernel, so there the host-BLAS path that
CPU OpenCL devices otherwise take for float32 matmul is off (test_host_blas.py covers that path, and
test_gemm_cpu.py the CPU devices' product kernels); ``cpu_cl`` and ``host_calls`` serve those two (``host_calls``
under the "small" rule of ``gemm_cpu``, so that the host BLAS takes what it takes on every CPU device).
``searching`` and ``two_tiles`` serve the tile-search tests."""

from __future__ import annotations

import pytest

import netcl.core as nc
from netcl.runtime import clear_caches, tune
from netcl.runtime.ops import gemm_configs, gemm_cpu, host_blas
from netcl.runtime.ops.gemm_source import GemmConfig


@pytest.fixture(autouse=True)
def _gemm_kernel_in_matmul_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.module.__name__.rsplit(".", 1)[-1] == "test_ops_matmul":
        monkeypatch.setenv(host_blas.ENV_VAR, "0")


@pytest.fixture
def cpu_cl(cl_device: nc.Device) -> nc.Device:
    """The OpenCL device where it keeps its buffers in host memory (a CPU device), else a skip."""
    if not host_blas.host_memory_device(cl_device):
        pytest.skip("the host-BLAS path and the small-product kernel are for CPU OpenCL devices")
    return cl_device


@pytest.fixture
def host_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Records every host-BLAS matmul (the real one still runs), kernels taking only small 2-D products."""
    calls: list[tuple] = []
    real = host_blas.matmul

    def counting(a, b, out_shape, result, **transposes):
        calls.append((a.shape, b.shape))
        return real(a, b, out_shape, result, **transposes)

    monkeypatch.setattr(host_blas, "matmul", counting)
    monkeypatch.delenv(host_blas.ENV_VAR, raising=False)
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "small")
    return calls


@pytest.fixture
def searching(cl_device, tmp_path, monkeypatch):
    """Searches on (``NETCL_TUNE=1``), a fresh tune store and no kept plans; both forgotten again afterwards,
    whatever the test did."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NETCL_TUNE", "1")
    tune.clear(cl_device)
    clear_caches()
    yield
    tune.clear(cl_device)
    clear_caches()


@pytest.fixture
def two_tiles(searching, monkeypatch) -> tuple[GemmConfig, GemmConfig]:
    """``searching``, with the GEMM kernel for every float32 product (no host BLAS) and two candidate tiles of
    different work-group sizes in place of the search's grid."""
    monkeypatch.setenv(host_blas.ENV_VAR, "0")
    candidates = (GemmConfig(16, 16, 2, 2, 32, 4, 4, 2), GemmConfig(8, 8, 2, 2, 32, 4, 4, 2))
    monkeypatch.setattr(gemm_configs, "_grid", lambda: candidates)
    return candidates
