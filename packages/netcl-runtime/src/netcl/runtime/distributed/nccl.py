"""NCCL through ctypes: a communicator per process group and in-place all-reduces of device memory.

The library is found, in order, at ``NETCL_NCCL_LIBRARY`` (a path), in the ``nvidia-nccl-cu12``
wheel (netcl-runtime's ``nccl`` extra: ``nvidia/nccl/lib/libnccl.so.2``), then by the dynamic
linker's search (``libnccl.so.2``). NCCL needs the CUDA driver only, which NVIDIA's OpenCL brings.

Every call raises ``NcclError`` naming the call and NCCL's error string.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np

ENV = "NETCL_NCCL_LIBRARY"
#: ncclDataType_t of the dtypes netcl all-reduces
DTYPES = {
    np.dtype(np.int32): 2,
    np.dtype(np.int64): 4,
    np.dtype(np.float16): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.float64): 8,
}
#: ncclRedOp_t of netcl's reduce ops ("mean" is ncclAvg, NCCL >= 2.10)
OPS = {"sum": 0, "mean": 4}
_IN_PROGRESS = 7  # ncclInProgress


class NcclError(RuntimeError):
    """NCCL is missing or one of its calls failed."""


class UniqueId(ctypes.Structure):
    """``ncclUniqueId``: rank 0 makes it, every rank passes it to ``Communicator``."""

    _fields_ = [("internal", ctypes.c_char * 128)]


_LIBRARY: ctypes.CDLL | None = None


def _candidates() -> list[str]:
    found = []
    chosen = os.environ.get(ENV, "").strip()
    if chosen:
        return [chosen]
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        found += [str(p) for p in sorted(Path(folder, "lib").glob("libnccl.so*"))]
    return [*found, "libnccl.so.2"]


def library() -> ctypes.CDLL:
    """The NCCL library, loaded once (``NcclError`` naming every place tried where none loads)."""
    global _LIBRARY
    if _LIBRARY is None:
        tried = []
        for candidate in _candidates():
            try:
                lib = ctypes.CDLL(candidate)
            except OSError as exc:
                tried.append(f"{candidate}: {exc}")
                continue
            lib.ncclGetErrorString.restype = ctypes.c_char_p
            _LIBRARY = lib
            break
        else:
            raise NcclError(
                f"NCCL cannot be loaded (set {ENV} or install netcl-runtime[nccl]); tried " + "; ".join(tried)
            )
    return _LIBRARY


def version() -> int:
    """NCCL's version code (e.g. 22703 for 2.27.3)."""
    value = ctypes.c_int()
    _check(library().ncclGetVersion(ctypes.byref(value)), "ncclGetVersion")
    return value.value


def _check(result: int, call: str) -> None:
    if result != 0:
        raise NcclError(f"{call} failed: NCCL error {result} ({library().ncclGetErrorString(result).decode()})")


def unique_id() -> bytes:
    """A new ``ncclUniqueId`` (rank 0 makes it and broadcasts the bytes)."""
    uid = UniqueId()
    _check(library().ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return bytes(ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid)))


class Communicator:
    """One rank of an NCCL communicator over ``size`` ranks (collective: every rank constructs it
    with the same ``uid``, on the thread whose current CUDA context is this rank's device)."""

    def __init__(self, uid: bytes, rank: int, size: int) -> None:
        if len(uid) != ctypes.sizeof(UniqueId):
            raise ValueError(f"an NCCL unique id has {ctypes.sizeof(UniqueId)} bytes, got {len(uid)}")
        handle = ctypes.c_void_p()
        _check(
            library().ncclCommInitRank(ctypes.byref(handle), size, UniqueId.from_buffer_copy(uid), rank),
            "ncclCommInitRank",
        )
        self.handle: Any = handle

    def all_reduce(self, pointer: int, count: int, dtype: np.dtype, op: str, stream: Any) -> None:
        """Enqueue the in-place all-reduce of ``count`` elements at device address ``pointer`` on
        ``stream`` (a ``cuda_driver.Stream`` handle)."""
        code = DTYPES.get(np.dtype(dtype))
        if code is None or op not in OPS:
            raise ValueError(
                f"NCCL all-reduce takes {sorted(map(str, DTYPES))} and ops {sorted(OPS)}; got {dtype}, {op!r}"
            )
        where = ctypes.c_void_p(pointer)
        _check(
            library().ncclAllReduce(where, where, ctypes.c_size_t(count), code, OPS[op], self.handle, stream),
            "ncclAllReduce",
        )

    def async_error(self) -> None:
        """Raise ``NcclError`` if the communicator failed asynchronously (a peer's error, say)."""
        result = ctypes.c_int()
        _check(library().ncclCommGetAsyncError(self.handle, ctypes.byref(result)), "ncclCommGetAsyncError")
        if result.value not in (0, _IN_PROGRESS):
            _check(result.value, "an NCCL collective")

    def abort(self) -> None:
        """Stop every operation in flight and free the communicator (after a peer died)."""
        if self.handle:
            library().ncclCommAbort(self.handle)
            self.handle = None

    def destroy(self) -> None:
        if self.handle:
            library().ncclCommDestroy(self.handle)
            self.handle = None
