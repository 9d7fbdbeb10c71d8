"""The registry of recordings: which queue a capture records on, and the hand-off of each launch.

``launch`` calls ``record`` whenever ``RECORDING`` is non-empty; a capture (a ``Graph``) registers
itself for one queue with ``begin`` and stops with ``end``. Captures do not nest on one queue. A host
read of a tensor on a recording queue raises ``HostReadInCaptureError`` (the check this module installs
in ``netcl.core.read_checks``): no replay would read it again. This module imports nothing of
netcl.runtime but its errors, so ``launch`` and ``graph`` both build on it; ``netcl.runtime.capture``
is the public face (it re-exports these names and adds ``capture_graph``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from typing import Any, Protocol

import pyopencl as cl

from netcl.core.read_checks import CHECKS as READ_CHECKS
from netcl.runtime.errors import HostReadInCaptureError


class CaptureState(str, Enum):
    """Where a capture (``netcl.runtime.graph.Graph``, ``netcl.autograd.graph.CompiledGraph``) stands.

    A ``str`` enum: a state equals its word (``graph.state == "captured"``) and prints as it.
    """

    EMPTY = "empty"  # nothing captured yet
    CAPTURING = "capturing"  # inside the capturing block
    CAPTURED = "captured"  # ready to replay
    FAILED = "failed"  # the capturing block raised (a runtime Graph cannot capture again)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Recorder(Protocol):
    """What records on a queue (a ``netcl.runtime.graph.Graph``): launches and non-kernel commands."""

    def record_launch(
        self,
        kernel: cl.Kernel,
        global_size: tuple[int, ...],
        local_size: tuple[int, ...] | None,
        args: list[Any],
        keep: Sequence[Any] = (),
    ) -> None: ...

    def record_command(self, command: Callable[..., Any], args: list[Any], keep: Sequence[Any] = ()) -> None: ...

    def record_host_step(self, step: Callable[[], None]) -> None: ...


#: queue int_ptr -> the recorder capturing launches on that queue. Empty when nothing records.
RECORDING: dict[int, Recorder] = {}
_lock = threading.Lock()
_local = threading.local()


def is_recording(queue: cl.CommandQueue) -> bool:
    """Whether a capture records launches on ``queue``."""
    return queue.int_ptr in RECORDING


def record(
    queue: cl.CommandQueue,
    kernel: cl.Kernel,
    gsize: tuple[int, ...],
    lsize: tuple[int, ...] | None,
    args: list[Any],
    keep: Sequence[Any] = (),
) -> None:
    """Hand one kernel launch to the recorder of ``queue`` (no-op when none records it).

    ``args`` are the raw kernel arguments; ``keep`` holds objects (e.g. Tensors) that the
    capture must keep alive so their buffers are not recycled while the graph exists.
    """
    recorder = RECORDING.get(queue.int_ptr)
    if recorder is not None:
        recorder.record_launch(kernel, gsize, lsize, args, keep)


def record_command(
    queue: cl.CommandQueue, command: Callable[..., Any], args: list[Any], keep: Sequence[Any] = ()
) -> None:
    """Hand a non-kernel command (``command(queue, *args)`` re-enqueues it) to ``queue``'s recorder."""
    recorder = RECORDING.get(queue.int_ptr)
    if recorder is not None:
        recorder.record_command(command, args, keep)


def record_host_step(queue: cl.CommandQueue, step: Callable[[], None]) -> None:
    """Have every replay of the capture recording on ``queue`` call ``step()`` before its launches (once
    per replay, however often it is handed over): host work that keeps device state current, such as an
    optimizer uploading hyperparameters that changed since. Nothing happens when nothing records."""
    recorder = RECORDING.get(queue.int_ptr)
    if recorder is not None:
        recorder.record_host_step(step)


def begin(queue: cl.CommandQueue, recorder: Recorder) -> None:
    """Start recording launches on ``queue`` into ``recorder``."""
    with _lock:
        if queue.int_ptr in RECORDING:
            raise RuntimeError(
                "a capture is already recording on this queue; captures do not nest on one queue "
                "(finish the active capture first, or capture on another queue)"
            )
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
    """The capture (a ``Graph``) this thread is recording into, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextmanager
def paused(queue: cl.CommandQueue) -> Iterator[None]:
    """Launches on ``queue`` inside the block run but are not recorded: one-time setup inside a capture
    (e.g. creating state that a replay must then find existing). A no-op when nothing records."""
    with _lock:
        recorder = RECORDING.pop(queue.int_ptr, None)
    try:
        yield
    finally:
        if recorder is not None:
            with _lock:
                RECORDING[queue.int_ptr] = recorder


def refuse_read_while_recording(queue: cl.CommandQueue) -> None:
    """``netcl.core.read_checks``'s check: raise ``HostReadInCaptureError`` for a host read on a queue a capture
    records on (a read inside a ``paused`` block is allowed: nothing records there)."""
    if RECORDING and queue.int_ptr in RECORDING:
        where = _caller_outside_netcl()
        raise HostReadInCaptureError(
            f"a device value was read to the host while a step was being captured ({where}). A replay re-enqueues "
            "the captured kernels only and would not read it again, so whatever the host decided from it would "
            "stay as captured. Read it outside the captured step, or use the device-side form of what reads it "
            "(GradScaler(capturable=True); clip_grad_norm_ without error_if_nonfinite)."
        )


def _caller_outside_netcl() -> str:
    """file:line of the innermost caller that is not netcl's own code (the read the user wrote), or of the
    innermost netcl caller that asked for the read when all of them are netcl's."""
    frame = sys._getframe(2)
    first = frame
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith("netcl."):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return f"{first.f_code.co_filename}:{first.f_lineno}" if first is not None else "<unknown>"


if refuse_read_while_recording not in READ_CHECKS:
    READ_CHECKS.append(refuse_read_while_recording)
