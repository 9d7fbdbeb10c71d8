"""The process group: MPI world, this rank's device, and the timeout every collective waits with.

Nothing here blocks without a deadline: even ``init`` exchanges host names with a non-blocking
allgather polled against the timeout, so a rank that died before ``init`` is an error, not a hang.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netcl.core import Device, devices, get_device, set_device
from netcl.runtime.distributed.errors import DistributedError, DistributedTimeoutError

TIMEOUT_ENV = "NETCL_DIST_TIMEOUT"
DEFAULT_TIMEOUT = 300.0
_HOSTNAME_BYTES = 256


def mpi() -> Any:
    """The ``mpi4py.MPI`` module, or an ImportError naming the extra that provides it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "netcl.runtime.distributed needs mpi4py and an MPI library: pip install 'netcl-runtime[mpi]' "
            f"(mpi4py and the mpich wheel); import failed with: {exc}"
        ) from exc
    return MPI


@dataclass(frozen=True)
class DistInfo:
    """What ``init`` returns: this process's place in the group and its device."""

    rank: int
    world_size: int
    local_rank: int  #: rank among the processes on this host
    local_size: int  #: processes on this host
    device: Device
    timeout: float  #: seconds a collective may wait before DistributedTimeoutError

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass
class _World:
    comm: Any  #: blocking-style collectives (broadcast, all_gather, barrier, objects), in program order
    exchange_comm: Any  #: the alltoall phase of all-reduces
    gather_comm: Any  #: the allgather phase of all-reduces
    info: DistInfo
    choice_comm: Any = None  #: tuned choices agreed at first use (netcl.runtime.tune.agree)
    broken: str | None = None
    #: all-reduces in flight, in creation order; each posts its alltoall (allgather) only when every
    #: earlier one has posted its own, so every rank posts them in the same order on each communicator
    active: list[Any] = field(default_factory=list)
    next_seq: int = 0
    exchange_turn: int = 0
    gather_turn: int = 0


_world: _World | None = None


def timeout_from_env() -> float:
    """``NETCL_DIST_TIMEOUT`` in seconds (default 300); ValueError naming the variable if malformed."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={text!r}: expected a number of seconds > 0") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{TIMEOUT_ENV}={text!r}: expected a number of seconds > 0")
    return value


def path_choice(variable: str) -> str:
    """A path switch such as ``NETCL_PEER_ALLREDUCE``: "off" (0), "on" (1: required) or "auto" (unset);
    ValueError naming the variable for anything else."""
    text = os.environ.get(variable, "").strip().lower()
    if text in ("", "auto"):
        return "auto"
    if text in ("0", "off", "false", "no"):
        return "off"
    if text in ("1", "on", "true", "yes"):
        return "on"
    raise ValueError(f"{variable}={text!r}: expected 0 (never), 1 (required) or unset/auto")


def init(device: Device | str | None = None, timeout: float | None = None) -> DistInfo:
    """Join the MPI process group; pick and set this rank's device; return a ``DistInfo``.

    Device: ``device`` if given; else, on a host with OpenCL GPUs (and ``NETCL_DEVICE`` unset or
    ``gpu``/``opencl``), GPU ``local_rank % n_gpus``; else the default device (``NETCL_DEVICE`` or
    automatic selection). The choice becomes the process default (``set_device``).
    ``timeout`` (seconds, default ``NETCL_DIST_TIMEOUT`` or 300) bounds every collective.
    Calling ``init`` again returns the existing group (a different ``device`` is an error).
    """
    global _world
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if _world is not None:
        if device is not None and get_device(device) is not _world.info.device:
            raise DistributedError(
                f"init(device={device!r}) but this rank was initialized on {_world.info.device!r}; "
                "a process has one device in the group"
            )
        return _world.info
    limit = float(timeout) if timeout is not None else timeout_from_env()
    MPI = mpi()
    world = MPI.COMM_WORLD
    # our own communicators: user traffic on COMM_WORLD cannot interleave with ours
    dups = [world.Idup() for _ in range(4)]
    _poll([r for _, r in dups], f"init (communicator setup, {world.size} ranks)", limit, world.rank, world.size)
    comm, exchange_comm, gather_comm, choice_comm = (c for c, _ in dups)
    names = np.zeros((comm.size, _HOSTNAME_BYTES), np.uint8)
    mine = np.frombuffer(socket.gethostname().encode()[:_HOSTNAME_BYTES].ljust(_HOSTNAME_BYTES, b"\0"), np.uint8)
    request = comm.Iallgather([mine, MPI.BYTE], [names, MPI.BYTE])
    _poll([request], "init (host names)", limit, comm.rank, comm.size)
    same_host = [bool(np.array_equal(names[r], mine)) for r in range(comm.size)]
    local_rank = sum(same_host[: comm.rank])
    chosen = _pick_device(device, local_rank)
    set_device(chosen)
    info = DistInfo(comm.rank, comm.size, local_rank, sum(same_host), chosen, limit)
    _world = _World(comm, exchange_comm, gather_comm, info, choice_comm=choice_comm)
    return info


def _pick_device(device: Device | str | None, local_rank: int) -> Device:
    if device is not None:
        return get_device(device)
    env = os.environ.get("NETCL_DEVICE", "").strip().lower()
    gpus = [d for d in devices() if d.is_gpu]
    if gpus and env in ("", "gpu", "opencl"):
        return gpus[local_rank % len(gpus)]
    return get_device()


def is_initialized() -> bool:
    return _world is not None


def is_usable() -> bool:
    """Whether the group is initialized and no collective has failed since (``world()`` returns it)."""
    return _world is not None and _world.broken is None


def world() -> _World:
    """The initialized group; ``DistributedError`` before ``init`` or after a failed collective."""
    if _world is None:
        raise DistributedError("netcl.runtime.distributed is not initialized: call init() first (under mpiexec)")
    if _world.broken is not None:
        raise DistributedError(f"the process group is unusable after an earlier failure: {_world.broken}")
    return _world


def get_rank() -> int:
    return world().info.rank


def get_world_size() -> int:
    return world().info.world_size


def wait_requests(requests: Sequence[Any], what: str) -> None:
    """Poll MPI ``requests`` until all complete; ``DistributedTimeoutError`` at the group's timeout."""
    MPI = mpi()
    reqs = list(requests)
    deadline = Deadline()
    while not MPI.Request.Testall(reqs):
        deadline.check(what)


def mark_broken(reason: str) -> None:
    """Make every later collective raise ``reason`` at once (after a timeout or a failed exchange)."""
    if _world is not None and _world.broken is None:
        _world.broken = reason


class Deadline:
    """Polling against a timeout: ``check(what)`` raises once it has passed.

    MPI moves a large message along only inside MPI calls (each test copies a slice of it), so
    the poller first spins: for ``SPIN_SECONDS`` it only yields the CPU (``sleep(0)``). After that
    the peer is evidently busy elsewhere, and the poller sleeps 50 us between polls, so a waiting
    rank leaves the CPU to ranks that still compute. A timeout marks the group broken: later
    collectives fail at once instead of waiting again.
    """

    SPIN_SECONDS = 0.05

    def __init__(self, timeout: float | None = None, rank: int | None = None, size: int | None = None) -> None:
        if timeout is None or rank is None:
            info = world().info
            timeout, rank, size = info.timeout, info.rank, info.world_size
        self.timeout, self.rank, self.size = timeout, rank, size
        self.start = time.monotonic()

    def check(self, what: str) -> None:
        waited = time.monotonic() - self.start
        time.sleep(0 if waited < self.SPIN_SECONDS else 5e-5)
        if waited > self.timeout:
            error = DistributedTimeoutError(
                f"{what} timed out after {self.timeout:g} s on rank {self.rank} of {self.size}: another rank "
                f"died, hangs, or did not call the same collective (set the limit with {TIMEOUT_ENV} or "
                "init(timeout=))"
            )
            mark_broken(str(error))
            raise error


def _poll(requests: Sequence[Any], what: str, limit: float, rank: int, size: int) -> None:
    MPI = mpi()
    reqs = list(requests)
    deadline = Deadline(limit, rank, size)
    while not MPI.Request.Testall(reqs):
        deadline.check(what)
