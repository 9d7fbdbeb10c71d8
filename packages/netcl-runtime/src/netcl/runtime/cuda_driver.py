"""The few CUDA driver calls netcl needs on NVIDIA's OpenCL, through ctypes (``libcuda.so.1``).

NVIDIA's OpenCL runs on the CUDA driver, so wherever it is installed ``libcuda`` is too: no CUDA
toolkit or Python CUDA package is needed. Used by the device-direct all-reduce: the device that
matches an OpenCL device (by PCI domain, bus and slot), its primary context, streams, and exportable
memory (the virtual memory management API: ``cuMemCreate`` with a POSIX file-descriptor handle,
exported, mapped into this process's address space) that OpenCL imports through
``cl_khr_external_memory_opaque_fd``. Used by the tensor-core GEMM: ``tensor_map``, the 128-byte
descriptor of a tiled copy by Hopper's Tensor Memory Accelerator (``cuTensorMapEncodeTiled``).

Every call raises ``CudaError`` naming the call and the driver's error string.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import pyopencl as cl

from netcl.core import Device

#: CUresult of a stream query whose work has not finished
NOT_READY = 600
_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_NO_FLAGS = ctypes.c_ulonglong(0)
_PCI_BUS, _PCI_SLOT, _PCI_DOMAIN = 33, 34, 50  # CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, _PCI_DEVICE_ID, _PCI_DOMAIN_ID


class CudaError(RuntimeError):
    """A CUDA driver call failed (or the driver is missing)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_LIBRARY: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """``libcuda.so.1``, initialized once (``CudaError`` where it cannot be loaded or initialized)."""
    global _LIBRARY
    if _LIBRARY is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaError(f"the CUDA driver (libcuda.so.1) cannot be loaded: {exc}") from None
        _check(lib, lib.cuInit(0), "cuInit")
        _LIBRARY = lib
    return _LIBRARY


def _check(lib: ctypes.CDLL, result: int, call: str) -> None:
    if result != 0:
        text = ctypes.c_char_p()
        lib.cuGetErrorString(result, ctypes.byref(text))
        raise CudaError(f"{call} failed: CUDA error {result} ({(text.value or b'?').decode()})")


def check(result: int, call: str) -> None:
    """Raise ``CudaError`` for a nonzero ``CUresult`` of ``call``."""
    _check(library(), result, call)


@dataclass(frozen=True)
class CudaDevice:
    """A CUDA device (its ordinal) and its primary context."""

    ordinal: int
    context: int

    def make_current(self) -> None:
        """Make the primary context current on the calling thread (contexts are per thread)."""
        check(library().cuCtxSetCurrent(ctypes.c_void_p(self.context)), "cuCtxSetCurrent")


def nvidia_pci(device: Device) -> tuple[int, int, int]:
    """(domain, bus, slot) of an NVIDIA OpenCL GPU (``cl_nv_device_attribute_query``)."""
    d = device.cl_device
    info = cl.device_info
    return (
        int(d.get_info(info.PCI_DOMAIN_ID_NV)),
        int(d.get_info(info.PCI_BUS_ID_NV)),
        int(d.get_info(info.PCI_SLOT_ID_NV)),
    )


def device_by_pci(domain: int, bus: int, slot: int) -> CudaDevice:
    """The CUDA device at PCI ``domain:bus:slot`` (what NVIDIA's OpenCL reports through
    ``cl_nv_device_attribute_query``), with its primary context retained and current."""
    lib = library()
    count = ctypes.c_int()
    check(lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    for ordinal in range(count.value):
        handle = ctypes.c_int()
        check(lib.cuDeviceGet(ctypes.byref(handle), ordinal), "cuDeviceGet")
        found = []
        for attribute in (_PCI_DOMAIN, _PCI_BUS, _PCI_SLOT):
            value = ctypes.c_int()
            check(lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, handle), "cuDeviceGetAttribute")
            found.append(value.value)
        if tuple(found) == (domain, bus, slot):
            context = ctypes.c_void_p()
            check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle), "cuDevicePrimaryCtxRetain")
            device = CudaDevice(handle.value, int(context.value or 0))
            device.make_current()
            return device
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise CudaError(
        f"no CUDA device at PCI {domain:04x}:{bus:02x}:{slot:02x} among {count.value}"
        + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
    )


#: ``CUtensorMapDataType`` of the element types a tiled copy moves
TENSOR_MAP_TYPES = {"float16": 6, "float32": 7, "bfloat16": 9}
#: ``CUtensorMapSwizzle`` by the swizzle span in bytes
TENSOR_MAP_SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}
_L2_PROMOTE_256 = 3  # CU_TENSOR_MAP_L2_PROMOTION_L2_256B
#: the address a template map is encoded with (the kernel replaces it: ``tensormap.replace``)
_TEMPLATE_ADDRESS = 1 << 20


def tensor_map(
    gpu: CudaDevice, element: str, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...], swizzle: int
) -> bytes:
    """The 128 bytes of a ``CUtensorMap`` for tiled copies of ``box`` elements (innermost first) out of a
    tensor of ``dims`` elements with byte ``strides`` (of every dimension after the first), elements of
    ``element`` ("float16", "float32", "bfloat16"), rows swizzled in spans of ``swizzle`` bytes (0, 32,
    64, 128), elements outside ``dims`` filled with zeros. Its global address is a placeholder: a kernel
    puts its operand's address in (``tensormap.replace``) before it copies. The driver encodes it in a
    context: ``gpu``'s primary context is made current on the calling thread."""
    lib = library()
    gpu.make_current()
    rank = len(dims)
    storage = ctypes.create_string_buffer(128 + 64)  # CUtensorMap is 64-byte aligned
    aligned = (ctypes.addressof(storage) + 63) // 64 * 64
    result = lib.cuTensorMapEncodeTiled(
        ctypes.c_void_p(aligned),
        ctypes.c_int(TENSOR_MAP_TYPES[element]),
        ctypes.c_uint(rank),
        ctypes.c_void_p(_TEMPLATE_ADDRESS),
        (ctypes.c_uint64 * rank)(*dims),
        (ctypes.c_uint64 * max(1, rank - 1))(*strides),
        (ctypes.c_uint32 * rank)(*box),
        (ctypes.c_uint32 * rank)(*([1] * rank)),
        ctypes.c_int(0),  # no interleave
        ctypes.c_int(TENSOR_MAP_SWIZZLES[swizzle]),
        ctypes.c_int(_L2_PROMOTE_256),
        ctypes.c_int(0),  # zeros outside the tensor
    )
    check(result, f"cuTensorMapEncodeTiled(dims {dims}, strides {strides}, box {box}, swizzle {swizzle})")
    return ctypes.string_at(aligned, 128)


class ExportableMemory:
    """``nbytes`` (rounded up to the allocation granularity) of device memory of ``device``,
    mapped at ``pointer`` in this process and exported as a POSIX file descriptor ``fd`` that
    another API (OpenCL) imports (``hand_over_fd``). ``free()`` unmaps and releases it and closes a
    descriptor not handed over."""

    def __init__(self, device: CudaDevice, nbytes: int) -> None:
        lib = library()
        device.make_current()
        prop = _AllocationProp()
        prop.type, prop.requestedHandleTypes = _PINNED, _POSIX_FD
        prop.location = _Location(_ON_DEVICE, device.ordinal)
        granularity = ctypes.c_size_t()
        check(lib.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop), 0), "granularity")
        step = granularity.value
        self.nbytes = max(step, -(-int(nbytes) // step) * step)
        handle = ctypes.c_ulonglong()
        size = ctypes.c_size_t(self.nbytes)
        check(lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), _NO_FLAGS), "cuMemCreate")
        self._handle = handle
        self.pointer = 0
        self.fd = -1
        try:
            fd = ctypes.c_int()
            check(lib.cuMemExportToShareableHandle(ctypes.byref(fd), handle, _POSIX_FD, _NO_FLAGS), "cuMemExport")
            self.fd = fd.value
            pointer = ctypes.c_ulonglong()
            anywhere = ctypes.c_ulonglong(0)
            check(
                lib.cuMemAddressReserve(ctypes.byref(pointer), size, ctypes.c_size_t(0), anywhere, _NO_FLAGS),
                "cuMemAddressReserve",
            )
            self.pointer = pointer.value
            check(lib.cuMemMap(pointer, size, ctypes.c_size_t(0), handle, _NO_FLAGS), "cuMemMap")
            access = _AccessDesc(_Location(_ON_DEVICE, device.ordinal), _READ_WRITE)
            check(lib.cuMemSetAccess(pointer, size, ctypes.byref(access), ctypes.c_size_t(1)), "cuMemSetAccess")
        except CudaError:
            self.free()
            raise

    def hand_over_fd(self) -> int:
        """The descriptor, which the caller now owns (an import that succeeded takes it: OpenCL's
        ``cl_khr_external_memory_opaque_fd``, like Vulkan's, owns an imported descriptor)."""
        fd, self.fd = self.fd, -1
        return fd

    def free(self) -> None:
        """Unmap, release and close (idempotent); whatever imported the memory must be released first."""
        lib = library()
        if self.pointer:
            size = ctypes.c_size_t(self.nbytes)
            lib.cuMemUnmap(ctypes.c_ulonglong(self.pointer), size)
            lib.cuMemAddressFree(ctypes.c_ulonglong(self.pointer), size)
            self.pointer = 0
        if self._handle is not None:
            lib.cuMemRelease(self._handle)
            self._handle = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Stream:
    """A CUDA stream of ``device`` that does not synchronize with the legacy default stream."""

    def __init__(self, device: CudaDevice) -> None:
        device.make_current()
        handle = ctypes.c_void_p()
        check(library().cuStreamCreate(ctypes.byref(handle), 1), "cuStreamCreate")  # CU_STREAM_NON_BLOCKING
        self.handle = handle

    def done(self) -> bool:
        """Whether every command of the stream has finished (``CudaError`` for a failed one)."""
        result = library().cuStreamQuery(self.handle)
        if result == NOT_READY:
            return False
        check(result, "cuStreamQuery")
        return True

    def destroy(self) -> None:
        if self.handle:
            library().cuStreamDestroy_v2(self.handle)
            self.handle = ctypes.c_void_p()
