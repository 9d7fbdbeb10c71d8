"""Collectives on Tensors: all_reduce (sum/mean), broadcast, all_gather, barrier, object exchange.

All are host-staged through pinned buffers (``staging``), bounded by the group's timeout, and
the same on OpenCL devices and the NumPy backend. Every rank must call the same collectives in
the same order with tensors of the same shape and dtype (``DistributedDataParallel`` checks its
parameters with a handshake; plain collectives do not check).

Inside a graph capture (``CompiledGraph`` / ``fuse_graph`` / ``Graph.capture``) on OpenCL a
collective runs now, blocking, and is recorded as one command of the graph: every replay runs
it again at that point of the step (blocking the host there), on the captured buffers.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import DTypeError, Tensor
from netcl.runtime import capture
from netcl.runtime.distributed.allreduce import AllReduceWork
from netcl.runtime.distributed.group import mpi, wait_requests, world
from netcl.runtime.distributed.staging import POOL
from netcl.runtime.launch import enqueue_copy

REDUCE_OPS = ("sum", "mean")


class CompletedWork:
    """The handle of a collective that already finished (one rank, or a recorded capture)."""

    def __init__(self, outputs: Sequence[Tensor]) -> None:
        self.outputs = list(outputs)
        self.comm_started_at = self.finished_at = None

    def test(self) -> bool:
        return True

    is_completed = test

    def wait(self) -> Sequence[Tensor]:
        return self.outputs


# ---- all-reduce ----------------------------------------------------------------------------------
def all_reduce(tensor: Tensor, op: str = "sum") -> Tensor:
    """Reduce ``tensor`` over all ranks in place (``op`` "sum" or "mean"); returns it."""
    all_reduce_async(tensor, op).wait()
    return tensor


def all_reduce_async(tensor: Tensor, op: str = "sum") -> AllReduceWork | CompletedWork:
    """Start an in-place all-reduce of ``tensor``; the handle's ``wait()`` finishes it."""
    _check_tensor(tensor, "tensor")
    return all_reduce_coalesced_async([tensor], op)


def all_reduce_coalesced_async(
    inputs: Sequence[Tensor], op: str = "sum", outputs: Sequence[Tensor] | None = None
) -> AllReduceWork | CompletedWork:
    """Start one all-reduce over several tensors (one staging buffer, one exchange).

    ``inputs`` share one dtype and device; ``outputs`` (default: ``inputs``, in place) match them
    in shape, dtype and device. Results are bit-identical on every rank.
    """
    inputs = list(inputs)
    outputs = inputs if outputs is None else list(outputs)
    _check_reduce(inputs, outputs, op)
    w = world()
    if w.info.world_size == 1:
        for src, dst in zip(inputs, outputs, strict=True):
            if src is not dst:
                _local_copy(dst, src)
        return CompletedWork(outputs)
    device = inputs[0].device
    if device.kind == "opencl" and capture.is_recording(device.queue):
        n = len(inputs)
        meta = [(t.shape, t.dtype) for t in inputs + outputs]

        def run(tensors: list[Tensor], wait_for: Any) -> None:
            AllReduceWork(tensors[:n], tensors[n:], op, wait_for).wait()

        _record_and_run(f"all_reduce_{op}", run, inputs + outputs, meta)
        return CompletedWork(outputs)
    return AllReduceWork(inputs, outputs, op)


def _check_reduce(inputs: list[Tensor], outputs: list[Tensor], op: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
    if not inputs:
        raise ValueError("all_reduce needs at least one tensor, got none")
    if len(outputs) != len(inputs):
        raise ValueError(f"outputs has {len(outputs)} tensors but inputs has {len(inputs)}")
    first = inputs[0]
    for i, (src, dst) in enumerate(zip(inputs, outputs, strict=True)):
        _check_tensor(src, f"inputs[{i}]")
        _check_tensor(dst, f"outputs[{i}]")
        if src.dtype != first.dtype or src.device is not first.device:
            raise DTypeError(
                f"inputs[{i}] is {src.dtype} on {src.device.spec}, inputs[0] is {first.dtype} on {first.device.spec}; "
                "one all-reduce takes tensors of one dtype and device"
            )
        if dst.shape != src.shape or dst.dtype != src.dtype or dst.device is not src.device:
            raise ValueError(
                f"outputs[{i}] is {dst.shape} {dst.dtype} on {dst.device.spec}, expected {src.shape} {src.dtype} "
                f"on {src.device.spec} like inputs[{i}]"
            )
    if op == "mean" and first.dtype.kind != "f":
        raise DTypeError(f"all_reduce op='mean' needs a floating-point tensor, got {first.dtype}")


# ---- broadcast, all_gather, barrier ----------------------------------------------------------
def broadcast(tensor: Tensor, root: int = 0) -> Tensor:
    """Overwrite ``tensor`` on every rank with rank ``root``'s contents; returns it."""
    _check_tensor(tensor, "tensor")
    w = world()
    _check_root(root, w.info.world_size)
    if w.info.world_size == 1:
        return tensor
    device = tensor.device
    if device.kind == "opencl" and capture.is_recording(device.queue):
        _record_and_run(
            "broadcast", lambda ts, wf: _broadcast_now(ts[0], root, wf), [tensor], [(tensor.shape, tensor.dtype)]
        )
        return tensor
    _broadcast_now(tensor, root)
    return tensor


def _broadcast_now(tensor: Tensor, root: int, wait_for: Any = None) -> None:
    MPI = mpi()
    w = world()
    staging = POOL.acquire(tensor.device, tensor.nbytes)
    host = staging.view(np.uint8, tensor.nbytes)
    if w.info.rank == root:
        _download(tensor, host, wait_for)
    wait_requests([w.comm.Ibcast([host, MPI.BYTE], root=root)], f"broadcast of {tensor.shape} {tensor.dtype}")
    event = _upload(tensor, host) if w.info.rank != root else None
    POOL.release(staging, event)


def all_gather(tensor: Tensor) -> Tensor:
    """A new tensor of shape ``(world_size, *tensor.shape)``: every rank's ``tensor``, in rank order."""
    _check_tensor(tensor, "tensor")
    w = world()
    out = Tensor.empty((w.info.world_size, *tensor.shape), tensor.dtype, tensor.device)
    if w.info.world_size == 1:
        _local_copy(out.reshape(tensor.shape), tensor)
        return out
    device = tensor.device
    if device.kind == "opencl" and capture.is_recording(device.queue):
        meta = [(tensor.shape, tensor.dtype), (out.shape, out.dtype)]
        _record_and_run("all_gather", lambda ts, wf: _all_gather_now(ts[0], ts[1], wf), [tensor, out], meta)
        return out
    _all_gather_now(tensor, out)
    return out


def _all_gather_now(tensor: Tensor, out: Tensor, wait_for: Any = None) -> None:
    MPI = mpi()
    w = world()
    staging = POOL.acquire(tensor.device, tensor.nbytes + out.nbytes)
    mine = staging.view(np.uint8, tensor.nbytes)
    gathered = staging.view(np.uint8, out.nbytes, tensor.nbytes)
    _download(tensor, mine, wait_for)
    request = w.comm.Iallgather([mine, MPI.BYTE], [gathered, MPI.BYTE])
    wait_requests([request], f"all_gather of {tensor.shape} {tensor.dtype}")
    POOL.release(staging, _upload(out, gathered))


def barrier() -> None:
    """Wait until every rank reached the barrier (bounded by the group's timeout)."""
    w = world()
    if w.info.world_size > 1:
        wait_requests([w.comm.Ibarrier()], "barrier")


# ---- Python objects (handshakes) --------------------------------------------------------------
def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order (two non-blocking exchanges: sizes, bytes)."""
    MPI = mpi()
    w = world()
    payload = np.frombuffer(pickle.dumps(obj), np.uint8)
    if w.info.world_size == 1:
        return [obj]
    sizes = np.zeros(w.info.world_size, np.int64)
    mine = np.array([payload.size], np.int64)
    wait_requests([w.comm.Iallgather([mine, MPI.INT64_T], [sizes, MPI.INT64_T])], "all_gather_object (sizes)")
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    data = np.empty(int(sizes.sum()), np.uint8)
    request = w.comm.Iallgatherv([payload, MPI.BYTE], [data, (sizes.tolist(), offsets.tolist()), MPI.BYTE])
    wait_requests([request], "all_gather_object (payload)")
    return [pickle.loads(data[o : o + s].tobytes()) for o, s in zip(offsets, sizes, strict=True)]


def broadcast_object(obj: Any, root: int = 0) -> Any:
    """Rank ``root``'s picklable ``obj`` on every rank."""
    w = world()
    _check_root(root, w.info.world_size)
    return all_gather_object(obj if w.info.rank == root else None)[root]


# ---- helpers -------------------------------------------------------------------------------------
def _check_tensor(t: Any, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a netcl Tensor, got {type(t).__name__} (pass node.value for a Node)")


def _check_root(root: Any, size: int) -> None:
    if not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"root must be a rank in [0, {size}), got {root!r}")


def _download(tensor: Tensor, host: np.ndarray, wait_for: Any = None) -> None:
    if not tensor.nbytes:
        return
    if tensor.device.kind == "opencl":
        cl.enqueue_copy(tensor.queue, host, tensor.data, is_blocking=True, wait_for=wait_for)
    else:
        host[...] = tensor.data.reshape(-1).view(np.uint8)


def _upload(tensor: Tensor, host: np.ndarray) -> cl.Event | None:
    if not tensor.nbytes:
        return None
    if tensor.device.kind == "opencl":
        event = cl.enqueue_copy(tensor.queue, tensor.data, host, is_blocking=False)
        tensor.queue.flush()
        return event
    tensor.data.reshape(-1).view(np.uint8)[...] = host
    return None


def _local_copy(dst: Tensor, src: Tensor) -> None:
    if dst.device.kind == "opencl":
        enqueue_copy(dst.queue, dst, src)
    else:
        dst.data.reshape(-1)[...] = src.data.reshape(-1)


class _RecordedCollective:
    """A collective as a graph command: replay calls it with the captured buffers."""

    def __init__(self, name: str, run: Callable[[list[Tensor], Any], None], meta: list[Any], device: Any) -> None:
        self.__name__ = name
        self.run, self.meta, self.device = run, meta, device

    def __call__(self, queue: cl.CommandQueue, *buffers: Any, wait_for: Any = None) -> cl.Event:
        tensors = [
            Tensor(buf, shape, dtype, self.device) for buf, (shape, dtype) in zip(buffers, self.meta, strict=True)
        ]
        self.run(tensors, wait_for)
        return cl.enqueue_marker(queue)


def _record_and_run(
    name: str, run: Callable[[list[Tensor], Any], None], tensors: list[Tensor], meta: list[Any]
) -> None:
    device = tensors[0].device
    command = _RecordedCollective(name, run, meta, device)
    capture.record_command(device.queue, command, [t.data for t in tensors], keep=tensors)
    run(tensors, None)
