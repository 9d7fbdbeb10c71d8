"""Eager ops with one implementation per backend, chosen once per call by the device the op runs on.

An op module writes the OpenCL implementation and names the module that holds its NumPy twin::

    @backend_op("netcl.runtime.numpy_twins.pool")
    def max_pool(x: Tensor, geo: ConvGeometry) -> Tensor:
        ...  # OpenCL: build (or look up) the kernel and launch it

The NumPy backend (``device.kind == "cpu"``) is a sibling of OpenCL behind this one interface, as
tinygrad's ``ops_cpu.py`` beside ``ops_cl.py``: a call whose device is the NumPy one runs the function of
the same name in the twin module, every other call runs the decorated function. Twins take exactly
the decorated function's parameters (``tests/runtime/test_backend_twins.py`` checks every registered
op) and return what it returns. The op's validation runs before the dispatch, in the public function that calls it,
so both backends see checked arguments and raise the same errors.

The device is read from one argument (``device_arg``: a position or a parameter name; the first
parameter by default): a Tensor's device, a Device, a device spec string, a non-empty sequence's first
Tensor, or the default device for ``None``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from netcl.core import Device, Tensor, get_device

P = ParamSpec("P")
R = TypeVar("R")

#: The NumPy backend's device kind; every other kind runs the OpenCL implementation.
NUMPY_KIND = "cpu"


@dataclass(frozen=True)
class BackendOp:
    """One registered op: its OpenCL implementation and where its NumPy twin lives."""

    name: str
    opencl: Callable[..., Any]
    twin_module: str

    def twin(self) -> Callable[..., Any]:
        """The NumPy twin (imports its module on first use)."""
        return getattr(importlib.import_module(self.twin_module), self.name)


#: Every op declared with ``backend_op``, by ``module.name`` of its OpenCL implementation.
REGISTRY: dict[str, BackendOp] = {}


def device_kind(where: Any) -> str:
    """The kind of the device an argument names (see the module docstring)."""
    if isinstance(where, Tensor):
        return where.device.kind
    if isinstance(where, Device):
        return where.kind
    if where is None or isinstance(where, str):
        return get_device(where).kind
    if isinstance(where, (list, tuple)):
        for item in where:
            if isinstance(item, Tensor):
                return item.device.kind
        return get_device().kind
    device = getattr(where, "device", None)
    if isinstance(device, Device):
        return device.kind
    raise TypeError(f"cannot tell the device of an argument of type {type(where).__name__}")


def backend_op(twin_module: str, *, device_arg: int | str = 0) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate an OpenCL implementation; calls on the NumPy backend go to ``twin_module``'s function of its name."""

    def decorate(opencl: Callable[P, R]) -> Callable[P, R]:
        names = list(inspect.signature(opencl).parameters)
        position = names.index(device_arg) if isinstance(device_arg, str) else device_arg
        keyword = names[position]
        op = BackendOp(opencl.__name__, opencl, twin_module)
        REGISTRY[f"{opencl.__module__}.{opencl.__qualname__}"] = op
        twin: list[Callable[..., Any]] = []

        @functools.wraps(opencl)
        def dispatch(*args: P.args, **kwargs: P.kwargs) -> R:
            where = args[position] if len(args) > position else kwargs.get(keyword)
            cls = type(where)
            kind = where.device.kind if cls is Tensor else where.kind if cls is Device else device_kind(where)
            if kind != NUMPY_KIND:
                return opencl(*args, **kwargs)
            if not twin:
                twin.append(op.twin())
            return twin[0](*args, **kwargs)

        dispatch.backend_op = op  # type: ignore[attr-defined]
        return dispatch

    return decorate


__all__ = ["NUMPY_KIND", "REGISTRY", "BackendOp", "backend_op", "device_kind"]
