"""Runtime's side of the ``netcl.profiler`` hook (``netcl.core.profile_hooks``): a replay that reports.

``Graph.execute`` replays through ``replay`` instead of its prepared loops while a profiler is
active: the same commands in the same order, each enqueued with an event and reported with the
host time of its enqueue, inside one host range named after the graph.
"""

from __future__ import annotations

from typing import Any

import pyopencl as cl

from netcl.core.profile_hooks import HOST, KERNEL, MEMCPY, MEMSET, RANGE, now, report

#: a recorded device command's function name -> (kind, name) it is reported as; other commands
#: (the host BLAS product, collectives) are host work, reported by name without their event
_COMMANDS = {"_copy_command": (MEMCPY, "Memcpy DtoD"), "_fill_command": (MEMSET, "Memset")}


def replay(queue: cl.CommandQueue, steps: list[tuple[Any, Any, Any]], chained: bool, label: str | None) -> Any:
    """Enqueue a graph plan's ``steps`` on ``queue`` as ``Graph.execute`` does, reporting each; the last event.

    ``steps`` are ``(kernel, global size, local size)`` or ``(None, command, args)``; ``chained``
    makes each wait for the one before (an out-of-order queue). The host range is named
    ``label`` (the graph's) or ``"Graph.execute"``.
    """
    began = now()
    event = None
    for kernel, a, b in steps:
        wait = (event,) if chained and event is not None else None
        start = now()
        if kernel is None:
            event = a(queue, *b, wait_for=wait)
            name = getattr(a, "__name__", type(a).__name__)
            kind, shown = _COMMANDS.get(name, (HOST, name))
            report(kind, shown, queue, None if kind == HOST else event, start)
        else:
            event = cl.enqueue_nd_range_kernel(queue, kernel, a, b, wait_for=wait)
            report(KERNEL, kernel.function_name, queue, event, start, a, local_size=b)
    report(RANGE, label or "Graph.execute", queue, None, began)
    return event
