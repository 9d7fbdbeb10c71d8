"""Which attention kernels take a call (``attention.select_variant``): on an NVIDIA GPU the blocked kernels
by default (test_attention_blocked.py) and under ``NETCL_ATTENTION=quad`` the quad kernels, for float32
calls without a mask or dropout and ``E == Ev`` in 16..128 (a multiple of 16); the portable kernels
otherwise or with ``NETCL_ATTENTION=portable``. The kernels' values are checked against
float64 by tests/autograd/test_attention.py, which runs them on an NVIDIA GPU (its float32 unmasked cases)."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime.ops import attention, attention_mma_tf32


def _spec(e: int = 64, ev: int = 64, mask=None, dropout: float = 0.0):
    q = nc.Tensor.empty((2, 4, 8, e), np.float32, "cpu")
    k = nc.Tensor.empty((2, 4, 8, e), np.float32, "cpu")
    v = nc.Tensor.empty((2, 4, 8, ev), np.float32, "cpu")
    return attention.check_attention(q, k, v, mask, dropout)


def test_the_portable_kernels_take_every_call_off_nvidia(cl_device, monkeypatch) -> None:
    if "NVIDIA" in cl_device.platform_name:
        pytest.skip("an NVIDIA device")
    monkeypatch.setenv("NETCL_ATTENTION", "quad")  # the blocked kernels stand aside (test_attention_blocked.py)
    assert attention.select_variant(cl_device, np.dtype(np.float32), _spec()).name == "portable"


def test_nvidia_calls_take_the_quad_kernels_where_they_apply(cl_device, monkeypatch) -> None:
    if not (cl_device.is_gpu and "NVIDIA" in cl_device.platform_name):
        pytest.skip("needs an NVIDIA GPU")
    f32 = np.dtype(np.float32)
    monkeypatch.setattr(attention_mma_tf32, "HIGHEST", None)  # "highest" off the tf32x3 tensor-core kernels
    assert attention.select_variant(cl_device, f32, _spec()).name == "blocked"  # the default (measured faster)
    monkeypatch.setenv("NETCL_ATTENTION", "quad")
    assert attention.select_variant(cl_device, f32, _spec()).name == "nvidia-quad"
    mask = nc.Tensor.empty((8, 8), np.bool_, "cpu")
    for spec, dtype in [
        (_spec(), np.dtype(np.float16)),
        (_spec(ev=32), f32),
        (_spec(e=24, ev=24), f32),
        (_spec(mask=mask), f32),
        (_spec(dropout=0.1), f32),
    ]:
        assert attention.select_variant(cl_device, dtype, spec).name == "portable"
    monkeypatch.setenv("NETCL_ATTENTION", "portable")
    assert attention.select_variant(cl_device, f32, _spec()).name == "portable"
