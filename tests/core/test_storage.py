"""Each device's ``storage`` (``netcl.core.storage``): chosen once per Device, and what Tensor asks of it."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import netcl.core as nc
from netcl.core import storage

devices_mod = importlib.import_module("netcl.core.devices")


def test_every_device_has_the_storage_of_its_backend() -> None:
    for device in nc.devices():
        if device.cl_device is None:
            assert device.storage is storage.NUMPY and not device.has_queue and device.queue is None
        else:
            assert device.storage is storage.OPENCL and device.has_queue


def test_tensor_data_is_what_the_storage_allocates(device: nc.Device) -> None:
    t = nc.Tensor.empty((2, 3), nc.float32, device)
    if device.has_queue:
        assert not isinstance(t.data, np.ndarray) and t.data.size >= t.nbytes
    else:
        assert isinstance(t.data, np.ndarray) and t.data.shape == (2, 3) and t.data.dtype == np.float32


def test_host_array_reads_host_memory_without_a_copy_and_nothing_on_a_device(device: nc.Device) -> None:
    values = np.arange(6, dtype=np.int32).reshape(2, 3)
    t = nc.Tensor.from_host(device, values)
    host = device.storage.host_array(t)
    if device.has_queue:
        assert host is None
    else:
        np.testing.assert_array_equal(host, values)
        host[0, 0] = 42  # the same memory: the tensor sees it
        assert t.to_host()[0, 0] == 42


def test_views_share_and_copies_own_their_data(device: nc.Device) -> None:
    t = nc.Tensor.from_host(device, np.arange(6, dtype=np.float32))
    view, copy = t.reshape(2, 3), t.copy()
    assert view.base is t and copy.base is None and type(copy) is nc.Tensor
    nc.Tensor.from_host(device, np.zeros(6, np.float32))  # other traffic on the device
    device.storage.zero(t)
    np.testing.assert_array_equal(view.to_host(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(copy.to_host(), np.arange(6, dtype=np.float32))


def test_check_allocation_names_the_bytes_asked_for_on_both_backends(device: nc.Device) -> None:
    assert devices_mod.check_allocation is storage.check_allocation
    too_many = min(device.max_alloc_size, device.global_mem_size) + 1
    with pytest.raises(MemoryError, match=f"cannot allocate {too_many} bytes"):
        device.storage.allocate(device, (too_many,), np.dtype(np.uint8), too_many)
