"""Peer all-reduce on the NVIDIA GPUs of one host: each rank's kernels read every other rank's gradients
over the GPUs' peer links (NVLink or PCIe), with no host wait and no work in a CUDA context.

Every rank allocates a *window* on its own GPU as exportable CUDA memory (``cuda_driver.ExportableMemory``:
``cuMemCreate`` with a POSIX file-descriptor handle; only an allocation, no CUDA kernel, stream or copy), and
hands the descriptor to every other rank of the host over a Unix socket (``SCM_RIGHTS``). Each rank imports
every window, its own and its peers', into its own OpenCL context (``cl_khr_external_memory_opaque_fd``):
NVIDIA's OpenCL maps a peer GPU's memory, so one kernel reads all of them. A window is a page of flags (one
ticket per rank) and two slots of the exchange's size.

An exchange (``PeerReducer.submit``) is three kinds of launch on the caller's device queue, in order:

1. *pack*: the inputs (multi-tensor kernels, ``optim_kernels.multi_source``) into this rank's slot ``t % 2``
   of the next ticket ``t`` (the ticket lives in the window: no launch argument changes between steps);
2. *meet*: one work-item publishes ``t`` into this rank's flag of every peer's window (``st.release.sys``)
   and waits until every peer has published ``t`` into this window (``ld.acquire.sys``), for at most the
   group's timeout (``%globaltimer``). A peer that does not arrive: the kernel records the fault in the
   device's error word (``netcl.core.device_errors``) and marks the window failed (later exchanges return at
   once); the host raises ``DistributedTimeoutError`` at its next wait;
3. *reduce*: every rank's slot summed in rank order 0, 1, ..., n-1 (float16 in float32, with IEEE ``add.rn``
   and ``div.rn``), divided by n for "mean", into the outputs: the arithmetic of ``allreduce.reduce_parts``,
   so every rank gets the bits the host-staged MPI path gives, run to run.

Two slots make the reuse safe: a rank writes slot ``t % 2`` again at ticket ``t + 2``, after meeting every
peer at ``t + 1``, which each peer published only after its own reduce of ``t`` (queues are in order).

``agree(device)`` is collective: the path is taken when every rank is on one host, owns an NVIDIA GPU of its
own under NVIDIA's OpenCL with the extension, and a trial exchange (every rank reads a pattern from every
peer's window) gives every rank the right bytes. ``NETCL_PEER_ALLREDUCE`` chooses: ``0`` never, ``1``
required (an error naming the failing rank and reason), unset: where the trial passes. Measurements:
benchmarks/RESULTS.md, "peer all-reduce".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor, float16, float32, float64
from netcl.core.device_errors import INDEX_CHECK_C, fault_code
from netcl.runtime import cuda_driver
from netcl.runtime.cuda_driver import nvidia_pci
from netcl.runtime.distributed.collectives import all_gather_object, barrier, broadcast_object
from netcl.runtime.distributed.errors import DistributedError, DistributedTimeoutError
from netcl.runtime.distributed.external_memory import EXTENSION, import_memory
from netcl.runtime.distributed.group import TIMEOUT_ENV, is_usable, mark_broken, path_choice, world
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import compute_ctype, get_kernel, round_up, storage_ctype, storage_pragmas
from netcl.runtime.ops.optim_kernels import multi_chunks, multi_source, multi_table
from netcl.runtime.ops.storage_io import bits_ctype, load_c, store_c

ENV = "NETCL_PEER_ALLREDUCE"
#: dtypes an exchange takes (others go through the MPI path)
DTYPES = (float32, float64, float16)
OPS = ("sum", "mean")
#: bytes of a window's flag page: one uint32 ticket per rank, then the failed word
FLAG_BYTES = 4096
_FAILED = FLAG_BYTES // 4 - 1
#: bytes of the trial exchange ``agree`` runs
_TRIAL_BYTES = 1 << 16
log = logging.getLogger("netcl.distributed")
_SAID = False

_SYNC_C = r"""
inline uint netcl_load_acquire_sys(__global const uint* p) {
    uint v; asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
inline void netcl_store_release_sys(__global uint* p, const uint v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
inline ulong netcl_now_ns(void) { ulong t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
"""

_MEET = """
__kernel void netcl_peer_meet({windows}, __global int* err, const int code, const ulong timeout_ns) {{
    __global uint* mine = w{rank};
    if (mine[{failed}]) return;
    const uint t = mine[{rank}] + 1;
{publish}    mine[{rank}] = t;
    const ulong start = netcl_now_ns();
{wait}}}
"""

_WAIT = """    while (netcl_load_acquire_sys(mine + {peer}) < t) {{
        if (netcl_now_ns() - start > timeout_ns) {{
            mine[{failed}] = 1;
            netcl_record_error(err, code, {peer}, t);
            return;
        }}
    }}
"""

_ARITHMETIC = {
    "float": """inline float netcl_add_rn(const float a, const float b) {
    float r; asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
inline float netcl_div_rn(const float a, const float b) {
    float r; asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
""",
    "double": """inline double netcl_add_rn(const double a, const double b) {
    double r; asm("add.rn.f64 %0, %1, %2;" : "=d"(r) : "d"(a), "d"(b)); return r;
}
inline double netcl_div_rn(const double a, const double b) {
    double r; asm("div.rn.f64 %0, %1, %2;" : "=d"(r) : "d"(a), "d"(b)); return r;
}
""",
}


class PeerTimeoutError(DistributedTimeoutError):
    """A peer rank did not reach a peer all-reduce within the group's timeout (raised at the next host wait)."""


def _timed_out(peer: int, ticket: int) -> BaseException:
    """The error of a meet that waited past the timeout (the group is broken from then on)."""
    where = f" on rank {world().info.rank} of {world().info.world_size}" if is_usable() else ""
    text = (
        f"peer all-reduce{where}: rank {peer} did not reach exchange {ticket} within {TIMEOUT_ENV}; "
        "another rank died or stopped"
    )
    mark_broken(text)
    return PeerTimeoutError(text)


_TIMEOUT_CODE = fault_code("peer all-reduce", _timed_out)


def mode() -> str:
    """``NETCL_PEER_ALLREDUCE``: "off", "on" (required) or "auto" (``group.path_choice``)."""
    return path_choice(ENV)


def applicable(device: Device) -> str | None:
    """Why this rank cannot take the path (None: it can, pending the trial exchange)."""
    if device.kind != "opencl" or not device.is_gpu or "NVIDIA" not in device.platform_name:
        return f"{device.name!r} is not an NVIDIA GPU under NVIDIA's OpenCL"
    if EXTENSION not in device.cl_device.extensions.split():
        return f"{device.name!r} lacks {EXTENSION}"
    try:
        cuda_driver.library()
    except cuda_driver.CudaError as exc:
        return str(exc)
    return None


def agree(device: Device) -> bool:
    """Collective: whether every rank takes the peer path (see the module docstring)."""
    choice = mode()
    why = f"{ENV}=0" if choice == "off" else applicable(device)
    everyone = all_gather_object((why, socket.gethostname(), None if why else nvidia_pci(device)))
    failed = [(r, reason) for r, (reason, _, _) in enumerate(everyone) if reason]
    problem = f"rank {failed[0][0]}: {failed[0][1]}" if failed else None
    if problem is None:
        if len({host for _, host, _ in everyone}) > 1:
            problem = "the ranks are on more than one host (peer memory is within one host)"
        elif len({pci for _, _, pci in everyone}) < len(everyone):
            problem = "two ranks share a GPU (the path needs one GPU per rank)"
    if problem is None:
        problem = _trial(device)  # collective; the same answer on every rank
        global _SAID
        if problem is not None and not _SAID and world().info.rank == 0:  # the path should have run
            log.warning("netcl: peer all-reduce off (%s)", problem)
            _SAID = True
    if problem is not None and choice == "on":
        raise DistributedError(f"{ENV}=1 but the peer all-reduce cannot run: {problem}")
    return problem is None


def _trial(device: Device) -> str | None:
    """Every rank writes a pattern of its own into its window, then reads every peer's (collective; the
    first failure, the same on every rank)."""
    rank, size = world().info.rank, world().info.world_size
    try:
        window = Window(device, _TRIAL_BYTES)
    except OSError as exc:
        return str(exc)
    words = _TRIAL_BYTES // 4

    def pattern(r: int) -> np.ndarray:
        return np.arange(words, dtype=np.uint32) * np.uint32(2654435761) + np.uint32(r)

    def write() -> None:
        cl.enqueue_copy(device.queue, window.buffers[rank], pattern(rank), dst_offset=FLAG_BYTES, is_blocking=True)

    def read() -> None:
        for peer in range(size):
            seen = np.empty(words, np.uint32)
            cl.enqueue_copy(device.queue, seen, window.buffers[peer], src_offset=FLAG_BYTES, is_blocking=True)
            if not np.array_equal(seen, pattern(peer)):
                raise OSError(f"read wrong bytes from rank {peer}'s window")

    problem = _on_every_rank(write) or _on_every_rank(read)  # each agreed: reads start after every write
    window.free()  # every rank is done reading
    return problem


def _on_every_rank(part: Callable[[], None]) -> str | None:
    """Run ``part`` on every rank and return the first rank's failure, the same on every rank (collective)."""
    failure = None
    try:
        part()
    except (cuda_driver.CudaError, cl.Error, OSError) as exc:
        failure = f"rank {world().info.rank}: {exc}"
    return next((f for f in all_gather_object(failure) if f), None)


class Window:
    """This rank's window (exportable memory on its GPU) and every rank's, imported into this rank's
    context: ``buffers[r]`` is rank r's (collective construction: every rank builds its windows in the same
    order and sizes). ``slot_bytes`` is one slot's size; the flags start zeroed."""

    def __init__(self, device: Device, slot_bytes: int) -> None:
        info = world().info
        self.device, self.rank, self.size = device, info.rank, info.world_size
        self.slot_bytes = -(-int(slot_bytes) // 256) * 256
        self.memory: cuda_driver.ExportableMemory | None = None
        self.buffers: list[cl.Buffer] = []
        self._agreed(self._allocate)
        # every window imported and its flags zero on every rank before anyone publishes
        self._agreed(lambda: self._import(info.timeout))

    def _agreed(self, part: Callable[[], None]) -> None:
        """Run ``part`` on every rank; if it failed on any, free and raise that failure on every rank."""
        failure = _on_every_rank(part)
        if failure is not None:
            self.free()
            raise OSError(f"peer window: {failure}")

    def _allocate(self) -> None:
        gpu = cuda_driver.device_by_pci(*nvidia_pci(self.device))
        self.memory = cuda_driver.ExportableMemory(gpu, FLAG_BYTES + 2 * self.slot_bytes)

    def _import(self, timeout: float) -> None:
        assert self.memory is not None
        descriptors = _exchange_descriptors(self.memory.fd, self.rank, self.size, timeout)
        try:
            while descriptors:  # an import owns its descriptor once it succeeds
                self.buffers.append(import_memory(self.device, descriptors[0], self.memory.nbytes))
                descriptors.pop(0)
        finally:
            for fd in descriptors:
                os.close(fd)
        zeros = np.zeros(FLAG_BYTES // 4, np.uint32)
        cl.enqueue_copy(self.device.queue, self.buffers[self.rank], zeros, is_blocking=True)

    def free(self) -> None:
        """Release the imports (after the device's queue is done with them) and this rank's memory."""
        if self.buffers:
            self.device.queue.finish()
        for buffer in self.buffers:
            buffer.release()
        self.buffers = []
        if self.memory is not None:
            self.memory.free()


def _exchange_descriptors(fd: int, rank: int, size: int, timeout: float) -> list[int]:
    """Every rank's window descriptor, by rank (this rank's own: a duplicate of ``fd``), over abstract Unix
    sockets named by a token rank 0 draws (collective)."""
    token = broadcast_object(uuid.uuid4().hex if rank == 0 else None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    got: dict[int, int] = {rank: os.dup(fd)}
    try:
        listening: OSError | None = None
        try:
            listener.bind(f"\0netcl-peer-{token}-{rank}")
            listener.listen(size)
            listener.settimeout(timeout)
        except OSError as exc:
            listening = exc
        barrier()  # every rank listens (one that cannot still joins, then fails; its peers fail to connect)
        if listening is not None:
            raise listening
        for peer in range(size):
            if peer != rank:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as out:
                    out.settimeout(timeout)
                    out.connect(f"\0netcl-peer-{token}-{peer}")
                    socket.send_fds(out, [rank.to_bytes(4, "little")], [fd])
        while len(got) < size:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(timeout)
                message, fds, _, _ = socket.recv_fds(conn, 4, 1)
                if len(message) != 4 or len(fds) != 1:
                    raise OSError(f"a malformed window message reached rank {rank}")
                got[int.from_bytes(message, "little")] = fds[0]
    except BaseException:
        for descriptor in got.values():
            os.close(descriptor)
        raise
    finally:
        listener.close()
    return [got[r] for r in range(size)]


@dataclass
class PeerWork:
    """An exchange enqueued on the device's queue: nothing to wait for on the host (a peer that never
    arrives is raised at the next host wait); ``wait()`` returns the outputs."""

    outputs: list[Tensor]

    def wait(self) -> list[Tensor]:
        return self.outputs


class PeerReducer:
    """Exchanges of buckets through peer windows, one window per (dtype, exchange size) (collective
    construction of each window at its first exchange: every rank submits the same exchanges in the same
    order, as for any collective), and one plan of prepared launches per (dtype, tensor sizes, op)."""

    def __init__(self, device: Device) -> None:
        info = world().info
        self.device, self.rank, self.size = device, info.rank, info.world_size
        self.timeout_ns = np.uint64(min(info.timeout * 1e9, 2**63))
        self.windows: dict[tuple[np.dtype, int], Window] = {}
        self.plans: dict[tuple[np.dtype, tuple[int, ...], str], _Plan] = {}

    def supports(self, dtype: np.dtype) -> bool:
        return np.dtype(dtype) in DTYPES

    def submit(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], op: str) -> PeerWork:
        """Enqueue the exchange of ``inputs`` (one dtype) into ``outputs`` on the device's queue."""
        if op not in OPS:
            raise ValueError(f"op must be one of {list(OPS)}, got {op!r}")
        dtype = inputs[0].dtype
        if not self.supports(dtype):
            raise DistributedError(f"peer all-reduce: dtype {dtype} is not one of {[str(d) for d in DTYPES]}")
        key = (dtype, tuple(t.size for t in inputs), op)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._plan(dtype, key[1], op)
        plan.run(inputs, outputs)
        return PeerWork(list(outputs))

    def _plan(self, dtype: np.dtype, sizes: tuple[int, ...], op: str) -> _Plan:
        total = sum(sizes)
        window = self.windows.get((dtype, total))
        if window is None:
            window = self.windows[(dtype, total)] = Window(self.device, total * dtype.itemsize)
        slot = window.slot_bytes // dtype.itemsize
        own = window.buffers[self.rank]
        pack = self._launches(_pack_spec(dtype, self.rank, slot), sizes, (own, own), (self.rank, slot))
        reduce_spec = _reduce_spec(dtype, self.rank, self.size, slot, op)
        args = (*window.buffers, own)
        reduce = self._launches(reduce_spec, sizes, args, (self.rank, self.size, slot))
        device = self.device
        kernel = _meet_kernel(device, self.rank, self.size)
        meet_args = (*window.buffers, device.error_word.buffer(device.queue), _TIMEOUT_CODE, self.timeout_ns)
        meet = PreparedLaunch.binding(kernel, (1,), (1,), dict(enumerate(meet_args)), device.queue)
        return _Plan(pack, meet, reduce)

    def _launches(self, spec: _MultiSpec, sizes: tuple[int, ...], args: tuple, baked: tuple) -> list[_Chunk]:
        """``spec``'s launches over tensors of ``sizes``, ``MULTI_ARITY`` a launch, every argument but the
        tensors bound (``first``: the launch's first element in the slot; ``baked``: what the source holds
        besides ``spec``)."""
        launches, first = [], 0
        for start, stop, arity in multi_chunks(len(sizes)):
            count = sum(sizes[start:stop])
            key = ("peer", spec.what, str(spec.dtype), arity, *baked)  # the source holds the rest
            slots = len(spec.slots) * arity
            arg_types = [None] * slots + [None] * len(args) + [np.int64, None, np.int64]
            resolved = get_kernel(key, self.device, functools.partial(spec.source, arity), spec.name, arg_types)
            table = multi_table(self.device, sizes[start:stop], (0,) * (stop - start), arity)
            bound = dict(enumerate((*args, first, table, count), start=slots))
            local = resolved.max_local
            prepared = PreparedLaunch.binding(resolved.kernel, round_up(count, local), local, bound, self.device.queue)
            launches.append(_Chunk(prepared.call, start, stop, arity, table))
            first += count
        return launches

    def close(self) -> None:
        """Free every window (after the device's queue is done with them; a peer's imports keep its memory
        alive for the peer)."""
        for window in self.windows.values():
            window.free()
        self.windows, self.plans = {}, {}

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()


@dataclass(frozen=True)
class _Chunk:
    """One multi-tensor launch of a plan: ``call(*buffers)`` of tensors ``[start, stop)``, ``arity`` slots
    (the unused ones repeat the first tensor); ``table`` is kept alive with it."""

    call: Callable[..., None]
    start: int
    stop: int
    arity: int
    table: Tensor

    def run(self, tensors: Sequence[Tensor]) -> None:
        buffers = [t.data for t in tensors[self.start : self.stop]]
        self.call(*buffers, *[buffers[0]] * (self.arity - len(buffers)))


@dataclass(frozen=True)
class _Plan:
    """An exchange's launches: pack, meet, reduce."""

    pack: list[_Chunk]
    meet: PreparedLaunch
    reduce: list[_Chunk]

    def run(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
        for chunk in self.pack:
            chunk.run(inputs)
        self.meet.call()
        for chunk in self.reduce:
            chunk.run(outputs)


def _pack_spec(dtype: np.dtype, rank: int, slot: int) -> _MultiSpec:
    """Copy the inputs (their bits) into the slot of the next ticket."""
    bits = bits_ctype(dtype)
    return _MultiSpec(
        "pack",
        dtype,
        bits,
        slots=("G",),
        read_only=("G",),
        params=f"__global {bits}* W, __global const uint* F, const long first",
        prologue=f"const long at = {FLAG_BYTES // dtype.itemsize} + ((F[{rank}] + 1) & 1) * {slot};",
        body="W[at + first + t_gid] = @G[gid];",
    )


def _reduce_spec(dtype: np.dtype, rank: int, size: int, slot: int, op: str) -> _MultiSpec:
    """Sum every rank's slot of the current ticket in rank order (``reduce_parts``'s arithmetic) into the outputs."""
    st, ct = storage_ctype(dtype), compute_ctype(dtype)
    body = "".join(f"acc = netcl_add_rn(acc, {load_c(dtype, f'W{r}', 'at')}); " for r in range(1, size))
    if op == "mean":
        body += f"acc = netcl_div_rn(acc, ({ct}){size}); "
    return _MultiSpec(
        f"reduce_{op}",
        dtype,
        st,
        slots=("O",),
        read_only=(),
        params=", ".join(f"__global const {st}* W{r}" for r in range(size))
        + ", __global const uint* F, const long first",
        prologue=f"const long at = {FLAG_BYTES // dtype.itemsize} + (F[{rank}] & 1) * {slot} + first"
        f" + t_gid;\n    {ct} acc = {load_c(dtype, 'W0', 'at')};",
        body=body + store_c(dtype, "@O", "gid", "acc", wide=ct) + ";",
        stop=f"F[{_FAILED}] != 0",  # a failed meet: the outputs stay as they are
    )


@dataclass(frozen=True)
class _MultiSpec:
    """A multi-tensor kernel of an exchange (``optim_kernels.multi_source``'s pieces)."""

    what: str
    dtype: np.dtype
    st: str  #: the C type of the slots' elements
    slots: tuple[str, ...]
    read_only: tuple[str, ...]
    params: str
    prologue: str
    body: str
    stop: str = ""

    @property
    def name(self) -> str:
        return f"netcl_peer_{self.what}"

    def source(self, arity: int) -> str:
        preamble = storage_pragmas([self.dtype]) + _ARITHMETIC.get(compute_ctype(self.dtype), "")
        types = {"st": self.st, "pragmas": preamble}
        return multi_source(
            self.name, self.slots, self.params, self.prologue, self.body, types, arity, self.read_only, stop=self.stop
        )


def _meet_kernel(device: Device, rank: int, size: int):
    def source() -> str:
        publish = "".join(f"    netcl_store_release_sys(w{p} + {rank}, t);\n" for p in range(size) if p != rank)
        wait = "".join(_WAIT.format(peer=p, failed=_FAILED) for p in range(size) if p != rank)
        windows = ", ".join(f"__global uint* w{r}" for r in range(size))
        text = _MEET.format(windows=windows, rank=rank, failed=_FAILED, publish=publish, wait=wait)
        return INDEX_CHECK_C + _SYNC_C + text

    scalar_types = [None] * (size + 1) + [np.int32, np.uint64]
    return get_kernel(("peer", "meet", rank, size), device, source, "netcl_peer_meet", scalar_types).kernel
