"""Tuned choices that agree across the processes of a distributed job (the choice authority).

A timed search picks its winner by the clock, so two processes searching the same shape class
can pick different GEMM tiles or split-K factors (or convolution algorithms) and round the same
gradient differently. While ``netcl.runtime.distributed`` is initialized with more than one rank,
every ``tune.select`` goes through ``choose``: at the first use of a key in this process, rank 0
decides (its stored winner, else its search, else the default; nothing on another rank is timed)
and an all-gather hands its choice, as the config's dict, to every rank, which all use it for the
rest of the process. Rank 0 stores what it searched in its tune cache (per device model, as
always), so a later job on that model reuses it; other ranks write nothing.

The exchange is collective: every rank must reach the same keys in the same order, which data
parallel training does (same model, same shapes). A rank that asks for another key gets a
``DistributedError`` naming both keys, on every rank; work that only some ranks run (evaluation on
rank 0, say) must run inside ``local_choices()``, whose new choices are this process's own (a key
agreed earlier keeps its agreed config there too); a rank that reaches a choice alone otherwise
waits for the others on the group's choice communicator until ``NETCL_DIST_TIMEOUT``. Ranks on
different device models cannot share configs: the first exchange finds that out, logs it once, and
each rank then chooses alone.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

log = logging.getLogger("netcl.tune")
_local = threading.local()
#: (device key, choice key) -> the agreed config's dict
_AGREED: dict[tuple[str, str], dict[str, Any]] = {}
_state = {"mixed_models": False}


@contextmanager
def local_choices() -> Iterator[None]:
    """Choices made inside are this process's own (no exchange with the other ranks)."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def active() -> bool:
    """Whether a choice made now is agreed with the other ranks (a group of > 1 ranks, usable,
    on the same device model, outside ``local_choices``)."""
    if getattr(_local, "depth", 0) or _state["mixed_models"]:
        return False
    from netcl.runtime.distributed import group

    return group.is_usable() and group.world().info.world_size > 1


def choose(
    device_key: str,
    key: str,
    decide: Callable[[], Any],
    encode: Callable[[Any], dict[str, Any]],
    decode: Callable[[dict[str, Any]], Any],
) -> Any:
    """Rank 0's choice for ``key`` on every rank (``decide()`` runs on rank 0 only, with nested
    choices local); ``DistributedError`` when the ranks ask for different keys."""
    from netcl.runtime.distributed import get_rank
    from netcl.runtime.distributed.errors import DistributedError

    agreed = _AGREED.get((device_key, key))
    if agreed is not None:
        return decode(dict(agreed))
    rank = get_rank()
    mine: Any = None
    failure: BaseException | None = None
    payload: dict[str, Any] | None = None
    if rank == 0:
        try:
            with local_choices():
                mine = decide()
            payload = dict(encode(mine))
        except Exception as exc:  # the others must not wait for a choice that never comes
            failure = exc
    entries = _all_gather((key, device_key, payload, None if failure is None else repr(failure)), key)
    root_key, root_model, root_payload, root_failure = entries[0]
    if failure is not None:
        raise failure
    if root_failure is not None:
        raise DistributedError(f"rank 0 failed to choose a config for {key!r}: {root_failure}")
    differing = [(r, e[0]) for r, e in enumerate(entries) if e[0] != root_key]
    if differing:
        r, other = differing[0]
        raise DistributedError(
            f"tuned choices must agree across ranks, but rank 0 asked for {root_key!r} while rank {r} asked for "
            f"{other!r}: every rank must run the same ops on the same shapes in the same order while the "
            "distributed group is initialized (run rank-local work inside netcl.runtime.tune.local_choices())"
        )
    if any(e[1] != root_model for e in entries):
        _state["mixed_models"] = True
        log.warning("netcl tune: the ranks run on different device models; each chooses its configs alone")
        return mine if rank == 0 else decide()
    assert root_payload is not None
    _AGREED[(device_key, key)] = root_payload
    return mine if rank == 0 else decode(dict(root_payload))


def agreed(device_key: str, key: str) -> dict[str, Any] | None:
    """The choice agreed for ``key`` earlier in this process, if any (``local_choices`` reuses it, so
    rank-local work on the job's shapes runs the job's configs)."""
    return _AGREED.get((device_key, key))


def agreed_any() -> bool:
    """Whether any choice was agreed in this process (a cheap test before ``agreed``)."""
    return bool(_AGREED)


def _all_gather(obj: Any, key: str) -> list[Any]:
    """Every rank's ``obj`` over the group's choice communicator (its own: a rank that reaches a choice
    alone waits there until the timeout, instead of pairing with another collective)."""
    from netcl.runtime.distributed.group import mpi, wait_requests, world

    MPI = mpi()
    comm = world().choice_comm
    payload = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.zeros(comm.size, np.int64)
    what = (
        f"agreeing the tuned choice {key!r} with the other ranks (every rank must reach it; run rank-local "
        "work inside netcl.runtime.tune.local_choices())"
    )
    wait_requests([comm.Iallgather([np.array([payload.size], np.int64), MPI.INT64_T], [sizes, MPI.INT64_T])], what)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    data = np.empty(int(sizes.sum()), np.uint8)
    wait_requests([comm.Iallgatherv([payload, MPI.BYTE], [data, (sizes.tolist(), offsets.tolist()), MPI.BYTE])], what)
    return [pickle.loads(data[o : o + s].tobytes()) for o, s in zip(offsets, sizes, strict=True)]


def forget() -> None:
    """Drop the agreed choices (tests; a new group)."""
    _AGREED.clear()
    _state["mixed_models"] = False
