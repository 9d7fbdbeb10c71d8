"""GPU timing: ``PerfCounter`` (named sections with history), ``timing_region``, ``event_based_timing``.

On an OpenCL queue with profiling enabled (every netcl device queue and ``Stream`` has it),
a timed region is bracketed by two commands on the queue: a marker (a barrier on an
out-of-order queue) at entry and a marker at exit. Its time is ``exit.END - entry.END``:
on the device's clock, from the moment everything enqueued before the region had finished
to the moment everything enqueued inside it had finished. That is GPU time, including
any idle gaps while the host was still enqueueing.

Without profiling events (the NumPy backend, or a queue created without
``PROFILING_ENABLE``) the region falls back to host wall-clock time (after a
``queue.finish()`` at both ends on OpenCL), and reports say "wall-clock".

Program builds are kept out: when the program cache builds (or loads from disk) a program
while a region is open on the building thread, a marker pair brackets the build on the
region's queue and the device time between them (the device idles while the host compiles)
is subtracted; on the wall clock the build's host time is. ``TimingRegion.builds`` and the
report say how many builds happened inside (see benchmarks/RESULTS.md, "Measurements moved out of
source docstrings", perf.py).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import pyopencl as cl

from netcl.core.devices import Device, get_device
from netcl.runtime.cache import BUILD_LISTENERS

EVENTS, WALL = "events", "wall-clock"
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE
_OUT_OF_ORDER = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE


@dataclass
class TimingRegion:
    """The result of one timed region; ``elapsed_ms`` is filled when the region exits."""

    name: str
    clock: str
    nbytes: int | None = None
    elapsed_ms: float | None = None
    #: programs built (or loaded from disk) inside the region; their time is not in ``elapsed_ms``
    builds: int = 0
    build_ms: float = 0.0

    @property
    def gbps(self) -> float | None:
        """Bandwidth in GB/s (1e9 bytes per second) when ``nbytes`` was given."""
        if self.nbytes is None or not self.elapsed_ms:
            return None
        return self.nbytes / (self.elapsed_ms * 1e6)


@dataclass
class SectionStats:
    """Summary of one ``PerfCounter`` section."""

    name: str
    calls: int = 0
    min_ms: float | None = None
    avg_ms: float | None = None
    max_ms: float | None = None
    total_ms: float = 0.0
    gbps: float | None = None
    clocks: set[str] = field(default_factory=set)
    #: program builds inside the section's calls (excluded from the times above)
    builds: int = 0


_OPEN = threading.local()  # .brackets: the regions open on this thread, innermost last


def _on_build(phase: str) -> None:
    for bracket in getattr(_OPEN, "brackets", ()):
        bracket.on_build(phase)


BUILD_LISTENERS.append(_on_build)


class _Bracket:
    """Start/stop of one timed region on a queue (events) or on the host clock."""

    __slots__ = ("queue", "clock", "start", "stop_event", "wall", "builds", "pauses", "build_wall", "_build_start")

    def __init__(self, queue: cl.CommandQueue | None) -> None:
        self.queue = queue
        self.clock = EVENTS if queue is not None and queue.properties & _PROFILING else WALL
        self.start: Any = None
        self.stop_event: cl.Event | None = None
        self.wall: float | None = None
        self.builds = 0
        self.pauses: list[tuple[cl.Event, cl.Event]] = []
        self.build_wall = 0.0
        self._build_start: tuple[Any, float] | None = None

    def enter(self) -> None:
        if self.clock == EVENTS:
            self.start = self._marker()
        else:
            if self.queue is not None:
                self.queue.finish()
            self.start = time.perf_counter()
        if not hasattr(_OPEN, "brackets"):
            _OPEN.brackets = []
        _OPEN.brackets.append(self)

    def exit(self) -> None:
        if self in _OPEN.brackets:
            _OPEN.brackets.remove(self)
        if self.clock == EVENTS:
            self.stop_event = cl.enqueue_marker(self.queue)
            self.queue.flush()
        else:
            if self.queue is not None:
                self.queue.finish()
            self.wall = (time.perf_counter() - self.start) * 1e3

    def _marker(self) -> cl.Event:
        ooo = self.queue.properties & _OUT_OF_ORDER
        return cl.enqueue_barrier(self.queue) if ooo else cl.enqueue_marker(self.queue)

    def on_build(self, phase: str) -> None:
        """A program build starts/ends on this thread while the region is open."""
        if phase == "start":
            self.builds += 1
            pause = self._marker() if self.clock == EVENTS else None
            if pause is not None:
                self.queue.flush()  # submitted now: its end is when the work before the build finished
            self._build_start = (pause, time.perf_counter())
        elif self._build_start is not None:
            pause, began = self._build_start
            self._build_start = None
            self.build_wall += (time.perf_counter() - began) * 1e3
            if pause is not None:
                self.pauses.append((pause, self._marker()))

    def excluded_ms(self) -> float:
        """Device (events) or host (wall-clock) milliseconds spent on builds inside the region."""
        if self.clock == WALL:
            return self.build_wall
        return sum((resume.profile.end - pause.profile.end) * 1e-6 for pause, resume in self.pauses)

    def elapsed_ms(self) -> float:
        """Milliseconds of the region without its builds (waits for the device when needed)."""
        if self.clock == WALL:
            return self.wall - self.build_wall
        self.stop_event.wait()
        return (self.stop_event.profile.end - self.start.profile.end) * 1e-6 - self.excluded_ms()


def _resolve_queue(queue: Any, device: Device | str | None) -> cl.CommandQueue | None:
    if queue is None:
        return get_device(device).queue
    if isinstance(queue, cl.CommandQueue):
        return queue
    return getattr(queue, "queue", None)  # a Stream or a Device


class PerfCounter:
    """Named timing sections with per-call history; ``report`` prints min/avg/max ms and GB/s.

    ``names`` declares the sections (``section`` with another name raises ``KeyError``);
    None allows any name. ``queue`` (a queue, ``Stream`` or ``Device``; default: the
    default device's queue) is where sections are timed unless ``section`` names another.
    Event timestamps are read lazily, so timing a section does not block the host.
    """

    def __init__(self, names: Iterable[str] | None = None, queue: Any = None, device: Device | str | None = None):
        self.names: list[str] | None = list(names) if names is not None else None
        self.queue = _resolve_queue(queue, device)
        self._records: dict[str, list[tuple[_Bracket, int | None]]] = {n: [] for n in self.names or ()}

    @contextmanager
    def section(self, name: str, nbytes: int | None = None, queue: Any = None) -> Iterator[None]:
        """Time the device work enqueued inside the block; ``nbytes`` (moved per call) gives GB/s."""
        if self.names is not None and name not in self._records:
            raise KeyError(f"unknown section {name!r}; this PerfCounter has {self.names}")
        bracket = _Bracket(self.queue if queue is None else _resolve_queue(queue, None))
        bracket.enter()
        try:
            yield
        finally:
            bracket.exit()
        self._records.setdefault(name, []).append((bracket, nbytes))

    def stats(self) -> dict[str, SectionStats]:
        """Per-section statistics (waits for pending sections to finish on the device)."""
        result = {}
        for name, records in self._records.items():
            stats = SectionStats(name)
            times = [b.elapsed_ms() for b, _ in records]
            if times:
                stats.calls = len(times)
                stats.min_ms, stats.max_ms = min(times), max(times)
                stats.total_ms = sum(times)
                stats.avg_ms = stats.total_ms / len(times)
                stats.clocks = {b.clock for b, _ in records}
                stats.builds = sum(b.builds for b, _ in records)
                timed = [(t, n) for t, (_, n) in zip(times, records, strict=True) if n is not None]
                if timed and sum(t for t, _ in timed) > 0:
                    stats.gbps = sum(n for _, n in timed) / (sum(t for t, _ in timed) * 1e6)
            result[name] = stats
        return result

    def report(self, stream: IO[str] | None = sys.stdout) -> str:
        """Print (to ``stream``; None: don't) and return a table of every section."""
        stats = self.stats()
        clocks = set().union(*(s.clocks for s in stats.values())) if stats else set()
        width = max([len("section"), *(len(n) for n in stats)])
        lines = [
            f"{'section':<{width}}  {'calls':>5}  {'min ms':>9}  {'avg ms':>9}  {'max ms':>9}  {'GB/s':>8}  clock",
        ]
        for s in stats.values():
            lines.append(
                f"{s.name:<{width}}  {s.calls:>5}  {_fmt(s.min_ms):>9}  {_fmt(s.avg_ms):>9}  {_fmt(s.max_ms):>9}  "
                f"{_fmt(s.gbps, 2):>8}  {'/'.join(sorted(s.clocks)) or '-'}"
            )
        if WALL in clocks:
            lines.append(
                "note: wall-clock = host time (no OpenCL profiling events on this backend/queue); "
                "it includes Python overhead"
            )
        if EVENTS in clocks:
            lines.append("note: events = GPU time between OpenCL profiling markers")
        built = {s.name: s.builds for s in stats.values() if s.builds}
        if built:
            listed = ", ".join(f"{name} {count}" for name, count in built.items())
            lines.append(f"note: program builds happened inside sections ({listed}); their time is excluded")
        text = "\n".join(lines) + "\n"
        if stream is not None:
            stream.write(text)
        return text

    def reset(self) -> None:
        """Forget every recorded call (the declared names stay)."""
        self._records = {n: [] for n in self.names or ()}


@contextmanager
def timing_region(
    name: str, queue: Any = None, device: Device | str | None = None, nbytes: int | None = None
) -> Iterator[TimingRegion]:
    """Time one block; the yielded ``TimingRegion`` gets ``elapsed_ms`` on exit (waits for the device)."""
    bracket = _Bracket(_resolve_queue(queue, device))
    region = TimingRegion(name, bracket.clock, nbytes)
    bracket.enter()
    try:
        yield region
    finally:
        bracket.exit()
    region.elapsed_ms = bracket.elapsed_ms()
    region.builds = bracket.builds
    region.build_ms = bracket.excluded_ms()


def enable_profiling(device: Device | str | None = None) -> bool:
    """The API reference's switch for event profiling; True when ``device``'s queue has it.

    netcl creates every device queue and ``Stream`` with ``PROFILING_ENABLE`` already, so there
    is nothing to turn on: this checks it and returns False on the NumPy backend (or a foreign
    queue without profiling), where ``PerfCounter`` and ``timing_region`` use the wall clock.
    """
    queue = get_device(device).queue
    return bool(queue is not None and queue.properties & _PROFILING)


def event_based_timing(queue: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Run ``fn(*args, **kwargs)``; return its result and the ms of the device work it enqueued.

    ``queue`` None means the default device's queue; the NumPy backend uses wall-clock time.
    """
    with timing_region(getattr(fn, "__name__", "fn"), queue) as region:
        result = fn(*args, **kwargs)
    return result, region.elapsed_ms


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
