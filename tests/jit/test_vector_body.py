"""Fused kernels on CPU OpenCL devices evaluate the body on float vectors (tuning's CPU default),
and fall back to one lane at a time for a primitive written in C the vector twins do not cover.

Values are checked against float64 NumPy; tolerances as in test_jit_compile (a few float32 ulps
per op of an 8-op chain).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.jit import jit_compile, workloads
from netcl.jit.tuning import launch_config


@pytest.fixture
def cpu_cl(cl_device):
    if cl_device.is_gpu:
        pytest.skip("the vector body is the CPU devices' default")
    return cl_device


def test_cpu_default_is_the_vector_body(cpu_cl, monkeypatch) -> None:
    for name in ("NETCL_JIT_VECTOR", "NETCL_JIT_ITEMS", "NETCL_JIT_VECTOR_BODY", "NETCL_JIT_LOCAL"):
        monkeypatch.delenv(name, raising=False)
    config = launch_config(cpu_cl)
    assert config.vector_body and config.vector_width == cpu_cl.vector_width
    width = config.vector_width
    arrays = [np.random.default_rng(k).uniform(-3, 3, 1003).astype(np.float32) for k in range(3)]
    nodes = [ag.tensor(a, requires_grad=True, device=cpu_cl) for a in arrays]
    fused = jit_compile(workloads.chain8)
    forward, backward = fused.source(*nodes)
    for source in (forward, backward):
        assert f"typedef float{width} VF;" in source and "VF v3 = MUL(x0, x1);" in source
        assert f"vstore{width}(" in source and ".s0" not in source
    with ag.Tape() as tape:
        out = fused(*nodes)
    tape.backward(out, grad=ag.tensor(np.ones(1003, np.float32), device=cpu_cl).value)
    want = workloads.chain8_reference(*(a.astype(np.float64) for a in arrays))
    np.testing.assert_allclose(out.to_host(), want, rtol=1e-5, atol=1e-6)
    assert all(np.isfinite(n.grad.to_host()).all() for n in nodes)


def test_c_only_primitive_runs_lane_by_lane(cpu_cl, c_only_step) -> None:
    @jit_compile
    def f(x):
        return c_only_step(x) * 3.0

    x = np.linspace(-2, 2, 40, dtype=np.float32)
    node = ag.tensor(x, device=cpu_cl)
    forward, _ = f.source(node)
    assert "VF " not in forward and ".s0" in forward  # lanes: the C conditional works per float
    np.testing.assert_allclose(f(node).to_host(), np.where(x > 0, 6 * x, 1.5 * x), rtol=1e-6)
