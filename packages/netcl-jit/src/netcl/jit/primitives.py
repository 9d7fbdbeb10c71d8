"""The primitive registry: op name -> how to write its forward and backward as C expressions.

A primitive's ``forward(args, attrs)`` returns one C expression of the output in terms of the
input expressions; ``backward(args, grad_var, attrs, out_var)`` returns one C expression per
input for that input's gradient. Re-registering a name bumps ``registry_version()``, which is
part of every JIT cache key, so the next compile uses the new definition.

``register_primitive`` returns the primitive, which is callable: ``my_op(x, y)`` builds the
Node through ``apply_op`` (eager kernels from the same expressions, fused under
``jit_compile``). ``preamble=`` brings C helpers the expressions call (placed after
``PRIMITIVE_PREAMBLE`` in every fused and eager kernel), ``numpy_helpers=`` their NumPy twins for
the NumPy backend. Registration builds a probe kernel of the forward and backward expressions
on an OpenCL device, so an expression that does not compile fails there, with the build log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    #: C helpers the expressions call beyond PRIMITIVE_PREAMBLE
    preamble: str = ""
    #: NumPy functions of the helpers ``preamble`` defines (the NumPy backend's twins)
    numpy_helpers: dict[str, Callable[..., Any]] = field(default_factory=dict, compare=False, hash=False)

    def __call__(self, *inputs: Any, **attrs: Any) -> Any:
        """Apply the primitive: a Node built through ``apply_op`` (traced inside ``jit_compile``)."""
        from netcl.jit.primitive_call import call_primitive

        return call_primitive(self, inputs, attrs)


_PRIMITIVES: dict[str, AutogradPrimitive] = {}
_lock = threading.Lock()
_version = 0


def register_primitive(
    name: str,
    forward: ForwardFn,
    backward: BackwardFn,
    arity: int | None = None,
    fusible: bool = True,
    preamble: str = "",
    numpy_helpers: dict[str, Callable[..., Any]] | None = None,
    probe: bool = True,
) -> AutogradPrimitive:
    """Register (or replace) the primitive ``name``; the next JIT compile uses it.

    Returns the primitive, callable as the op itself (``my_op(x, y)``). ``preamble``: C helper
    definitions the expressions call; ``numpy_helpers``: name -> NumPy function of each, for the
    NumPy backend. With ``probe`` (default) the forward and backward expressions are built once
    into a probe kernel on an OpenCL device (when one exists): a ``JitError`` with the build log
    names an expression that does not compile. Expressions needing attributes the probe cannot
    guess (``attrs`` is empty there) are probed when they first compile instead.
    """
    global _version
    if not isinstance(name, str) or not name.isidentifier():
        raise JitError(f"primitive name must be an identifier string, got {name!r}")
    if not callable(forward) or not callable(backward):
        raise JitError(f"primitive {name!r}: forward and backward must be callables")
    if arity is not None and (not isinstance(arity, int) or arity not in (1, 2, 3)):
        raise JitError(f"primitive {name!r}: arity must be 1, 2, 3 or None, got {arity!r}")
    if not isinstance(preamble, str):
        raise JitError(f"primitive {name!r}: preamble must be a string of C definitions, got {type(preamble).__name__}")
    helpers = dict(numpy_helpers or {})
    if any(not callable(f) for f in helpers.values()):
        raise JitError(f"primitive {name!r}: numpy_helpers must map names to callables")
    primitive = AutogradPrimitive(name, forward, backward, arity, bool(fusible), preamble, helpers)
    if probe:
        from netcl.jit.primitive_call import probe_primitive

        probe_primitive(primitive)  # raises JitError with the build log before anything is registered
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


def custom_preamble() -> str:
    """The ``preamble=`` C helpers of every registered primitive (each once, in name order)."""
    with _lock:
        parts = dict.fromkeys(p.preamble for _, p in sorted(_PRIMITIVES.items()) if p.preamble)
    return "".join(part if part.endswith("\n") else part + "\n" for part in parts)


def custom_numpy_helpers() -> dict[str, Callable[..., Any]]:
    """The ``numpy_helpers=`` of every registered primitive, merged."""
    helpers: dict[str, Callable[..., Any]] = {}
    with _lock:
        for primitive in _PRIMITIVES.values():
            helpers.update(primitive.numpy_helpers)
    return helpers
