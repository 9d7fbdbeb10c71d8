"""``fuse_graph``: a model's step, jit-fused and captured once, replayed per call.

The spec's ``netcl.runtime.graph_fusion.fuse_graph`` lives here, in netcl.jit: it needs
``jit_compile`` and autograd's ``CompiledGraph``, and the runtime layer cannot depend on either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from netcl.autograd.autocast_mode import autocast_dtype, set_autocast_dtype
from netcl.autograd.capture_checks import CaptureChecks
from netcl.autograd.engine import Node, Tape, no_grad, untracked
from netcl.autograd.graph import CompiledGraph
from netcl.core import Device, Tensor, get_device
from netcl.core.writes import written
from netcl.jit.compiler import jit_compile
from netcl.runtime.errors import StaleCaptureError
from netcl.runtime.ops import get_float32_matmul_precision, matmul_precision


class FusedGraph:
    """One step of a model (forward, or forward + backward [+ update]), captured for replay.

    ``execute(x, target)`` (alias ``replay``) runs one step on new inputs of the captured shapes
    and returns the step's output Node: the loss when there is a ``loss_fn``, else the model's
    output. On OpenCL that is one replay of the captured kernels, and the returned Node is this
    step's result: a small one (a loss) stays valid when later steps run (the next replay copies
    it out of the graph's buffer if it is still referenced), reading a large one after a later
    step raises ``StaleResultError`` (``copy_outputs=True`` keeps it). After a training step every
    parameter's ``grad`` holds this step's gradient (not accumulated). A replay computes as the
    capture did: under the autocast dtype and matmul precision in effect when ``fuse_graph`` ran,
    whatever is in effect at the replay. On the NumPy backend there is nothing to capture and each
    call runs the jit-compiled step (under those two settings).
    """

    def __init__(
        self,
        step: Callable[..., Node],
        params: list[Node],
        device: Device,
        train: bool,
        has_target: bool,
        optimizer_step: Callable[[], Any] | None,
        after_step: Callable[[Node], Any] | None = None,
    ) -> None:
        self.step = step
        self.params = params
        self.device = device
        self.train = train
        self.has_target = has_target
        self.optimizer_step = optimizer_step
        self.after_step = after_step
        #: The CompiledGraph holding the captured step (None on the NumPy backend).
        self.compiled: CompiledGraph | None = None
        self.outputs: Node | None = None
        #: autocast's dtype and the matmul precision at capture: what every replay computes with (on the
        #: NumPy backend, where each call runs the step again, they are restored around it)
        self.autocast = autocast_dtype()
        self.precision = get_float32_matmul_precision()
        #: what the captured step depended on besides its inputs (the CompiledGraph's on OpenCL)
        self.checks = CaptureChecks(params)

    # ---- capture -------------------------------------------------------------------------------
    def capture(self, inputs: list[Node]) -> Node:
        """Run the step once on ``inputs`` while capturing it (OpenCL) or just run it (NumPy)."""
        if self.device.kind != "opencl":
            with self.checks.recording():
                self.outputs = self._eager(inputs)
            return self.outputs
        compiled = CompiledGraph(self.params, device=self.device)
        with compiled:
            compiled.graph.label = f"FusedGraph {getattr(self.step, '__name__', 'step')}"
            compiled.outputs = self._run(inputs)
        compiled.compile([x.value for x in inputs])
        self.compiled, self.outputs, self.checks = compiled, compiled.outputs, compiled.checks
        return self.outputs

    def _run(self, inputs: list[Node]) -> Node:
        if not self.train:
            with no_grad():
                return self.step(*inputs)
        out = self.step(*inputs)
        out.backward()
        if self.optimizer_step is not None:
            self.optimizer_step()
        if self.after_step is not None:
            self.after_step(out)
        return out

    def _eager(self, inputs: list[Node]) -> Node:
        for p in self.params:
            p.grad, p._grad_owned, p.value.grad = None, False, None
        previous = set_autocast_dtype(self.autocast)
        try:
            with Tape(), matmul_precision(self.precision):
                return self._run(inputs)
        finally:
            set_autocast_dtype(previous)

    # ---- replay --------------------------------------------------------------------------------
    def execute(self, x: Any, target: Any = None, copy_outputs: bool = False) -> Node:
        """One step on ``x`` (and ``target``): same shapes, dtype and device as the captured samples.

        ``copy_outputs=True`` returns a fresh copy of the result (no later step touches it). Raises
        ``StaleCaptureError`` when a module whose training flag the captured step read has switched
        mode since (``model.eval()`` after capturing a training step), a parameter was frozen or
        unfrozen (``requires_grad``), or holds another tensor (``Module.to`` another device): the replay
        would compute the captured mode's numbers, the captured gradients and updates, on the old buffers.
        """
        inputs = self._inputs(x, target)
        if self.compiled is None:  # the NumPy backend: the captured settings are checked here, as replay does
            stale = self.checks.stale_reason()
            if stale is not None:
                raise StaleCaptureError(stale)
            return self._eager(inputs)
        result = self.compiled.replay([n.value for n in inputs], copy_outputs=copy_outputs)
        if self.optimizer_step is not None:  # the replayed update wrote the parameters (``netcl.core.writes``)
            written(*(p.value for p in self.params))
        return result

    replay = execute

    def _inputs(self, x: Any, target: Any) -> list[Node]:
        if self.has_target and target is None:
            raise ValueError("this graph was captured with a target: execute(x, target)")
        if not self.has_target and target is not None:
            raise ValueError("this graph was captured without a target: execute(x)")
        items = [x, target] if self.has_target else [x]
        return [_as_node(v, self.device) for v in items]

    @property
    def graph(self) -> Any:
        """The runtime ``Graph`` of the captured step (None on the NumPy backend)."""
        return self.compiled.graph if self.compiled is not None else None

    @property
    def launches(self) -> list[Any]:
        """The captured kernel launches, in order (empty on the NumPy backend)."""
        return self.graph.launches if self.graph is not None else []

    def __repr__(self) -> str:
        kind = "train" if self.train else "inference"
        return f"<FusedGraph {kind} on {self.device.spec}: {len(self.launches)} launches, {len(self.params)} params>"


def _as_node(value: Any, device: Device) -> Node:
    if isinstance(value, Node):
        return value
    if isinstance(value, Tensor):
        return untracked(value, "tensor")
    return untracked(Tensor.from_host(device, np.asarray(value)), "tensor")


def _parameters(model: Any, params: Iterable[Node] | None) -> list[Node]:
    if params is None:
        getter = getattr(model, "parameters", None)
        params = getter() if callable(getter) else ()
    result = list(params)
    for i, p in enumerate(result):
        if not isinstance(p, Node):
            raise TypeError(f"parameter {i} is a {type(p).__name__}; parameters must be Nodes")
    return result


def fuse_graph(
    model: Callable[[Node], Node],
    sample_input: Any,
    target: Any = None,
    loss_fn: Callable[..., Node] | None = None,
    *,
    params: Iterable[Node] | None = None,
    optimizer_step: Callable[[], Any] | None = None,
    after_step: Callable[[Node], Any] | None = None,
    jit: bool = True,
) -> FusedGraph:
    """Jit-fuse and capture one step of ``model``; returns a ``FusedGraph`` to ``execute`` per step.

    ``model`` is a callable taking one input Node and returning a Node, built from netcl.autograd
    ops; its trainable parameters are the leaf Nodes (``requires_grad=True``) returned by
    ``model.parameters()``, or ``params=`` for a plain function. With ``loss_fn`` the step is a
    training step: ``loss = loss_fn(model(x), target)`` (``loss_fn(model(x))`` when ``target`` is
    None), then the backward into the parameters' ``grad``, then ``optimizer_step()`` when given
    (e.g. an SGD update with in-place runtime ops), then ``after_step(loss)`` when given (device work on
    the step's loss, e.g. appending it to a device-side log: captured with the step, so every replay
    runs it). Without ``loss_fn`` it is an inference step (``model(x)`` under ``no_grad``).

    How: the step function is wrapped in ``jit_compile`` (``jit=False`` skips it), so chains of
    elementwise ops collapse into fused kernels while matmuls and losses stay their own kernels;
    then one step runs on ``sample_input`` / ``target`` inside a ``CompiledGraph`` on the
    parameters' device, which records every launch (forward, backward, update). That first step
    really runs: its gradients (and update) are applied. ``execute(x, target)`` replays with new
    inputs of the same shapes. On the NumPy backend there are no launches to capture and
    ``execute`` runs the jit-compiled step eagerly (same results).
    """
    if not callable(model):
        raise TypeError(f"model must be callable (input Node -> Node), got {type(model).__name__}")
    param_list = _parameters(model, params)
    train = loss_fn is not None
    if not train and target is not None:
        raise ValueError("fuse_graph got a target but no loss_fn; pass loss_fn to capture a training step")
    if not train and (optimizer_step is not None or after_step is not None):
        raise ValueError("optimizer_step and after_step need a training step: pass loss_fn")
    if train and not any(p.requires_grad for p in param_list):
        raise ValueError(
            "a training step needs parameters that require grad: give model a parameters() method returning "
            "leaf Nodes with requires_grad=True, or pass params="
        )
    if param_list:
        device = param_list[0].device
    elif isinstance(sample_input, (Node, Tensor)):
        device = sample_input.device
    else:
        device = get_device()
    has_target = target is not None

    if has_target:

        def step(x: Node, y: Node) -> Node:
            return loss_fn(model(x), y)

    elif train:

        def step(x: Node) -> Node:
            return loss_fn(model(x))

    else:

        def step(x: Node) -> Node:
            return model(x)

    step.__qualname__ = step.__name__ = f"fused_step_{getattr(model, '__name__', type(model).__name__)}"
    fused = FusedGraph(
        jit_compile(step) if jit else step, param_list, device, train, has_target, optimizer_step, after_step
    )
    inputs = fused._inputs(sample_input, target)
    fused.capture(inputs)
    return fused
