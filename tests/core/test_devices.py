"""Device listing, default selection, NETCL_DEVICE, set_device and the device report."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.core import engine_choice

# ``netcl.core.devices`` the attribute is the function; the module holds the process default.
devices_mod = importlib.import_module("netcl.core.devices")


@pytest.fixture(autouse=True)
def restore_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test here starts from automatic selection and leaves the process default as it was.

    The CPU-engine measurement is off (``NETCL_ENGINE_PROBE=0``) unless a test fakes it, so the
    choice does not depend on timing; tests/core/test_engine_choice.py covers the measured choice.
    """
    saved = (devices_mod._default, devices_mod._default_reason)
    monkeypatch.delenv("NETCL_DEVICE", raising=False)
    monkeypatch.setenv(engine_choice.PROBE_ENV, "0")
    devices_mod._default = None
    yield
    devices_mod._default, devices_mod._default_reason = saved


def _expected_auto() -> nc.Device:
    """GPUs first, then the best-ranked CPU OpenCL device (no measurement), then NumPy."""
    opencl = [d for d in nc.devices() if d.kind == "opencl"]
    gpus = [d for d in opencl if d.is_gpu]
    usable = [d for d in opencl if d.build_error is None]
    return (gpus or sorted(usable, key=engine_choice.cpu_rank) or [nc.devices()[-1]])[0]


def _fake_registry(*types: int, build_errors: dict[int, str] | None = None) -> list[nc.Device]:
    """Fake OpenCL devices of the given ``cl.device_type``s, then the NumPy backend.

    ``build_errors`` maps a device index to the reason it cannot build programs (default: all can).
    """
    found = []
    for index, dev_type in enumerate(types):
        fake = SimpleNamespace(
            name=f"Fake {cl.device_type.to_string(dev_type)} {index}",
            type=dev_type,
            version="OpenCL 3.0",
            driver_version="1.0",
            platform=SimpleNamespace(name="Fake", vendor="Fake"),
        )
        device = nc.Device("opencl", f"{index}:0", fake)  # type: ignore[arg-type]
        device.__dict__["build_error"] = (build_errors or {}).get(index)  # a fake cannot build anything
        device.__dict__["vector_width"] = 8  # nor run a child process's vector-width check
        found.append(device)
    return [*found, nc.Device("cpu", "cpu")]


# ---- listing ---------------------------------------------------------------------------------
def test_devices_lists_every_opencl_device_then_cpu() -> None:
    listed = nc.devices()
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    expected = [(p, d) for p, platform in enumerate(platforms) for d in range(len(platform.get_devices()))]
    assert [d.spec for d in listed[:-1]] == [f"{p}:{d}" for p, d in expected]
    assert all(d.kind == "opencl" and d.is_opencl for d in listed[:-1])
    assert listed[-1].kind == "cpu" and listed[-1].spec == "cpu" and listed[-1].name == "NumPy"
    assert listed[-1].context is None and listed[-1].queue is None and listed[-1].cl_device is None


def test_devices_is_a_stable_registry() -> None:
    first, second = nc.devices(), nc.devices()
    assert first == second and all(a is b for a, b in zip(first, second, strict=True))
    second.pop()  # a copy: mutating it does not touch the registry
    assert len(nc.devices()) == len(first)


def test_device_repr_is_readable(device: nc.Device) -> None:
    text = repr(device)
    if device.kind == "cpu":
        assert text == "<Device cpu: NumPy backend>"
    else:
        assert text.startswith(f"<Device {device.spec}: {device.name} (")
        assert device.platform_name in text


def test_opencl_device_has_profiling_in_order_queue(cl_device: nc.Device) -> None:
    queue = cl_device.queue
    assert queue is cl_device.queue  # one default queue per device
    assert queue.context == cl_device.context and queue.device == cl_device.cl_device
    assert queue.properties & cl.command_queue_properties.PROFILING_ENABLE
    assert not queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    assert cl_device.context.devices == [cl_device.cl_device]
    assert cl_device.global_mem_size > 0 and 0 < cl_device.max_alloc_size <= cl_device.global_mem_size
    assert "cl_khr_fp64" in cl_device.extensions or not cl_device.supports(nc.float64)


# ---- default selection -----------------------------------------------------------------------
def test_default_follows_selection_order() -> None:
    device = nc.get_device()
    assert device is _expected_auto()
    assert nc.get_device() is device
    reason = nc.default_reason()
    if device.is_gpu:
        assert reason == f"first OpenCL GPU ({device.name!r})"
    elif device.kind == "opencl":
        assert reason.startswith(f"no OpenCL GPU; best CPU OpenCL device {device.spec} {device.name!r}: ")
        assert "(not measured: NETCL_ENGINE_PROBE=0)" in reason
    elif nc.devices()[:-1]:
        assert reason.startswith("no OpenCL device here builds programs (") and reason.endswith("; NumPy backend")
    else:
        assert reason == "no OpenCL device found; NumPy backend"


def test_selection_order_prefers_gpu_then_other_opencl_then_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = _fake_registry(cl.device_type.CPU, cl.device_type.ACCELERATOR, cl.device_type.GPU)
    monkeypatch.setattr(devices_mod, "_registry", registry)
    assert nc.get_device() is registry[2]
    assert nc.default_reason() == f"first OpenCL GPU ({registry[2].name!r})"
    assert nc.get_device("opencl") is registry[2]  # "opencl" also takes GPUs first
    assert nc.get_device("gpu") is registry[2]
    assert nc.get_device("1:0") is registry[1]
    assert nc.get_device("cpu") is registry[3]

    registry = _fake_registry(cl.device_type.CPU, cl.device_type.ACCELERATOR)
    monkeypatch.setattr(devices_mod, "_registry", registry)
    assert nc.set_device(None) is registry[0]  # equal rank (target unknown): the first one
    assert nc.default_reason() == (
        f"no OpenCL GPU; best CPU OpenCL device 0:0 {registry[0].name!r}: compiler target unknown; ranked before "
        f"1:0 {registry[1].name!r} (compiler target unknown) (not measured: NETCL_ENGINE_PROBE=0)"
    )

    registry = _fake_registry()
    monkeypatch.setattr(devices_mod, "_registry", registry)
    assert nc.set_device(None) is registry[0] and registry[0].kind == "cpu"
    assert nc.default_reason() == "no OpenCL device found; NumPy backend"
    with pytest.raises(nc.DeviceError, match=r"device spec 'opencl': no OpenCL device found; available: cpu \(NumPy\)"):
        nc.get_device("opencl")


def test_cpu_device_that_cannot_build_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    why = "error: unknown target CPU 'generic'"  # the pip PoCL's LLVM 14 on AMD Zen 5
    registry = _fake_registry(cl.device_type.CPU, cl.device_type.CPU, build_errors={0: why})
    monkeypatch.setattr(devices_mod, "_registry", registry)
    assert nc.get_device() is registry[1]
    assert nc.default_reason().endswith(f"(not considered: 0:0 {registry[0].name!r} cannot build programs ({why}))")
    assert nc.get_device("opencl") is registry[1]
    assert nc.get_device("0:0") is registry[0]  # named explicitly: the user's choice

    registry = _fake_registry(cl.device_type.CPU, build_errors={0: why})
    monkeypatch.setattr(devices_mod, "_registry", registry)
    assert nc.set_device(None) is registry[1] and registry[1].kind == "cpu"
    assert nc.default_reason() == (
        f"no OpenCL device here builds programs (0:0 {registry[0].name!r} cannot build programs ({why})); NumPy backend"
    )
    with pytest.raises(nc.DeviceError, match=r"no usable OpenCL device: 0:0 .* cannot build .*pocl-opencl-icd"):
        nc.get_device("opencl")


def test_build_error_of_real_cpu_devices() -> None:
    """A CPU OpenCL device either builds a kernel and runs it, or says why it cannot build."""
    for device in nc.devices():
        if device.kind != "opencl" or device.is_gpu:
            continue
        if device.build_error is not None:
            assert isinstance(device.build_error, str) and device.build_error
            with pytest.raises(cl.Error):
                cl.Program(device.context, "__kernel void k(__global int* x) { x[0] = 2; }").build()
            continue
        program = cl.Program(device.context, "__kernel void k(__global int* x) { x[0] = 2; }").build()
        buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4)
        program.k(device.queue, (1,), None, buffer)
        out = np.zeros(1, np.int32)
        cl.enqueue_copy(device.queue, out, buffer)
        assert out[0] == 2


# ---- NETCL_DEVICE ----------------------------------------------------------------------------
def test_env_cpu_selects_numpy_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCL_DEVICE", " CPU ")
    device = nc.get_device()
    assert device.kind == "cpu" and device is nc.devices()[-1]
    assert nc.default_reason() == "NETCL_DEVICE='CPU' (spec 'CPU' names the NumPy backend)"


def test_env_opencl_and_index(monkeypatch: pytest.MonkeyPatch, cl_device: nc.Device) -> None:
    monkeypatch.setenv("NETCL_DEVICE", "opencl")
    assert nc.get_device() is cl_device
    assert "NETCL_DEVICE='opencl'" in nc.default_reason()
    last = [d for d in nc.devices() if d.kind == "opencl"][-1]
    monkeypatch.setenv("NETCL_DEVICE", last.spec.replace(":", " : "))
    assert nc.set_device(None) is last
    assert nc.get_device("0:0") is nc.devices()[0]


def test_env_gpu_without_gpu_is_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    if any(d.is_gpu for d in nc.devices()):
        assert nc.get_device("gpu").is_gpu
        monkeypatch.setattr(devices_mod, "_registry", _fake_registry(cl.device_type.CPU))
    monkeypatch.setenv("NETCL_DEVICE", "gpu")
    with pytest.raises(nc.DeviceError, match=r"device spec 'gpu': no OpenCL GPU found; available: .*cpu \(NumPy\)"):
        nc.get_device()


def test_cuda_is_torchs_name_for_the_opencl_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "cuda" / "cuda:<index>" name the OpenCL GPUs in order (torch's spelling, a port's ``.to("cuda")``); an index
    past them, a bad index and a machine without a GPU are refused with the devices listed."""
    monkeypatch.setattr(
        devices_mod, "_registry", _fake_registry(cl.device_type.CPU, cl.device_type.GPU, cl.device_type.GPU)
    )
    gpus = [d for d in nc.devices() if d.is_gpu]
    assert nc.get_device("cuda") is gpus[0] and nc.get_device("CUDA:1") is gpus[1]
    with pytest.raises(nc.DeviceError, match=r"device spec 'cuda:2' \(torch's name for GPU 2\): 2 OpenCL GPU"):
        nc.get_device("cuda:2")
    with pytest.raises(nc.DeviceError, match=r"expected 'cuda' or 'cuda:<index>'"):
        nc.get_device("cuda:x")
    monkeypatch.setattr(devices_mod, "_registry", _fake_registry(cl.device_type.CPU))
    with pytest.raises(nc.DeviceError, match=r"0 OpenCL GPU\(s\) found; available: 0:0"):
        nc.get_device("cuda")


def test_env_garbage_is_device_error_listing_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCL_DEVICE", "tpu7")
    with pytest.raises(nc.DeviceError) as info:
        nc.get_device()
    message = str(info.value)
    assert "unknown device spec 'tpu7'" in message
    assert "the environment variable NETCL_DEVICE='tpu7' is not a usable device" in message  # where it came from
    assert "expected 'gpu', 'opencl', 'cpu', 'cuda[:<index>]' or '<platform>:<device>'" in message
    for device in nc.devices():
        assert f"{device.spec} ({device.name})" in message
    assert devices_mod._default is None  # a failed selection does not stick


# ---- set_device ------------------------------------------------------------------------------
def test_set_device_changes_default_and_none_resets(device: nc.Device) -> None:
    auto = nc.get_device()
    assert nc.set_device(device) is device
    assert nc.get_device() is device
    assert nc.default_reason() == f"set_device({device!r})"
    assert nc.Tensor.zeros(3).device is device  # new tensors land on the new default
    assert nc.set_device("cpu").kind == "cpu"
    assert nc.default_reason() == "set_device('cpu')"
    assert nc.set_device(None) is auto
    assert nc.get_device() is auto


def test_set_device_bad_spec_keeps_default() -> None:
    before = nc.get_device()
    with pytest.raises(nc.DeviceError, match="unknown device spec 'nope'"):
        nc.set_device("nope")
    assert nc.get_device() is before


def test_get_device_passes_devices_through_and_rejects_other_types() -> None:
    cpu = nc.devices()[-1]
    assert nc.get_device(cpu) is cpu
    with pytest.raises(nc.DeviceError, match="device spec must be a str or Device, got int"):
        nc.get_device(0)  # type: ignore[arg-type]


# ---- python -m netcl.core --------------------------------------------------------------------
def _report(env_value: str | None, status: int = 0) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NETCL_DEVICE"}
    if env_value is not None:
        env["NETCL_DEVICE"] = env_value
    done = subprocess.run(
        [sys.executable, "-m", "netcl.core"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def test_report_with_a_bad_env_lists_the_devices_and_says_what_is_wrong() -> None:
    out = _report("tpu7", status=1)  # `hatch run devices` with a typo: a list and a sentence, no traceback
    for device in nc.devices():
        assert device.spec in out
    assert "no default device: the environment variable NETCL_DEVICE='tpu7' is not a usable device" in out
    assert "override with NETCL_DEVICE=" in out


def test_report_names_default_and_why() -> None:
    out = _report(None)
    default = _expected_auto()
    assert f"default: {default.spec} ({default.name}) because {nc.default_reason()}" in out
    for device in nc.devices():
        if device.kind == "opencl":
            assert f"* {device.spec}" in out if device is default else f"  {device.spec}" in out
            assert device.name in out and "memory:" in out and "extensions:" in out
    assert "cpu    NumPy backend" in out
    assert "override with NETCL_DEVICE=" in out


def test_report_names_the_host_blas_kernels() -> None:
    """The report's BLAS line is threadpoolctl's view of this process's BLAS (same environment, same library)."""
    threadpool_info = pytest.importorskip("threadpoolctl").threadpool_info
    prefix = "host BLAS (NumPy's, for products run on the host): "
    (line,) = [text for text in _report(None).splitlines() if text.startswith(prefix)]
    libraries = [lib for lib in threadpool_info() if lib["user_api"] == "blas"]
    expected = [f"{lib['internal_api']} {lib['version']}" for lib in libraries]
    expected += [f"{lib['architecture']} kernels" for lib in libraries if lib.get("architecture")]
    assert all(part in line for part in expected) and (libraries or line.endswith("none found")), line


def test_report_with_env_override() -> None:
    out = _report("cpu")
    assert "* cpu    NumPy backend" in out
    assert "default: cpu (NumPy) because NETCL_DEVICE='cpu'" in out


@pytest.mark.parametrize("given,expected", [(None, "1"), ("0", "0")])
def test_pocl_workers_are_pinned_unless_the_user_says(given: str | None, expected: str) -> None:
    """netcl.core asks PoCL to pin its worker threads (POCL_AFFINITY=1) before any platform loads."""
    env = {k: v for k, v in os.environ.items() if k != "POCL_AFFINITY"}
    if given is not None:
        env["POCL_AFFINITY"] = given
    code = "import os, netcl.core; print(os.environ['POCL_AFFINITY'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected
