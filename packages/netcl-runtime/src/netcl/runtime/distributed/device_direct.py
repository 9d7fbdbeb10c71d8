"""Device-direct all-reduce on NVIDIA GPUs: NCCL on memory that OpenCL and CUDA share.

NVIDIA's OpenCL imports memory by file descriptor (``cl_khr_external_memory_opaque_fd``). A
bucket's flat buffer is allocated as exportable CUDA memory (``cuda_driver.ExportableMemory``) and
imported into the device's OpenCL context, so one allocation is both a ``cl.Buffer`` and a CUDA
device address: OpenCL copies the gradients in, NCCL all-reduces it in place (over NVLink or PCIe,
no host staging), OpenCL copies the results out.

``probe(device)`` says whether this process can do that (an NVIDIA OpenCL GPU with the extension,
the CUDA driver, NCCL, and a round trip through one imported buffer that checks both APIs see the
same bytes); ``agree(device)`` is collective: every rank probes and the path is taken only when
every rank can and no two ranks of a host share a GPU (NCCL refuses that), and not under
``use_deterministic_algorithms(True)`` (NCCL chooses its algorithm, and so the summation order, by size
and topology; the MPI path's order is fixed by rank). ``NETCL_DEVICE_DIRECT`` chooses: ``0`` never,
``1`` required (an error naming the failing rank and reason), unset: where the probe passes. Where
it is off the host-staged MPI path (``overlap``) runs; if some rank has an NVIDIA GPU (where the path
could have run), rank 0 says why once per process (a log warning).

``DeviceDirectReducer`` has ``OverlapReducer``'s interface: ``submit(inputs, outputs, op)`` marks
the device queue's point where the bucket is complete and hands it to a thread of its own, with an
OpenCL queue and a CUDA stream of its own; the thread waits for that event (not the queue), copies
the gradients into the bucket's shared buffer, runs ``ncclAllReduce`` ("mean" is ``ncclAvg``)
and, once the stream is done, copies the results out. ``wait()`` puts a barrier on the device's
queue behind those copies. Every rank gets identical bits (each element is reduced once and
broadcast); they need not equal the MPI path's, whose summation order is fixed by rank. A peer that
dies makes the stream's wait time out at ``NETCL_DIST_TIMEOUT``: the communicator is aborted and
``DistributedTimeoutError`` raised, and every later bucket fails at once.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor
from netcl.runtime import cuda_driver
from netcl.runtime.cuda_driver import nvidia_pci
from netcl.runtime.determinism import are_deterministic_algorithms_enabled
from netcl.runtime.distributed import nccl
from netcl.runtime.distributed.collectives import all_gather_object, barrier, broadcast_object
from netcl.runtime.distributed.errors import DistributedError, DistributedTimeoutError
from netcl.runtime.distributed.external_memory import EXTENSION, import_memory
from netcl.runtime.distributed.group import Deadline, mark_broken, path_choice, world
from netcl.runtime.distributed.overlap import ThreadedReducer, ThreadedWork

ENV = "NETCL_DEVICE_DIRECT"
_PROBE_BYTES = 1 << 16
log = logging.getLogger("netcl.distributed")


@dataclass(frozen=True)
class Probe:
    """Whether this process can all-reduce ``device``'s memory device-direct, and if not, why."""

    ok: bool
    reason: str
    pci: tuple[int, int, int] | None = None  #: (domain, bus, slot) of the GPU
    #: an NVIDIA GPU under NVIDIA's OpenCL: where the path could run (a failure there is worth saying)
    applicable: bool = True


_PROBES: dict[int, Probe] = {}
_SAID = False


def mode() -> str:
    """``NETCL_DEVICE_DIRECT``: "off", "on" (required) or "auto" (``group.path_choice``)."""
    return path_choice(ENV)


def probe(device: Device) -> Probe:
    """This process's answer for ``device`` (cached; never raises for a missing piece)."""
    cached = _PROBES.get(id(device))
    if cached is None:
        try:
            cached = _probe(device)
        except (cuda_driver.CudaError, nccl.NcclError, cl.Error, OSError) as exc:
            cached = Probe(False, str(exc))  # e.g. no NCCL: worth saying
        _PROBES[id(device)] = cached
    return cached


def _probe(device: Device) -> Probe:
    if device.kind != "opencl" or not device.is_gpu or "NVIDIA" not in device.platform_name:
        return Probe(False, f"{device.name!r} is not an NVIDIA GPU under NVIDIA's OpenCL", applicable=False)
    if EXTENSION not in device.cl_device.extensions.split():
        return Probe(False, f"{device.name!r} lacks {EXTENSION}")
    pci = nvidia_pci(device)
    gpu = cuda_driver.device_by_pci(*pci)
    nccl.library()
    shared = SharedBuffer(device, gpu, _PROBE_BYTES)
    try:
        pattern = np.arange(_PROBE_BYTES // 4, dtype=np.uint32) * np.uint32(2654435761)
        cl.enqueue_copy(device.queue, shared.buffer, pattern, is_blocking=True)
        seen = np.empty_like(pattern)
        cuda_driver.check(
            cuda_driver.library().cuMemcpyDtoH_v2(
                seen.ctypes.data_as(ctypes.c_void_p), ctypes.c_ulonglong(shared.pointer), ctypes.c_size_t(seen.nbytes)
            ),
            "cuMemcpyDtoH",
        )
        if not np.array_equal(seen, pattern):
            return Probe(False, "CUDA does not read what OpenCL wrote into an imported buffer", pci)
    finally:
        shared.free()
    return Probe(True, f"NCCL {nccl.version()} on GPU {pci[0]:04x}:{pci[1]:02x}:{pci[2]:02x}", pci)


def agree(device: Device) -> bool:
    """Collective: whether every rank takes the device-direct path (see the module docstring)."""
    choice = mode()
    if choice == "off":
        mine = Probe(False, f"{ENV}=0", applicable=False)
    elif are_deterministic_algorithms_enabled():  # NCCL picks its algorithm and order by size and topology
        mine = Probe(False, "use_deterministic_algorithms(True) keeps the rank-ordered MPI sum", applicable=False)
    else:
        mine = probe(device)
    everyone = all_gather_object((mine.ok, mine.reason, socket.gethostname(), mine.pci, mine.applicable))
    failed = [(r, reason, applicable) for r, (ok, reason, _, _, applicable) in enumerate(everyone) if not ok]
    why = f"rank {failed[0][0]}: {failed[0][1]}" if failed else None
    worth_saying = any(applicable for _, _, applicable in failed)
    if why is None:
        places = [(host, pci) for _, _, host, pci, _ in everyone]
        if len(set(places)) < len(places):
            why, worth_saying = "two ranks share a GPU (NCCL needs one GPU per rank)", True
    if why is not None and choice == "on":
        raise DistributedError(f"{ENV}=1 but the device-direct all-reduce cannot run: {why}")
    global _SAID
    if why is not None and worth_saying and not _SAID and world().info.rank == 0:
        log.warning("netcl: device-direct all-reduce off (%s); all-reducing through host-staged MPI", why)
        _SAID = True
    return why is None


class SharedBuffer:
    """``nbytes`` of GPU memory that is both a CUDA address (``pointer``) and a ``cl.Buffer``
    (``buffer``) of ``device``'s context. ``free()`` releases the OpenCL side first."""

    def __init__(self, device: Device, gpu: cuda_driver.CudaDevice, nbytes: int) -> None:
        self.memory = cuda_driver.ExportableMemory(gpu, nbytes)
        self.pointer, self.nbytes = self.memory.pointer, self.memory.nbytes
        try:
            self.buffer = import_memory(device, self.memory.fd, self.memory.nbytes)
            self.memory.hand_over_fd()  # the import owns it now
        except BaseException:
            self.memory.free()
            raise

    def free(self) -> None:
        if self.buffer is not None:
            self.buffer.release()
            self.buffer = None
        self.memory.free()


class DeviceDirectReducer(ThreadedReducer):
    """NCCL all-reduces of buckets beside the caller's work (collective construction: every rank
    builds its reducers in the same order, after ``agree`` returned True)."""

    def __init__(self, device: Device) -> None:
        info = world().info
        gpu = cuda_driver.device_by_pci(*nvidia_pci(device))
        uid = broadcast_object(nccl.unique_id() if info.rank == 0 else None)
        barrier()  # every rank is alive: NCCL's own setup waits without a timeout
        comm = nccl.Communicator(uid, info.rank, info.world_size)
        self._start(device, "netcl-nccl", _NcclExchange(device, gpu, comm, (info.timeout, info.rank, info.world_size)))

    def submit(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], op: str) -> ThreadedWork:
        """Start the all-reduce of ``inputs`` into ``outputs`` once the work enqueued so far on the
        device's queue completes. Keep both alive until ``wait``."""
        if op not in nccl.OPS:
            raise ValueError(f"op must be one of {sorted(nccl.OPS)}, got {op!r}")
        work = ThreadedWork(inputs, outputs, op, self._ready(), self.limits)
        self.jobs.put(work)
        return work


class _NcclExchange:
    """The reducer thread's side: an OpenCL queue and a CUDA stream of its own, a shared buffer per
    exchange size, the communicator."""

    what = "device-direct all-reduce"

    def __init__(self, device: Device, gpu: cuda_driver.CudaDevice, comm: nccl.Communicator, limits) -> None:
        self.device, self.gpu, self.comm, self.limits = device, gpu, comm, limits
        self.stream = cuda_driver.Stream(gpu)
        self.cl_queue = cl.CommandQueue(device.context, device.cl_device)
        self.buffers: dict[int, SharedBuffer] = {}

    def stopped(self, failed: bool) -> None:
        self.cl_queue.finish()
        for shared in self.buffers.values():
            shared.free()
        if not failed:  # a failed communicator was aborted, or may be unusable
            self.comm.destroy()
        self.stream.destroy()

    def run(self, work: ThreadedWork) -> None:
        self.gpu.make_current()  # CUDA contexts are current per thread
        item = work.dtype.itemsize
        nbytes = work.total * item
        shared = self.buffers.get(nbytes)
        if shared is None:
            shared = self.buffers[nbytes] = SharedBuffer(self.device, self.gpu, nbytes)
        copies, offset = [], 0
        for t in work.inputs:
            size = t.size * item
            if size:
                copies.append(
                    cl.enqueue_copy(
                        self.cl_queue, shared.buffer, t.data, dst_offset=offset, byte_count=size, wait_for=[work.ready]
                    )
                )
            offset += size
        self.cl_queue.flush()
        cl.wait_for_events(copies or [work.ready])
        work.comm_started_at = time.perf_counter()
        self.comm.all_reduce(shared.pointer, work.total, work.dtype, work.op, self.stream.handle)
        what = f"a device-direct all-reduce({work.op}) of {work.total} {work.dtype} elements"
        deadline = Deadline(*self.limits)
        try:
            while not self.stream.done():
                self.comm.async_error()
                deadline.check(what)
        except nccl.NcclError as exc:  # NCCL saw a peer fail before the deadline
            self.comm.abort()
            _, rank, size = self.limits
            error = DistributedTimeoutError(
                f"{what} failed on rank {rank} of {size}: another rank died or failed ({exc})"
            )
            mark_broken(str(error))
            raise error from None
        except BaseException:
            self.comm.abort()
            raise
        offset = 0
        for t in work.outputs:
            size = t.size * item
            if size:
                cl.enqueue_copy(self.cl_queue, t.data, shared.buffer, src_offset=offset, byte_count=size)
            offset += size
        work.uploaded = cl.enqueue_marker(self.cl_queue)
        self.cl_queue.flush()
        work.finished_at = time.perf_counter()
