"""``launch``: the one function through which every kernel launch in netcl goes.

``PreparedLaunch`` is its hot-path form: one kernel, sizes and constant arguments fixed once,
the per-call arguments set by generated code, the enqueue through ``netcl.runtime.enqueue``;
while a capture records, it goes through ``launch`` so the capture sees it. The module also
holds ``enqueue_copy`` and ``enqueue_fill``, the device-side copy and fill commands that a capture
records alongside kernels (plain ``cl.enqueue_copy`` calls are not recorded).
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Tensor
from netcl.core.devices import devices
from netcl.core.profile_hooks import ACTIVE as _PROFILERS
from netcl.core.profile_hooks import KERNEL, MEMCPY, MEMSET, now, report
from netcl.core.strided_view import StridedView
from netcl.runtime import native, recording
from netcl.runtime.cache import KernelHandle, declared_scalar_dtypes
from netcl.runtime.errors import LaunchError
from netcl.runtime.variable import IN_USE as _VARIABLES_IN_USE
from netcl.runtime.variable import launch_values

#: cl.Kernel objects hold their arguments, so setting them and enqueueing must not interleave.
_LAUNCH_LOCK = threading.Lock()
_QUEUE_OF_CONTEXT: dict[int, cl.CommandQueue] = {}
_PREFERRED_LOCAL = (256, 128, 64, 32, 16, 8, 4, 2, 1)
_MAX_DIMS = 3
#: (kernel, global, local) tuple sizes that passed ``_checked_sizes`` (multi-dimensional launches).
_CHECKED: set[tuple[Any, tuple[int, ...], tuple[int, ...] | None]] = set()


def launch(
    kernel: KernelHandle | cl.Kernel,
    global_size: int | Sequence[int],
    local_size: int | Sequence[int] | None,
    *args: Any,
    queue: cl.CommandQueue | None = None,
    wait_for: Sequence[cl.Event] | None = None,
) -> cl.Event:
    """Set ``args`` on ``kernel`` and enqueue it; returns the event.

    ``args`` may be ``cl.Buffer``, ``Tensor`` (its buffer is passed), numpy scalars, or Python
    numbers when the kernel's scalar dtypes were declared (``KernelHandle.kernel(name, dtypes)``).
    A strided view (``x.T``, ``x[:, 0]``: ``netcl.core.strided_view``) raises ``LaunchError`` before
    anything is set: a kernel reads (and may write) its buffers in C order, and a write into a view's
    gathered copy would be lost; pass ``view.contiguous()`` or the view's source.
    With ``local_size=None`` a 1-D launch gets the largest of 256, 128, ... that divides the
    global size and the kernel allows; other shapes leave the choice to the driver.
    ``queue`` defaults to the default queue of the device that owns the kernel's context.
    A ``netcl.runtime.Variable`` argument passes its current value as a C ``int``; a capture records
    the variable itself, so replays pass its value at replay time.
    If a capture is recording on the queue, the launch is also recorded; while a
    ``netcl.profiler.profile`` is active, it is reported to it.
    """
    start = now() if _PROFILERS else 0
    cl_kernel = kernel if isinstance(kernel, cl.Kernel) else kernel.kernel()
    if (
        type(global_size) is int
        and type(local_size) is int
        and 0 < local_size <= global_size
        and global_size % local_size == 0
        and local_size <= getattr(cl_kernel, "_netcl_wg_limit", 0)
    ):  # the common 1-D case, already valid: skip the general checks
        gsize, lsize = (global_size,), (local_size,)
    elif type(global_size) is tuple and (cl_kernel, global_size, local_size) in _CHECKED:
        gsize, lsize = global_size, local_size  # tuple sizes this kernel was launched with before
    else:
        gsize, lsize = _checked_sizes(cl_kernel, global_size, local_size)
        if type(global_size) is tuple and (local_size is None or type(local_size) is tuple):
            if len(_CHECKED) >= 4096:
                _CHECKED.clear()
            _CHECKED.add((cl_kernel, gsize, lsize))
    if queue is None:
        queue = _kernel_queue(cl_kernel)
    if StridedView in map(type, args):
        raise _view_argument(cl_kernel, args)
    raw = [a.data if isinstance(a, Tensor) else a for a in args]
    values = launch_values(raw) if _VARIABLES_IN_USE[0] else raw  # a Variable passes its current value
    with _LAUNCH_LOCK:
        try:
            cl_kernel.set_args(*values)
        except (cl.LogicError, TypeError, ValueError) as exc:
            raise LaunchError(
                f"cannot set arguments of kernel {cl_kernel.function_name!r}: {exc}{_scalar_hint(cl_kernel, values)}"
            ) from exc
        try:
            event = cl.enqueue_nd_range_kernel(queue, cl_kernel, gsize, lsize, wait_for=wait_for)
        except cl.LogicError as exc:
            raise LaunchError(
                f"cannot enqueue kernel {cl_kernel.function_name!r} with global size {gsize} and "
                f"local size {lsize}: {exc}"
            ) from exc
    if recording.RECORDING:
        _record(queue, cl_kernel, gsize, lsize, raw, args)
    if start:
        report(KERNEL, cl_kernel.function_name, queue, event, start, gsize, args, lsize)
    return event


def _scalar_hint(kernel: cl.Kernel, raw: Sequence[Any]) -> str:
    """A hint when Python numbers went to a kernel whose scalar argument types were never declared."""
    from netcl.runtime.cache import declared_scalar_dtypes

    numbers = [i for i, a in enumerate(raw) if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if not numbers or declared_scalar_dtypes(kernel) is not None:
        return ""
    where = ", ".join(f"#{i + 1} ({type(raw[i]).__name__} {raw[i]!r})" for i in numbers)
    return (
        f". Python numbers were passed as argument(s) {where}, but OpenCL needs their C type: declare it once "
        "with handle.kernel(name, scalar_dtypes=[None, np.float32, ...]) (None for buffers), "
        "or pass NumPy scalars such as np.float32(x) / np.int32(n)"
    )


def _checked_sizes(
    cl_kernel: cl.Kernel, global_size: int | Sequence[int], local_size: int | Sequence[int] | None
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Validated (global, local) size tuples; picks the local size when it is None."""
    gsize = _sizes(global_size, "global")
    if local_size is None:
        lsize = _pick_local_size(cl_kernel, gsize)
    else:
        lsize = _sizes(local_size, "local")
        if len(lsize) != len(gsize) or any(g % loc for g, loc in zip(gsize, lsize, strict=True)):
            raise LaunchError(
                f"local size {lsize} must have as many dimensions as global size {gsize} and divide it in each"
            )
        limit = _work_group_limit(cl_kernel)
        if math.prod(lsize) > limit:  # some drivers (NVIDIA's) accept this at enqueue and fail later
            raise LaunchError(
                f"local size {lsize} has {math.prod(lsize)} work-items; kernel {cl_kernel.function_name!r} "
                f"allows at most {limit} per work-group on this device"
            )
    return gsize, lsize


def enqueue_copy(
    queue: cl.CommandQueue,
    dst: Tensor | cl.Buffer,
    src: Tensor | cl.Buffer,
    byte_count: int | None = None,
    wait_for: Sequence[cl.Event] | None = None,
) -> cl.Event:
    """Device-to-device copy of ``byte_count`` bytes (default: all of ``src``); recorded by captures. ``src``
    may be a strided view on its device's queue (its gathered copy is read); ``dst`` may not be one."""
    start = now() if _PROFILERS else 0
    if type(src) is StridedView and queue is not src.device.queue:
        raise LaunchError("enqueue_copy: a strided view is gathered on its device's queue; copy it on that queue")
    dst_buf, src_buf = _raw(dst, "enqueue_copy's destination"), _raw(src)
    if byte_count is None:
        byte_count = src.nbytes if isinstance(src, Tensor) else src_buf.size
    event = _copy_command(queue, dst_buf, src_buf, byte_count, wait_for=wait_for)
    if start:
        report(MEMCPY, "Memcpy DtoD", queue, event, start, args=(src,))
    if recording.RECORDING:
        recording.record_command(queue, _copy_command, [dst_buf, src_buf, byte_count], keep=(dst, src))
    return event


def enqueue_fill(
    queue: cl.CommandQueue,
    buffer: Tensor | cl.Buffer,
    value: Any = 0,
    dtype: Any = np.uint8,
    byte_count: int | None = None,
    wait_for: Sequence[cl.Event] | None = None,
) -> cl.Event:
    """Fill ``buffer`` with ``value`` of ``dtype`` (default: zero bytes); recorded by captures."""
    start = now() if _PROFILERS else 0
    buf = _raw(buffer, "enqueue_fill's buffer")
    pattern = np.full(1, value, dtype=np.dtype(dtype))
    if byte_count is None:
        byte_count = buffer.nbytes if isinstance(buffer, Tensor) else buf.size
    event = _fill_command(queue, buf, pattern, byte_count, wait_for=wait_for)
    if start:
        report(MEMSET, "Memset", queue, event, start, args=(buffer,))
    if recording.RECORDING:
        recording.record_command(queue, _fill_command, [buf, pattern, byte_count], keep=(buffer,))
    return event


def _copy_command(
    queue: cl.CommandQueue, dst: cl.Buffer, src: cl.Buffer, nbytes: int, wait_for: Any = None
) -> cl.Event:
    return cl.enqueue_copy(queue, dst, src, byte_count=nbytes, wait_for=wait_for)


def _fill_command(
    queue: cl.CommandQueue, buf: cl.Buffer, pattern: np.ndarray, nbytes: int, wait_for: Any = None
) -> cl.Event:
    return cl.enqueue_fill_buffer(queue, buf, pattern, 0, nbytes, wait_for=wait_for)


def _view_argument(kernel: cl.Kernel, args: Sequence[Any]) -> LaunchError:
    """The error of a launch given a strided view as an argument."""
    index, view = next((i, a) for i, a in enumerate(args) if type(a) is StridedView)
    return LaunchError(
        f"argument {index} of kernel {kernel.function_name!r} is a strided view (shape {view.shape}, strides "
        f"{view.strides} of a tensor of shape {view.source.shape}, as x.T or x[:, 0] make): a kernel takes "
        "C-contiguous buffers; pass view.contiguous() to read it, or the source tensor"
    )


def _raw(obj: Tensor | cl.Buffer, written: str = "") -> cl.Buffer:
    """The buffer of ``obj``; ``written`` names a destination, which a strided view may not be (``LaunchError``)."""
    if written and type(obj) is StridedView:
        raise LaunchError(
            f"{written} is a strided view (shape {obj.shape}, strides {obj.strides}): views are read-only; "
            "write into the source tensor or into view.contiguous()"
        )
    return obj.data if isinstance(obj, Tensor) else obj


def _record(
    queue: cl.CommandQueue,
    kernel: cl.Kernel,
    gsize: tuple[int, ...],
    lsize: tuple[int, ...] | None,
    raw: list[Any],
    args: tuple[Any, ...],
) -> None:
    if recording.is_recording(queue):
        recording.record(queue, kernel, gsize, lsize, raw, keep=args)
    elif recording.get_capture() is not None:
        warnings.warn(
            f"kernel {kernel.function_name!r} was launched on a queue this thread is not capturing "
            "while a capture is active on another queue; it is NOT part of the captured graph",
            RuntimeWarning,
            stacklevel=3,
        )


def default_queue_for(context: cl.Context) -> cl.CommandQueue:
    """The default queue of the netcl device that owns ``context``."""
    key = context.int_ptr
    queue = _QUEUE_OF_CONTEXT.get(key)
    if queue is None:
        for device in devices():
            if device.kind == "opencl" and "context" in device.__dict__ and device.context == context:
                queue = device.queue
                break
        else:
            raise LaunchError("kernel's context belongs to no netcl device; pass queue= explicitly")
        _QUEUE_OF_CONTEXT[key] = queue
    return queue


def _sizes(value: int | Sequence[int], what: str) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)):
        sizes: tuple[int, ...] = (int(value),)
    elif isinstance(value, (tuple, list)) and all(isinstance(v, (int, np.integer)) for v in value):
        sizes = tuple(int(v) for v in value)
    else:
        raise LaunchError(f"{what} size must be an int or a tuple/list of ints, got {value!r}")
    if not 1 <= len(sizes) <= _MAX_DIMS:
        raise LaunchError(f"{what} size {sizes} must have 1 to {_MAX_DIMS} dimensions")
    if any(s <= 0 for s in sizes):
        raise LaunchError(f"{what} size {sizes} must be positive in every dimension")
    return sizes


def _kernel_queue(kernel: cl.Kernel) -> cl.CommandQueue:
    queue = getattr(kernel, "_netcl_queue", None)
    if queue is None:
        queue = kernel._netcl_queue = default_queue_for(kernel.context)
    return queue


def _pick_local_size(kernel: cl.Kernel, gsize: tuple[int, ...]) -> tuple[int, ...] | None:
    if len(gsize) != 1:
        return None
    limit = _work_group_limit(kernel)
    for size in _PREFERRED_LOCAL:
        if size <= limit and gsize[0] % size == 0:
            return (size,)
    return None


def _work_group_limit(kernel: cl.Kernel) -> int:
    """The kernel's maximum work-group size on its device (queried once per kernel)."""
    limit = getattr(kernel, "_netcl_wg_limit", None)
    if limit is None:
        device = kernel.context.devices[0]
        limit = kernel._netcl_wg_limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device)
    return limit


class PreparedLaunch:
    """One kernel launch prepared for a hot path: ``prepared.call(*dynamic_args)`` sets and enqueues.

    ``kernel`` gets a private copy (its own ``cl.Kernel`` of the same program and function),
    so no other launch can disturb the arguments set here; ``static`` maps argument index ->
    value, set once now; ``dynamic`` lists the per-call arguments in call order as
    (argument index, numpy dtype for a scalar or None for a buffer). Each call passes raw
    ``cl.Buffer``s and numbers (no Tensors, no conversions): generated code packs them with
    pyopencl's multi-argument setters and the enqueue is ``enqueue.enqueuer``'s (no event).
    While a capture records on the queue or a ``netcl.profiler.profile`` is active, the call goes
    through ``launch`` instead, which records or reports it. Sizes are validated once, here, as
    ``launch`` validates them.
    """

    def __init__(
        self,
        kernel: cl.Kernel,
        global_size: int | Sequence[int],
        local_size: int | Sequence[int] | None,
        static: dict[int, Any],
        dynamic: Sequence[tuple[int, Any]],
        queue: cl.CommandQueue | None = None,
    ) -> None:
        from netcl.runtime.enqueue import enqueuer

        self.kernel = cl.Kernel(kernel.program, kernel.function_name)
        self.global_size, self.local_size = _checked_sizes(self.kernel, global_size, local_size)
        self.queue = queue if queue is not None else _kernel_queue(kernel)
        indices = sorted([*static, *(i for i, _ in dynamic)])
        if indices != list(range(self.kernel.num_args)):
            raise LaunchError(
                f"kernel {kernel.function_name!r} has {self.kernel.num_args} arguments; static and dynamic "
                f"must name each index once, got {indices}"
            )
        self._static = dict(static)
        self._dynamic = [(int(i), None if d is None else np.dtype(d)) for i, d in dynamic]
        for index, value in self._static.items():
            self.kernel.set_arg(index, value.data if isinstance(value, Tensor) else value)
        self._lock = threading.Lock()
        self._enqueue, self._returns_status = enqueuer(self.queue, self.kernel, self.global_size, self.local_size)
        #: ``call(*dynamic_args)``: the generated setter + enqueue (hot paths bind it once)
        self.call = self._generate()

    @classmethod
    def binding(
        cls,
        kernel: cl.Kernel,
        global_size: int | Sequence[int],
        local_size: int | Sequence[int] | None,
        bound: dict[int, Any],
        queue: cl.CommandQueue | None = None,
    ) -> PreparedLaunch:
        """The launch of a kernel with declared scalar dtypes (``KernelHandle.kernel(name, dtypes)``):
        the arguments at ``bound``'s indices set once (numbers typed by their declared dtype), every
        other argument passed per call, in index order."""
        dtypes = declared_scalar_dtypes(kernel)
        if dtypes is None:
            raise LaunchError(f"kernel {kernel.function_name!r} has no declared scalar dtypes to bind arguments by")
        static = {i: v if dtypes[i] is None else dtypes[i].type(v) for i, v in bound.items()}
        dynamic = [(i, d) for i, d in enumerate(dtypes) if i not in bound]
        return cls(kernel, global_size, local_size, static, dynamic, queue)

    def __call__(self, *dynamic: Any) -> None:
        self.call(*dynamic)

    def with_bound(self, bound: dict[int, Any]) -> PreparedLaunch:
        """A new launch of this kernel and sizes with the per-call arguments at ``bound``'s indices set once too
        (the other per-call arguments keep their order): for a caller that passes the same buffers every time."""
        dynamic = [(i, d) for i, d in self._dynamic if i not in bound]
        static = {**self._static, **bound}
        return PreparedLaunch(self.kernel, self.global_size, self.local_size, static, dynamic, self.queue)

    def with_trailing(self, values: Sequence[Any]) -> PreparedLaunch:
        """A new launch with its last ``len(values)`` per-call arguments set once to ``values`` (numbers typed as
        their declared dtypes): for a plan that passes the same sizes, flags and error word every call, which then
        passes only the arguments before them. This launch itself for no values."""
        if not values:
            return self
        trailing = self._dynamic[len(self._dynamic) - len(values) :]
        if len(trailing) != len(values):
            raise LaunchError(
                f"kernel {self.kernel.function_name!r} takes {len(self._dynamic)} per-call arguments; "
                f"cannot set the last {len(values)} once"
            )
        return self.with_bound({i: v if d is None else d.type(v) for (i, d), v in zip(trailing, values, strict=True)})

    def _generate(self) -> Any:
        compiled = native.launcher()
        if compiled is not None:
            return self._compiled(compiled)
        from netcl.runtime.enqueue import raise_status

        names = [f"a{n}" for n in range(len(self._dynamic))]
        buffers = [f"{i}, {name}" for (i, d), name in zip(self._dynamic, names, strict=True) if d is None]
        scalars = [
            f"{i}, {d.char.encode()!r}, {name}"
            for (i, d), name in zip(self._dynamic, names, strict=True)
            if d is not None
        ]
        lines = [f"def prepared({', '.join(names)}):"]
        every = f"({', '.join(names)},)" if names else "()"
        lines.append(f"    if RECORDING or PROFILERS: return slow({every})")
        # the lock's bound methods, not ``with lock``: a with block looks up and calls __enter__ and __exit__
        lines.append("    acquire()")
        lines.append("    try:")
        if names:
            lines.append("        try:")
        if buffers:
            lines.append(f"            set_buffers(({', '.join(buffers)},))")
        if scalars:
            lines.append(f"            set_scalars(({', '.join(scalars)},))")
        if names:
            lines.append("        except Exception as exc: raise bad_args(exc) from exc")
        if self._returns_status:
            lines.append("        status = enqueue()")
            lines.append("        if status: raise_status(status, kernel)")
        else:
            lines.append("        enqueue()")
        lines.append("    finally:")
        lines.append("        release()")
        # the generated function must not reach ``self`` (no reference cycle: a dropped plan frees at once)
        sizes = self._sizes()
        scope = {
            "RECORDING": recording.RECORDING,
            "PROFILERS": _PROFILERS,
            "slow": functools.partial(_prepared_through_launch, *sizes, dict(self._static), list(self._dynamic)),
            "acquire": self._lock.acquire,
            "release": self._lock.release,
            "set_buffers": self.kernel._set_arg_multi,
            "set_scalars": self.kernel._set_arg_buf_pack_multi,
            "bad_args": functools.partial(_bad_args, self.kernel.function_name),
            "enqueue": self._enqueue,
            "raise_status": raise_status,
            "kernel": self.kernel,
        }
        exec(compile("\n".join(lines), f"<netcl prepared launch of {self.kernel.function_name}>", "exec"), scope)
        return scope.pop("prepared")

    def _compiled(self, launcher_type: type) -> Any:
        """The call as one ``native`` ``Launcher``: the generated function's contract (the same arguments set, the
        same lock, the same slow path and errors), without its frames and with no event."""
        set_arg, enqueue = native.entry_points()  # type: ignore[misc]  # not None: the type was built
        return launcher_type(
            kernel=self.kernel.int_ptr,
            queue=self.queue.int_ptr,
            set_arg=set_arg,
            enqueue=enqueue,
            global_size=self.global_size,
            local_size=self.local_size,
            indices=tuple(i for i, _ in self._dynamic),
            codes=tuple(None if d is None else d.char.encode() for _, d in self._dynamic),
            keep=(self.kernel, self.queue),
            recording=recording.RECORDING,
            profilers=_PROFILERS,
            slow=functools.partial(_prepared_through_launch, *self._sizes(), dict(self._static), list(self._dynamic)),
            acquire=self._lock.acquire,
            release=self._lock.release,
            memory_type=cl.MemoryObjectHolder,
            set_buffers=self.kernel._set_arg_multi,
            set_scalars=self.kernel._set_arg_buf_pack_multi,
            error=LaunchError,
            name=self.kernel.function_name,
        )

    def _sizes(self) -> tuple[Any, ...]:
        """What the slow path (``_prepared_through_launch``) launches with besides the arguments."""
        return (self.kernel, self.global_size, self.local_size, self.queue, self._lock)


def _prepared_through_launch(
    kernel: cl.Kernel,
    gsize: tuple[int, ...],
    lsize: tuple[int, ...] | None,
    queue: cl.CommandQueue,
    lock: threading.Lock,
    static: dict[int, Any],
    dynamic_types: list[tuple[int, np.dtype | None]],
    dynamic: tuple[Any, ...],
) -> None:
    """A ``PreparedLaunch`` call while a capture records or a profiler is active: through ``launch``."""
    args: list[Any] = [None] * kernel.num_args
    for index, value in static.items():
        args[index] = value
    for (index, dtype), value in zip(dynamic_types, dynamic, strict=True):
        args[index] = value if dtype is None else dtype.type(value)
    with lock:  # launch sets every argument, the static ones to the same values
        launch(kernel, gsize, lsize, *args, queue=queue)


def _bad_args(name: str, exc: Exception) -> LaunchError:
    return LaunchError(f"cannot set arguments of kernel {name!r}: {exc}")
