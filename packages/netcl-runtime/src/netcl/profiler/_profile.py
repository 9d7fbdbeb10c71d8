"""``profile``: records the device work of a block; ``record_function``: a named host range."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence
from contextlib import ContextDecorator
from typing import Any

from netcl.core import Device, Tensor, get_device, profile_hooks
from netcl.profiler._events import ProfilerEvent, Record, resolve
from netcl.profiler._table import EventList, key_averages
from netcl.profiler._trace import write_chrome_trace

NOT_STARTED, RECORDING, FINISHED = "not started", "recording", "finished"


class profile:  # noqa: N801 - torch.profiler.profile's name
    """Records every kernel, copy and fill that netcl enqueues while it is active; a context manager.

    ``with profile() as prof: ...`` records, from every thread, each kernel launched by eager
    ops, jit-compiled functions, graph replays, GEMMs and convolutions (everything that goes
    through ``netcl.runtime.launch``, prepared launches and ``Graph.execute``), the device copies
    and fills of ``netcl.runtime.launch``, and ``Tensor``'s host<->device copies
    (``from_host``: "Memcpy HtoD", ``to_host``: "Memcpy DtoH", ``copy``: "Memcpy DtoD",
    ``zeros``: "Memset") and the host BLAS products of CPU OpenCL devices ("host_matmul", kind
    ``"host"``: device time = host time), each with the host time of the call that enqueued it and the device
    time its profiling event measured; and the host ranges of ``record_function`` (and one per
    ``Graph.execute``). Then ``prof.key_averages().table(sort_by="device_time")`` prints the
    per-name table and ``prof.export_chrome_trace(path)`` writes a trace for Perfetto.

    ``device``: None records on every device; a ``Device`` or spec only the commands on queues
    of its OpenCL context. The NumPy backend (``"cpu"``) launches no kernels, so a profile of it
    (or ``device=None`` with the NumPy backend as the default device) records only host ranges,
    and their device time is their host time: the backend computes on the host. ``record_shapes``
    keeps the shapes of the Tensor arguments of each command (launches that pass raw buffers
    have none) and makes ``key_averages()`` group by name, shapes and global size.

    Profiles nest: each one active records everything enqueued while it is. A profile records
    once (entering it again raises ``RuntimeError``); nothing is recorded after it exits.
    While one is active, prepared launches and replays take pyopencl's enqueue with an event
    instead of their event-free fast paths, so host times are those of the profiled path.
    Device times are read when first asked for (waiting for the commands to finish).
    """

    def __init__(self, device: Device | str | None = None, record_shapes: bool = False) -> None:
        self.device = None if device is None else get_device(device)
        self.record_shapes = bool(record_shapes)
        #: whether host ranges' device time is their host time (a profile of the NumPy backend)
        self.host_clock = not (self.device or get_device()).has_queue
        self.state = NOT_STARTED
        self._context = (
            self.device.context.int_ptr if self.device is not None and self.device.kind == "opencl" else None
        )
        self._queue_kept: dict[int, bool] = {}
        self._records: list[Record] = []
        self._lock = threading.Lock()
        self._start_ns = 0
        self._events: list[ProfilerEvent] | None = None

    # ---- recording ------------------------------------------------------------------------
    def start(self) -> None:
        """Begin recording (``__enter__`` does this)."""
        if self.state != NOT_STARTED:
            raise RuntimeError(f"this profile is {self.state}; a profile records once, make a new one")
        self.state = RECORDING
        self._start_ns = profile_hooks.now()
        profile_hooks.ACTIVE.append(self)

    def stop(self) -> None:
        """Stop recording (``__exit__`` does this); later commands are not recorded."""
        if self.state == RECORDING:
            if self in profile_hooks.ACTIVE:
                profile_hooks.ACTIVE.remove(self)
            self.state = FINISHED

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def add(
        self,
        kind: str,
        name: str,
        queue: Any,
        event: Any,
        start_ns: int,
        end_ns: int,
        thread: int,
        global_size: Sequence[int] | None,
        args: Sequence[Any],
        local_size: Sequence[int] | None = None,
    ) -> None:
        """Called by ``netcl.core.profile_hooks.report`` for each command or range (see there)."""
        if self.device is not None and queue is not None and not self._keeps(queue):
            return
        shapes = tuple(a.shape for a in args if isinstance(a, Tensor)) or None if self.record_shapes else None
        size = None if global_size is None else tuple(global_size)
        local = None if local_size is None else tuple(local_size)
        record = Record(kind, name, queue, event, start_ns, end_ns, thread, size, shapes, local)
        with self._lock:
            if self.state == RECORDING:
                self._records.append(record)
                self._events = None

    def _keeps(self, queue: Any) -> bool:
        """Whether a command on ``queue`` belongs to this profile's device."""
        key = queue.int_ptr
        kept = self._queue_kept.get(key)
        if kept is None:
            kept = self._queue_kept[key] = self._context is not None and queue.context.int_ptr == self._context
        return kept

    # ---- results --------------------------------------------------------------------------
    def events(self) -> list[ProfilerEvent]:
        """Every recorded event, in host start order (waits for the recorded commands to finish)."""
        with self._lock:
            records = list(self._records)
            events = self._events
        if events is None:
            events = resolve(records, self._start_ns, self.host_clock)
            with self._lock:
                if len(self._records) == len(records):
                    self._events = events
        return events

    def key_averages(self, group_by_input_shape: bool | None = None) -> EventList:
        """The events grouped by name (and shapes and global size when ``group_by_input_shape``;
        None: when ``record_shapes``), in first-seen order; ``.table(sort_by=..., row_limit=...)``
        prints them."""
        by_shapes = self.record_shapes if group_by_input_shape is None else bool(group_by_input_shape)
        return key_averages(self.events(), by_shapes)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the events to ``path`` as a Chrome trace (JSON; open it in https://ui.perfetto.dev)."""
        write_chrome_trace(self.events(), path)

    def __repr__(self) -> str:
        where = "every device" if self.device is None else repr(self.device)
        return f"<netcl.profiler.profile {self.state} on {where}: {len(self._records)} records>"


class record_function(ContextDecorator):  # noqa: N801 - torch.profiler.record_function's name
    """A named host range in every active profile: ``with record_function("forward"): ...``.

    The range shows on the host track of the trace around what ran inside it, and as a row of
    the table whose device time is that of the commands enqueued inside it (on this thread).
    It also works as a decorator. Without an active profile it records nothing.
    """

    def __init__(self, name: str) -> None:
        self.name = str(name)
        self._starts: list[int] = []

    def __enter__(self) -> record_function:
        self._starts.append(profile_hooks.now() if profile_hooks.ACTIVE else 0)
        return self

    def __exit__(self, *exc: Any) -> None:
        start = self._starts.pop()
        if start and profile_hooks.ACTIVE:
            profile_hooks.report(profile_hooks.RANGE, self.name, None, None, start)


def merged_events(profiles: Sequence[profile]) -> list[ProfilerEvent]:
    """The events of several profiles on one timeline (microseconds from the earliest start)."""
    if not profiles:
        return []
    origin = min(p._start_ns for p in profiles)
    merged = []
    for p in profiles:
        shift = (p._start_ns - origin) / 1e3
        for event in p.events():
            moved = dataclasses.replace(event, host_start=event.host_start + shift, host_end=event.host_end + shift)
            if event.device_start is not None and event.device_end is not None:
                moved.device_start, moved.device_end = event.device_start + shift, event.device_end + shift
            merged.append(moved)
    merged.sort(key=lambda e: (e.host_start, -e.host_end))
    return merged


def export_chrome_trace(profiles: Sequence[profile], path: str | os.PathLike[str]) -> None:
    """One Chrome trace of several profiles (e.g. one per measured call) on one timeline."""
    write_chrome_trace(merged_events(profiles), path)


def key_averages_of(profiles: Sequence[profile], group_by_input_shape: bool = False) -> EventList:
    """``key_averages()`` over the events of several profiles together."""
    return key_averages(merged_events(profiles), bool(group_by_input_shape))
