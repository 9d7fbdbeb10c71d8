"""The primitive registry: op name -> how to write its forward and backward as C expressions.

``PrimitiveDef`` is one op's definition; ``PRIMITIVES`` maps each registered name to it (the callable
``netcl.jit.primitives.AutogradPrimitive``, which ``register_primitive`` validates, probes and adds
here). Adding a name bumps ``registry_version()``, which is part of every JIT cache key, so the next
compile uses the new definition. The code writers (tracing, codegen, the row IR, the NumPy and
OpenCL sources) read the registry from here; this module imports nothing of netcl.jit but its errors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ForwardFn = Callable[[list[str], dict], str]
BackwardFn = Callable[[list[str], str, dict, str], list[str]]


@dataclass(frozen=True)
class PrimitiveDef:
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


#: name -> registered primitive. Add through ``add`` (``register_primitive``); tests that register
#: throwaway primitives pop their names again.
PRIMITIVES: dict[str, PrimitiveDef] = {}
_lock = threading.Lock()
_version = 0


def add(primitive: PrimitiveDef) -> None:
    """Register (or replace) ``primitive`` under its name and bump ``registry_version()``."""
    with _lock:
        PRIMITIVES[primitive.name] = primitive
    bump_version()


def bump_version() -> None:
    """Make every JIT cache key new: a definition the compiled code depends on changed (a primitive, a row op)."""
    global _version
    with _lock:
        _version += 1


def get_primitive(name: str) -> PrimitiveDef | None:
    """The registered primitive ``name``, or None."""
    return PRIMITIVES.get(name)


def registry_version() -> int:
    """Bumped on every registration (of a primitive or a ``row_ops`` row op); part of every JIT cache key."""
    return _version


def custom_preamble() -> str:
    """The ``preamble=`` C helpers of every registered primitive (each once, in name order)."""
    with _lock:
        parts = dict.fromkeys(p.preamble for _, p in sorted(PRIMITIVES.items()) if p.preamble)
    return "".join(part if part.endswith("\n") else part + "\n" for part in parts)


def custom_numpy_helpers() -> dict[str, Callable[..., Any]]:
    """The ``numpy_helpers=`` of every registered primitive, merged."""
    helpers: dict[str, Callable[..., Any]] = {}
    with _lock:
        for primitive in PRIMITIVES.values():
            helpers.update(primitive.numpy_helpers)
    return helpers
