"""What a profile records (``Record``, as reported) and what it reads back (``ProfilerEvent``).

A record keeps the command's ``cl.Event``; its device times are read only when the profile is
asked for events, a table or a trace (``resolve``), which waits for the commands to finish. A
device's clock is not the host's: each device's offset is found from the commands' QUEUED
timestamps, which the driver takes inside the host's enqueue call (so ``host start <= QUEUED
+ offset <= host end`` for every command); the intersection of those windows, or where a driver
breaks it the median of their midpoints, places the device events on the host timeline.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

from netcl.core.profile_hooks import HOST, RANGE

_PROFILING = cl.command_queue_properties.PROFILING_ENABLE


@dataclass(eq=False)
class Record:
    """One reported command or host range, as the hook handed it over (times: host ns)."""

    kind: str
    name: str
    queue: Any
    event: Any
    start_ns: int
    end_ns: int
    thread: int
    global_size: tuple[int, ...] | None
    shapes: tuple[tuple[int, ...], ...] | None
    local_size: tuple[int, ...] | None = None


@dataclass(eq=False)
class ProfilerEvent:
    """One recorded kernel, copy, fill or host range; times in microseconds from the profile's start.

    ``host_start`` / ``host_end`` bracket the host call that enqueued the command (setting its
    arguments and enqueueing; a blocking copy's wait included) or the range. ``device_start`` /
    ``device_end`` are when the device ran it, on the host's timeline (None for host ranges, for
    commands on a queue without profiling, and on the NumPy backend; for host work on a device's
    memory, kind ``"host"``, its host times). ``device`` names the device,
    ``queue`` numbers its queues in order of first use. ``shapes`` are the shapes of the Tensor
    arguments (``record_shapes=True`` only; launches that pass raw buffers have none).
    ``global_size`` / ``local_size``: a kernel's sizes (``local_size`` None: the driver chose).
    """

    name: str
    kind: str
    host_start: float
    host_end: float
    thread: int
    device_start: float | None = None
    device_end: float | None = None
    device: str | None = None
    queue: int | None = None
    global_size: tuple[int, ...] | None = None
    local_size: tuple[int, ...] | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None
    #: host ranges: the device time of the commands enqueued inside (on the NumPy backend: the host time)
    device_time_inside: float = 0.0
    #: host time of this event minus that of the events directly inside it (ranges contain others)
    self_host_time: float = 0.0

    @property
    def host_time(self) -> float:
        return self.host_end - self.host_start

    @property
    def device_time(self) -> float | None:
        """Device microseconds: the command's run time, or for a range the device time inside it."""
        if self.kind == RANGE:
            return self.device_time_inside
        if self.device_start is None or self.device_end is None:
            return None
        return self.device_end - self.device_start

    @property
    def self_device_time(self) -> float:
        """The device time of the command itself (0 for ranges, which run nothing on the device)."""
        if self.kind == RANGE:
            return 0.0
        return self.device_time or 0.0


def resolve(records: Sequence[Record], origin_ns: int, host_clock: bool) -> list[ProfilerEvent]:
    """``records`` as ``ProfilerEvent``s (waits for their commands), nested, sorted by host start.

    ``origin_ns`` is the host time that becomes 0; ``host_clock`` (a profile of the NumPy
    backend) makes a range's device time its host time.
    """
    timings = [_device_ns(r) for r in records]
    offsets = _clock_offsets(records, timings)
    names: dict[int, str] = {}
    queue_index: dict[int, int] = {}
    events = []
    for record, timing in zip(records, timings, strict=True):
        event = ProfilerEvent(
            record.name,
            record.kind,
            (record.start_ns - origin_ns) / 1e3,
            (record.end_ns - origin_ns) / 1e3,
            record.thread,
            global_size=record.global_size,
            local_size=record.local_size,
            shapes=record.shapes,
        )
        if record.queue is not None:
            key = record.queue.int_ptr
            event.queue = queue_index.setdefault(key, len(queue_index))
            device_key = record.queue.device.int_ptr
            if device_key not in names:
                names[device_key] = record.queue.device.name.strip()
            event.device = names[device_key]
            if record.kind == HOST:  # host work on the device's memory: the device is busy while the host is
                event.device_start, event.device_end = event.host_start, event.host_end
            elif timing is not None:
                offset = offsets[device_key]
                event.device_start = (timing[1] + offset - origin_ns) / 1e3
                event.device_end = (timing[2] + offset - origin_ns) / 1e3
        events.append(event)
    events.sort(key=lambda e: (e.host_start, -e.host_end))
    _nest(events, host_clock)
    return events


def _device_ns(record: Record) -> tuple[int, int, int] | None:
    """(queued, start, end) on the device clock, or None when the command has no profiling info."""
    if record.event is None or record.queue is None or not record.queue.properties & _PROFILING:
        return None
    try:
        record.event.wait()
        profile = record.event.profile
        return profile.queued, profile.start, profile.end
    except cl.Error:
        return None


def _clock_offsets(records: Sequence[Record], timings: Sequence[Any]) -> dict[int, float]:
    """Device int_ptr -> host ns minus device ns (see the module docstring)."""
    windows: dict[int, list[tuple[int, int]]] = {}
    for record, timing in zip(records, timings, strict=True):
        if timing is not None:
            queued = timing[0]
            windows.setdefault(record.queue.device.int_ptr, []).append(
                (record.start_ns - queued, record.end_ns - queued)
            )
    offsets = {}
    for device, spans in windows.items():
        low, high = max(s for s, _ in spans), min(e for _, e in spans)
        offsets[device] = (low + high) / 2 if low <= high else statistics.median((s + e) / 2 for s, e in spans)
    return offsets


def _nest(events: list[ProfilerEvent], host_clock: bool) -> None:
    """Fill ranges' device time inside and every event's self host time (per thread, by containment)."""
    open_ranges: dict[int, list[ProfilerEvent]] = {}
    for event in events:
        event.self_host_time = event.host_time
        stack = open_ranges.setdefault(event.thread, [])
        while stack and stack[-1].host_end < event.host_end:
            stack.pop()  # a range that ended before this event did is not its parent
        if stack:
            stack[-1].self_host_time -= event.host_time
            if event.kind != RANGE:
                for outer in stack:
                    outer.device_time_inside += event.self_device_time
        if event.kind == RANGE:
            stack.append(event)
    if host_clock:
        for event in events:
            if event.kind == RANGE:
                event.device_time_inside = event.host_time
