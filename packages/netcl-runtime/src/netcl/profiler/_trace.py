"""``export_chrome_trace``: the Chrome trace event format (JSON), which Perfetto and chrome://tracing open.

One process for the host (a track per Python thread: every event's host call, ranges around
what they contain) and one per device (a track per queue: each command when the device ran it),
"X" complete events with microsecond ``ts`` / ``dur`` from the profile's start, and a flow arrow
from each host call to the command it enqueued.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from netcl.profiler._events import ProfilerEvent

#: device processes get pids after this one (the host's is the real pid)
_DEVICE_PID_BASE = 1 << 24


def chrome_trace(events: Sequence[ProfilerEvent]) -> dict[str, Any]:
    """The trace of ``events`` as a JSON-ready dict (``{"traceEvents": [...], ...}``)."""
    host_pid = os.getpid()
    thread_names = {t.ident: t.name for t in threading.enumerate()}
    threads: dict[int, int] = {}
    devices: dict[str, int] = {}
    queues: set[tuple[int, int]] = set()
    out: list[dict[str, Any]] = [_meta("process_name", host_pid, 0, "host (Python)")]
    for flow, event in enumerate(events, start=1):
        tid = threads.get(event.thread)
        if tid is None:
            tid = threads[event.thread] = len(threads) + 1
            name = thread_names.get(event.thread, f"thread {event.thread}")
            out.append(_meta("thread_name", host_pid, tid, name))
        args: dict[str, Any] = {"kind": event.kind}
        if event.device is not None:
            args["device"] = event.device
        if event.global_size is not None:
            args["global size"] = list(event.global_size)
        if event.local_size is not None:
            args["local size"] = list(event.local_size)
        if event.shapes is not None:
            args["shapes"] = [list(s) for s in event.shapes]
        out.append(_complete(event.name, event.kind, host_pid, tid, event.host_start, event.host_time, args))
        if event.device_start is None or event.device_end is None:
            continue
        pid = devices.get(event.device or "")
        if pid is None:
            pid = devices[event.device or ""] = _DEVICE_PID_BASE + len(devices)
            out.append(_meta("process_name", pid, 0, f"device {event.device}"))
        queue_tid = (event.queue or 0) + 1
        if (pid, queue_tid) not in queues:
            queues.add((pid, queue_tid))
            out.append(_meta("thread_name", pid, queue_tid, f"queue {event.queue}"))
        duration = max(event.device_end - event.device_start, 0.0)
        out.append(_complete(event.name, event.kind, pid, queue_tid, event.device_start, duration, args))
        flow_start = (event.host_start + event.host_end) / 2
        out.append({"ph": "s", "id": flow, "cat": "launch", "name": "launch", "pid": host_pid, "tid": tid,
                    "ts": flow_start})  # fmt: skip
        out.append({"ph": "f", "bp": "e", "id": flow, "cat": "launch", "name": "launch", "pid": pid,
                    "tid": queue_tid, "ts": event.device_start})  # fmt: skip
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(events: Sequence[ProfilerEvent], path: str | os.PathLike[str]) -> None:
    """Write ``chrome_trace(events)`` as JSON to ``path``."""
    Path(path).write_text(json.dumps(chrome_trace(events)))


def _complete(name: str, cat: str, pid: int, tid: int, ts: float, dur: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": max(dur, 0.0), "args": args}


def _meta(what: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": {"name": name}}
