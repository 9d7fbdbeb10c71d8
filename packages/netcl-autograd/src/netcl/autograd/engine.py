"""The reverse-mode engine: ``Node``, ``Tape``, ``apply_op`` and the thread-local slots.

Nodes form the graph; a ``Tape`` is the thread-local recorder and drives ``backward``.
The graph is built by ``apply_op`` whenever grad mode is on, an input requires grad, and the
tape in scope (if any) is enabled; a tape only adds its record of the nodes (``tape.nodes``).
``apply_op`` never imports netcl.jit: a tracer installs itself with ``set_tracer``.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Protocol

import numpy as np

from netcl.autograd import grad_mode
from netcl.autograd.grad_mode import (
    detect_anomaly,
    is_anomaly_enabled,
    is_grad_enabled,
    no_grad,
    set_detect_anomaly,
    set_grad_enabled,
)
from netcl.autograd.saved_values import check_unmodified
from netcl.core import Device, DeviceError, Tensor, get_device, writes
from netcl.core.dtypes import FLOATING, is_floating
from netcl.core.strided_view import StridedView
from netcl.core.tensor import format_values
from netcl.runtime.ops import layout, pointwise

#: The one-argument form stored on a Node: upstream gradient -> one gradient per parent.
GradFn = Callable[[Tensor], list[Tensor | None]]
#: The form ``apply_op`` takes: (grad_out, input values, output) -> one gradient per argument.
OpGradFn = Callable[[Tensor, tuple[Any, ...], Tensor], Sequence[Tensor | None]]
#: A gradient-ready hook: (node, the gradient backward will store in ``node.grad``) -> None.
GradReadyHook = Callable[["Node", Tensor], None]

__all__ = [
    "GradFn",
    "GradReadyHook",
    "HookHandle",
    "Node",
    "OpGradFn",
    "Tape",
    "Tracer",
    "apply_op",
    "detect_anomaly",
    "forward_only",
    "get_current_tape",
    "get_tracer",
    "is_anomaly_enabled",
    "is_grad_enabled",
    "no_grad",
    "queue_callback",
    "set_current_tape",
    "set_detect_anomaly",
    "set_grad_enabled",
    "set_tracer",
    "tensor",
    "untracked",
]


class Node:
    """One value in the computational graph: a forward ``Tensor`` plus how to send gradients back.

    Equality and hashing are by identity. A plain class, not a dataclass: its ``__init__`` sets only the
    fields every node has and leaves the rest to class-level defaults, since every eager op makes one.
    """

    value: Tensor
    grad_fn: GradFn | None
    parents: list[Node]
    grad: Tensor | None = None
    requires_grad: bool
    creation_trace: list[str] | None = None
    op_name: str | None
    #: True when ``grad`` is a buffer the engine allocated for this node alone (safe to add into).
    _grad_owned: bool = False
    #: True once a backward without ``retain_graph`` released this node's grad_fn and parents.
    _freed: bool = False
    #: Hooks run by backward as soon as this node's gradient is final (``register_grad_ready_hook``).
    _grad_hooks: list[GradReadyHook] | None = None

    def __init__(
        self,
        value: Tensor,
        grad_fn: GradFn | None = None,
        parents: list[Node] | None = None,
        grad: Tensor | None = None,
        requires_grad: bool = False,
        creation_trace: list[str] | None = None,
        op_name: str | None = None,
    ) -> None:
        self.value = value
        self.grad_fn = grad_fn
        self.parents = [] if parents is None else parents
        if grad is not None:
            self.grad = grad
        self.requires_grad = requires_grad
        if creation_trace is not None:
            self.creation_trace = creation_trace
        self.op_name = op_name

    # ---- tensor-like surface ----------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    @property
    def device(self) -> Device:
        """The value's device; for a traced value, the device the traced call runs on."""
        value = self.value
        if isinstance(value, Tensor):
            return value.device
        tracer = get_tracer()
        if tracer is not None and tracer.device is not None:
            return tracer.device
        return value.device

    @property
    def ndim(self) -> int:
        return len(self.value.shape)

    @property
    def size(self) -> int:
        return self.value.size

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def to_host(self) -> np.ndarray:
        """A NumPy copy of the value (a synchronization point)."""
        return self.value.to_host()

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the value (as ``to_host``)."""
        return self.value.to_host()

    def to(self, device: Device | str) -> Node:
        """This node on ``device``: itself when already there, else a copy whose gradient flows back."""
        target = get_device(device)
        if target is self.device:
            return self

        def move_back(grad: Tensor, values: tuple, out: Tensor) -> list[Tensor]:
            return [grad.to(values[0].device)]

        return apply_op(lambda v: v.to(target), move_back, self, op_name="to")

    def item(self) -> float:
        """The value of a one-element node as a Python number."""
        if self.value.size != 1:
            raise ValueError(f"item() needs a one-element node, this one has shape {self.shape}")
        return self.to_host().reshape(()).item()

    def __bool__(self) -> bool:
        """Truth of a one-element node (a synchronization point); ambiguous for more elements."""
        if self.value.size != 1:
            raise ValueError(f"the truth value of a Node of shape {self.shape} is ambiguous; reduce it first")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def register_grad_ready_hook(self, hook: GradReadyHook) -> HookHandle:
        """Run ``hook(node, grad)`` during each backward, as soon as this node's gradient is final.

        ``grad`` is the tensor backward will store in ``node.grad`` once the whole pass succeeds
        (for a leaf that already had a gradient: the accumulated sum, in a buffer of its own). On
        OpenCL its kernels may still be queued: the hook may enqueue work that reads it. The rest of
        the backward runs after the hook returns; use ``queue_callback`` from a hook to run something
        after the backward has stored every gradient. Returns a handle whose ``remove()`` detaches it.
        """
        if not callable(hook):
            raise TypeError(f"hook must be callable (node, grad) -> None, got {type(hook).__name__}")
        if self._grad_hooks is None:
            self._grad_hooks = []
        self._grad_hooks.append(hook)
        return HookHandle(self._grad_hooks, hook)

    def requires_grad_(self, requires_grad: bool = True) -> Node:
        """Set ``requires_grad`` in place (torch's name); returns self. Only floating-point values can
        require grad, and only leaves can stop requiring it (a computed node's gradient flows anyway)."""
        if requires_grad and not is_floating(self.dtype):
            raise TypeError(f"only floating-point tensors can require grad, got dtype {self.dtype}")
        if not requires_grad and not self.is_leaf:
            raise RuntimeError(
                f"requires_grad_(False) on a computed node (op {self.op_name!r}): only leaves can stop requiring "
                "grad; use detach() for a copy cut off from the graph"
            )
        self.requires_grad = bool(requires_grad)
        return self

    def detach(self) -> Node:
        """A new leaf sharing this node's value, cut off from the graph."""
        return untracked(self.value, "detach")

    def backward(self, grad: Tensor | Node | np.ndarray | None = None, retain_graph: bool = False) -> None:
        """``Tape.backward(self, grad)`` on the current tape (or a throwaway one)."""
        (get_current_tape() or Tape()).backward(self, grad, retain_graph=retain_graph)

    def __repr__(self) -> str:
        device = getattr(self.value, "device", None)  # a tracer's value has no device
        if not isinstance(self.value, Tensor):
            return (
                f"Node(op={self.op_name!r}, shape={self.shape}, dtype={self.dtype}, "
                f"device={getattr(device, 'spec', None)}, requires_grad={self.requires_grad})"
            )
        grad = ", requires_grad=True" if self.requires_grad else ""
        op = f", op={self.op_name!r}" if self.op_name else ""
        values = format_values(self.value, "Node(")
        return f"Node({values}, device={device.spec}, dtype={self.dtype}{op}{grad})"

    # The operators (``+``, ``@``, ``<``, ...) and the op methods (``reshape``, ``sum``, ``T``,
    # ``__getitem__``, ...) are installed by netcl.autograd.node_methods when netcl.autograd is imported.


_new_object = object.__new__


def untracked(value: Tensor, op_name: str | None) -> Node:
    """``Node(value, op_name=op_name)``: the Node of a result nothing differentiates (no ``grad_fn``, no parents,
    ``requires_grad`` False), made without ``__init__``'s optional arguments. Every eager op under ``no_grad``
    returns one, so it is the cheapest way to make a Node (see benchmarks/RESULTS.md, "Forty-sixth session");
    it sets the fields ``__init__`` sets for these arguments."""
    node = _new_object(Node)
    node.value = value
    node.grad_fn = None
    node.parents = []
    node.requires_grad = False
    node.op_name = op_name
    return node


class HookHandle:
    """Returned by ``Node.register_grad_ready_hook`` and a Module's forward hook registrations; ``remove()``
    detaches the hook (idempotent)."""

    def __init__(self, hooks: list[Any], hook: Any) -> None:
        self._hooks = hooks
        self._hook = hook

    def remove(self) -> None:
        for i, h in enumerate(self._hooks):
            if h is self._hook:
                del self._hooks[i]
                return


def names_dtype(value: Any) -> bool:
    """Whether ``value`` names a dtype (``np.float16``, ``nc.float16``, "float32") rather than a device (a
    ``Device``, or a spec such as "cpu", "gpu", "cuda:1", "0:1"): how ``to(...)`` tells its positional arguments
    apart."""
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return True
    if not isinstance(value, str):
        return False
    try:
        np.dtype(value)
    except TypeError:
        return False
    return True


def tensor(data: Any, requires_grad: bool = False, device: Device | str | None = None, dtype: Any = None) -> Node:
    """A leaf Node from NumPy data, a Python sequence/scalar, a ``Tensor`` or another Node's value.

    ``device`` is a ``Device`` or a spec string (``"cpu"``, ``"opencl"``, ``"0:0"``); a ``Tensor``
    on another device is copied there through the host; a strided view (``x.T``) is gathered into
    memory of its own (a leaf may be written in place, a view may not).
    """
    if isinstance(data, Node):
        data = data.value
    if isinstance(data, Tensor) and data.strided:
        data = data.contiguous()
    if isinstance(data, Tensor):
        target = data.device if device is None else get_device(device)
        value = data if target is data.device else Tensor.from_host(target, data.to_host(), dtype or data.dtype)
        if dtype is not None and value.dtype != np.dtype(dtype):
            value = layout.cast(value, dtype)
    else:
        value = Tensor.from_host(get_device(device), data, dtype)
    if requires_grad and not is_floating(value.dtype):
        raise TypeError(f"only floating-point tensors can require grad, got dtype {value.dtype}")
    return Node(value, requires_grad=requires_grad, op_name="tensor")


# ---- thread-local slots ------------------------------------------------------------------------
class _ThreadState(threading.local):
    """This thread's tape, tracer and backward callback stack; the class attributes are the defaults, so a
    thread that never set one reads None without the failed instance lookup ``getattr(local, name, None)``
    pays on a bare ``threading.local`` (on every op)."""

    tape: Tape | None = None
    tracer: Tracer | None = None
    backward_callbacks: list[list[Callable[[], Any]]] | None = None


_local = _ThreadState()


def get_current_tape() -> Tape | None:
    """The tape installed on this thread, or None."""
    return getattr(_local, "tape", None)


def set_current_tape(tape: Tape | None) -> None:
    """Install ``tape`` as this thread's current tape (``None`` removes it)."""
    _local.tape = tape


def queue_callback(callback: Callable[[], Any]) -> None:
    """Run ``callback()`` once at the end of the backward running on this thread.

    Callbacks run in the order queued, after the backward has stored every gradient (and released
    the graph); a callable queued twice in one backward (by equality, so the same bound method)
    runs once. A backward that raises runs none of them. Outside a backward: ``RuntimeError``.
    """
    stack = getattr(_local, "backward_callbacks", None)
    if not stack:
        raise RuntimeError("queue_callback is only valid during a backward (call it from a grad-ready hook)")
    callbacks = stack[-1]
    if callback not in callbacks:
        callbacks.append(callback)


class Tracer(Protocol):
    """What a tracer (e.g. netcl.jit's TracingContext) installs in ``apply_op``'s hook.

    ``device`` is where the traced call will run (what a traced Node's ``device`` answers).
    """

    device: Device | None

    def trace(
        self,
        op_name: str,
        fn: Callable[..., Tensor],
        grad_fn: OpGradFn | None,
        args: tuple[Any, ...],
        attrs: dict[str, Any] | None,
        folds_addends: bool = False,
    ) -> Any: ...


def get_tracer() -> Tracer | None:
    """The tracer active on this thread, or None."""
    return getattr(_local, "tracer", None)


def set_tracer(tracer: Tracer | None) -> None:
    """Install ``tracer`` on this thread (``None`` removes it); ``apply_op`` then defers to it."""
    _local.tracer = tracer


# ---- apply_op ----------------------------------------------------------------------------------
def forward_only() -> bool:
    """Whether an op called now runs its forward alone: grad mode off and no tracer installed. ``apply_op``
    then returns ``untracked(fn(*values), op_name)``; an op's front may do the same itself, without
    building the gradient function and attributes that nothing would read."""
    return not grad_mode.grad_enabled and _local.tracer is None


def gathered(values: Sequence[Any]) -> tuple[Any, ...]:
    """``values`` with each strided view replaced by its gathered copy (``StridedView.contiguous``; one copy of a
    view given twice)."""
    copies: dict[int, Any] = {}
    out = []
    for v in values:
        if type(v) is StridedView:
            copy = copies.get(id(v))
            if copy is None:
                copy = copies[id(v)] = v.contiguous()
            v = copy
        out.append(v)
    return tuple(out)


def apply_op(
    fn: Callable[..., Tensor],
    grad_fn: OpGradFn | None,
    *args: Any,
    tape: Tape | None = None,
    op_name: str | None = None,
    attrs: dict[str, Any] | None = None,
    folds_addends: bool = False,
    takes_views: bool = False,
) -> Any:
    """Run ``fn`` on the values of ``args`` and record how to differentiate it.

    ``args`` are Nodes, Tensors or Python scalars; ``fn`` gets them with Nodes replaced by their
    values. ``grad_fn(grad_out, values, output)`` returns one gradient per argument (None for
    constants); ``None`` marks the op as not differentiable. Order: (1) an installed tracer takes
    the call, (2) with grad mode off the result is a plain Node, (3) otherwise a Node with the
    graph edges is built and recorded on ``tape`` (default: the current tape). A strided view among
    the values (``x.T``, ``x[:, 0]``) is gathered once here, so ``fn`` and the backward read one copy,
    unless ``takes_views`` (the view ops, which compose views).

    ``folds_addends``: backward may call ``grad_fn(grad_out, values, output, addends=...)`` with one
    entry per argument, a gradient already summed for it or None; the op then returns, for each
    argument given an addend, a NEW tensor ``addend + its gradient`` (or None: no gradient). A
    product adds it in its store, which saves the add kernel of a gradient summed over several
    uses or accumulated into a leaf's ``grad`` (see ``Tape.backward``).
    """
    if op_name is None:
        op_name = sys._getframe(1).f_code.co_name
    tracer = _local.tracer
    if tracer is not None:
        return tracer.trace(op_name, fn, grad_fn, args, attrs, folds_addends)
    single = len(args) == 1
    if single:  # most ops take one operand: no comprehension frame
        (first,) = args
        values: tuple[Any, ...] = (first.value if isinstance(first, Node) else first,)
        if type(values[0]) is StridedView and not takes_views:
            values = (values[0].contiguous(),)
    else:
        values = tuple([a.value if isinstance(a, Node) else a for a in args])  # a list: cheaper than a generator
        if not takes_views and StridedView in map(type, values):
            values = gathered(values)
    out = fn(*values)
    if not grad_mode.grad_enabled:
        return untracked(out, op_name)
    if single and isinstance(first, Node):  # the common arity
        return record_one(out, first, values[0], grad_fn, op_name, folds_addends, tape)
    if tape is None:
        tape = _local.tape
    index: list[int] = []
    parents: list[Node] = []
    wanted = False
    for i, a in enumerate(args):  # one loop over the (two or three) arguments, no comprehension frames
        if isinstance(a, Node):
            index.append(i)
            parents.append(a)
            wanted = wanted or a.requires_grad
    tracking = wanted and grad_fn is not None and (tape is None or tape.enabled) and out.dtype in FLOATING
    if not tracking:
        node = untracked(out, op_name)
    else:
        node = Node(
            out,
            _BoundGrad(grad_fn, values, out, index, len(args), op_name, folds_addends),
            parents,
            None,
            True,
            traceback.format_stack()[:-1] if grad_mode.anomaly_enabled else None,
            op_name,
        )
    if tape is not None and tape.enabled:  # ``Tape.record``, inlined on this path
        tape.nodes.append(node)
    return node


def record_one(
    out: Tensor,
    x: Node,
    value: Any,
    grad_fn: OpGradFn | None,
    op_name: str,
    folds_addends: bool = False,
    tape: Tape | None = None,
) -> Node:
    """``apply_op``'s record of a one-argument op whose forward already ran: ``out`` computed from ``value``, the
    value of Node ``x`` (gathered where it was a strided view). Call it with grad mode on and no tracer; it makes
    a Node with the edge to ``x`` (a bare Node where ``x`` does not require grad, ``grad_fn`` is None, ``tape``
    (default: the current tape) is disabled or ``out`` is not floating) and appends it to an enabled tape."""
    if tape is None:
        tape = _local.tape
    if x.requires_grad and grad_fn is not None and (tape is None or tape.enabled) and out.dtype in FLOATING:
        node = Node(
            out,
            _BoundGrad(grad_fn, (value,), out, [0], 1, op_name, folds_addends),
            [x],
            None,
            True,
            traceback.format_stack()[:-1] if grad_mode.anomaly_enabled else None,
            op_name,
        )
    else:
        node = untracked(out, op_name)
    if tape is not None and tape.enabled:  # ``Tape.record``, inlined on this path
        tape.nodes.append(node)
    return node


class _BoundGrad:
    """A Node's ``grad_fn``: the op's ``grad_fn(grad_out, values, output)`` bound to one call, returning
    one gradient per parent (the Node arguments). One object per recorded op (a closure would make a
    function and a cell per bound name, each tracked by the garbage collector)."""

    __slots__ = ("grad_fn", "values", "out", "index", "nargs", "op_name", "folds_addends", "written")

    def __init__(
        self,
        grad_fn: OpGradFn,
        values: tuple[Any, ...],
        out: Tensor,
        index: list[int],
        nargs: int,
        op_name: str,
        folds_addends: bool,
    ) -> None:
        self.grad_fn, self.values, self.out, self.index = grad_fn, values, out, index
        self.nargs, self.op_name, self.folds_addends = nargs, op_name, folds_addends
        #: the in-place writes clock when the op ran (``saved_values``)
        self.written = writes.clock

    def check_unmodified(self) -> None:
        """``ModifiedInPlaceError`` if a Node argument's value or the output was written in place since the op
        ran (tensors passed as plain arguments, such as BatchNorm's running statistics, are not checked)."""
        check_unmodified(self.op_name, self.values, self.out, self.written, (*self.index, -1))

    def __call__(self, grad_out: Tensor, addends: Sequence[Tensor | None] | None = None) -> list[Tensor | None]:
        nargs, index = self.nargs, self.index
        if addends is None:
            grads = list(self.grad_fn(grad_out, self.values, self.out))
        else:  # one per parent (the Node arguments), passed on as one per argument
            per_argument: list[Tensor | None] = [None] * nargs
            for i, addend in zip(index, addends, strict=True):
                per_argument[i] = addend
            grads = list(self.grad_fn(grad_out, self.values, self.out, addends=per_argument))  # type: ignore[call-arg]
        if len(grads) != nargs:
            raise RuntimeError(f"grad_fn of op {self.op_name!r} returned {len(grads)} gradients for {nargs} arguments")
        return [grads[i] for i in index]


# ---- Tape ----------------------------------------------------------------------------------------
class Tape:
    """Records the Nodes of a forward pass on this thread and runs ``backward``.

    Nothing here waits for the device: a training loop's next forward is enqueued while the
    previous step's kernels still run (one in-order queue orders them; the caching allocator's
    reuse is safe on it, see ``netcl.runtime.memory``). Reading a value (``item``, ``to_host``)
    waits for what it depends on.
    """

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.enabled = True
        self._saved: list[Tape | None] = []

    def __enter__(self) -> Tape:
        self._saved.append(get_current_tape())
        set_current_tape(self)
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        set_current_tape(self._saved.pop() if self._saved else None)

    def record(self, node: Node) -> None:
        """Append ``node`` to ``nodes``; a no-op when the tape is disabled."""
        if self.enabled:
            self.nodes.append(node)

    def backward(self, loss: Node, grad: Tensor | Node | np.ndarray | None = None, retain_graph: bool = False) -> None:
        """Send gradients from ``loss`` to every node that requires grad.

        Each grad_fn runs once, in reverse topological order; a parent used several times gets the
        sum of its gradients (added in place on the device, or in the store of a product whose op
        folds addends, ``apply_op``). Leaves accumulate into an existing ``grad`` across calls (a
        product that is a leaf's one use in the graph adds it in its store: gradient accumulation
        over micro-batches costs no add kernels there); every reached node's ``grad`` and
        ``value.grad`` are set. Without ``retain_graph`` the graph is released afterwards and a
        second backward through it raises.
        Nothing is written to any node unless the whole pass succeeds. Grad-ready hooks
        (``Node.register_grad_ready_hook``) run as soon as a node's gradient is final, in the middle
        of the pass; callbacks queued with ``queue_callback`` run after the gradients are stored.
        """
        if not isinstance(loss, Node):
            raise TypeError(f"backward needs a Node, got {type(loss).__name__}")
        if not loss.requires_grad:
            raise RuntimeError(
                f"loss (op {loss.op_name!r}) does not require grad: no input had requires_grad=True, "
                "or it was computed under no_grad"
            )
        order = _topological_order(loss)
        _check_saved_values(order)
        seed = _seed(loss, grad)
        stack = getattr(_local, "backward_callbacks", None)
        if stack is None:
            stack = _local.backward_callbacks = []
        callbacks: list[Callable[[], Any]] = []
        stack.append(callbacks)
        try:
            self._run_backward(loss, seed, order, retain_graph, seed_is_users=isinstance(grad, (Tensor, Node)))
        finally:
            stack.pop()
        for callback in callbacks:
            callback()

    def _run_backward(
        self, loss: Node, seed: Tensor, order: list[Node], retain_graph: bool, seed_is_users: bool = False
    ) -> None:
        anomaly = grad_mode.anomaly_enabled
        pending: dict[Node, Tensor] = {loss: seed}
        owned: set[Node] = set()
        with_stored: set[Node] = set()  # leaves whose pending sum already holds their stored grad
        uses: list[Counter[Node]] = []  # counted at the first leaf that needs it (see ``_addend``)
        results: list[tuple[Node, Tensor, bool, bool]] = []
        for node in reversed(order):
            g = pending.pop(node, None)
            if g is None:
                continue
            hooks = node._grad_hooks
            stored = node in with_stored
            if hooks:
                replace = node.grad_fn is None and node.grad is not None
                if replace and not stored:  # the accumulated gradient, in a fresh buffer: node.grad untouched
                    g = pointwise.add(node.grad, g)
                results.append((node, g, replace or node in owned, replace))
                for hook in list(hooks):
                    hook(node, g)
            else:
                results.append((node, g, stored or node in owned, stored))
            if node.grad_fn is None:
                continue
            addends = None
            if getattr(node.grad_fn, "folds_addends", False):
                addends = [
                    None if any(p is parent for p in node.parents[:k]) else _addend(parent, pending, uses, order)
                    for k, parent in enumerate(node.parents)
                ]
                parent_grads = node.grad_fn(g, addends)  # type: ignore[call-arg]
            else:
                parent_grads = node.grad_fn(g)
            for k, (parent, pg) in enumerate(zip(node.parents, parent_grads, strict=True)):
                if pg is None or not parent.requires_grad:
                    continue
                if isinstance(pg, Node):
                    pg = pg.value
                if tuple(pg.shape) != tuple(parent.shape):
                    raise RuntimeError(
                        f"grad_fn of op {node.op_name!r} returned a gradient of shape {pg.shape} "
                        f"for an input of shape {parent.shape}"
                    )
                if pg.dtype != parent.dtype and is_floating(parent.dtype):
                    pg = layout.cast(pg, parent.dtype)  # as torch's engine: a gradient has its tensor's dtype
                if anomaly:
                    _check_finite(node, pg)
                if addends is not None and addends[k] is not None:  # the op's store added the sum so far
                    if parent not in pending:
                        with_stored.add(parent)
                    pending[parent] = pg
                    owned.add(parent)
                elif parent not in pending:
                    pending[parent] = pg
                elif parent in owned:
                    pointwise.add_(pending[parent], pg)
                else:
                    pending[parent] = pointwise.add(pending[parent], pg)
                    owned.add(parent)
        # the memory leaves took without owning it in this backward, and the caller's grad= (theirs to change)
        leaf_memory: set[Any] = {seed.device.storage.region(seed.data)} if seed_is_users else set()
        for node, g, is_owned, replace in results:
            if node.grad_fn is None and not is_owned and (replace or node.grad is None):
                region = g.device.storage.region(g.data)
                if region in leaf_memory:  # one gradient for two leaves (``a + b``), or the caller's grad=: a
                    g, is_owned = layout.copy(g), True  # buffer of its own (in-place updates must not reach both)
                leaf_memory.add(region)
            _store_grad(node, g, is_owned, replace)
        if not retain_graph:
            for node in order:
                if node.grad_fn is not None:
                    node.grad_fn, node.parents, node._freed = None, [], True


def _uses(order: list[Node]) -> Counter[Node]:
    """How many gradient edges lead to each node of ``order``."""
    return Counter(parent for node in order for parent in node.parents if parent.requires_grad)


def _addend(parent: Node, pending: dict[Node, Tensor], uses: list[Counter[Node]], order: list[Node]) -> Tensor | None:
    """What a folding op may add ``parent``'s gradient to: the sum pending for it, or a leaf's stored
    grad where this is the leaf's one use (so the float sums keep the unfolded path's order)."""
    if not parent.requires_grad:
        return None
    if parent in pending:
        return pending[parent]
    grad = parent.grad
    if parent.grad_fn is None and grad is not None and grad.dtype == parent.dtype:
        if not uses:  # once per backward, only where a leaf already holds a gradient
            uses.append(_uses(order))
        if uses[0][parent] != 1:
            return None
        return grad
    return None


def _seed(loss: Node, grad: Tensor | Node | np.ndarray | None) -> Tensor:
    if grad is None:
        if loss.value.size != 1:
            raise RuntimeError(
                f"backward of a non-scalar loss of shape {loss.shape} needs grad= (a tensor of that shape); "
                "reduce the loss to one element or pass the upstream gradient"
            )
        return layout.ones_like(loss.value)
    if isinstance(grad, Node):
        grad = grad.value
    if not isinstance(grad, Tensor):
        grad = Tensor.from_host(loss.device, np.asarray(grad), loss.dtype)
    if tuple(grad.shape) != tuple(loss.shape):
        raise RuntimeError(f"grad= has shape {grad.shape} but the loss has shape {loss.shape}")
    if grad.device is not loss.device:
        raise DeviceError(f"grad= lives on {grad.device!r} but the loss on {loss.device!r}; move grad= there first")
    return grad


def _topological_order(root: Node) -> list[Node]:
    """Nodes reachable from ``root`` through requires_grad edges, parents before children."""
    order: list[Node] = []
    visited: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        if finished:
            order.append(node)
            continue
        if node in visited:
            continue
        if node._freed:
            raise RuntimeError(
                f"backward through the graph a second time: node {node.op_name!r} was released by an earlier "
                "backward; pass retain_graph=True to the first backward to keep it"
            )
        visited.add(node)
        stack.append((node, True))
        for parent in node.parents:
            if parent.requires_grad and parent not in visited:
                stack.append((parent, False))
    return order


def _check_finite(node: Node, grad: Tensor) -> None:
    host = grad.to_host()
    if np.all(np.isfinite(host)):
        return
    kind = "NaN" if np.isnan(host).any() else "Inf"
    trace = "".join(node.creation_trace) if node.creation_trace else "(no creation trace: enable detect_anomaly)\n"
    raise RuntimeError(
        f"anomaly detected: the backward of op {node.op_name!r} produced {kind} in a gradient of shape "
        f"{grad.shape}.\nThe op was created at:\n{trace}"
    )


def _check_saved_values(order: list[Node]) -> None:
    """Before any backward kernel: ``ModifiedInPlaceError`` if a value some node's backward reads was written in
    place after that node's op ran (``saved_values``). One comparison per node while nothing was written since."""
    clock = writes.clock
    for node in order:
        grad_fn = node.grad_fn
        if grad_fn is not None and getattr(grad_fn, "written", clock) != clock:
            grad_fn.check_unmodified()


def _store_grad(node: Node, g: Tensor, owned: bool, replace: bool = False) -> None:
    if not replace and node.grad_fn is None and node.grad is not None:  # a leaf accumulates across calls
        if node._grad_owned:
            pointwise.add_(node.grad, g)
        else:
            node.grad, node._grad_owned = pointwise.add(node.grad, g), True
    else:
        node.grad, node._grad_owned = g, owned
    node.value.grad = node.grad
