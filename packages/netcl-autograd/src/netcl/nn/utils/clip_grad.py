"""``clip_grad_norm_`` and ``clip_grad_value_`` (torch's ``torch.nn.utils`` ones)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.runtime.ops import pointwise
from netcl.runtime.ops.clip_kernels import grad_norm, scale_many_
from netcl.runtime.ops.layout import cast
from netcl.runtime.ops.upload import copy_into


def clip_grad_norm_(
    parameters: Node | Iterable[Node],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Scale the gradients of ``parameters`` in place so their total ``norm_type`` norm is at most
    ``max_norm``; returns that total norm (before clipping) as a 0-d float32 Tensor on their device.

    The total norm is the norm of all gradients seen as one vector; every gradient is multiplied by
    ``min(max_norm / (norm + 1e-6), 1)``. Parameters without a gradient are skipped; with none the
    result is a 0-d zero on the CPU backend. Nothing is read back to the host (one multi-tensor
    partial-norm launch per dtype and 16 gradients, one finishing launch, one multi-tensor scaling
    launch), so a captured training step replays the clip. ``error_if_nonfinite=True`` reads the
    norm back (a host sync) and raises ``RuntimeError`` when it is inf or NaN, before any gradient
    is scaled; inside a captured step that read raises ``HostReadInCaptureError`` (no replay would
    check again). ``foreach`` is accepted for torch compatibility (the kernels are always multi-tensor).
    """
    if isinstance(parameters, Node):
        parameters = [parameters]
    params = list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Node):
            raise TypeError(f"clip_grad_norm_: parameter {i} is a {type(p).__name__}, expected a Parameter (Node)")
    if isinstance(norm_type, str) and norm_type == "inf":
        norm_type = math.inf
    if foreach is not None and not isinstance(foreach, bool):
        raise TypeError(f"clip_grad_norm_: foreach must be a bool or None, got {foreach!r}")
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        from netcl.core import get_device

        return Tensor.from_host(params[0].device if params else get_device("cpu"), np.zeros((), np.float32))
    norm, coef = grad_norm(grads, max_norm, norm_type)
    if error_if_nonfinite:
        total = float(np.asarray(norm.to_host()))
        if not math.isfinite(total):
            raise RuntimeError(
                f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is non-finite ({total}), "
                "so they cannot be clipped; pass error_if_nonfinite=False to scale them anyway"
            )
    scale_many_(grads, coef)
    return norm


def clip_grad_value_(parameters: Node | Iterable[Node], clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient of ``parameters`` to ``[-clip_value, clip_value]`` in place (torch's); parameters
    without a gradient are skipped. One launch per gradient and a copy into it, nothing read back to the host."""
    if isinstance(parameters, Node):
        parameters = [parameters]
    if isinstance(clip_value, bool) or not isinstance(clip_value, (int, float)) or not clip_value >= 0:
        raise ValueError(f"clip_grad_value_: clip_value must be a number >= 0, got {clip_value!r}")
    bound = float(clip_value)
    for i, p in enumerate(list(parameters)):
        if not isinstance(p, Node):
            raise TypeError(f"clip_grad_value_: parameter {i} is a {type(p).__name__}, expected a Parameter (Node)")
        if p.grad is not None:
            clamped = pointwise.clamp(p.grad, -bound, bound)
            copy_into(p.grad, clamped if clamped.dtype == p.grad.dtype else cast(clamped, p.grad.dtype))


__all__ = ["clip_grad_norm_", "clip_grad_value_"]
