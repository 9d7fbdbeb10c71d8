"""Pattern-based fused training ops: ``TrainingGraphCompiler``, ``TrainingPattern`` and the fused detection loss.

A ``TrainingPattern`` says whether a call fits (``matcher``) and how to build the fused plan for
it (``planner``); ``key`` says which calls share a plan (default: the shapes, dtypes and devices of
the tensor arguments plus the other arguments). A ``TrainingGraphCompiler`` is a registry of
patterns with a plan cache. A *call site* is a pattern name: ``match("weighted_bce_smooth_l1_sum",
*args)`` asks that pattern; ``match(None, *args)`` asks every pattern, the most recently
registered first. ``plan_for`` returns the cached plan (building it once per key) and ``run``
calls it. ``get_training_compiler()`` is the process-wide registry, which starts with the
built-in ``weighted_bce_smooth_l1_sum`` pattern; ``clear_caches()`` empties its plan cache.

    compiler = get_training_compiler()
    compiler.register(TrainingPattern("my_loss", matcher=..., planner=...))
    loss = compiler.run("my_loss", pred, target)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op
from netcl.core import Tensor
from netcl.jit.detection_loss import (
    OP_NAME,
    FusedDetectionLossPlan,
    build_plan,
    matches,
    plan_key,
    validate_inputs,
    validate_scalars,
)
from netcl.jit.errors import JitError
from netcl.runtime.cache import register_cache

__all__ = [
    "FusedDetectionLossPlan",
    "NoMatchingPatternError",
    "TrainingGraphCompiler",
    "TrainingPattern",
    "fused_weighted_bce_smooth_l1_loss",
    "get_training_compiler",
    "signature_key",
]


class NoMatchingPatternError(JitError, LookupError):
    """No registered training pattern accepts the call."""


def signature_key(*args: Any, **kwargs: Any) -> tuple:
    """Default plan key: (shape, dtype, device) per tensor argument, the value (or type) of the rest."""

    def one(x: Any) -> Hashable:
        value = x.value if isinstance(x, Node) else x
        if isinstance(value, Tensor):
            return ("tensor", tuple(value.shape), np.dtype(value.dtype).str, value.device)
        try:
            hash(value)
        except TypeError:
            return ("unhashable", type(value).__qualname__)
        return value

    return (tuple(one(a) for a in args), tuple(sorted((k, one(v)) for k, v in kwargs.items())))


@dataclass(frozen=True)
class TrainingPattern:
    """One registry entry: ``matcher(*args, **kwargs) -> bool`` and ``planner(*args, **kwargs) -> plan``.

    ``key(*args, **kwargs)`` names the calls that share one plan (``signature_key`` when None).
    ``plan_for`` builds a plan once per key; ``run`` calls ``plan(*args, **kwargs)``, so a plan
    that should be run that way is a callable.
    """

    name: str
    matcher: Callable[..., bool]
    planner: Callable[..., object]
    key: Callable[..., Hashable] | None = None

    def plan_key(self, *args: Any, **kwargs: Any) -> Hashable:
        return (self.key or signature_key)(*args, **kwargs)


class _GlobalOnBareCall(type):
    """``TrainingGraphCompiler()`` with no arguments is the process-wide singleton, as the API
    reference's ``compiler = ag.TrainingGraphCompiler()  # the global singleton`` expects (a pattern
    registered there is one ``fused_weighted_bce_smooth_l1_loss`` and every caller sees)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            return get_training_compiler()
        return super().__call__(*args, **kwargs)


class TrainingGraphCompiler(metaclass=_GlobalOnBareCall):
    """A registry of ``TrainingPattern``s and a cache of the plans they built.

    ``TrainingGraphCompiler()`` is the process-wide registry (the same as ``get_training_compiler()``);
    ``TrainingGraphCompiler(builtins=True)`` makes a private one holding the built-in patterns and
    ``builtins=False`` an empty one.
    """

    def __init__(self, builtins: bool = True) -> None:
        self._patterns: list[TrainingPattern] = []
        self._by_name: dict[str, TrainingPattern] = {}
        self._plans: dict[tuple[str, Hashable], object] = {}
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0
        if builtins:
            for pattern in builtin_patterns():
                self.register(pattern)

    # ---- registry ----------------------------------------------------------------------------
    def register(self, pattern: TrainingPattern, replace: bool = False) -> TrainingPattern:
        """Add ``pattern``; a name already registered needs ``replace=True`` (its plans are dropped)."""
        if not isinstance(pattern, TrainingPattern):
            raise TypeError(f"register needs a TrainingPattern, got {type(pattern).__name__}")
        if not callable(pattern.matcher) or not callable(pattern.planner):
            raise TypeError(f"pattern {pattern.name!r}: matcher and planner must be callables")
        with self._lock:
            if pattern.name in self._by_name:
                if not replace:
                    raise ValueError(
                        f"a training pattern named {pattern.name!r} is already registered; pass replace=True"
                    )
                self.unregister(pattern.name)
            self._patterns.append(pattern)
            self._by_name[pattern.name] = pattern
        return pattern

    def unregister(self, name: str) -> TrainingPattern:
        """Remove the pattern ``name`` and its cached plans; returns it."""
        with self._lock:
            pattern = self.get(name)
            self._patterns.remove(pattern)
            del self._by_name[name]
            for key in [k for k in self._plans if k[0] == name]:
                del self._plans[key]
            return pattern

    @property
    def patterns(self) -> list[TrainingPattern]:
        """The registered patterns, in registration order."""
        return list(self._patterns)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self._patterns]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def get(self, name: str) -> TrainingPattern:
        """The pattern registered as ``name`` (KeyError listing the names otherwise)."""
        pattern = self._by_name.get(name)
        if pattern is not None:
            return pattern
        raise KeyError(f"no training pattern named {name!r}; registered: {self.names}")

    # ---- lookup ------------------------------------------------------------------------------
    def match(self, call_site: str | None, *args: Any, **kwargs: Any) -> TrainingPattern | None:
        """The pattern for this call: ``call_site``'s if its matcher accepts, else None.

        ``call_site=None`` tries every pattern, the most recently registered first. An unknown
        ``call_site`` name raises KeyError.
        """
        if call_site is not None:
            pattern = self.get(call_site)
            return pattern if pattern.matcher(*args, **kwargs) else None
        for pattern in reversed(self._patterns):
            if pattern.matcher(*args, **kwargs):
                return pattern
        return None

    def plan_for(self, call_site: str | None, *args: Any, **kwargs: Any) -> object:
        """The plan of the matching pattern for these arguments, built on the first call per key."""
        pattern = self.match(call_site, *args, **kwargs)
        if pattern is None:
            where = f"pattern {call_site!r}" if call_site is not None else f"any of {self.names}"
            raise NoMatchingPatternError(f"the call does not match {where}: {_describe(args)}")
        key = (pattern.name, pattern.plan_key(*args, **kwargs))
        plan = self._plans.get(key)
        if plan is not None:
            self.hits += 1
            return plan
        with self._lock:  # build once, even when threads race for the same key
            plan = self._plans.get(key)
            if plan is None:
                plan = pattern.planner(*args, **kwargs)
                self._plans[key] = plan
                self.misses += 1
            else:
                self.hits += 1
        return plan

    def run(self, call_site: str | None, *args: Any, **kwargs: Any) -> Any:
        """``plan_for(call_site, *args, **kwargs)(*args, **kwargs)``."""
        return self.plan_for(call_site, *args, **kwargs)(*args, **kwargs)

    # ---- cache -------------------------------------------------------------------------------
    def cached_plans(self, name: str | None = None) -> list[object]:
        """The cached plans (of pattern ``name`` only, when given)."""
        return [plan for (n, _), plan in list(self._plans.items()) if name is None or n == name]

    def clear_plans(self) -> None:
        """Forget every cached plan (the next call per key builds again)."""
        with self._lock:
            self._plans.clear()

    def cache_info(self) -> dict[str, int]:
        return {"plans": len(self._plans), "hits": self.hits, "misses": self.misses}

    def __repr__(self) -> str:
        return f"<TrainingGraphCompiler patterns={self.names} plans={len(self._plans)}>"


def _describe(args: tuple[Any, ...]) -> str:
    parts = []
    for a in args:
        v = a.value if isinstance(a, Node) else a
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            parts.append(f"{type(a).__name__}{tuple(v.shape)} {np.dtype(v.dtype)}")
        else:
            parts.append(type(a).__name__)
    return "(" + ", ".join(parts) + ")"


# ---- the built-in pattern and the fused detection loss ------------------------------------------
def builtin_patterns() -> list[TrainingPattern]:
    """The patterns every new compiler starts with."""
    return [TrainingPattern(OP_NAME, matcher=matches, planner=build_plan, key=plan_key)]


_SINGLETON: TrainingGraphCompiler | None = None
_SINGLETON_LOCK = threading.Lock()


def get_training_compiler() -> TrainingGraphCompiler:
    """The process-wide ``TrainingGraphCompiler`` (created, with the built-ins, on first use)."""
    global _SINGLETON
    if _SINGLETON is None:
        with _SINGLETON_LOCK:
            if _SINGLETON is None:
                compiler = TrainingGraphCompiler(builtins=True)
                register_cache(compiler.clear_plans)
                _SINGLETON = compiler
    return _SINGLETON


def _plan(pred: Tensor, target: Tensor, heat_weight: Tensor, reg_weight: Tensor) -> FusedDetectionLossPlan:
    plan = get_training_compiler().plan_for(OP_NAME, pred, target, heat_weight, reg_weight)
    if not isinstance(plan, FusedDetectionLossPlan):
        raise JitError(f"pattern {OP_NAME!r} built a {type(plan).__name__}, not a FusedDetectionLossPlan")
    return plan


def _forward(p: Tensor, t: Tensor, hw: Tensor, rw: Tensor, hs: float, rs: float, beta: float) -> Tensor:
    return _plan(p, t, hw, rw).forward(p, t, hw, rw, hs, rs, beta)


def _backward(grad_out: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
    return [_plan(*values[:4]).backward(grad_out, *values), None, None, None, None, None, None]


def fused_weighted_bce_smooth_l1_loss(
    pred: Any,
    target: Any,
    heat_weight: Any,
    reg_weight: Any,
    heat_scale: float = 1.0,
    reg_scale: float = 1.0,
    beta: float = 0.05,
) -> Node:
    """The fused detection loss of docs/architecture.md as one scalar Node:

    heat_scale*sum(heat_weight*bce_logits(pred, target)) + reg_scale*sum(reg_weight*smooth_l1(pred - target, beta))

    All four inputs are float32 Nodes/Tensors of one shape on one device (``ShapeError`` /
    ``DTypeError`` / ``DeviceError`` naming the argument otherwise); ``beta >= 0`` (0 is plain L1).
    Returns a 0-d Node; the gradient flows to ``pred`` only. On OpenCL the forward is two launches
    (per-block partial sums, one-group reduce) and the backward one; the kernels are compiled once
    per device (scales and beta are kernel arguments) and the result is bit-identical across calls.
    """
    validate_inputs(pred, target, heat_weight, reg_weight)
    hs, rs, b = validate_scalars(heat_scale, reg_scale, beta)
    values = [x.value if isinstance(x, Node) else x for x in (pred, target, heat_weight, reg_weight)]
    if all(isinstance(v, Tensor) for v in values):
        return _plan(*values).apply(pred, target, heat_weight, reg_weight, hs, rs, b)
    # traced (inside jit_compile): the plan is looked up when the op runs on real tensors
    return apply_op(
        _forward,
        _backward,
        pred,
        target,
        heat_weight,
        reg_weight,
        hs,
        rs,
        b,
        op_name=OP_NAME,
        attrs={"heat_scale": hs, "reg_scale": rs, "beta": b},
    )
