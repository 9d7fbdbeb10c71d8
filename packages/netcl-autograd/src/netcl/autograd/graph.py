"""``CompiledGraph``: capture one whole training step (forward, backward, update) and replay it.

Built on ``netcl.runtime.graph.Graph``. The first ``with g:`` runs the step eagerly while every
kernel launch on the parameters' queue is recorded; ``compile(inputs)`` names the tensors that
change from step to step; ``replay(new_inputs)`` re-enqueues the recorded launches with the new
input buffers (the recorded backward writes every gradient buffer from scratch: nothing to zero).
Everything else is frozen: the step's intermediate, gradient and output buffers are the captured
ones (kept alive here), so a Node created in the captured step (e.g. the loss) reads the latest
replay's value. What ``replay`` returns is different: new Nodes over ``ReplayResult`` tensors,
which the next replay copies out (small ones, such as a loss) or marks stale (reading them raises
``StaleResultError``), so a collected list of losses never reads back the last one.
Host work in the step (uploads, Python branches) is not replayed; a host read of a device value
(``to_host``, ``item``) inside the capture raises ``HostReadInCaptureError``. A replay after a module the
step read switched mode, or after a parameter was frozen, unfrozen or given another tensor, raises
``StaleCaptureError`` (``netcl.autograd.capture_checks``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from netcl.autograd.capture_checks import CaptureChecks
from netcl.autograd.engine import Node, Tape, get_current_tape, untracked
from netcl.core import Device, Tensor, get_device
from netcl.runtime.capture import CaptureState
from netcl.runtime.errors import ReplayError, StaleCaptureError
from netcl.runtime.graph import Graph


class CompiledGraph:
    """Capture-and-replay of a training step over ``params`` (leaf Nodes that get gradients).

    The captured step starts from cleared gradients (each parameter's ``grad`` is set to None on
    the first entry), so the recorded backward writes every gradient buffer from scratch.
    Set ``g.outputs`` inside the capturing block to what ``replay`` should return (e.g. the loss
    Node); replays overwrite those buffers in place and return results that stay valid.
    """

    def __init__(self, params: Iterable[Node] = (), device: Device | str | None = None) -> None:
        self.params: list[Node] = list(params)
        self.outputs: Any = None
        self.state = CaptureState.EMPTY
        self.graph: Graph | None = None
        self.grads: list[Tensor | None] = []
        self._device = device
        self._capture_cm: Any = None
        self._tape: Tape | None = None
        self._own_tape = False
        self._keep: list[Any] = []
        self._allocator: Any = None
        self._compiled = False
        self._result_template: Any = None
        #: what the capture depended on besides its inputs (module modes, parameters), checked per replay
        self.checks = CaptureChecks(self.params)
        self._checks_cm: Any = None

    @property
    def device(self) -> Device:
        if self._device is not None:
            return get_device(self._device)
        return self.params[0].device if self.params else get_device()

    # ---- capture ---------------------------------------------------------------------------
    def __enter__(self) -> CompiledGraph:
        if self.state == CaptureState.CAPTURED:
            self.restore_grads()
            return self
        if self.state == CaptureState.CAPTURING:
            raise ReplayError("CompiledGraph is already capturing; its with-blocks do not nest")
        device = self.device
        if device.kind != "opencl":
            raise ReplayError(
                f"CompiledGraph captures OpenCL kernel launches; the parameters live on {device!r} "
                "(the NumPy backend has no launches to capture): run the step eagerly there"
            )
        for p in self.params:
            p.grad, p._grad_owned, p.value.grad = None, False, None
        self.graph = Graph()
        self.graph.label = f"CompiledGraph over {len(self.params)} params"
        self._keep = []
        self._watch_allocations(device)
        self._capture_cm = self.graph.capture(device.queue)
        try:
            self._capture_cm.__enter__()
        except BaseException:
            self._unwatch_allocations(device)
            raise
        self._own_tape = get_current_tape() is None
        self._tape = Tape() if self._own_tape else get_current_tape()
        if self._own_tape:
            self._tape.__enter__()
        self.checks = CaptureChecks(self.params)
        self._checks_cm = self.checks.recording()
        self._checks_cm.__enter__()
        self.state = CaptureState.CAPTURING
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.state != CaptureState.CAPTURING:
            return
        device = self.device
        self._checks_cm.__exit__(exc_type, exc, tb)
        if self._own_tape and self._tape is not None:
            self._tape.__exit__(exc_type, exc, tb)
        try:
            self._capture_cm.__exit__(exc_type, exc, tb)
        finally:
            self._unwatch_allocations(device)
        if exc_type is not None:
            self.state, self.graph, self._keep = CaptureState.EMPTY, None, []
            return
        # keep every tensor of the captured step alive: replay writes into these buffers
        if self._tape is not None:
            for node in self._tape.nodes:
                self._keep.append(node)
                self._keep.append(node.grad)
        self._tape = None
        self.grads = [p.grad for p in self.params]
        self.state = CaptureState.CAPTURED

    def _watch_allocations(self, device: Device) -> None:
        """Keep every buffer allocated during the capture (so no pool hands it out again)."""
        original = device.allocator
        keep = self._keep

        def allocate(dev: Device, nbytes: int) -> Any:
            buffer = original(dev, nbytes)
            keep.append(buffer)
            return buffer

        self._allocator = original
        device.allocator = allocate

    def _unwatch_allocations(self, device: Device) -> None:
        if self._allocator is not None:
            device.allocator = self._allocator
            self._allocator = None

    # ---- replay ----------------------------------------------------------------------------
    def compile(self, inputs: Sequence[Node | Tensor]) -> CompiledGraph:
        """Declare the dynamic inputs: the tensors the captured step read that replays replace."""
        graph = self._captured()
        graph.set_inputs([_tensor(x, i) for i, x in enumerate(inputs)])
        self._compiled = True
        return self

    def replay(self, new_inputs: Sequence[Node | Tensor] = (), copy_outputs: bool = False) -> Any:
        """Re-enqueue the captured step with ``new_inputs`` (its backward rewrites the gradient buffers).

        ``new_inputs`` must match the compiled inputs in count, shape, dtype and device
        (``ReplayError`` otherwise, before anything is enqueued); ``StaleCaptureError`` when the
        modules or parameters no longer match the capture (``CaptureChecks``). Returns ``outputs`` as this
        replay's results: new Nodes (no graph history) over ``ReplayResult`` tensors that the
        next replay copies out or marks stale (see ``netcl.runtime.replay_results``); with
        ``copy_outputs=True``, over fresh copies. The parameters' ``grad`` always holds the
        latest replay's gradient.
        """
        graph = self._captured()
        stale = self.checks.stale_reason()
        if stale is not None:
            raise StaleCaptureError(stale)
        tensors = [_tensor(x, i) for i, x in enumerate(new_inputs)]
        if tensors and not self._compiled:
            raise ReplayError("replay got new inputs but compile(inputs) was never called to declare them")
        if tensors:
            _validate(graph.inputs, tensors)  # before anything is enqueued
        if self._result_template is not self.outputs:
            self._result_template = self.outputs
            graph.outputs = _map_nodes(self.outputs, lambda n: n.value)
        results = graph.execute(*tensors, copy_outputs=copy_outputs)
        self.restore_grads()
        return _rewrap(self.outputs, results)

    def restore_grads(self) -> None:
        """Point every parameter's ``grad`` (and ``value.grad``) at its captured gradient buffer."""
        for p, grad in zip(self.params, self.grads, strict=True):
            p.grad, p._grad_owned, p.value.grad = grad, False, grad

    def _captured(self) -> Graph:
        if self.state != CaptureState.CAPTURED or self.graph is None:
            raise ReplayError(f"CompiledGraph is {self.state}; capture a step with `with graph:` first")
        return self.graph

    def __repr__(self) -> str:
        steps = len(self.graph) if self.graph is not None else 0
        return f"<CompiledGraph {self.state}: {steps} captured steps, {len(self.params)} params>"


def _validate(captured: Sequence[Any], new: Sequence[Tensor]) -> None:
    if len(new) != len(captured):
        raise ReplayError(f"graph was captured with {len(captured)} inputs; replay got {len(new)}")
    for index, (old, tensor) in enumerate(zip(captured, new, strict=True)):
        if isinstance(old, Tensor) and (
            old.shape != tensor.shape or old.dtype != tensor.dtype or old.device is not tensor.device
        ):
            raise ReplayError(
                f"input {index}: captured {old.shape} {old.dtype} on {old.device.spec}, "
                f"got {tensor.shape} {tensor.dtype} on {tensor.device.spec}; replay needs the captured signature"
            )


def _tensor(x: Node | Tensor, index: int) -> Tensor:
    if isinstance(x, Node):
        return x.value
    if isinstance(x, Tensor):
        return x
    raise ReplayError(f"input {index}: expected a Node or Tensor, got {type(x).__name__}")


def _map_nodes(obj: Any, fn: Any) -> Any:
    """``fn`` applied to each Node of a nested tuple/list/dict structure."""
    if isinstance(obj, (tuple, list)):
        items = [_map_nodes(o, fn) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        return {k: _map_nodes(v, fn) for k, v in obj.items()}
    return fn(obj) if isinstance(obj, Node) else obj


def _rewrap(template: Any, results: Any) -> Any:
    """The replay's result tensors in ``template``'s structure, Nodes where it has Nodes."""
    if isinstance(template, (tuple, list)):
        items = [_rewrap(t, r) for t, r in zip(template, results, strict=True)]
        return type(template)(*items) if hasattr(template, "_fields") else type(template)(items)
    if isinstance(template, dict):
        return {k: _rewrap(v, results[k]) for k, v in template.items()}
    if isinstance(template, Node):
        return untracked(results, template.op_name)
    return results
