"""Recording of kernel launches for replay (see ``netcl.runtime.graph.Graph``).

``launch`` calls ``record`` whenever ``RECORDING`` is non-empty; a capture registers itself
for one queue with ``begin`` and stops with ``end``.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import pyopencl as cl


class Recorder(Protocol):
    def record_launch(
        self, kernel: cl.Kernel, global_size: tuple[int, ...], local_size: tuple[int, ...] | None, args: list[Any]
    ) -> None: ...


#: queue int_ptr -> the recorder capturing launches on that queue. Empty when nothing records.
RECORDING: dict[int, Recorder] = {}
_lock = threading.Lock()
_local = threading.local()


def record(
    queue: cl.CommandQueue, kernel: cl.Kernel, gsize: tuple[int, ...], lsize: tuple[int, ...] | None, args: list[Any]
) -> None:
    recorder = RECORDING.get(queue.int_ptr)
    if recorder is not None:
        recorder.record_launch(kernel, gsize, lsize, args)


def begin(queue: cl.CommandQueue, recorder: Recorder) -> None:
    """Start recording launches on ``queue`` into ``recorder``."""
    with _lock:
        if queue.int_ptr in RECORDING:
            raise RuntimeError("a capture is already recording on this queue; captures do not nest")
        RECORDING[queue.int_ptr] = recorder
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(recorder)


def end(queue: cl.CommandQueue, recorder: Recorder) -> None:
    """Stop recording on ``queue``."""
    with _lock:
        if RECORDING.get(queue.int_ptr) is recorder:
            del RECORDING[queue.int_ptr]
    stack = getattr(_local, "stack", [])
    if recorder in stack:
        stack.remove(recorder)


def get_capture() -> Recorder | None:
    """The capture this thread is recording into, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None
