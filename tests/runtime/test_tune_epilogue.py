"""A product with a code epilogue searches its tile under its own key, with the epilogue in every trial."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import clear_caches, tune
from netcl.runtime.ops import gemm, gemm_configs
from netcl.runtime.ops.gemm_source import Epilogue, GemmConfig


@pytest.fixture
def searching(cl_device, tmp_path, monkeypatch):
    """Searches on (``NETCL_TUNE=1``), two candidate tiles, a fresh tune store and no kept plans; both
    forgotten again afterwards, whatever the test did."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NETCL_TUNE", "1")
    monkeypatch.setenv("NETCL_HOST_BLAS", "0")
    candidates = (GemmConfig(16, 16, 2, 2, 32, 4, 4, 2), GemmConfig(8, 8, 2, 2, 32, 4, 4, 2))
    monkeypatch.setattr(gemm_configs, "_grid", lambda: candidates)
    tune.clear(cl_device)
    clear_caches()
    yield
    tune.clear(cl_device)
    clear_caches()


def test_a_code_epilogue_searches_with_the_epilogue_under_its_own_key(cl_device, searching, monkeypatch):
    planned: list[Epilogue] = []
    make_plan = gemm_configs.make_plan

    def spy(device, dtype, out_dtype, out_shape, problem, epilogue=gemm_configs.IDENTITY, **kw):
        planned.append(epilogue)
        return make_plan(device, dtype, out_dtype, out_shape, problem, epilogue, **kw)

    monkeypatch.setattr(gemm_configs, "make_plan", spy)
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, (40, 48)).astype(np.float32), rng.uniform(-1, 1, (48, 24)).astype(np.float32)
    col = rng.uniform(-1, 1, 24).astype(np.float32)
    ep = Epilogue(
        "col", code="float ep_out0 = tanh(ep_value) * ep0;\nfloat ep_out1 = ep_value;", operands=("col", "out")
    )
    saved = nc.Tensor.empty((40, 24), np.dtype("f4"), cl_device)
    bias = nc.tensor(col[::-1].copy(), device=cl_device)
    args = [nc.tensor(col, device=cl_device), saved]
    x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
    got = gemm.gemm(x, y, epilogue=ep, bias=bias, epilogue_args=args).to_host()

    assert planned and set(planned) == {ep}  # every trial ran the epilogue
    (key,) = tune.winners(cl_device)
    assert key == tune.shape_class("portable", 40, 24, 48, False, "NN", "<f4") + f"|e{gemm_configs.epilogue_digest(ep)}"
    # 48 products of magnitude <= 1 in float32, tanh within a few ulp: error well below 1e-5
    v = a.astype(np.float64) @ b.astype(np.float64) + col[::-1]
    np.testing.assert_allclose(saved.to_host(), v, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got, np.tanh(v) * col, rtol=0, atol=1e-5)

    planned.clear()
    gemm.gemm(x, y)  # the same shape without an epilogue: its own search, trials without one
    assert set(planned) == {gemm_configs.IDENTITY}
    assert len(tune.winners(cl_device)) == 2


def test_epilogue_digests_are_stable_and_tell_epilogues_apart():
    relu = Epilogue(code="float ep_out0 = fmax(ep_value, 0.0f);")
    assert gemm_configs.epilogue_digest(relu) == gemm_configs.epilogue_digest(
        Epilogue(code="float ep_out0 = fmax(ep_value, 0.0f);")
    )
    assert gemm_configs.epilogue_digest(relu) != gemm_configs.epilogue_digest(
        Epilogue("col", code="float ep_out0 = fmax(ep_value, 0.0f);")
    )
