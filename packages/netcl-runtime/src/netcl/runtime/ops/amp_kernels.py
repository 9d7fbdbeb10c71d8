"""Device-side loss scaling for a capturable ``GradScaler``: nothing here reads a value back to the host.

The scale (a 0-d float32 tensor), the count of clean steps (0-d int32) and the inf/NaN flag (int32)
live on the device, so a captured training step replays them: ``unscale_by_`` divides a gradient
by the current scale and raises the flag (``unscale_many_``: many gradients, one launch per dtype
and ``MULTI_ARITY`` of them, bit-identical), ``update_scale_`` applies torch's schedule (back off after
an inf/NaN step, grow after ``interval`` clean ones), and ``copy_if_`` snapshots and conditionally
restores tensors (how an optimizer step is undone when the flag is up). Each kernel has a NumPy twin.
"""

from __future__ import annotations

import functools

import numpy as np

from netcl.core import Tensor
from netcl.core.dtypes import refuse_bfloat16
from netcl.core.errors import DTypeError, ShapeError
from netcl.core.writes import check_writable
from netcl.runtime.ops._common import compute_ctype, device_of, pragmas, storage_ctype
from netcl.runtime.ops._grid import run_1d
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.optim_kernels import launch_multi, multi_chunks, multi_source

_TWINS = "netcl.runtime.numpy_twins.amp_kernels"

#: copy_if_ modes: copy always, copy where the flag is up, zero where the flag is up.
ALWAYS, IF_FOUND, ZERO_IF_FOUND = 0, 1, 2

#: ``netcl_amp_unscale``'s per-gradient statements on the buffer ``@G`` (``1 / scale`` as ``inv``): the
#: one-gradient kernel and the multi-tensor one (``multi_source``) run the same text, so the same bits
_UNSCALE_BODY = """const {ct} v = ({ct})@G[gid] * inv;
    if (!isfinite(v)) found[0] = 1;
    @G[gid] = ({st})v;"""
_UNSCALE_PARAMS = "__global const float* scale, __global int* found"
_UNSCALE_PROLOGUE = "const {ct} inv = ({ct})(1.0f / scale[0]);"

_UNSCALE = """{pragmas}
__kernel void netcl_amp_unscale(__global {st}* g, __global const float* scale, __global int* found, const long n) {{
    const long gid = get_global_id(0);
    if (gid >= n) return;
    {prologue}
    {body}
}}
"""

_COPY = """{pragmas}
__kernel void netcl_amp_copy_if(__global {st}* dst, __global const {st}* src, __global const int* found,
                                const int mode, const long n) {{
    const long gid = get_global_id(0);
    if (gid >= n || (mode != 0 && found[0] == 0)) return;
    dst[gid] = mode == 2 ? ({st})0 : src[gid];
}}
"""

_UPDATE = """
__kernel void netcl_amp_update_scale(__global float* scale, __global int* tracker, __global const int* found,
                                     const float growth, const float backoff, const int interval) {
    if (get_global_id(0) != 0) return;
    if (found[0]) {
        scale[0] *= backoff;
        tracker[0] = 0;
    } else {
        const int t = tracker[0] + 1;
        if (t == interval) scale[0] *= growth;
        tracker[0] = t == interval ? 0 : t;
    }
}
"""


def _scalar(t: object, dtype: type, name: str, op: str) -> None:
    if not isinstance(t, Tensor) or t.dtype != np.dtype(dtype) or t.size != 1:
        got = f"{getattr(t, 'shape', None)} {getattr(t, 'dtype', type(t).__name__)}"
        raise DTypeError(f"{op}: {name} must be a one-element {np.dtype(dtype)} Tensor, got {got}")


def unscale_by_(grad: Tensor, scale: Tensor, found_inf: Tensor) -> Tensor:
    """``grad *= 1 / scale`` in place (``scale``: one float32 on the device); ``found_inf = 1`` (int32)
    if any result is inf or NaN."""
    op = "unscale_by_"
    if isinstance(grad, Tensor):
        refuse_bfloat16(op, grad.dtype)
    if not isinstance(grad, Tensor) or grad.dtype.kind != "f":
        raise DTypeError(f"{op}: grad must be a floating-point Tensor, got {getattr(grad, 'dtype', type(grad))}")
    _scalar(scale, np.float32, "scale", op)
    _scalar(found_inf, np.int32, "found_inf", op)
    device_of([grad, scale, found_inf], op)
    check_writable(grad)
    return unscale(grad, scale, found_inf)


@backend_op(_TWINS)
def unscale(grad: Tensor, scale: Tensor, found_inf: Tensor) -> Tensor:
    """``unscale_by_`` of a checked call."""
    st, ct = storage_ctype(grad.dtype), compute_ctype(grad.dtype)
    prologue, body = _UNSCALE_PROLOGUE.format(ct=ct), _UNSCALE_BODY.format(st=st, ct=ct).replace("@G", "g")
    source = lambda: _UNSCALE.format(pragmas=pragmas([grad.dtype]), st=st, ct=ct, prologue=prologue, body=body)  # noqa: E731
    types = [None, None, None, np.int64]
    run_1d(("amp", "unscale", st), grad.device, source, "netcl_amp_unscale", types, grad.size, grad, scale, found_inf,
           np.int64(grad.size))  # fmt: skip
    return grad


def unscale_many_(grads: list[Tensor], scale: Tensor, found_inf: Tensor) -> list[Tensor]:
    """``unscale_by_`` on each of ``grads`` (any dtypes): one launch per dtype and ``MULTI_ARITY``
    gradients, the same arithmetic (bit-identical). Returns ``grads``."""
    op = "unscale_many_"
    _scalar(scale, np.float32, "scale", op)
    _scalar(found_inf, np.int32, "found_inf", op)
    for g in grads:
        if isinstance(g, Tensor):
            refuse_bfloat16(op, g.dtype)
        if not isinstance(g, Tensor) or g.dtype.kind != "f":
            raise DTypeError(f"{op}: each grad must be a floating-point Tensor, got {getattr(g, 'dtype', type(g))}")
    device_of([*grads, scale, found_inf], op)
    check_writable(*grads)
    return unscale_group(grads, scale, found_inf)


@backend_op(_TWINS, device_arg="scale")
def unscale_group(grads: list[Tensor], scale: Tensor, found_inf: Tensor) -> list[Tensor]:
    """``unscale_many_`` of a checked call."""
    by_dtype: dict[np.dtype, list[Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for dtype, group in by_dtype.items():
        types = {"st": storage_ctype(dtype), "ct": compute_ctype(dtype), "pragmas": pragmas([dtype])}
        prologue, body = _UNSCALE_PROLOGUE.format(**types), _UNSCALE_BODY.format(**types)
        for start, stop, arity in multi_chunks(len(group)):
            chunk = group[start:stop]
            slots = chunk + [chunk[0]] * (arity - len(chunk))  # unused slots cover no elements
            source = functools.partial(
                multi_source, "netcl_amp_unscale_multi", ("G",), _UNSCALE_PARAMS, prologue, body, types, arity, ()
            )
            arg_types = [None] * (arity + 3) + [np.int64]
            key = ("amp", "unscale_multi", types["st"], arity)
            launch_multi(key, source, "netcl_amp_unscale_multi", arg_types, arity, chunk, [0] * len(chunk), slots,
                         (scale, found_inf))  # fmt: skip
    return grads


def copy_if_(dst: Tensor, src: Tensor | None, found_inf: Tensor, mode: int) -> Tensor:
    """``dst = src`` (``ALWAYS``), the same only where ``found_inf`` is up (``IF_FOUND``), or ``dst = 0``
    where it is up (``ZERO_IF_FOUND``; ``src`` unused); the flag is read on the device."""
    op = "copy_if_"
    if mode not in (ALWAYS, IF_FOUND, ZERO_IF_FOUND):
        raise ValueError(f"{op}: mode must be ALWAYS (0), IF_FOUND (1) or ZERO_IF_FOUND (2), got {mode!r}")
    if not isinstance(dst, Tensor):
        raise TypeError(f"{op}: dst must be a Tensor, got {type(dst).__name__}")
    src = dst if mode == ZERO_IF_FOUND else src
    if not isinstance(src, Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
        raise ShapeError(f"{op}: src must be a Tensor of dst's shape {dst.shape} and dtype {dst.dtype}")
    _scalar(found_inf, np.int32, "found_inf", op)
    device_of([dst, src, found_inf], op)
    check_writable(dst)
    return copy_where(dst, src, found_inf, mode)


@backend_op(_TWINS)
def copy_where(dst: Tensor, src: Tensor, found_inf: Tensor, mode: int) -> Tensor:
    """``copy_if_`` of a checked call (``src`` is dst for ``ZERO_IF_FOUND``)."""
    st = storage_ctype(dst.dtype)
    source = lambda: _COPY.format(pragmas=pragmas([dst.dtype]), st=st)  # noqa: E731
    types = [None, None, None, np.int32, np.int64]
    run_1d(("amp", "copy", st), dst.device, source, "netcl_amp_copy_if", types, dst.size, dst, src, found_inf,
           np.int32(mode), np.int64(dst.size))  # fmt: skip
    return dst


def update_scale_(
    scale: Tensor, tracker: Tensor, found_inf: Tensor, growth: float, backoff: float, interval: int
) -> Tensor:
    """torch's ``_amp_update_scale_`` on the device: after an inf/NaN step ``scale *= backoff`` and the
    clean-step count restarts; after ``interval`` clean steps in a row ``scale *= growth``."""
    op = "update_scale_"
    _scalar(scale, np.float32, "scale", op)
    _scalar(tracker, np.int32, "tracker", op)
    _scalar(found_inf, np.int32, "found_inf", op)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
        raise ValueError(f"{op}: interval must be a positive int, got {interval!r}")
    device_of([scale, tracker, found_inf], op)
    return update_scale(scale, tracker, found_inf, growth, backoff, interval)


@backend_op(_TWINS)
def update_scale(
    scale: Tensor, tracker: Tensor, found_inf: Tensor, growth: float, backoff: float, interval: int
) -> Tensor:
    """``update_scale_`` of a checked call."""
    types = [None, None, None, np.float32, np.float32, np.int32]
    run_1d(("amp", "update"), scale.device, lambda: _UPDATE, "netcl_amp_update_scale", types, 1, scale, tracker,
           found_inf, np.float32(growth), np.float32(backoff), np.int32(interval))  # fmt: skip
    return scale


__all__ = ["ALWAYS", "IF_FOUND", "ZERO_IF_FOUND", "copy_if_", "unscale_by_", "update_scale_"]
