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

from collections.abc import Callable
from typing import Any

from netcl.jit.errors import JitError
from netcl.jit.primitive_call import call_primitive, probe_primitive
from netcl.jit.primitive_registry import (
    BackwardFn,
    ForwardFn,
    PrimitiveDef,
    add,
    custom_numpy_helpers,
    custom_preamble,
    get_primitive,
    registry_version,
)

__all__ = [
    "AutogradPrimitive",
    "BackwardFn",
    "ForwardFn",
    "custom_numpy_helpers",
    "custom_preamble",
    "get_primitive",
    "register_primitive",
    "registry_version",
]


class AutogradPrimitive(PrimitiveDef):
    """A registered primitive: its definition (``PrimitiveDef``), callable as the op itself."""

    def __call__(self, *inputs: Any, **attrs: Any) -> Any:
        """Apply the primitive: a Node built through ``apply_op`` (traced inside ``jit_compile``)."""
        return call_primitive(self, inputs, attrs)


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
        probe_primitive(primitive)  # raises JitError with the build log before anything is registered
    add(primitive)
    return primitive
