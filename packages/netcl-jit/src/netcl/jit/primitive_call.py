"""Calling a registered primitive eagerly, and the probe build at registration.

``call_primitive`` runs a primitive outside ``jit_compile`` (or records it inside): the forward
expression and each backward expression become eager elementwise kernels
(``netcl.runtime.ops.elementwise``, with the primitive's ``preamble``) or, on the NumPy backend,
Python over NumPy arrays with the primitive's ``numpy_helpers``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.autograd.engine import apply_op
from netcl.core import Tensor, get_device, usable_opencl_devices
from netcl.core.kernels.primitives import PRIMITIVE_PREAMBLE
from netcl.jit.errors import JitError
from netcl.jit.numpy_helpers import NAMESPACE
from netcl.jit.numpy_source import to_python
from netcl.jit.primitive_registry import PrimitiveDef
from netcl.runtime.cache import program_cache
from netcl.runtime.errors import CompileError
from netcl.runtime.ops import layout, pointwise


def _placeholders(count: int) -> list[str]:
    return [f"{{{i}}}" for i in range(count)]


def _is_zero(expr: str) -> bool:
    return expr.strip() in ("0.0f", "0", "0.0")


def _numpy_fn(primitive: PrimitiveDef, expr: str, count: int) -> Callable[..., np.ndarray]:
    """``expr`` ({i} = argument i) as a Python function over NumPy arrays (the NumPy backend)."""
    body = to_python(expr)
    for i in range(count):
        body = body.replace(f"{{{i}}}", f"x{i}")
    namespace = {**NAMESPACE, **primitive.numpy_helpers}
    source = f"lambda {', '.join(f'x{i}' for i in range(count))}: {body}"
    try:
        return eval(compile(source, f"<primitive {primitive.name}>", "eval"), namespace)
    except SyntaxError as exc:
        raise JitError(f"primitive {primitive.name!r}: expression {expr!r} is not valid on the NumPy path") from exc


def _evaluate(primitive: PrimitiveDef, expr: str, values: Sequence[Any]) -> Tensor:
    numpy_fn = _numpy_fn(primitive, expr, len(values))

    def checked(*arrays: np.ndarray) -> np.ndarray:
        try:
            return numpy_fn(*arrays)
        except NameError as exc:
            raise JitError(
                f"primitive {primitive.name!r}: {exc} on the NumPy backend; pass numpy_helpers= to "
                "register_primitive with a NumPy function for each helper its preamble defines"
            ) from None

    return pointwise.elementwise(expr, checked, *values, preamble=primitive.preamble)


def call_primitive(primitive: PrimitiveDef, inputs: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """Apply ``primitive`` to ``inputs`` through ``apply_op`` (Nodes, Tensors or scalars)."""
    if primitive.arity is not None and len(inputs) != primitive.arity:
        raise JitError(f"primitive {primitive.name!r} takes {primitive.arity} inputs, got {len(inputs)}")
    if not inputs:
        raise JitError(f"primitive {primitive.name!r} needs at least one input")
    count = len(inputs)
    forward_expr = primitive.forward(_placeholders(count), dict(attrs))

    def forward(*values: Any) -> Tensor:
        return _evaluate(primitive, forward_expr, values)

    def backward(grad: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        exprs = primitive.backward(_placeholders(count), f"{{{count}}}", dict(attrs), f"{{{count + 1}}}")
        if len(exprs) != count:
            raise JitError(
                f"primitive {primitive.name!r} backward returned {len(exprs)} expressions for {count} inputs"
            )
        grads: list[Tensor | None] = []
        for value, expr in zip(values, exprs, strict=True):
            if not isinstance(value, Tensor) or _is_zero(expr):
                grads.append(None)
                continue
            full = _evaluate(primitive, expr, (*values, grad, out))
            grads.append(layout.sum_to_shape(full, value.shape) if full.shape != value.shape else full)
        return grads

    return apply_op(forward, backward, *inputs, op_name=primitive.name, attrs=dict(attrs))


def _probe_device():
    default = get_device()
    if default.kind == "opencl":
        return default
    return next(iter(usable_opencl_devices()), None)


def probe_primitive(primitive: PrimitiveDef) -> None:
    """Build the forward and backward expressions into one kernel; JitError with the build log if they fail.

    The expressions' types are checked everywhere; the build needs an OpenCL device (none: skipped).
    """
    count = primitive.arity or 2
    args = [f"a{i}" for i in range(count)]
    try:
        forward = primitive.forward(args, {})
        backward = primitive.backward(args, "g", {}, "out_v")
    except (KeyError, IndexError, TypeError, ValueError):
        return  # the expressions need attributes or arguments the probe cannot know
    if (
        not isinstance(forward, str)
        or not isinstance(backward, (list, tuple))
        or not all(isinstance(e, str) for e in backward)
    ):
        raise JitError(f"primitive {primitive.name!r}: forward must return a C expression, backward a list of them")
    device = _probe_device()
    if device is None:
        return  # no OpenCL here: the NumPy path evaluates the expressions when called
    params = ", ".join(f"const float {a}" for a in [*args, "g"])
    stores = "\n".join(f"    out[{i + 1}] = {expr};" for i, expr in enumerate(backward))
    source = (
        f"{PRIMITIVE_PREAMBLE}\n{primitive.preamble}\n"
        f"__kernel void netcl_probe(__global float* out, {params}) {{\n"
        f"    const float out_v = {forward};\n    out[0] = out_v;\n{stores}\n}}\n"
    )
    try:
        program_cache.get_or_compile(("netcl.jit.probe", primitive.name), source, device.context)
    except CompileError as exc:
        raise JitError(
            f"primitive {primitive.name!r} does not compile (probe kernel on {device.name}): forward {forward!r}, "
            f"backward {backward!r}; C helpers it calls go in register_primitive(..., preamble=...).\n{exc}"
        ) from None
