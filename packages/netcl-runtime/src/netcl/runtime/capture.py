"""Recording of kernel launches for replay (see ``netcl.runtime.graph.Graph``).

``launch`` calls ``record`` whenever ``RECORDING`` is non-empty; a capture registers itself
for one queue with ``begin`` and stops with ``end``. Captures do not nest on one queue.
``capture_graph(queue, fn, *args, **kwargs)`` is the functional form (it lives in
``netcl.runtime.graph`` and is re-exported here). The registry itself lives in
``netcl.runtime.recording``, which ``launch`` and ``graph`` import (this module imports ``graph``).
"""

from __future__ import annotations

from netcl.runtime.graph import capture_graph
from netcl.runtime.recording import (
    RECORDING,
    CaptureState,
    Recorder,
    begin,
    end,
    get_capture,
    is_recording,
    paused,
    record,
    record_command,
    record_host_step,
)

__all__ = [
    "RECORDING",
    "CaptureState",
    "Recorder",
    "begin",
    "capture_graph",
    "end",
    "get_capture",
    "is_recording",
    "paused",
    "record",
    "record_command",
    "record_host_step",
]
