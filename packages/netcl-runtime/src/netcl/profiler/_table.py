"""``key_averages()``: events grouped by name (and shapes), and the table torch users know."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from netcl.profiler._events import ProfilerEvent

#: sort_by key -> (attribute, description); "device_time" is the total, as in the docs' example
SORT_KEYS: dict[str, str] = {
    "device_time": "device_time_total",
    "device_time_total": "device_time_total",
    "self_device_time_total": "self_device_time_total",
    "device_time_avg": "device_time_avg",
    "host_time": "host_time_total",
    "host_time_total": "host_time_total",
    "self_host_time_total": "self_host_time_total",
    "host_time_avg": "host_time_avg",
    "count": "count",
    # torch's names, for habits: CUDA/CPU are the device/host here; torch's "cuda_time" is the average
    "cuda_time_total": "device_time_total",
    "self_cuda_time_total": "self_device_time_total",
    "cuda_time": "device_time_avg",
    "cpu_time_total": "host_time_total",
    "self_cpu_time_total": "self_host_time_total",
    "cpu_time": "host_time_avg",
}


@dataclass(eq=False)
class FunctionEventAvg:
    """The events of one key: name (and shapes, global size when grouped by them), times in µs."""

    key: str
    kind: str
    count: int = 0
    host_time_total: float = 0.0
    self_host_time_total: float = 0.0
    device_time_total: float = 0.0
    self_device_time_total: float = 0.0
    #: events that had a device time (commands on a profiling queue, ranges)
    device_count: int = 0
    shapes: tuple[tuple[int, ...], ...] | None = None
    global_size: tuple[int, ...] | None = None
    events: list[ProfilerEvent] = field(default_factory=list, repr=False)

    @property
    def host_time_avg(self) -> float:
        return self.host_time_total / self.count if self.count else 0.0

    @property
    def device_time_avg(self) -> float:
        return self.device_time_total / self.device_count if self.device_count else 0.0

    def add(self, event: ProfilerEvent) -> None:
        self.count += 1
        self.host_time_total += event.host_time
        self.self_host_time_total += event.self_host_time
        device = event.device_time
        if device is not None:
            self.device_count += 1
            self.device_time_total += device
            self.self_device_time_total += event.self_device_time
        self.events.append(event)


class EventList(list):
    """What ``profile.key_averages()`` returns: ``FunctionEventAvg``s with ``table(...)``."""

    def __init__(self, items: Iterable[FunctionEventAvg], by_shapes: bool = False) -> None:
        super().__init__(items)
        self.by_shapes = by_shapes

    def table(self, sort_by: str | None = None, row_limit: int | None = 100, max_name_column_width: int = 55) -> str:
        """The rows as text: sorted by ``sort_by`` (descending; None keeps first-seen order), at most
        ``row_limit`` of them (None or a negative number: all). Times are totals over the calls
        unless the column says "avg"; "Self" excludes what ran inside a host range.

        Raises ``ValueError`` naming the accepted keys when ``sort_by`` is not one of ``SORT_KEYS``.
        """
        rows = list(self)
        if sort_by is not None:
            if sort_by not in SORT_KEYS:
                raise ValueError(f"sort_by={sort_by!r} is not a sort key; choose one of {', '.join(SORT_KEYS)}")
            attribute = SORT_KEYS[sort_by]
            rows.sort(key=lambda r: getattr(r, attribute), reverse=True)
        if row_limit is not None and row_limit >= 0:
            rows = rows[:row_limit]
        return _format(rows, list(self), self.by_shapes, max_name_column_width)

    def __str__(self) -> str:
        return self.table()


def key_averages(events: Iterable[ProfilerEvent], by_shapes: bool) -> EventList:
    """Group ``events`` by name, or by (name, shapes, global size) when ``by_shapes``."""
    groups: dict[tuple, FunctionEventAvg] = {}
    for event in events:
        key = (event.name, event.kind, event.shapes, event.global_size) if by_shapes else (event.name, event.kind)
        group = groups.get(key)
        if group is None:
            group = groups[key] = FunctionEventAvg(event.name, event.kind)
            if by_shapes:
                group.shapes, group.global_size = event.shapes, event.global_size
        group.add(event)
    return EventList(groups.values(), by_shapes)


def format_time(us: float) -> str:
    """``12.345us``, ``1.234ms`` or ``1.234s``, as torch's tables print times."""
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _format(rows: list[FunctionEventAvg], every: list[FunctionEventAvg], by_shapes: bool, width: int) -> str:
    host_total = sum(r.self_host_time_total for r in every)
    device_total = sum(r.self_device_time_total for r in every)
    name_width = max([len("Name"), *(min(len(r.key), width) for r in rows)])
    headers = [
        "Self host %",
        "Self host",
        "Host total",
        "Host avg",
        "Self device",
        "Self device %",
        "Device total",
        "Device avg",
        "# of Calls",
    ]
    if by_shapes:
        headers += ["Input Shapes", "Global Size"]
    cells = []
    for r in rows:
        device_known = r.device_count > 0
        cell = [
            _percent(r.self_host_time_total, host_total),
            format_time(r.self_host_time_total),
            format_time(r.host_time_total),
            format_time(r.host_time_avg),
            format_time(r.self_device_time_total) if device_known else "-",
            _percent(r.self_device_time_total, device_total) if device_known else "-",
            format_time(r.device_time_total) if device_known else "-",
            format_time(r.device_time_avg) if device_known else "-",
            str(r.count),
        ]
        if by_shapes:
            cell += [str(list(r.shapes or ())), str(list(r.global_size or ()))]
        cells.append(cell)
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers)]
    rule = "-" * name_width + "  " + "  ".join("-" * w for w in widths)
    lines = [rule, f"{'Name':<{name_width}}  " + "  ".join(f"{h:>{w}}" for h, w in zip(headers, widths, strict=True))]
    lines.append(rule)
    for r, cell in zip(rows, cells, strict=True):
        name = r.key if len(r.key) <= name_width else r.key[: name_width - 3] + "..."
        lines.append(f"{name:<{name_width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cell, widths, strict=True)))
    lines.append(rule)
    lines.append(f"Self host time total: {format_time(host_total)}")
    lines.append(f"Self device time total: {format_time(device_total)}")
    return "\n".join(lines) + "\n"


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.2f}%" if whole > 0 else "0.00%"
