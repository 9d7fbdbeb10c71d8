"""Shared fixtures: every device-facing test runs on OpenCL (PoCL here) and on the NumPy backend."""

from __future__ import annotations

import pytest

import netcl.core as nc


def _has_opencl() -> bool:
    return any(d.kind == "opencl" for d in nc.devices())


@pytest.fixture(params=["opencl", "cpu"])
def device(request: pytest.FixtureRequest) -> nc.Device:
    """The first OpenCL device (GPU first, else PoCL), then the NumPy backend."""
    if request.param == "opencl" and not _has_opencl():
        pytest.skip("no OpenCL device on this machine")
    return nc.get_device(request.param)


@pytest.fixture
def cl_device() -> nc.Device:
    """An OpenCL device only (tests of OpenCL-specific machinery)."""
    if not _has_opencl():
        pytest.skip("no OpenCL device on this machine")
    return nc.get_device("opencl")
