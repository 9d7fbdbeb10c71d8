"""``netcl.runtime.use_deterministic_algorithms``: tuned choices fixed to their defaults, searches refused."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import netcl.core as nc
import netcl.runtime as rt
from netcl.runtime import determinism, tune


@pytest.fixture
def deterministic():
    """Turn the mode on for one test and off again whatever happens."""
    rt.use_deterministic_algorithms(True)
    yield
    rt.use_deterministic_algorithms(False)


def _select(device, key, calls, force=False):
    return tune.select(device, key, [1, 2, 3], 0, calls.append, lambda c: {"v": c}, lambda d: d["v"], force)


def test_switch_and_arguments():
    assert not rt.are_deterministic_algorithms_enabled()
    rt.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert rt.are_deterministic_algorithms_enabled() and rt.is_deterministic_algorithms_warn_only_enabled()
    finally:
        rt.use_deterministic_algorithms(False, warn_only=True)
    assert not rt.are_deterministic_algorithms_enabled() and not rt.is_deterministic_algorithms_warn_only_enabled()
    with pytest.raises(TypeError, match="mode must be a bool, got int"):
        rt.use_deterministic_algorithms(1)
    with pytest.raises(TypeError, match="warn_only must be a bool, got str"):
        rt.use_deterministic_algorithms(True, warn_only="yes")
    assert not rt.are_deterministic_algorithms_enabled()  # a refused call changes nothing


def test_environment_variable_turns_it_on_at_import():
    code = "import netcl.runtime as rt; print(rt.are_deterministic_algorithms_enabled())"
    env = {**os.environ, determinism.ENV: "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_choices_take_the_default_and_stored_winners_are_ignored(cl_device, tmp_path, monkeypatch, deterministic):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NETCL_TUNE", "1")
    tune.clear(cl_device)
    key = tune.shape_class("det", 100, 60, 33, False, "NN", "<f4")
    tune.remember(cl_device, key, {"v": 3}, 0.1)  # a stored winner the mode must not use
    calls: list[int] = []
    assert _select(cl_device, key, calls) == 0 and calls == []
    rt.use_deterministic_algorithms(False)
    assert _select(cl_device, key, calls) == 3  # off again: the stored winner
    tune.clear(cl_device)


def test_a_forced_search_raises_or_warns(cl_device, tmp_path, monkeypatch, deterministic):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    calls: list[int] = []
    with pytest.raises(RuntimeError, match=r"timed config search for 'forced'.*use_deterministic_algorithms\(True\)"):
        _select(cl_device, "forced", calls, force=True)
    assert calls == []  # refused before any trial ran
    rt.use_deterministic_algorithms(True, warn_only=True)
    with pytest.warns(UserWarning, match="does not have a deterministic implementation"):
        assert _select(cl_device, "forced", calls, force=True) in (1, 2, 3)
    assert set(calls) == {1, 2, 3}
    tune.clear(cl_device)


def test_matmul_under_the_mode_is_the_default_config(cl_device, tmp_path, monkeypatch, deterministic):
    """With tuning forced on, a deterministic matmul searches nothing and equals float64 within fp32 rounding."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NETCL_TUNE", "1")
    monkeypatch.setenv("NETCL_HOST_BLAS", "0")
    searched = []
    monkeypatch.setattr(tune, "search", lambda *args, **kwargs: searched.append(args) or (None, 0.0))
    rng = np.random.default_rng(4)
    a, b = rng.uniform(-1, 1, (37, 29)).astype(np.float32), rng.uniform(-1, 1, (29, 11)).astype(np.float32)
    from netcl.runtime import ops as R

    got = R.matmul(nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)).to_host()
    assert searched == []
    # 29 products of magnitude <= 1 in float32: error well below 1e-5
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=0, atol=1e-5)
