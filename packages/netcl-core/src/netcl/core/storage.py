"""Where a Tensor's data lives: one ``Storage`` per backend, chosen once per ``Device`` (``Device.storage``).

``Tensor`` keeps no backend branches: it asks its device's storage to allocate, upload, zero, read,
view and copy. ``OPENCL`` keeps data in ``cl.Buffer`` objects (allocated through ``device.allocator``,
which ``netcl.runtime`` replaces by a caching pool) and moves bytes with queue commands that the
profiler sees; ``NUMPY`` (the NumPy backend) keeps C-contiguous ``np.ndarray`` objects on the host.
The device and the tensors are read through the ``StorageDevice`` and ``StoredTensor`` Protocols, so
this module (which ``devices`` imports) does not import ``devices`` or ``tensor`` back.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

import numpy as np
import pyopencl as cl

from netcl.core.profile_hooks import ACTIVE as _PROFILERS
from netcl.core.profile_hooks import MEMCPY, MEMSET, now, report
from netcl.core.read_checks import CHECKS as _READ_CHECKS


class StorageDevice(Protocol):
    """What a storage reads of a ``netcl.core.Device``."""

    name: str
    queue: Any
    allocator: Any

    @property
    def error_word(self) -> Any: ...

    @property
    def max_alloc_size(self) -> int: ...

    @property
    def global_mem_size(self) -> int: ...


class StoredTensor(Protocol):
    """What a storage reads of a ``netcl.core.Tensor``."""

    data: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    device: Any

    @property
    def nbytes(self) -> int: ...

    @property
    def queue(self) -> Any: ...


def check_allocation(device: StorageDevice, nbytes: int) -> None:
    """Raise ``MemoryError`` naming the bytes asked for when ``device`` cannot hold them."""
    limit = min(device.max_alloc_size, device.global_mem_size)
    if nbytes > limit:
        raise MemoryError(
            f"cannot allocate {nbytes} bytes on {device.name!r}: the device allows at most {limit} bytes "
            f"in one buffer (global memory {device.global_mem_size} bytes)"
        )


class Storage:
    """The memory operations of one backend; ``Tensor`` calls them through ``tensor.device.storage``."""

    #: whether ``view`` returns its ``data`` argument itself (a reshape then skips the call)
    view_is_data = False

    def allocate(self, device: StorageDevice, dims: tuple[int, ...], dtype: np.dtype, nbytes: int) -> Any:
        """Uninitialized data for a tensor of ``dims`` and ``dtype`` (``nbytes`` bytes) on ``device``."""
        raise NotImplementedError

    def from_host(self, cls: Any, host: np.ndarray, dtype: np.dtype, device: StorageDevice) -> Any:
        """A new ``cls`` on ``device`` holding a copy of ``host`` (C-contiguous, of ``dtype``)."""
        raise NotImplementedError

    def zero(self, tensor: StoredTensor) -> None:
        """Set every byte of ``tensor`` to zero."""
        raise NotImplementedError

    def to_host(self, tensor: StoredTensor) -> np.ndarray:
        """A NumPy copy of ``tensor``'s contents (waiting for pending device work)."""
        raise NotImplementedError

    def view(self, data: Any, dims: tuple[int, ...]) -> Any:
        """``data`` as the data of a view of shape ``dims`` (same element count, shared memory)."""
        raise NotImplementedError

    def copy(self, tensor: StoredTensor, cls: Any) -> Any:
        """A new ``cls`` with its own data and ``tensor``'s contents."""
        raise NotImplementedError

    def host_array(self, tensor: StoredTensor) -> np.ndarray | None:
        """``tensor``'s values as a NumPy array read without a copy or a device wait, where the data is
        host memory; None where reading them needs a device read (``to_host``)."""
        raise NotImplementedError

    def region(self, data: Any) -> Hashable:
        """A key of the memory ``data`` is: equal for views of the same elements (reshapes), different for
        distinct blocks of one buffer."""
        raise NotImplementedError


class NumPyStorage(Storage):
    """The NumPy backend: data is a C-contiguous ``np.ndarray`` of the tensor's shape and dtype."""

    def allocate(self, device: StorageDevice, dims: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
        check_allocation(device, nbytes)
        return np.empty(dims, dtype=dtype)

    def from_host(self, cls: Any, host: np.ndarray, dtype: np.dtype, device: StorageDevice) -> Any:
        return cls(host.copy(), host.shape, dtype, device)

    def zero(self, tensor: StoredTensor) -> None:
        tensor.data.fill(0)

    def to_host(self, tensor: StoredTensor) -> np.ndarray:
        return np.array(tensor.data, copy=True).reshape(tensor.shape)

    def view(self, data: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
        return data.reshape(dims)

    def copy(self, tensor: StoredTensor, cls: Any) -> Any:
        return cls(tensor.data.copy(), tensor.shape, tensor.dtype, tensor.device)

    def host_array(self, tensor: StoredTensor) -> np.ndarray:
        return np.asarray(tensor.data)

    def region(self, data: np.ndarray) -> Hashable:
        return data.__array_interface__["data"][0], data.nbytes


class OpenCLStorage(Storage):
    """An OpenCL device: data is a ``cl.Buffer`` (at least 4 bytes) from ``device.allocator``; bytes move
    by commands on the device's queue, each reported to active profilers."""

    view_is_data = True

    def allocate(self, device: StorageDevice, dims: tuple[int, ...], dtype: np.dtype, nbytes: int) -> cl.Buffer:
        return device.allocator(device, nbytes)

    def from_host(self, cls: Any, host: np.ndarray, dtype: np.dtype, device: StorageDevice) -> Any:
        tensor = cls.empty(host.shape, dtype, device)
        if host.nbytes:
            start = now() if _PROFILERS else 0
            event = cl.enqueue_copy(device.queue, tensor.data, host, is_blocking=True)
            if start:
                report(MEMCPY, "Memcpy HtoD", device.queue, event, start, args=(tensor,))
        return tensor

    def zero(self, tensor: StoredTensor) -> None:
        if tensor.nbytes:
            start = now() if _PROFILERS else 0
            event = cl.enqueue_fill_buffer(tensor.queue, tensor.data, np.zeros(1, np.uint8), 0, tensor.nbytes)
            if start:
                report(MEMSET, "Memset", tensor.queue, event, start, args=(tensor,))

    def to_host(self, tensor: StoredTensor) -> np.ndarray:
        queue, word = tensor.queue, tensor.device.error_word
        for check in _READ_CHECKS:  # e.g. no read inside a capture (netcl.runtime.recording)
            check(queue)
        out = np.empty(tensor.shape, dtype=tensor.dtype)
        pending = word.enqueue_read(queue)
        if out.nbytes:
            start = now() if _PROFILERS else 0
            event = cl.enqueue_copy(queue, out, tensor.data, is_blocking=True)
            if start:
                report(MEMCPY, "Memcpy DtoH", queue, event, start, args=(tensor,))
        elif pending is not None:
            queue.finish()
        word.raise_if_set(pending, queue)
        return out

    def view(self, data: cl.Buffer, dims: tuple[int, ...]) -> cl.Buffer:
        return data

    def copy(self, tensor: StoredTensor, cls: Any) -> Any:
        out = cls.empty(tensor.shape, tensor.dtype, tensor.device)
        if tensor.nbytes:
            start = now() if _PROFILERS else 0
            event = cl.enqueue_copy(tensor.queue, out.data, tensor.data, byte_count=tensor.nbytes)
            if start:
                report(MEMCPY, "Memcpy DtoD", tensor.queue, event, start, args=(tensor,))
        return out

    def region(self, data: cl.Buffer) -> Hashable:
        return data.int_ptr  # a view shares its buffer; a block is a sub-buffer of its own

    def host_array(self, tensor: StoredTensor) -> None:
        return None


#: The storage of every NumPy-backend device and of every OpenCL device.
NUMPY = NumPyStorage()
OPENCL = OpenCLStorage()

__all__ = ["NUMPY", "OPENCL", "NumPyStorage", "OpenCLStorage", "Storage", "check_allocation"]
