"""Where netcl's launch and copy paths report device work to ``netcl.profiler``.

``ACTIVE`` lists the profilers that are recording (``netcl.profiler.profile`` objects, outermost
first); it is empty when none is, and then the only cost on a launch or copy path is the test
``if ACTIVE`` (the list object never changes, so callers bind it once). While it is not empty, a
path takes ``start = now()`` before it enqueues and calls ``report(...)`` after, with the
command's ``cl.Event``; every active profiler gets the record (``profiler.add``), filters it by
its device and resolves the event's times lazily. Core itself reports the host<->device copies
and fills of ``Tensor``; netcl-runtime reports kernels (``launch``, prepared launches, replays)
and its device copies and fills.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

#: the active profilers, outermost first; empty when nothing is profiled
ACTIVE: list[Any] = []

#: the host clock of every record (``time.perf_counter_ns``)
now = time.perf_counter_ns

#: record kinds: a kernel, a copy, a fill, host work on a device's memory (the host BLAS of CPU
#: OpenCL devices: its device time is its host time), and a named host range
KERNEL, MEMCPY, MEMSET, HOST, RANGE = "kernel", "memcpy", "memset", "host", "range"


def report(
    kind: str,
    name: str,
    queue: Any,
    event: Any,
    start_ns: int,
    global_size: Sequence[int] | None = None,
    args: Sequence[Any] = (),
    local_size: Sequence[int] | None = None,
) -> None:
    """Hand one enqueued command to every active profiler.

    ``kind`` is ``KERNEL``, ``MEMCPY``, ``MEMSET``, ``HOST`` or ``RANGE``; ``name`` the kernel's
    function name or the copy's name; ``queue`` and ``event`` the ``cl.CommandQueue`` and
    ``cl.Event`` of the command (``event`` None when it made none; ``queue`` None for a range of
    no device); ``start_ns`` the host clock (``now()``) when the op that enqueued it started; the
    end is taken here. ``args`` are the launch's arguments as the caller passed them (their
    Tensors' shapes are what ``record_shapes`` keeps); ``global_size`` and ``local_size`` a
    kernel's sizes.
    """
    end_ns = now()
    thread = threading.get_ident()
    for profiler in tuple(ACTIVE):
        profiler.add(kind, name, queue, event, start_ns, end_ns, thread, global_size, args, local_size)
