"""Runtime test fixtures: test_ops_matmul.py tests the GEMM kernel, so there the host-BLAS path that
CPU OpenCL devices otherwise take for float32 matmul is off (test_host_blas.py covers that path)."""

from __future__ import annotations

import pytest

from netcl.runtime.ops import host_blas


@pytest.fixture(autouse=True)
def _gemm_kernel_in_matmul_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.module.__name__.rsplit(".", 1)[-1] == "test_ops_matmul":
        monkeypatch.setenv(host_blas.ENV_VAR, "0")
