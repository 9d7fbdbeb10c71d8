"""The CPU-engine choice: capability ranking, the measured OpenCL-vs-NumPy decision and its reason,
the on-disk cache of the measurement, and NETCL_DEVICE overriding all of it.

Fake devices stand in for PoCL builds this machine may not have; the measurement is replaced by
fixed numbers, so every assertion is deterministic (no timing is compared in a test).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

import netcl.core as nc
from netcl.core import engine_choice
from netcl.core.engine_choice import Measurement, choose_cpu_engine, compiler_target, cpu_rank, targets_host_isa
from netcl.core.host_pool import host_threads

devices_mod = importlib.import_module("netcl.core.devices")
CPU_TYPE = 2  # cl.device_type.CPU


@pytest.fixture(autouse=True)
def restore_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    saved = (devices_mod._default, devices_mod._default_reason)
    monkeypatch.delenv("NETCL_DEVICE", raising=False)
    monkeypatch.delenv(engine_choice.PROBE_ENV, raising=False)
    devices_mod._default = None
    yield
    devices_mod._default, devices_mod._default_reason = saved


def fake_cpu(spec: str, name: str, version: str = "OpenCL 3.0", driver: str = "3.1", width: int = 8) -> nc.Device:
    cl_device = SimpleNamespace(
        name=name,
        type=CPU_TYPE,
        version=version,
        driver_version=driver,
        preferred_vector_width_float=width,
        platform=SimpleNamespace(name="Portable Computing Language", vendor="The pocl project"),
    )
    device = nc.Device("opencl", spec, cl_device)  # type: ignore[arg-type]
    device.__dict__["build_error"] = None  # a fake builds nothing: say it could
    device.__dict__["vector_width"] = width
    return device


NUMPY = nc.Device("cpu", "cpu")
SYSTEM_POCL = fake_cpu("0:0", "pthread-skylake-avx512-Intel(R) Xeon(R) Processor", width=16)
PIP_POCL = fake_cpu(
    "1:0",
    "pthread-Intel(R) Xeon(R) Processor",
    "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-x86-64",
    "3.0-rc2",
    4,
)


# ---- what the compiler targets ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "version", "target", "native"),
    [
        ("pthread-haswell-AMD EPYC", "OpenCL 3.0 PoCL", "haswell", True),
        ("pthread-skylake-avx512-Intel(R) Xeon(R)", "OpenCL 3.0 PoCL", "skylake-avx512", True),
        ("cpu-znver3-AMD Ryzen", "OpenCL 3.0 PoCL", "znver3", True),
        ("pthread-AMD EPYC", "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver3", "znver3", True),
        ("pthread-X", "OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-skylake-avx512", "skylake-avx512", True),
        (
            "pthread-Intel(R) Xeon(R) Processor",
            "OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-x86-64",
            "x86-64",
            False,
        ),
        (
            "pthread-Intel(R) Xeon(R) Processor",
            "OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-generic",
            "generic",
            False,
        ),
        ("pthread-Intel(R) Xeon(R) Processor", "OpenCL 3.0 PoCL", None, False),
    ],
)
def test_compiler_target_from_name_or_version(name: str, version: str, target: str | None, native: bool) -> None:
    device = fake_cpu("0:0", name, version)
    assert compiler_target(device) == target
    assert targets_host_isa(device) is native


def test_intel_cpu_runtime_targets_the_host() -> None:
    device = fake_cpu("0:0", "Intel(R) Xeon(R) Gold 6248", "OpenCL 3.0 (Build 0)")
    device.cl_device.platform = SimpleNamespace(
        name="Intel(R) CPU Runtime for OpenCL(TM) Applications", vendor="Intel(R) Corporation"
    )
    assert targets_host_isa(device)
    assert compiler_target(NUMPY) is None and not targets_host_isa(NUMPY)


def test_rank_puts_host_isa_first_then_wider_vectors_then_newer_driver() -> None:
    older = fake_cpu("2:0", "pthread-haswell-AMD EPYC", driver="3.0", width=8)
    newer = fake_cpu("3:0", "pthread-haswell-AMD EPYC", driver="5.0", width=8)
    assert sorted([PIP_POCL, older, SYSTEM_POCL, newer], key=cpu_rank) == [SYSTEM_POCL, newer, older, PIP_POCL]


# ---- the measured choice and its reason -------------------------------------------------------------
def test_numpy_backend_wins_when_it_measures_faster() -> None:
    calls = []

    def measure(device: nc.Device) -> Measurement:
        calls.append(device)
        return Measurement(opencl_ms=40.0, numpy_ms=5.0)

    chosen, reason = choose_cpu_engine([PIP_POCL], NUMPY, measure)
    assert chosen is NUMPY and calls == [PIP_POCL]
    assert reason == (
        "no OpenCL GPU; the NumPy backend beat the best CPU OpenCL device 1:0 'pthread-Intel(R) Xeon(R) Processor': "
        f"generic compiler target (x86-64): fused chain8 probe ({engine_choice.PROBE_ELEMENTS:,} elements): "
        f"OpenCL 40.00 ms, NumPy backend fused path 5.00 ms on {host_threads()} thread(s) (measured now); "
        "NETCL_DEVICE=1:0 picks that device anyway"
    )


def test_host_isa_device_is_measured_first_and_wins_when_faster() -> None:
    measured = []

    def measure(device: nc.Device) -> Measurement:
        measured.append(device)
        return Measurement(opencl_ms=3.0, numpy_ms=5.0, cached=True)

    chosen, reason = choose_cpu_engine([PIP_POCL, SYSTEM_POCL], NUMPY, measure)
    assert chosen is SYSTEM_POCL and measured == [SYSTEM_POCL]  # only the best-ranked one is measured
    assert reason.startswith(
        "no OpenCL GPU; best CPU OpenCL device 0:0 'pthread-skylake-avx512-Intel(R) Xeon(R) Processor': compiler "
        "targets skylake-avx512; ranked before 1:0 'pthread-Intel(R) Xeon(R) Processor' (generic compiler target "
        "(x86-64)); it beat the NumPy backend: fused chain8 probe"
    )
    assert reason.endswith("(cached measurement)")


def test_a_failing_probe_falls_back_to_numpy() -> None:
    def measure(device: nc.Device) -> Measurement:
        raise RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE\nlog ...")

    chosen, reason = choose_cpu_engine([SYSTEM_POCL], NUMPY, measure)
    assert chosen is NUMPY
    assert reason.endswith("(RuntimeError: clBuildProgram failed: BUILD_PROGRAM_FAILURE); NumPy backend")


def test_no_measurement_and_no_opencl() -> None:
    chosen, reason = choose_cpu_engine([PIP_POCL, SYSTEM_POCL], NUMPY, None)
    assert chosen is SYSTEM_POCL and reason.endswith("(not measured: NETCL_ENGINE_PROBE=0)")
    assert choose_cpu_engine([], NUMPY, None) == (NUMPY, "no OpenCL device found; NumPy backend")


def test_auto_selection_uses_the_measurement_and_env_overrides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = [PIP_POCL, SYSTEM_POCL, NUMPY]
    monkeypatch.setattr(devices_mod, "_registry", registry)
    monkeypatch.setattr(engine_choice, "cached_measure", lambda device: Measurement(9.0, 2.0))
    assert nc.get_device() is NUMPY
    assert nc.default_reason().startswith("no OpenCL GPU; the NumPy backend beat the best CPU OpenCL device 0:0")

    monkeypatch.setattr(engine_choice, "cached_measure", lambda device: Measurement(1.0, 2.0))
    assert nc.set_device(None) is SYSTEM_POCL
    assert "it beat the NumPy backend" in nc.default_reason()

    for spec, expected in (("1:0", PIP_POCL), ("cpu", NUMPY), ("opencl", SYSTEM_POCL)):
        monkeypatch.setenv("NETCL_DEVICE", spec)
        assert nc.set_device(None) is expected
        assert nc.default_reason().startswith(f"NETCL_DEVICE={spec!r} (")

    monkeypatch.delenv("NETCL_DEVICE")
    monkeypatch.setenv(engine_choice.PROBE_ENV, "0")
    monkeypatch.setattr(engine_choice, "cached_measure", lambda device: pytest.fail("measured with the probe off"))
    assert nc.set_device(None) is SYSTEM_POCL


# ---- the disk cache of the measurement ----------------------------------------------------------------
def test_measurement_is_cached_per_device_and_driver(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    runs = []

    def probe(device: nc.Device) -> Measurement:
        runs.append(device.spec)
        return Measurement(7.5, 2.5)

    monkeypatch.setattr(engine_choice, "measure_probe", probe)
    first = engine_choice.cached_measure(SYSTEM_POCL)
    again = engine_choice.cached_measure(SYSTEM_POCL)
    assert (first.opencl_ms, first.numpy_ms, first.cached) == (7.5, 2.5, False)
    assert (again.opencl_ms, again.numpy_ms, again.cached) == (7.5, 2.5, True)
    assert runs == ["0:0"] and (tmp_path / engine_choice.CACHE_NAME).is_file()
    upgraded = fake_cpu("0:0", SYSTEM_POCL.name, driver="9.9", width=16)  # a new driver is measured again
    assert not engine_choice.cached_measure(upgraded).cached and runs == ["0:0", "0:0"]
    (tmp_path / engine_choice.CACHE_NAME).write_text("not json")  # a corrupt cache is measured over
    assert not engine_choice.cached_measure(SYSTEM_POCL).cached


def test_real_probe_runs_on_an_opencl_cpu(cl_device: nc.Device) -> None:
    """The probe kernel builds and both engines report a positive time (no comparison of the two)."""
    if cl_device.is_gpu:
        pytest.skip("the probe is for CPU OpenCL devices")
    result = engine_choice.measure_probe(cl_device, n=4099, repeats=1)
    assert result.opencl_ms > 0 and result.numpy_ms > 0
