"""Every op declared with ``backend_op`` has a NumPy twin with its exact parameters, and dispatch picks by device."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import netcl.runtime.ops as ops_package
from netcl.core import Tensor, get_device
from netcl.runtime.ops.backend import REGISTRY, backend_op, device_kind


def _import_every_op_module() -> None:
    for info in pkgutil.iter_modules(ops_package.__path__, ops_package.__name__ + "."):
        importlib.import_module(info.name)


_import_every_op_module()


@pytest.mark.parametrize("qualified", sorted(REGISTRY))
def test_twin_has_the_parameters_of_the_opencl_implementation(qualified: str) -> None:
    op = REGISTRY[qualified]
    twin = op.twin()
    opencl_params = [(p.name, p.kind, p.default) for p in inspect.signature(op.opencl).parameters.values()]
    twin_params = [(p.name, p.kind, p.default) for p in inspect.signature(twin).parameters.values()]
    assert twin_params == opencl_params, f"{qualified}: twin {op.twin_module}.{op.name}"


def test_registry_is_not_empty() -> None:
    assert any(name.startswith("netcl.runtime.ops.pool.") for name in REGISTRY)


def test_dispatch_runs_the_twin_on_the_numpy_backend_and_the_kernel_elsewhere(tmp_path, monkeypatch) -> None:
    module = tmp_path / "netcl_twin_probe.py"
    module.write_text("def probe(x, tag):\n    return ('numpy', tag)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[str] = []

    @backend_op("netcl_twin_probe", device_arg="x")
    def probe(x, tag):
        calls.append(tag)
        return ("opencl", tag)

    numpy_tensor = Tensor.from_host("cpu", np.zeros(2, np.float32))
    assert probe(numpy_tensor, "a") == ("numpy", "a")
    assert probe(tag="b", x=numpy_tensor) == ("numpy", "b")
    assert calls == []
    opencl = get_device()
    if opencl.kind == "cpu":
        pytest.skip("no OpenCL device: the default device is the NumPy backend")
    assert probe(Tensor.from_host(opencl, np.zeros(2, np.float32)), "c") == ("opencl", "c")
    assert calls == ["c"]


def test_device_kind_reads_tensors_devices_specs_and_sequences() -> None:
    numpy_tensor = Tensor.from_host("cpu", np.zeros(1, np.float32))
    assert device_kind(numpy_tensor) == "cpu"
    assert device_kind(numpy_tensor.device) == "cpu"
    assert device_kind("cpu") == "cpu"
    assert device_kind([3, numpy_tensor]) == "cpu"
    with pytest.raises(TypeError, match="cannot tell the device"):
        device_kind(object())
