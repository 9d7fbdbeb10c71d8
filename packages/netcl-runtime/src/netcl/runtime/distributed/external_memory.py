"""OpenCL's side of memory the CUDA driver exports: the import of a descriptor into a device's context
(``cl_khr_external_memory_opaque_fd``, which NVIDIA's OpenCL offers; ``clCreateBufferWithProperties``,
which pyopencl does not wrap, through ctypes). Used by the device-direct (NCCL) and the peer all-reduce.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import pyopencl as cl

from netcl.core import Device

EXTENSION = "cl_khr_external_memory_opaque_fd"
_EXTERNAL_MEMORY_OPAQUE_FD = 0x2060  # CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR
_DEVICE_HANDLE_LIST, _DEVICE_HANDLE_LIST_END = 0x2051, 0  # CL_MEM_DEVICE_HANDLE_LIST(_END)_KHR


@functools.cache
def _create_buffer_with_properties() -> Any:
    """OpenCL 3.0's ``clCreateBufferWithProperties`` (pyopencl does not wrap it), looked up once."""
    create = ctypes.CDLL("libOpenCL.so.1").clCreateBufferWithProperties
    create.restype = ctypes.c_void_p
    create.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.c_uint64,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_int32),
    ]
    return create


def import_memory(device: Device, fd: int, nbytes: int) -> cl.Buffer:
    """``nbytes`` of memory exported as descriptor ``fd`` (by this process or another, for this GPU or a peer
    GPU of the host), imported into ``device``'s context. The import owns ``fd`` once this returns (as in
    Vulkan); on an error the caller still does."""
    create = _create_buffer_with_properties()
    values = [
        _EXTERNAL_MEMORY_OPAQUE_FD,
        fd,
        _DEVICE_HANDLE_LIST,
        device.cl_device.int_ptr,
        _DEVICE_HANDLE_LIST_END,
        0,
    ]
    properties = (ctypes.c_uint64 * len(values))(*values)
    status = ctypes.c_int32()
    handle = create(device.context.int_ptr, properties, cl.mem_flags.READ_WRITE, nbytes, None, ctypes.byref(status))
    if status.value != 0 or not handle:
        raise cl.Error(f"clCreateBufferWithProperties (import of {nbytes} bytes by descriptor): status {status.value}")
    return cl.Buffer.from_int_ptr(handle, retain=False)
