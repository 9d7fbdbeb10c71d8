"""``jit_compile``: trace a Python function of elementwise ops once per signature, fuse, cache.

The first call with a new signature traces the function on symbolic values, splits the trace
into fused groups and eager steps, and builds the kernels. Later calls are one dict lookup and
the launches, plus, when the function reads tensors that are not arguments, Python numbers it bakes
into its kernels, or modules' training flags, a guard that re-traces if one of those tensors was
rebound or one of those numbers changed (``guards.py``), or one of those modules switched between
``train()`` and ``eval()`` (``netcl.autograd.mode_reads``). A function
that cannot be traced (it asks a traced value for ``bool``/``float``, returns something that is
not a Node, raises while tracing) runs un-fused instead, every time, so decorating a function is
always safe.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from netcl.autograd import engine, mode_reads
from netcl.autograd.autocast_mode import autocast_dtype
from netcl.autograd.engine import Node, apply_op
from netcl.core import Device, DeviceError, DTypeError, ShapeError, Tensor, same_device
from netcl.jit.conv_moments import share_conv_moments
from netcl.jit.errors import JitError, RetraceWarning, UnwatchedCaptureWarning
from netcl.jit.fused_step import FusedStep
from netcl.jit.gemm_epilogue import GemmEpilogueStep, MatmulGroup, merge_epilogues
from netcl.jit.guards import find_guards, find_number_guards, traced_numbers
from netcl.jit.norm_epilogue import fuse_norm_epilogues
from netcl.jit.partition import EagerStep, FusedGroup, RowGroup, partition
from netcl.jit.primitive_registry import registry_version
from netcl.jit.row_step import RowStep
from netcl.jit.tracing import TraceNode, TracingContext
from netcl.runtime.ops import random

log = logging.getLogger("netcl.jit")
if os.environ.get("NETCL_DEBUG", "").strip() not in ("", "0"):
    logging.basicConfig()
    log.setLevel(logging.DEBUG)

_FALLBACK = object()
#: After this many re-traces of one function, ``RetraceWarning`` (once).
RETRACE_WARNING = 8
#: ``NETCL_JIT_STRICT=1``: a jitted function that would fall back raises ``JitError`` (``jit_compile(strict=...)``)
STRICT_ENV = "NETCL_JIT_STRICT"
#: errors about the caller's inputs: strict mode raises them as they are (the un-fused call would too)
_INPUT_ERRORS = (ShapeError, DTypeError, DeviceError, IndexError)


@dataclass
class Plan:
    """What one signature compiles to: the traced inputs, the steps, and where outputs come from."""

    arg_traces: list[TraceNode | None]
    consts: list[TraceNode]
    steps: list[FusedStep | RowStep | GemmEpilogueStep | EagerStep]
    outputs: list[TraceNode]
    returns_tuple: bool
    fused_steps: list[FusedStep | RowStep | GemmEpilogueStep] = field(default_factory=list)
    #: For a plan that is one fused kernel reading only arguments: argument index per kernel
    #: input and kernel-output index per function output (the fast path of ``run``).
    direct: tuple[list[int], list[int]] | None = None
    #: ``guard(args)`` is False once a captured tensor the trace baked in was rebound or a baked Python number
    #: changed (see guards.py), or a module whose training flag the trace read is in the other mode (``mode_reads``)
    guard: Callable[[tuple[Any, ...]], bool] | None = None
    #: Whether an argument of this signature wants a gradient (then ``run`` goes through autograd).
    needs_grad: bool = True
    #: ``fast(args)``: a direct plan without gradients as one generated call (``FusedStep.direct_caller``)
    fast: Callable[[tuple[Any, ...]], Any] | None = None

    def __post_init__(self) -> None:
        if len(self.steps) != 1 or isinstance(self.steps[0], EagerStep):
            return
        group = self.steps[0].group
        position = {id(t): i for i, t in enumerate(self.arg_traces) if t is not None}
        if all(id(p) in position for p in group.inputs) and all(o in group.outputs for o in self.outputs):
            self.direct = ([position[id(p)] for p in group.inputs], [group.outputs.index(o) for o in self.outputs])
            caller = getattr(self.steps[0], "direct_caller", None)  # a FusedStep's (not a GEMM epilogue's)
            if caller is not None and not self.needs_grad:
                self.fast = caller(*self.direct, self.returns_tuple)

    def run(self, args: tuple[Any, ...]) -> Any:
        if self.fast is not None:
            return self.fast(args)
        if self.direct is not None:
            inputs, outputs = self.direct
            nodes = self.steps[0].forward([args[i] for i in inputs])
            return tuple(nodes[j] for j in outputs) if self.returns_tuple else nodes[outputs[0]]
        env: dict[int, Any] = {}
        for trace, arg in zip(self.arg_traces, args, strict=False):
            if trace is not None:
                env[trace.id] = arg
        for const in self.consts:
            env[const.id] = const.attrs["value"]
        for step in self.steps:
            if not isinstance(step, EagerStep):
                for trace, node in zip(
                    step.group.outputs, step.forward([env[p.id] for p in step.group.inputs]), strict=True
                ):
                    env[trace.id] = node
            else:
                env[step.node.id] = _run_eager(step.node, env)
        results = [_as_node(env[o.id]) for o in self.outputs]
        return tuple(results) if self.returns_tuple else results[0]


def _run_eager(trace: TraceNode, env: dict[int, Any]) -> Any:
    args = [env[trace.inputs[item].id] if kind == "node" else item for kind, item in trace.arg_layout]
    return apply_op(
        trace.fn, trace.grad_fn, *args, op_name=trace.op_name, attrs=trace.attrs, folds_addends=trace.folds_addends
    )


def _as_node(value: Any) -> Any:
    return Node(value) if isinstance(value, Tensor) else value


class JitFunction:
    """A function compiled per signature into fused kernels (see ``jit_compile``)."""

    def __init__(self, fn: Callable[..., Any], strict: bool | None = None) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        #: raise JitError where the function would fall back (None: NETCL_JIT_STRICT decides at each call)
        self.strict = strict
        self._plans: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.fallbacks = 0
        self.retraces = 0
        self.label = f"jit:{getattr(fn, '__qualname__', repr(fn))}"
        self._warned: set[tuple[str, int]] = set()

    # ---- calling -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if engine.get_tracer() is not None:  # called inside another trace: inline it
            return self.fn(*args, **kwargs)
        key = self._key(args, kwargs)
        if key is not None:
            plan = self._plans.get(key)
        elif self._is_strict():
            raise JitError(f"{self.label} cannot be compiled for this call: {self._unkeyed_reason(args, kwargs)}")
        else:
            plan = _FALLBACK
        fast = getattr(plan, "fast", None)
        if fast is not None and plan.guard is None:  # the hit path of a one-kernel plan, no gradient
            self.hits += 1
            return fast(args)
        if plan is None:
            plan = self._compile(key, args, kwargs)
        else:
            self.hits += 1
        if plan is _FALLBACK:
            return self.fn(*args, **kwargs)
        if plan.guard is not None and not plan.guard(args):
            plan = self._retrace(key, plan, args, kwargs)
            if plan is _FALLBACK:
                return self.fn(*args, **kwargs)
        return plan.run(args)

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple | None:
        # Whether each argument needs a gradient is part of the signature: the ops the trace
        # runs eagerly (matmul, reductions) decide at trace time which inputs get a gradient. So is
        # autocast's dtype: the matrix products choose their autocast forms at trace time.
        parts: list[Any] = []
        append = parts.append
        device: Device | None = None
        grad_on = engine.is_grad_enabled()
        for arg in args:
            if isinstance(arg, Node):
                value = arg.value
                append((value.shape, value.dtype, grad_on and arg.requires_grad))
                if device is None:
                    device = value.device
            elif isinstance(arg, Tensor):
                append((arg.shape, arg.dtype, False))
                if device is None:
                    device = arg.device
            elif isinstance(arg, Real) and not isinstance(arg, bool):
                append("scalar")
            else:
                append(("static", _hashable(arg)))
        if device is None:
            return None
        if not kwargs:
            return (tuple(parts), (), device, registry_version(), autocast_dtype())
        try:
            static = tuple(sorted((k, _hashable(v)) for k, v in kwargs.items()))
        except TypeError:
            return None
        return (tuple(parts), static, device, registry_version(), autocast_dtype())

    def _is_strict(self) -> bool:
        if self.strict is not None:
            return self.strict
        return os.environ.get(STRICT_ENV, "").strip() not in ("", "0")

    @staticmethod
    def _unkeyed_reason(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if not any(isinstance(a, (Node, Tensor)) for a in args):
            return "no Tensor or Node positional argument (the device and signature come from them)"
        return f"keyword arguments that cannot be hashed into the signature: {sorted(kwargs)}"

    def _retrace(self, key: tuple, stale: Plan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A captured tensor was rebound, a baked number changed, or a module the trace asked for its mode
        is in the other mode, since ``stale`` was traced: trace again for this key (and say so once when
        that keeps happening: each trace builds the plan anew)."""
        with self._lock:
            if self._plans.get(key) is stale:
                del self._plans[key]
            self.retraces += 1
            log.debug("%s: a captured tensor, number or module mode changed since the trace; tracing again", self.label)
            if self.retraces == RETRACE_WARNING:
                warnings.warn(
                    f"{self.label} was traced again {self.retraces} times: a tensor, Python number or module mode "
                    "it reads without taking it as an argument keeps changing between calls. Pass the value as an "
                    "argument (a Python number argument is a kernel argument, never baked in).",
                    RetraceWarning,
                    stacklevel=3,
                )
        return self._compile(key, args, kwargs)

    # ---- compiling -----------------------------------------------------------------------
    def _compile(self, key: tuple, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            existing = self._plans.get(key)
            if existing is not None:
                return existing
            self.misses += 1
            log.debug("%s: cache miss (%s)", self.label, self._miss_reason(key))
            plan, reason = self._trace(args, kwargs)
            if plan is None and self._is_strict():
                raise JitError(f"{self.label} cannot be compiled (strict mode): {reason}")
            if plan is None:
                self.fallbacks += 1
                log.debug("%s: falls back to the un-fused function: %s", self.label, reason)
                plan = _FALLBACK
            else:
                log.debug("%s: compiled for %s: %s", self.label, key[0], reason)
            self._plans[key] = plan
            return plan

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Plan | None, str]:
        devices = [a.value.device if isinstance(a, Node) else a.device for a in args if isinstance(a, (Node, Tensor))]
        device = same_device(*devices)
        context = TracingContext(device)
        arg_traces: list[TraceNode | None] = []
        traced_args: list[Any] = []
        needs_grad = False
        wanting: set[int] = set()  # traced inputs that want gradients
        try:  # the trace's dropout seeds are not the ones its runs use: the global generator does not advance
            with context, mode_reads.recording() as modes, random.draws_not_taken():
                for position, arg in enumerate(args):
                    value = arg.value if isinstance(arg, Node) else arg
                    if isinstance(value, Tensor):
                        wants = engine.is_grad_enabled() and isinstance(arg, Node) and arg.requires_grad
                        needs_grad = needs_grad or wants
                        node = context.input(value.shape, value.dtype, wants)
                        if wants:
                            wanting.add(node.value.id)
                    elif isinstance(value, Real) and not isinstance(value, bool):
                        node = context.param(position)
                    else:
                        arg_traces.append(None)
                        traced_args.append(arg)
                        continue
                    arg_traces.append(node.value)
                    traced_args.append(node)
                result = self.fn(*traced_args, **kwargs)
        except Exception as exc:
            if self._is_strict() and isinstance(exc, _INPUT_ERRORS):
                raise  # what the un-fused call would raise too: the caller's inputs are wrong
            if self._is_strict():
                raise JitError(f"{self.label} cannot be compiled (strict mode): tracing raised {exc!r}") from exc
            return None, f"tracing raised {type(exc).__name__}: {exc}"
        returns_tuple = isinstance(result, (tuple, list))
        outputs = list(result) if returns_tuple else [result]
        if not outputs or not all(isinstance(o, Node) and isinstance(o.value, TraceNode) for o in outputs):
            return None, "the function does not return traced Nodes"
        output_traces = [o.value for o in outputs]
        fuse_norm_epilogues(output_traces, wanting)
        share_conv_moments(output_traces)
        steps: list[FusedStep | RowStep | GemmEpilogueStep | EagerStep] = []
        fused: list[FusedStep | RowStep | GemmEpilogueStep] = []
        step_kinds = {FusedGroup: FusedStep, RowGroup: RowStep, MatmulGroup: GemmEpilogueStep}
        for step in merge_epilogues(partition(output_traces), output_traces):
            if type(step) in step_kinds:
                kind = step_kinds[type(step)]
                runnable = kind(step, device, f"{self.label}#{len(fused)}")
                fused.append(runnable)
                steps.append(runnable)
            else:
                steps.append(step)
        plan = Plan(arg_traces, context.consts, steps, output_traces, returns_tuple, fused, needs_grad=needs_grad)
        numbers = {number for node in context.nodes for number in traced_numbers(node.attrs)}
        plan.guard = _all_of(
            self._guard(args, context) if context.consts else None,
            find_number_guards(self.fn, args, numbers),
            (lambda args: not mode_reads.changed(modes)) if modes else None,
        )
        epilogues = sum(isinstance(s, GemmEpilogueStep) for s in fused)
        summary = f"{len(fused)} fused kernel(s) ({epilogues} in a GEMM's store), {len(steps) - len(fused)} eager op(s)"
        return plan, summary

    def _guard(self, args: tuple[Any, ...], context: TracingContext) -> Callable[[tuple[Any, ...]], bool] | None:
        """Watch where each captured tensor came from; warn (once per line) about those we cannot."""
        captured = [const.attrs["value"] for const in context.consts]
        check, unwatched = find_guards(self.fn, args, captured)
        for value in unwatched:
            const = next(c for c in context.consts if c.attrs["value"] is value)
            filename, lineno, text = context.const_sources.get(const.id, ("<unknown>", 0, ""))
            if (filename, lineno) in self._warned:
                continue
            self._warned.add((filename, lineno))
            warnings.warn_explicit(
                f"{self.label}: the {const.shape} {const.dtype} tensor read at {filename}:{lineno} "
                f"({text!r}) is not an argument, and netcl cannot watch where it comes from: the "
                "compiled function keeps using the tensor it saw while tracing, even where a later call "
                "would read another one (in-place updates of its buffer are seen). Pass it as an argument.",
                UnwatchedCaptureWarning,
                filename,
                lineno,
            )
        return check

    def _miss_reason(self, key: tuple) -> str:
        if not self._plans:
            return "first call"
        if any(k[:4] == key[:4] for k in self._plans):
            return f"autocast {'off' if key[4] is None else key[4]} (compiled with another autocast state)"
        if any(k[:3] == key[:3] for k in self._plans):
            return "the primitive registry changed since this signature was compiled"
        if any(k[0] == key[0] and k[2] == key[2] for k in self._plans):
            return f"new keyword arguments {dict(key[1])}"
        if any(k[0] == key[0] for k in self._plans):
            return f"new device {key[2]!r}"
        return f"new input signature {key[0]}"

    # ---- inspection ----------------------------------------------------------------------
    def plan_for(self, *args: Any, **kwargs: Any) -> Plan | None:
        """The compiled plan for these arguments (compiling if needed); None when it falls back."""
        key = self._key(args, kwargs)
        if key is None:
            return None
        plan = self._plans.get(key) or self._compile(key, args, kwargs)
        return None if plan is _FALLBACK else plan

    def source(self, *args: Any, **kwargs: Any) -> tuple[str, str]:
        """The generated (forward, backward) source for these arguments.

        With several fused groups the sources are joined in run order. The backward shown is
        the one for the first output of each group with every tensor input requiring a gradient.
        """
        plan = self.plan_for(*args, **kwargs)
        if plan is None:
            raise ValueError(f"{self.label} is not fused for these arguments (it falls back); see NETCL_DEBUG=1")
        forward = "\n".join(step.forward_source for step in plan.fused_steps)
        backward = "\n".join(
            step.backward_source(0, tuple(p.kind != "param" for p in step.group.inputs)) for step in plan.fused_steps
        )
        return forward, backward

    def cache_info(self) -> dict[str, int]:
        """hits, misses, entries (signatures compiled), fallbacks, retraces (a captured tensor rebound)."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "entries": len(self._plans),
            "fallbacks": self.fallbacks,
            "retraces": self.retraces,
        }

    def cache_clear(self) -> None:
        with self._lock:
            self._plans.clear()


def _all_of(*guards: Callable[[tuple[Any, ...]], bool] | None) -> Callable[[tuple[Any, ...]], bool] | None:
    """One plan guard of the captured-tensor, baked-number and module-mode checks (each may be None)."""
    checks = [c for c in guards if c is not None]
    if len(checks) <= 1:
        return checks[0] if checks else None
    return lambda args: all(check(args) for check in checks)


def _hashable(value: Any) -> Any:
    hash(value)
    return value


def jit_compile(fn: Callable[..., Any] | None = None, *, strict: bool | None = None) -> Any:
    """Decorator: fuse the elementwise ops of ``fn`` into one forward and one backward kernel.

    Usable as ``@jit_compile``, ``@jit_compile()`` or ``@jit_compile(strict=True)``. Where a call cannot be
    compiled (tracing raised, the result is not traced Nodes, no Tensor argument), the function runs
    un-fused and ``cache_info()["fallbacks"]`` counts it; with ``strict=True`` (or, when ``strict`` is
    None, with the environment variable ``NETCL_JIT_STRICT=1``) a ``JitError`` with the reason is raised
    instead.
    """
    if fn is None:
        return functools.partial(jit_compile, strict=strict)
    return JitFunction(fn, strict)
