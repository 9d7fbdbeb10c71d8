"""Capture and replay of kernel-launch sequences: ``Graph`` and ``capture_graph``.

A ``Graph`` records every launch that goes through ``netcl.runtime.launch`` (and the
``enqueue_copy`` / ``enqueue_fill`` commands of ``netcl.runtime.launch``) on one queue
while ``Graph.capture(queue)`` is active. ``Graph.execute(*new_inputs)`` replays them.

Replay semantics:

* Every captured launch gets its own private ``cl.Kernel`` (a fresh kernel object for the
  same program and function) whose arguments are set once, when the graph is first
  executed. Eager code that launches the same kernel, or another graph, can therefore
  never disturb a graph's arguments, and replay re-sets nothing that is static.
* The dynamic arguments are the *inputs* declared at capture (``capture(queue, inputs=...)``,
  ``set_inputs`` or the Tensor/``cl.Buffer`` positional arguments of ``capture_graph``).
  They are recognised by buffer identity (``int_ptr``) and rebound with one ``set_arg``
  per use when a replay passes a different buffer; then the replay is a tight loop of
  ``cl.enqueue_nd_range_kernel`` calls. ``execute()`` with no arguments replays on the
  captured inputs.
* New inputs must match the captured ones in count, byte size and, for Tensors, shape,
  dtype and device; otherwise ``ReplayError`` names the slot and nothing is enqueued.
* Everything else is frozen: intermediate and output buffers are the ones allocated
  during capture (the graph keeps them alive), scalars keep their captured values, and
  host work in the captured function (prints, uploads) is not replayed. A host read of a
  tensor on the capturing queue (``to_host``, ``item``) raises ``HostReadInCaptureError``:
  no replay would read it again.
* Except bound integers: a ``netcl.runtime.Variable`` passed as a kernel argument is recorded as
  the variable, and each replay passes its value at that time (``var.bind(n)`` before
  ``execute``, or ``execute(bindings={"name": n})``; a value outside the variable's range raises
  ``ValueError`` before anything is enqueued). ``graph.variables`` lists them by name.
* And host steps: a function handed to ``recording.record_host_step`` during the capture (an
  optimizer's upload of hyperparameters that changed, so a learning rate set between replays
  reaches the next one) runs before each replay's launches (``graph.host_steps``).
* **Results are never silently overwritten.** Each replay writes into the same captured
  output buffers, so ``execute`` hands out ``ReplayResult`` tensors that alias them until the
  next replay of the graph, which first *retires* the ones still referenced: a result of at
  most ``snapshot_bytes`` (1 MiB) is copied into a buffer of its own (so collecting losses in
  a list works), a larger one becomes stale and reading it raises ``StaleResultError``
  (``netcl.runtime.replay_results``). ``copy_outputs=True`` returns fresh copies right away.
  A result that is dropped before the next replay costs no copy. ``g.outputs`` itself is the
  graph's working memory and always shows the latest replay. On the NumPy backend every
  replay's results are fresh arrays.
* On an out-of-order queue the replayed commands are chained with events, so they still
  run in captured order.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Tensor
from netcl.core.devices import Device, get_device
from netcl.core.profile_hooks import ACTIVE as _PROFILERS
from netcl.runtime import recording
from netcl.runtime.cache import declared_scalar_dtypes
from netcl.runtime.enqueue import enqueuer, raise_status
from netcl.runtime.errors import ReplayError
from netcl.runtime.launch import enqueue_copy
from netcl.runtime.profiling import replay as _profiled_replay
from netcl.runtime.recording import CaptureState
from netcl.runtime.replay_results import SNAPSHOT_BYTES, hand_out, retire
from netcl.runtime.variable import IN_USE as _VARIABLES_IN_USE
from netcl.runtime.variable import Variable

_OUT_OF_ORDER = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE


@dataclass(eq=False)
class Launch:
    """One recorded kernel launch: the kernel, its sizes and its raw arguments at capture."""

    kernel: cl.Kernel
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    args: list[Any]
    #: argument index -> input slot, for the arguments that are graph inputs
    dynamic: dict[int, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.kernel.function_name


@dataclass(eq=False)
class Command:
    """One recorded non-kernel command (device copy or fill): ``command(queue, *args)``."""

    command: Callable[..., Any]
    args: list[Any]
    dynamic: dict[int, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.command.__name__.strip("_")


@dataclass(frozen=True)
class _Slot:
    """What a dynamic input looked like at capture; replays must match it."""

    nbytes: int
    shape: tuple[int, ...] | None
    dtype: np.dtype | None
    device: Device | None


@dataclass
class _Plan:
    steps: list[tuple[Any, Any, Any]]
    uses: list[list[tuple[Callable[[int, Any], None], int]]]
    has_commands: bool
    #: on the captured in-order queue, kernels only: one prepared enqueue per step but the last
    #: (``netcl.runtime.enqueue.enqueuer``), whether they return a status, and the last step
    calls: list[Callable[[], Any]] = field(default_factory=list)
    calls_return_status: bool = False
    #: per recorded Variable: [variable, value its uses were last set to, [(setter, argument index)]]
    variables: list[list[Any]] = field(default_factory=list)


class Graph:
    """A captured sequence of kernel launches on one queue, replayable with new inputs.

    Use ``with g.capture(queue, inputs=[x]): ...`` (or ``capture_graph``), then
    ``g.execute(x2)``. See the module docstring for what replay reuses and checks.
    """

    def __init__(self) -> None:
        self.steps: list[Launch | Command] = []
        self.inputs: list[Tensor | cl.Buffer] = []
        #: What ``execute`` returns: set by ``capture_graph`` from ``fn``'s result, or by you.
        self.outputs: Any = None
        self.queue: cl.CommandQueue | None = None
        self.state = CaptureState.EMPTY
        #: Event of the last command of the most recent replay (None before the first).
        self.last_event: cl.Event | None = None
        self._slots: list[_Slot] = []
        self._captured_raw: list[Any] = []
        self._keep: list[Any] = []
        self._plan: _Plan | None = None
        self._bound: list[Any] = []
        self._lock = threading.Lock()
        self._out_of_order = False
        self._numpy_fn: tuple[Callable[..., Any], list[Any], list[int], dict[str, Any]] | None = None
        #: How many replays ran; a result names the replay that made it and the one that overwrote it.
        self.replays = 0
        #: Results up to this many bytes are copied when a later replay would overwrite them.
        self.snapshot_bytes = SNAPSHOT_BYTES
        #: How stale-result errors name this graph (owners such as CompiledGraph set it).
        self.label: str | None = None
        self._live_results: list[Any] = []
        self._input_ids: set[int] = set()
        self._last_queue: cl.CommandQueue | None = None
        self._variables: dict[int, Variable] = {}
        #: host functions every replay calls before its launches (``record_host_step``), in capture order
        self.host_steps: list[Callable[[], None]] = []

    # ---- inspection -----------------------------------------------------------------------
    @property
    def launches(self) -> list[Launch]:
        """The recorded kernel launches, in order (copies and fills are in ``steps``)."""
        return [s for s in self.steps if isinstance(s, Launch)]

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def variables(self) -> dict[str, Variable]:
        """The bound integers (``netcl.runtime.Variable``) the captured launches take, by name."""
        return {v.name: v for v in self._variables.values()}

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.steps[:6]) + (", ..." if len(self.steps) > 6 else "")
        return f"<Graph {self.state}: {len(self.steps)} steps [{names}], {len(self.inputs)} inputs>"

    # ---- capture --------------------------------------------------------------------------
    @contextmanager
    def capture(
        self, queue: cl.CommandQueue | Any = None, inputs: Sequence[Tensor | cl.Buffer] | None = None
    ) -> Iterator[Graph]:
        """Record every launch on ``queue`` (a queue, ``Stream`` or ``Device``; default device's).

        ``inputs`` declares the dynamic input buffers (also possible later with ``set_inputs``).
        Raises ``RuntimeError`` if another capture is already recording on the queue.
        """
        if self.state != CaptureState.EMPTY:
            raise ReplayError(f"this graph is already {self.state}; make a new Graph to capture again")
        q = as_queue(queue)
        if q is None:
            raise ReplayError(
                "Graph.capture needs an OpenCL queue; on the NumPy backend use capture_graph(None, fn, *args)"
            )
        self.queue = q
        self._out_of_order = bool(q.properties & _OUT_OF_ORDER)
        if inputs is not None:
            self.set_inputs(inputs)
        recording.begin(q, self)
        self.state = CaptureState.CAPTURING
        try:
            yield self
        except BaseException:
            self.state = CaptureState.FAILED
            raise
        finally:
            recording.end(q, self)
        self.state = CaptureState.CAPTURED

    def record_launch(
        self,
        kernel: cl.Kernel,
        global_size: tuple[int, ...],
        local_size: tuple[int, ...] | None,
        args: list[Any],
        keep: Sequence[Any] = (),
    ) -> None:
        """Called by ``launch`` for each launch on the capturing queue."""
        self.steps.append(Launch(kernel, tuple(global_size), local_size, _freeze_scalars(kernel, args)))
        self._keep.extend(keep)
        if _VARIABLES_IN_USE[0]:
            self._note_variables(args)

    def _note_variables(self, args: Sequence[Any]) -> None:
        for a in args:
            if type(a) is Variable:
                other = self.variables.get(a.name)
                if other is not None and other is not a:
                    raise ReplayError(
                        f"two different Variables named {a.name!r} in one capture; bindings name them, so names "
                        "must be unique within a graph"
                    )
                self._variables[id(a)] = a

    def record_command(self, command: Callable[..., Any], args: list[Any], keep: Sequence[Any] = ()) -> None:
        """Called by ``enqueue_copy`` / ``enqueue_fill`` for each command on the capturing queue."""
        self.steps.append(Command(command, list(args)))
        self._keep.extend(keep)

    def record_host_step(self, step: Callable[[], None]) -> None:
        """Called by ``recording.record_host_step`` during the capture: ``step()`` runs before each replay's
        launches (once, however often it is recorded)."""
        if step not in self.host_steps:
            self.host_steps.append(step)

    def set_inputs(self, inputs: Sequence[Tensor | cl.Buffer]) -> None:
        """Declare the dynamic inputs (Tensors or ``cl.Buffer``s used by the captured launches)."""
        inputs = list(inputs)
        slots, raws, seen = [], [], {}
        for index, obj in enumerate(inputs):
            if isinstance(obj, Tensor):
                if obj.device.kind != "opencl" and self._numpy_fn is None:
                    raise ReplayError(f"input {index} lives on the NumPy backend; an OpenCL graph needs device buffers")
                slots.append(_Slot(obj.nbytes, obj.shape, obj.dtype, obj.device))
                raw = obj.data
            elif isinstance(obj, cl.MemoryObjectHolder):
                slots.append(_Slot(obj.size, None, None, None))
                raw = obj
            else:
                raise ReplayError(f"input {index} is a {type(obj).__name__}; graph inputs are Tensors or cl.Buffers")
            if isinstance(raw, cl.MemoryObjectHolder):
                other = seen.setdefault(raw.int_ptr, index)
                if other != index:
                    raise ReplayError(
                        f"inputs {other} and {index} share one buffer; a graph cannot tell their uses apart"
                    )
            raws.append(raw)
        self.inputs, self._slots, self._captured_raw = inputs, slots, raws
        self._input_ids = {id(x) for x in inputs} | {id(r) for r in raws}
        self._plan = None

    # ---- replay ---------------------------------------------------------------------------
    def execute(
        self,
        *new_inputs: Tensor | cl.Buffer,
        copy_outputs: bool = False,
        queue: Any = None,
        wait: bool = False,
        bindings: dict[str, int] | None = None,
    ) -> Any:
        """Replay the captured launches with ``new_inputs`` in place of the captured inputs.

        ``bindings`` maps ``Variable`` names (``graph.variables``) to the values this replay (and,
        the variables keeping them, later ones) passes; every recorded Variable's current value is
        passed either way. An unknown name is a ``ReplayError``, a value out of range a ``ValueError``,
        both before anything is enqueued.

        Returns ``outputs`` as this replay's results: ``ReplayResult`` tensors that the next
        replay copies out (up to ``snapshot_bytes``) or marks stale (larger: reading them raises
        ``StaleResultError``), or fresh copies of them with ``copy_outputs=True``. ``queue``
        replays on another queue of the same context; ``wait`` blocks until it has finished.
        """
        if bindings:
            self._bind(bindings)
        if self._numpy_fn is not None:
            return self._execute_numpy(new_inputs, copy_outputs)
        if self.state != CaptureState.CAPTURED:
            raise ReplayError(f"cannot execute a graph that is {self.state}; capture it first")
        raws = self._check(new_inputs)
        q = self.queue if queue is None else as_queue(queue)
        if q is not self.queue and q.context != self.queue.context:
            raise ReplayError("execute(queue=...) must be a queue of the context the graph was captured on")
        for step in self.host_steps:  # host work that keeps device state current (uploads on the graph's queue)
            step()
        with self._lock:
            if self._live_results:  # results of the last replay still referenced: keep them valid
                previous = self._last_queue or q
                ooo = self._out_of_order if previous is self.queue else bool(previous.properties & _OUT_OF_ORDER)
                retire(self, previous, ooo)
                if previous is not q:
                    previous.finish()
            plan = self._plan or self._build_plan()
            bound = self._bound
            for slot, raw in enumerate(raws):
                if raw is not bound[slot]:
                    for setter, index in plan.uses[slot]:
                        setter(index, raw)
                    bound[slot] = raw
            for entry in plan.variables:  # bound integers: their value now, where it changed
                value = entry[0].value
                if value != entry[1]:
                    arg = np.int32(value)
                    for setter, index in entry[2]:
                        setter(index, arg)
                    entry[1] = value
            chained = self._out_of_order if q is self.queue else q.properties & _OUT_OF_ORDER
            if _PROFILERS:  # netcl.profiler is active: every command with an event, reported
                event = _profiled_replay(q, plan.steps, bool(chained), self.label)
            elif chained:
                event = _run_chained(q, plan.steps)
            elif q is self.queue and plan.steps and not plan.has_commands:
                event = _run_prepared(q, plan)
            elif plan.has_commands:
                event = _run_mixed(q, plan.steps)
            else:
                event = _run_kernels(q, plan.steps)
            self.replays += 1
            self._last_queue = q
        self.last_event = event
        result = self._map_outputs(new_inputs, copy_outputs, q)
        if wait:
            q.finish()
        return result

    __call__ = execute

    def _bind(self, bindings: dict[str, int]) -> None:
        """Check every binding, then bind them all (nothing changes when one is bad)."""
        known = self.variables
        checked = []
        for name, value in bindings.items():
            variable = known.get(name)
            if variable is None:
                raise ReplayError(
                    f"execute(bindings=...): this graph has no Variable named {name!r}; "
                    f"its variables: {sorted(known) or 'none'}"
                )
            checked.append((variable, variable.check(value)))
        for variable, value in checked:
            variable.bind(value)

    def _check(self, new_inputs: Sequence[Any]) -> list[Any]:
        """Validate a replay's inputs against the captured signature; return their buffers."""
        if not new_inputs:
            return self._captured_raw
        if not self._slots:
            raise ReplayError(
                f"execute got {len(new_inputs)} new input(s), but this graph was captured without declared inputs: "
                "declare them when capturing, graph.capture(queue, inputs=[x, ...]) (or graph.set_inputs([x, ...]) "
                "after capture, or capture_graph(queue, fn, x, ...)); execute() with no arguments replays on the "
                "captured buffers"
            )
        if len(new_inputs) != len(self._slots):
            raise ReplayError(f"graph was captured with {len(self._slots)} inputs; execute got {len(new_inputs)}")
        raws = []
        for index, (obj, slot) in enumerate(zip(new_inputs, self._slots, strict=True)):
            if isinstance(obj, Tensor):
                if slot.shape is not None and (obj.shape != slot.shape or obj.dtype != slot.dtype):
                    raise ReplayError(
                        f"input {index}: captured {slot.shape} {slot.dtype}, got {obj.shape} {obj.dtype}; "
                        "replay needs the captured shape and dtype"
                    )
                if obj.nbytes != slot.nbytes:
                    raise ReplayError(f"input {index}: captured {slot.nbytes} bytes, got {obj.nbytes} bytes")
                if slot.device is not None and obj.device is not slot.device:
                    raise ReplayError(f"input {index}: captured on {slot.device!r}, got a tensor on {obj.device!r}")
                if slot.device is None and (obj.device.kind != "opencl" or obj.device.context != self.queue.context):
                    raise ReplayError(f"input {index}: tensor on {obj.device!r} is not in the graph's OpenCL context")
                raws.append(obj.data)
            elif isinstance(obj, cl.MemoryObjectHolder):
                if obj.size != slot.nbytes:
                    raise ReplayError(f"input {index}: captured {slot.nbytes} bytes, got a {obj.size}-byte buffer")
                if obj.context != self.queue.context:
                    raise ReplayError(f"input {index}: buffer belongs to another OpenCL context than the graph")
                raws.append(obj)
            else:
                raise ReplayError(f"input {index}: expected a Tensor or cl.Buffer, got {type(obj).__name__}")
        return raws

    def _build_plan(self) -> _Plan:
        """Make private kernels with every argument set; find where each input is used."""
        slot_of = {raw.int_ptr: slot for slot, raw in enumerate(self._captured_raw)}
        uses: list[list[tuple[Callable[[int, Any], None], int]]] = [[] for _ in self._captured_raw]
        steps: list[tuple[Any, Any, Any]] = []
        variables: dict[int, list[Any]] = {}
        has_commands = False
        for step in self.steps:
            step.dynamic = {
                i: slot_of[a.int_ptr]
                for i, a in enumerate(step.args)
                if isinstance(a, cl.MemoryObjectHolder) and a.int_ptr in slot_of
            }
            if isinstance(step, Launch):
                private = cl.Kernel(step.kernel.program, step.kernel.function_name)
                for i, a in enumerate(step.args):
                    if type(a) is Variable:
                        entry = variables.get(id(a))
                        if entry is None:
                            entry = variables[id(a)] = [a, a.value, []]
                        entry[2].append((private.set_arg, i))
                        a = np.int32(entry[1])
                    private.set_arg(i, a)
                setter = private.set_arg
                steps.append((private, step.global_size, step.local_size))
            else:
                has_commands = True
                args = list(step.args)
                setter = args.__setitem__
                steps.append((None, step.command, args))
            for i, slot in step.dynamic.items():
                uses[slot].append((setter, i))
        self._bound = list(self._captured_raw)
        self._plan = _Plan(steps, uses, has_commands, variables=list(variables.values()))
        if not has_commands and not self._out_of_order:
            prepared = [enqueuer(self.queue, kernel, gsize, lsize) for kernel, gsize, lsize in steps[:-1]]
            self._plan.calls = [call for call, _ in prepared]
            self._plan.calls_return_status = any(status for _, status in prepared)
        return self._plan

    def _map_outputs(self, new_inputs: Sequence[Any], copy: bool, queue: cl.CommandQueue) -> Any:
        """``outputs`` with captured inputs (and views of them) replaced by the replay's inputs."""
        outputs = self.outputs
        if outputs is None:
            return None
        if (  # the common case, kept short: one output tensor that is no input
            not copy
            and type(outputs) is Tensor
            and id(outputs) not in self._input_ids
            and id(outputs.data) not in self._input_ids
        ):
            return hand_out(self, outputs)
        new_inputs = new_inputs or self.inputs
        replace = {id(old): new for old, new in zip(self.inputs, new_inputs, strict=False)}
        replace_raw = {id(old): new for old, new in zip(self._captured_raw, new_inputs, strict=False)}

        def one(obj: Any) -> Any:
            if id(obj) in replace:
                obj = replace[id(obj)]
            elif isinstance(obj, Tensor) and id(obj.data) in replace_raw:
                source = replace_raw[id(obj.data)]
                data = source.data if isinstance(source, Tensor) else source
                obj = Tensor(
                    data, obj.shape, obj.dtype, obj.device, base=source if isinstance(source, Tensor) else None
                )
            elif isinstance(obj, Tensor) and not copy:
                return hand_out(self, obj)  # a graph buffer: valid until the next replay retires it
            return _copy_tensor(obj, queue) if copy else obj

        return _map_structure(self.outputs, one)

    # ---- NumPy backend --------------------------------------------------------------------
    def _execute_numpy(self, new_inputs: Sequence[Any], copy: bool) -> Any:
        fn, args, positions, kwargs = self._numpy_fn  # type: ignore[misc]
        self._check_numpy(new_inputs)
        call_args = list(args)
        for position, new in zip(positions, new_inputs, strict=False):
            call_args[position] = new
        result = fn(*call_args, **kwargs)
        input_arrays = [t.data for t in self.inputs]
        _reuse_outputs(self.outputs, result, input_arrays)  # g.outputs shows the latest replay, as on OpenCL
        self.replays += 1
        working = [a for a in _tensor_arrays(self.outputs) if not any(np.shares_memory(a, i) for i in input_arrays)]

        def one(obj: Any) -> Any:
            if not isinstance(obj, Tensor):
                return obj
            if copy or any(np.shares_memory(obj.data, a) for a in working):
                return _copy_tensor(obj)  # fn handed back state the next replay overwrites
            return obj

        return _map_structure(result, one)

    def _check_numpy(self, new_inputs: Sequence[Any]) -> None:
        if not new_inputs:
            return
        if not self._slots:
            raise ReplayError(
                f"execute got {len(new_inputs)} new input(s), but this graph was captured without declared inputs: "
                "declare them when capturing, graph.capture(queue, inputs=[x, ...]) (or graph.set_inputs([x, ...]) "
                "after capture, or capture_graph(queue, fn, x, ...)); execute() with no arguments replays on the "
                "captured buffers"
            )
        if len(new_inputs) != len(self._slots):
            raise ReplayError(f"graph was captured with {len(self._slots)} inputs; execute got {len(new_inputs)}")
        for index, (obj, slot) in enumerate(zip(new_inputs, self._slots, strict=True)):
            if not isinstance(obj, Tensor):
                raise ReplayError(f"input {index}: expected a Tensor, got {type(obj).__name__}")
            if obj.shape != slot.shape or obj.dtype != slot.dtype or obj.device is not slot.device:
                raise ReplayError(
                    f"input {index}: captured {slot.shape} {slot.dtype} on {slot.device!r}, "
                    f"got {obj.shape} {obj.dtype} on {obj.device!r}"
                )


def capture_graph(queue: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Graph:
    """Run ``fn(*args, **kwargs)`` once while capturing its launches; return the ``Graph``.

    The ``Tensor`` / ``cl.Buffer`` positional ``args`` are the dynamic inputs (replace them
    with ``g.execute(*new)``, same order); keyword arguments and other positional ones are
    frozen. ``fn``'s return value becomes ``g.outputs``. ``queue`` may be None (the queue of
    the first Tensor argument, else the default device's). On the NumPy backend nothing
    can be captured: ``execute`` re-runs ``fn``, copies its results into ``outputs`` (which
    shows the latest replay, as on OpenCL) and returns the re-run's own results.
    """
    positions = [i for i, a in enumerate(args) if isinstance(a, (Tensor, cl.MemoryObjectHolder))]
    inputs = [args[i] for i in positions]
    graph = Graph()
    graph._note_variables([*args, *kwargs.values()])  # bindable by name on both backends
    if _is_numpy(queue, inputs):
        graph._numpy_fn = (fn, list(args), positions, dict(kwargs))
        graph.set_inputs(inputs)
        graph.outputs = fn(*args, **kwargs)
        graph.state = CaptureState.CAPTURED
        return graph
    if queue is None:
        first = next((a for a in inputs if isinstance(a, Tensor)), None)
        queue = first.device.queue if first is not None else None
    with graph.capture(queue, inputs=inputs):
        graph.outputs = fn(*args, **kwargs)
    if not graph.steps:
        warnings.warn(
            f"capture_graph captured nothing from {getattr(fn, '__name__', fn)!r}: its work did not go "
            "through netcl.runtime.launch on the capturing queue, so execute() will enqueue nothing",
            RuntimeWarning,
            stacklevel=2,
        )
    return graph


def as_queue(obj: Any) -> cl.CommandQueue | None:
    """The command queue of a queue, ``Stream``, ``Device`` or device spec (None: default device)."""
    if isinstance(obj, cl.CommandQueue):
        return obj
    if obj is None or isinstance(obj, str):
        return get_device(obj).queue
    queue = getattr(obj, "queue", None)
    if queue is None and not isinstance(obj, Device):
        raise TypeError(f"expected a cl.CommandQueue, Stream or Device, got {type(obj).__name__}")
    return queue


# ---- replay loops (kept tiny: this is the per-kernel host cost) -------------------------------
def _run_prepared(queue: cl.CommandQueue, plan: _Plan) -> cl.Event:
    """Kernels only, on the captured queue: the prepared enqueues, then the last step with its event."""
    if plan.calls_return_status:
        for index, call in enumerate(plan.calls):
            status = call()
            if status:
                raise_status(status, plan.steps[index][0])
    else:
        for call in plan.calls:
            call()
    kernel, gsize, lsize = plan.steps[-1]
    return cl.enqueue_nd_range_kernel(queue, kernel, gsize, lsize)


def _run_kernels(queue: cl.CommandQueue, steps: list[tuple[Any, Any, Any]]) -> cl.Event | None:
    enqueue = cl.enqueue_nd_range_kernel
    event = None
    for kernel, gsize, lsize in steps:
        event = enqueue(queue, kernel, gsize, lsize)
    return event


def _run_mixed(queue: cl.CommandQueue, steps: list[tuple[Any, Any, Any]]) -> cl.Event | None:
    enqueue = cl.enqueue_nd_range_kernel
    event = None
    for kernel, a, b in steps:
        event = a(queue, *b) if kernel is None else enqueue(queue, kernel, a, b)
    return event


def _run_chained(queue: cl.CommandQueue, steps: list[tuple[Any, Any, Any]]) -> cl.Event | None:
    enqueue = cl.enqueue_nd_range_kernel
    event = None
    for kernel, a, b in steps:
        wait = None if event is None else (event,)
        event = a(queue, *b, wait_for=wait) if kernel is None else enqueue(queue, kernel, a, b, wait_for=wait)
    return event


# ---- helpers ---------------------------------------------------------------------------------
def _freeze_scalars(kernel: cl.Kernel, args: list[Any]) -> list[Any]:
    """Convert Python numbers to the kernel's declared numpy scalar types, as set_args did."""
    if not any(isinstance(a, (bool, int, float)) for a in args):
        return list(args)
    dtypes = declared_scalar_dtypes(kernel)
    frozen = []
    for index, arg in enumerate(args):
        if isinstance(arg, (bool, int, float)):
            dtype = dtypes[index] if dtypes is not None and index < len(dtypes) else None
            if dtype is None:
                raise ReplayError(
                    f"cannot capture argument {index} of kernel {kernel.function_name!r}: a Python number whose "
                    "type was not declared with KernelHandle.kernel(name, scalar_dtypes); pass a numpy scalar"
                )
            arg = dtype.type(arg)
        frozen.append(arg)
    return frozen


def _is_numpy(queue: Any, inputs: list[Any]) -> bool:
    """Whether the capture runs on a device without a queue (the NumPy backend): nothing to record."""
    if isinstance(queue, Device):
        return not queue.has_queue
    if isinstance(queue, str):
        return not get_device(queue).has_queue
    if queue is not None:
        return False
    if any(isinstance(a, Tensor) and not a.device.has_queue for a in inputs):
        return True
    return not inputs and not get_device().has_queue


def _copy_tensor(tensor: Any, queue: cl.CommandQueue | None = None) -> Any:
    if not isinstance(tensor, Tensor):
        return tensor
    if not tensor.device.has_queue:
        return tensor.copy()
    out = Tensor.empty(tensor.shape, tensor.dtype, tensor.device)
    if tensor.nbytes:
        enqueue_copy(queue, out, tensor)
    return out


def _map_structure(obj: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(obj, (tuple, list)):
        return _rebuild(obj, [_map_structure(o, fn) for o in obj])
    if isinstance(obj, dict):
        return {k: _map_structure(v, fn) for k, v in obj.items()}
    return fn(obj)


def _rebuild(template: tuple | list, items: list[Any]) -> Any:
    if isinstance(template, list):
        return items
    return type(template)(*items) if hasattr(template, "_fields") else tuple(items)


def _tensor_arrays(obj: Any) -> list[Any]:
    """The NumPy arrays of the Tensors in a nested structure of outputs."""
    arrays: list[Any] = []
    _map_structure(obj, lambda t: arrays.append(t.data) if isinstance(t, Tensor) else None)
    return arrays


def _reuse_outputs(outputs: Any, result: Any, input_arrays: list[np.ndarray]) -> Any:
    """NumPy backend: write a re-run's results into the captured output tensors and return them.

    A captured output that shares memory with a captured input is not overwritten (that
    would clobber the input); the re-run's own result is returned in its place.
    """
    if isinstance(outputs, Tensor):
        if not isinstance(result, Tensor) or result.shape != outputs.shape or result.dtype != outputs.dtype:
            raise ReplayError("the replayed function returned another shape or dtype than at capture")
        if any(np.shares_memory(outputs.data, a) for a in input_arrays):
            return result
        np.copyto(outputs.data, result.data.reshape(outputs.data.shape))
        return outputs
    if isinstance(outputs, (tuple, list)):
        if not isinstance(result, (tuple, list)) or len(result) != len(outputs):
            raise ReplayError("the replayed function returned another structure than at capture")
        merged = [_reuse_outputs(o, r, input_arrays) for o, r in zip(outputs, result, strict=True)]
        return _rebuild(outputs, merged)
    if isinstance(outputs, dict):
        return {key: _reuse_outputs(o, result[key], input_arrays) for key, o in outputs.items()}
    return result
