"""Tracing: run a Python function on symbolic values and record the ops it applies.

``TracingContext`` installs itself as autograd's tracer for the current thread. Every
``apply_op`` then calls ``trace(...)``, which appends a ``TraceNode`` instead of running the
op. A traced value refuses to become concrete (``bool``, ``float``, ``to_host``) with
``TracerConversionError``; ``jit_compile`` then falls back to the un-fused function.
"""

from __future__ import annotations

import linecache
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.autograd import engine
from netcl.core import Device, Tensor, broadcast_shapes
from netcl.jit.errors import TracerConversionError
from netcl.jit.primitive_registry import get_primitive
from netcl.jit.shapes import infer_shape


def _user_line() -> tuple[str, int, str]:
    """(file, line, text) of the innermost caller outside netcl: the code that read a capture."""
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("netcl."):
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0, "")
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    return filename, lineno, linecache.getline(filename, lineno).strip()


class TraceNode:
    """A symbolic value: the op that makes it, its inputs, its shape, dtype and attributes.

    ``kind`` is ``"input"`` (a tensor argument of the traced function), ``"param"`` (a Python
    scalar argument: a kernel argument at run time), ``"const"`` (a concrete tensor the
    function closed over) or ``"op"``.
    """

    __slots__ = (
        "op_name", "inputs", "shape", "dtype", "attrs", "kind", "index", "fn", "grad_fn", "folds_addends", "arg_layout",
        "id",
    )  # fmt: skip

    def __init__(
        self,
        op_name: str,
        inputs: Sequence[TraceNode],
        shape: tuple[int, ...],
        dtype: Any,
        attrs: dict | None = None,
    ) -> None:
        self.op_name = op_name
        self.inputs = list(inputs)
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.attrs = dict(attrs or {})
        self.kind = "op"
        self.index = -1
        self.fn: Callable | None = None
        self.grad_fn: Callable | None = None
        #: ``apply_op``'s flag: ``grad_fn`` takes the gradients already summed for its inputs (``addends=``)
        self.folds_addends = False
        #: For ops run eagerly: per original argument, ("node", i) into ``inputs`` or ("value", v).
        self.arg_layout: list[tuple[str, Any]] = []
        self.id = -1

    @property
    def fusible(self) -> bool:
        primitive = get_primitive(self.op_name)
        return self.kind == "op" and primitive is not None and primitive.fusible

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def _refuse(self, what: str) -> None:
        raise TracerConversionError(
            f"cannot use {what} of a traced value ({self.op_name}, shape {self.shape}) inside a jit_compile "
            "function: values are symbolic while tracing; the call falls back to the un-fused function"
        )

    def __bool__(self) -> bool:
        self._refuse("bool()")
        return False

    def __float__(self) -> float:
        self._refuse("float()")
        return 0.0

    def __int__(self) -> int:
        self._refuse("int()")
        return 0

    def __index__(self) -> int:
        self._refuse("int()")
        return 0

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        self._refuse("a NumPy conversion")
        return np.empty(0)

    def to_host(self) -> np.ndarray:
        self._refuse("to_host()")
        return np.empty(0)

    def __repr__(self) -> str:
        return f"TraceNode({self.op_name}, kind={self.kind}, shape={self.shape}, id={self.id})"


class TracingContext:
    """Thread-local tracing state; ``active`` while a jit_compile trace runs on this thread."""

    _local = threading.local()

    def __init__(self, device: Device | None = None) -> None:
        self.active = False
        #: the device the traced call runs on (a traced Node's ``device``)
        self.device = device
        self.nodes: list[TraceNode] = []
        self.inputs: list[TraceNode] = []
        self.consts: list[TraceNode] = []
        self._const_ids: dict[int, TraceNode] = {}
        #: const trace id -> (file, line, source text) of the user code that first read it
        self.const_sources: dict[int, tuple[str, int, str]] = {}

    @classmethod
    def current(cls) -> TracingContext | None:
        return getattr(cls._local, "context", None)

    def __enter__(self) -> TracingContext:
        if engine.get_tracer() is not None:
            raise TracerConversionError("jit_compile functions cannot be traced inside another trace")
        self.active = True
        TracingContext._local.context = self
        engine.set_tracer(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.active = False
        TracingContext._local.context = None
        engine.set_tracer(None)

    # ---- symbolic values -----------------------------------------------------------------
    def _add(self, node: TraceNode) -> TraceNode:
        node.id = len(self.nodes)
        self.nodes.append(node)
        return node

    def input(self, shape: tuple[int, ...], dtype: Any, requires_grad: bool) -> engine.Node:
        """A symbolic tensor argument, wrapped in a Node as user code expects."""
        trace = TraceNode("input", [], shape, dtype)
        trace.kind = "input"
        trace.index = len(self.inputs)
        self.inputs.append(self._add(trace))
        return engine.Node(trace, requires_grad=requires_grad)

    def param(self, position: int) -> engine.Node:
        """A symbolic Python-scalar argument (a kernel argument at run time)."""
        trace = TraceNode("param", [], (), np.float32)
        trace.kind = "param"
        trace.index = len(self.inputs)
        self.inputs.append(self._add(trace))
        return engine.Node(trace)

    def _const(self, value: Any) -> TraceNode:
        """A concrete Node or Tensor used inside the function: an extra input at run time."""
        key = id(value)
        if key not in self._const_ids:
            tensor = value.value if isinstance(value, engine.Node) else value
            trace = TraceNode("const", [], tensor.shape, tensor.dtype)
            trace.kind = "const"
            trace.attrs["value"] = value
            trace.index = len(self.consts)
            self.consts.append(self._add(trace))
            self._const_ids[key] = trace
            self.const_sources[trace.id] = _user_line()
        return self._const_ids[key]

    # ---- the hook autograd's apply_op calls -------------------------------------------------
    def trace(
        self,
        op_name: str | None,
        fn: Callable,
        grad_fn: Callable | None,
        args: tuple,
        attrs: dict | None,
        folds_addends: bool = False,
    ) -> engine.Node:
        """Record one op (``apply_op``'s arguments, ``folds_addends`` kept for the op's eager run); returns a Node
        whose value is its TraceNode."""
        name = op_name or getattr(fn, "__name__", "op")
        inputs: list[TraceNode] = []
        layout: list[tuple[str, Any]] = []
        requires_grad = False
        for arg in args:
            if isinstance(arg, engine.Node) and isinstance(arg.value, TraceNode):
                layout.append(("node", len(inputs)))
                inputs.append(arg.value)
                requires_grad = requires_grad or arg.requires_grad
            elif isinstance(arg, (engine.Node, Tensor)):
                layout.append(("node", len(inputs)))
                inputs.append(self._const(arg))
                requires_grad = requires_grad or (isinstance(arg, engine.Node) and arg.requires_grad)
            else:
                layout.append(("value", arg))
        attrs = dict(attrs or {})
        primitive = get_primitive(name)
        if primitive is not None and primitive.fusible and all(kind == "node" for kind, _ in layout):
            if primitive.arity is not None and primitive.arity != len(inputs):
                raise TracerConversionError(
                    f"primitive {name!r} has arity {primitive.arity} but was applied to {len(inputs)} tensors"
                )
            shape = broadcast_shapes(*(i.shape for i in inputs)) if inputs else ()
            dtype = np.result_type(*(i.dtype for i in inputs)) if inputs else np.float32
        else:
            shape, dtype = infer_shape(name, fn, inputs, layout, attrs)
        node = TraceNode(name, inputs, shape, dtype, attrs)
        node.fn, node.grad_fn, node.arg_layout, node.folds_addends = fn, grad_fn, layout, folds_addends
        self._add(node)
        return engine.Node(node, requires_grad=requires_grad and engine.is_grad_enabled(), op_name=name)
