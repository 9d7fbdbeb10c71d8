"""Every bad input to netcl.core is a named error whose message says what was wrong and what was expected."""

from __future__ import annotations

import re

import numpy as np
import pytest

import netcl.core as nc
from netcl.core.dtypes import as_dtype, c_type


def test_error_hierarchy() -> None:
    for cls in (nc.DeviceError, nc.ShapeError, nc.DTypeError):
        assert issubclass(cls, nc.NetclError)
    assert issubclass(nc.ShapeError, ValueError) and issubclass(nc.DTypeError, TypeError)


@pytest.mark.parametrize("spec", ["tpu", "9:9", "0:", "opencl:1", ""])
def test_unknown_device_spec(spec: str) -> None:
    with pytest.raises(
        nc.DeviceError, match=rf"unknown device spec '{spec}'; expected 'gpu', 'opencl', 'cpu', 'cuda\[:<index>\]' or"
    ) as info:
        nc.get_device(spec)
    assert "cpu (NumPy)" in str(info.value)  # the message lists what is available


def test_unknown_device_on_tensor_construction() -> None:
    with pytest.raises(nc.DeviceError, match="unknown device spec 'tpu'"):
        nc.Tensor.zeros(3, device="tpu")
    with pytest.raises(nc.DeviceError, match="unknown device spec 'tpu'"):
        nc.tensor([1.0], device="tpu")


def test_shapes_that_cannot_broadcast() -> None:
    with pytest.raises(
        nc.ShapeError, match=r"shapes \(8, 1, 3\), \(2, 4\) cannot broadcast: axis -1 has sizes \[3, 4\]"
    ):
        nc.broadcast_shapes((8, 1, 3), (2, 4))
    with pytest.raises(nc.ShapeError, match=r"input shape \(3, 1\) does not broadcast to output shape \(1, 4\)"):
        nc.broadcast_index_lines((3, 1), (1, 4), "i", "j")


@pytest.mark.parametrize(
    ("dtype", "match"),
    [
        (np.complex64, r"unsupported dtype complex64; expected one of \['bfloat16', 'bool', 'float16', 'float32'"),
        (object, r"unsupported dtype object; expected one of"),
        ("U4", r"unsupported dtype <U4; expected one of"),
        (np.uint16, r"unsupported dtype uint16; expected one of .*'uint8'\]"),
        ("not-a-dtype", r"unknown dtype 'not-a-dtype'; expected one of"),
    ],
)
def test_unsupported_dtype(device: nc.Device, dtype: object, match: str) -> None:
    with pytest.raises(nc.DTypeError, match=match):
        as_dtype(dtype)
    with pytest.raises(nc.DTypeError, match=match):
        nc.Tensor.zeros(2, dtype=dtype, device=device)


def test_unsupported_host_data(device: nc.Device) -> None:
    with pytest.raises(nc.DTypeError, match="unsupported dtype complex128"):
        nc.tensor(np.ones(3, np.complex128), device=device)
    with pytest.raises(nc.DTypeError, match="unsupported dtype object"):
        nc.Tensor.from_host(device, np.array([object()]))
    with pytest.raises(nc.DTypeError, match="unsupported dtype <U1"):
        nc.tensor(["a"], device=device)


def test_c_types() -> None:
    assert [c_type(d) for d in (nc.float32, nc.float16, nc.float64, nc.int32, nc.int64, nc.uint8, nc.bool_)] == [
        "float",
        "half",
        "double",
        "int",
        "long",
        "uchar",
        "uchar",
    ]
    with pytest.raises(nc.DTypeError, match="unsupported dtype int8"):
        c_type(np.int8)


@pytest.mark.parametrize(("dtype", "extension"), [(nc.float64, "cl_khr_fp64")])  # float16: storage-only, below
def test_dtype_the_device_lacks(cl_device: nc.Device, dtype: np.dtype, extension: str) -> None:
    if cl_device.supports(dtype):
        assert extension in cl_device.extensions
        assert nc.Tensor.zeros(2, dtype=dtype, device=cl_device).dtype == dtype
        pytest.skip(f"{cl_device.name} has {extension}")
    match = re.escape(f"dtype {dtype} needs {extension}, which device '{cl_device.name}' lacks")
    with pytest.raises(nc.DTypeError, match=match):
        nc.Tensor.empty(2, dtype=dtype, device=cl_device)
    with pytest.raises(nc.DTypeError, match=match):
        nc.Tensor.from_host(cl_device, np.zeros(2, dtype))
    with pytest.raises(nc.DTypeError, match=match):
        nc.tensor([1.0], dtype=dtype, device=cl_device)


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((2, -1), r"shape \(2, -1\) has negative dimension -1; expected ints >= 0"),
        (-3, r"shape \(-3,\) has negative dimension -3"),
        ((2.5,), r"shape \(2\.5,\) has non-integer dimension 2\.5; expected ints >= 0"),
        ((2, "3"), r"non-integer dimension '3'"),
        ((True, 2), r"non-integer dimension True"),
        ((2, None), r"non-integer dimension None"),
        (None, r"shape \(None,\) has non-integer dimension None"),
        (np.float32(4.0), r"non-integer dimension (np\.float32\()?4\.0"),  # NumPy 2 / 1 reprs
    ],
)
def test_bad_shapes(device: nc.Device, shape: object, match: str) -> None:
    with pytest.raises(nc.ShapeError, match=match):
        nc.Tensor.empty(shape, device=device)  # type: ignore[arg-type]
    with pytest.raises(nc.ShapeError, match=match):
        nc.Tensor.zeros(shape, device=device)  # type: ignore[arg-type]


def test_mixing_devices(cl_device: nc.Device) -> None:
    cpu = nc.get_device("cpu")
    assert nc.same_device(cpu, cpu, cpu) is cpu
    assert nc.same_device(cl_device) is cl_device
    match = re.escape(f"tensors on two devices in one op: {cl_device!r} and {cpu!r}; move one first")
    with pytest.raises(nc.DeviceError, match=match):
        nc.same_device(cl_device, cl_device, cpu)
    a = nc.Tensor.zeros(2, device=cl_device)
    b = nc.Tensor.zeros(2, device=cpu)
    with pytest.raises(nc.DeviceError, match=r"<Device cpu: NumPy backend>"):
        nc.same_device(a.device, b.device)


def test_allocation_larger_than_device(device: nc.Device) -> None:
    elements = device.max_alloc_size // 4 + 1  # one float32 more than one buffer may hold
    nbytes = elements * 4
    message = f"cannot allocate {nbytes} bytes on '{device.name}': the device allows at most"
    with pytest.raises(MemoryError, match=re.escape(message)):
        nc.Tensor.empty((elements,), device=device)
    huge = 2**62
    with pytest.raises(MemoryError, match=rf"cannot allocate {huge * 8} bytes"):
        nc.Tensor.zeros((2**31, 2**31), dtype=nc.int64, device=device)
