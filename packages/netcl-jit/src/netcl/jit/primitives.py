"""The primitive registry: op name -> how to write its forward and backward as C expressions.

A primitive's ``forward(args, attrs)`` returns one C expression of the output in terms of the
input expressions; ``backward(args, grad_var, attrs, out_var)`` returns one C expression per
input for that input's gradient. Re-registering a name bumps ``registry_version()``, which is
part of every JIT cache key, so the next compile uses the new definition.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from netcl.jit.errors import JitError

ForwardFn = Callable[[list[str], dict], str]
BackwardFn = Callable[[list[str], str, dict, str], list[str]]


@dataclass(frozen=True)
class AutogradPrimitive:
    """How one elementwise op is written inside a fused kernel."""

    name: str
    forward: ForwardFn
    backward: BackwardFn
    arity: int | None = None
    fusible: bool = True


_PRIMITIVES: dict[str, AutogradPrimitive] = {}
_lock = threading.Lock()
_version = 0


def register_primitive(
    name: str, forward: ForwardFn, backward: BackwardFn, arity: int | None = None, fusible: bool = True
) -> AutogradPrimitive:
    """Register (or replace) the primitive ``name``; the next JIT compile uses it."""
    global _version
    if not isinstance(name, str) or not name.isidentifier():
        raise JitError(f"primitive name must be an identifier string, got {name!r}")
    if not callable(forward) or not callable(backward):
        raise JitError(f"primitive {name!r}: forward and backward must be callables")
    if arity is not None and (not isinstance(arity, int) or arity not in (1, 2, 3)):
        raise JitError(f"primitive {name!r}: arity must be 1, 2, 3 or None, got {arity!r}")
    primitive = AutogradPrimitive(name, forward, backward, arity, bool(fusible))
    with _lock:
        _PRIMITIVES[name] = primitive
        _version += 1
    return primitive


def get_primitive(name: str) -> AutogradPrimitive | None:
    """The registered primitive ``name``, or None."""
    return _PRIMITIVES.get(name)


def registry_version() -> int:
    """Bumped on every registration; part of every JIT cache key."""
    return _version
