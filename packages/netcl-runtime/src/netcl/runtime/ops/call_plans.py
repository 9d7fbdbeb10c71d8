"""Plans of eager layer calls by signature: what a call's arguments decide, worked out once.

A layer op (``conv2d`` and its two gradients, ``batch_norm`` forward and backward) spends most of a
small call deciding things that depend only on its signature: the device, shapes and dtypes, the
window arguments, the options, the matmul precision and the environment variables and modes its
algorithm choice reads. Such an op builds a key of that signature, looks its plan up in a
``PlanCache`` and, on a hit, only allocates its outputs and enqueues its prepared launches. A miss
validates the call in full (so bad arguments raise as before) and makes the plan; a key exists only
for arguments of exact, hashable types (``window`` and ``tensor_sig``), so a hit is always an
already-validated signature. A plan made inside a capture is kept like any other: its timed choices
were searched there too (``netcl.runtime.tune``). Every ``PlanCache`` is bounded and emptied by
``clear_caches``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import Any

from netcl.core import Tensor
from netcl.runtime.cache import register_cache
from netcl.runtime.determinism import are_deterministic_algorithms_enabled
from netcl.runtime.ops._common import MAX_MEMO
from netcl.runtime.ops.precision import get_float32_matmul_precision

#: A signature part that cannot be keyed (an argument of another type): the call goes the full way, unplanned.
UNKEYED = object()
#: Environment variables the layer ops' algorithm choices read (Winograd's tile, host BLAS, tuning).
ENV_VARS = ("NETCL_WINOGRAD", "NETCL_HOST_BLAS", "NETCL_TUNE")

_CACHES: dict[str, PlanCache] = {}


class PlanCache:
    """Plans by signature key: ``get`` a plan, else ``make`` records one (``misses`` counts the makes)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.plans: dict[Hashable, Any] = {}
        self.misses = 0
        _CACHES[name] = self
        register_cache(self.plans.clear)

    def planned(self, key: tuple[Any, ...], make: Callable[..., Any], *args: Any) -> Any:
        """The plan kept under ``key``, else ``make(*args)`` kept there; a key with an ``UNKEYED`` part or an
        unhashable one: ``make(*args)`` every call (which says what is wrong with such arguments), kept nowhere."""
        try:
            plan = self.plans.get(key)
        except TypeError:  # an unhashable part
            return self.keep(None, make(*args))
        if plan is None:
            plan = self.keep(complete(key), make(*args))
        return plan

    def keep(self, key: Hashable | None, plan: Any) -> Any:
        """Count a miss and keep ``plan`` under ``key`` (not for a None key)."""
        self.misses += 1
        if key is not None:
            if len(self.plans) >= MAX_MEMO:
                self.plans.clear()
            self.plans[key] = plan
        return plan


def plan_cache_info() -> dict[str, tuple[int, int]]:
    """{cache name: (plans held, plans made so far)} for every ``PlanCache`` (introspection, tests)."""
    return {name: (len(cache.plans), cache.misses) for name, cache in _CACHES.items()}


#: ``os.environ``'s own dict (CPython's ``os._Environ``: a lookup there is what ``os.environ.get`` does after encoding
#: the key), else None: ``os.environ.get`` each time.
_ENV_DATA: dict | None = getattr(os.environ, "_data", None)
if not isinstance(_ENV_DATA, dict):
    _ENV_DATA = None


def env_reader(*names: str) -> Callable[[], tuple[Any, ...]]:
    """A function returning the values of the environment variables ``names`` as stored (None where unset), a dict
    lookup each: how a key made on every call reads the variables its choices depend on."""
    encode = getattr(os.environ, "encodekey", None)
    if _ENV_DATA is None or encode is None:
        get = os.environ.get
        return lambda: tuple(map(get, names))
    keys = tuple(map(encode, names))
    lookup = _ENV_DATA.get
    return lambda: tuple(map(lookup, keys))


_read_env = env_reader(*ENV_VARS)


def clear_plans() -> None:
    """Empty every ``PlanCache`` (``clear_caches`` does too, with every other in-memory cache)."""
    for cache in _CACHES.values():
        cache.plans.clear()


def context() -> tuple[Any, ...]:
    """The state outside the arguments that a layer op's choices read: the matmul precision, the
    deterministic-algorithms mode and ``ENV_VARS``' values (as stored, None when unset)."""
    return (get_float32_matmul_precision(), are_deterministic_algorithms_enabled(), *_read_env())


def window(value: Any) -> Any:
    """A window argument (stride, padding, dilation) as a key part: a plain int or a pair of plain
    ints as itself, anything else (bools, NumPy ints, lists) ``UNKEYED``."""
    if type(value) is int:
        return value
    if type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is int:
        return value
    return UNKEYED


def tensor_sig(value: Any) -> Any:
    """An optional tensor argument as a key part: None, (shape, dtype, device) of a Tensor, else ``UNKEYED``."""
    if value is None:
        return None
    if type(value) is Tensor:
        return (value.shape, value.dtype, value.device)
    return UNKEYED


def exact(value: Any, *types: type) -> Any:
    """``(type, value)`` when ``value``'s type is one of ``types`` exactly (1 and True differ), else ``UNKEYED``."""
    kind = type(value)
    return (kind, value) if kind in types else UNKEYED


def complete(key: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``key`` when none of its parts is ``UNKEYED``, else None (the call is not planned)."""
    for part in key:
        if part is UNKEYED:
            return None
    return key


__all__ = [
    "ENV_VARS",
    "UNKEYED",
    "PlanCache",
    "complete",
    "context",
    "env_reader",
    "exact",
    "plan_cache_info",
    "tensor_sig",
    "window",
]
