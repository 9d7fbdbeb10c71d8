"""``Stream``: a command queue of its own with a priority hint and explicit dependency edges.

Streams of one device share its context, so buffers move freely between them. Work on two
streams is unordered unless ``wait_for`` adds an edge: ``s1.wait_for(s2)`` puts a marker on
``s2`` and a barrier on ``s1`` that waits for it, so everything enqueued on ``s1`` afterwards
runs after everything enqueued on ``s2`` before the call.

Priorities use ``cl_khr_priority_hints``. Where the device lacks it (PoCL's CPU device, for
one) the queue is created without the hint, ``stream.priority_applied`` is False and a
``RuntimeWarning`` says so once per device. Likewise ``out_of_order_applied`` tells whether
an out-of-order queue was granted.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import Any

import pyopencl as cl

from netcl.core.devices import Device, get_device
from netcl.core.tensor import Tensor
from netcl.runtime.cache import KernelHandle
from netcl.runtime.errors import LaunchError
from netcl.runtime.launch import launch

PRIORITY_EXTENSION = "cl_khr_priority_hints"
_CL_QUEUE_PROPERTIES = 0x1093
_CL_QUEUE_PRIORITY_KHR = 0x1096
#: CL_QUEUE_PRIORITY_HIGH_KHR / MED / LOW
PRIORITIES = {"high": 1 << 0, "normal": 1 << 1, "low": 1 << 2}
_OUT_OF_ORDER = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
_PROFILING = cl.command_queue_properties.PROFILING_ENABLE

_warned: set[tuple[str, str]] = set()
_warn_lock = threading.Lock()


class Stream:
    """A new command queue on ``device`` (default: the default device) with a priority hint.

    ``priority`` is "high", "normal" or "low"; ``out_of_order=True`` asks for an
    out-of-order queue (kernels then need explicit events or ``wait_for`` edges to order
    them). Queues are created with profiling enabled, so ``PerfCounter`` works on them.
    On the NumPy backend a Stream has no queue: ``wait_for``/``finish`` do nothing (NumPy
    work is synchronous) and ``submit`` raises.
    """

    def __init__(
        self,
        priority: str = "normal",
        out_of_order: bool = False,
        device: Device | str | None = None,
        profiling: bool = True,
    ) -> None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {sorted(PRIORITIES)}, got {priority!r}")
        self.device = get_device(device)
        self.priority = priority
        self.out_of_order = out_of_order
        self.priority_applied = False
        self.out_of_order_applied = False
        self.queue: cl.CommandQueue | None = None
        if self.device.kind == "opencl":
            self.queue = self._make_queue(profiling)

    def _make_queue(self, profiling: bool) -> cl.CommandQueue:
        dev = self.device.cl_device
        flags = _PROFILING if profiling else 0
        if self.out_of_order:
            if dev.queue_properties & _OUT_OF_ORDER:
                flags |= _OUT_OF_ORDER
                self.out_of_order_applied = True
            else:
                _warn_once(self.device, "out_of_order", "out-of-order queues; this stream is in-order")
        if PRIORITY_EXTENSION in self.device.extensions:
            try:
                queue = cl.CommandQueue(
                    self.device.context,
                    dev,
                    [_CL_QUEUE_PROPERTIES, flags, _CL_QUEUE_PRIORITY_KHR, PRIORITIES[self.priority]],
                )
            except cl.Error as exc:
                _warn_once(self.device, "priority", f"queue priorities (creation failed: {exc}); hint dropped")
            else:
                self.priority_applied = True
                return queue
        elif self.priority != "normal":
            _warn_once(self.device, "priority", f"{PRIORITY_EXTENSION}; stream priorities are not applied")
        return cl.CommandQueue(self.device.context, dev, flags)

    @classmethod
    def default(cls, device: Device | str | None = None) -> Stream:
        """A Stream wrapping the device's default queue (the one eager ops use)."""
        stream = cls.__new__(cls)
        stream.device = get_device(device)
        stream.priority, stream.out_of_order = "normal", False
        stream.priority_applied = stream.out_of_order_applied = False
        stream.queue = stream.device.queue
        return stream

    def submit(
        self,
        kernel: KernelHandle | cl.Kernel,
        *args: Any,
        global_size: int | Sequence[int] | None = None,
        local_size: int | Sequence[int] | None = None,
        wait_for: Sequence[cl.Event] | None = None,
    ) -> cl.Event:
        """Launch ``kernel`` with ``args`` on this stream (through ``netcl.runtime.launch``); the event.

        As the API reference: ``stream.submit(kernel, *args)``. The global size defaults to the
        element count of the largest ``Tensor`` argument (one work-item per element); pass
        ``global_size=`` (and ``local_size=``) for anything else or when only raw buffers are passed.
        """
        if self.queue is None:
            raise LaunchError("a Stream on the NumPy backend cannot run OpenCL kernels")
        if global_size is None:
            sizes = [a.size for a in args if isinstance(a, Tensor)]
            if not sizes or max(sizes) == 0:
                raise LaunchError(
                    "Stream.submit: no Tensor argument with elements to take the global size from; "
                    "pass global_size= (and local_size=)"
                )
            global_size = max(sizes)
        return launch(kernel, global_size, local_size, *args, queue=self.queue, wait_for=wait_for)

    def record(self) -> cl.Event | None:
        """A marker event that completes when everything enqueued so far on this stream has."""
        return None if self.queue is None else cl.enqueue_marker(self.queue)

    def wait_for(self, other: Stream | cl.CommandQueue | cl.Event) -> cl.Event | None:
        """Make later work on this stream wait for everything enqueued on ``other`` so far.

        ``other`` may also be a queue or an event. Returns the barrier event on this stream.
        """
        if self.queue is None:
            return None
        if isinstance(other, cl.Event):
            marker = other
        else:
            queue = other.queue if isinstance(other, Stream) else other
            if queue is None:
                return None
            if queue.context != self.queue.context:
                raise LaunchError("wait_for: the other stream belongs to another OpenCL context")
            marker = cl.enqueue_marker(queue)
            queue.flush()  # make sure the marker is submitted, or a barrier on us could wait forever
        return cl.enqueue_barrier(self.queue, wait_for=[marker])

    def finish(self) -> None:
        """Block until everything enqueued on this stream has completed; ``IndexError`` when a kernel
        recorded an out-of-range index since the last wait (``netcl.core.device_errors``)."""
        if self.queue is not None:
            self.device.error_word.check(self.queue)

    def flush(self) -> None:
        """Submit everything enqueued so far to the device without waiting."""
        if self.queue is not None:
            self.queue.flush()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def __repr__(self) -> str:
        mode = "out-of-order" if self.out_of_order_applied else "in-order"
        applied = "" if self.priority_applied else " (hint not applied)"
        return f"<Stream {self.priority}{applied} {mode} on {self.device.name}>"


def _warn_once(device: Device, what: str, text: str) -> None:
    key = (device.spec, what)
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"device {device.name!r} does not support {text}", RuntimeWarning, stacklevel=4)
