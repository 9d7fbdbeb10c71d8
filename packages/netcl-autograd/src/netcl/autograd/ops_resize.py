"""``interpolate``: torch's ``nn.functional.interpolate`` on (N, C, L) and (N, C, H, W) inputs.

Modes "nearest", "nearest-exact", "linear" (3-d) and "bilinear" (4-d), with torch's source indices (computed in
float32, as torch's kernels do, so boundaries round alike): each resized axis is one ``index_select`` (nearest) or
two and a weighted sum of the neighbours (linear). The gradient is therefore ``index_select``'s deterministic
scatter-add. The index and weight tensors of an (axis size, output size, mode, scale) are made once per device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, untracked
from netcl.autograd.ops import add, mul, reshape
from netcl.autograd.ops_index import index_select
from netcl.core import ShapeError, Tensor
from netcl.runtime.ops._common import DEVICE_CONSTANTS, remember

Operand = Any  # Node | Tensor

#: modes by input rank: what torch accepts for 3-d and 4-d inputs (bicubic, trilinear, area: not here)
_MODES = {3: ("nearest", "nearest-exact", "linear"), 4: ("nearest", "nearest-exact", "bilinear")}
#: (device, input size, output size, mode, scale or None, align_corners) -> index / weight tensors of one axis
_AXES: dict[tuple, tuple[Tensor, ...]] = {}


def interpolate(
    x: Operand,
    size: int | Sequence[int] | None = None,
    scale_factor: float | Sequence[float] | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
) -> Node:
    """Resize the spatial axes of x (N, C, L) or (N, C, H, W) to ``size`` or by ``scale_factor`` (one of them),
    as ``torch.nn.functional.interpolate``: the output length is ``floor(length * scale_factor)``, and a given
    scale factor (not the size ratio) places the source samples, as torch does by default."""
    shape = tuple(x.shape)
    if len(shape) not in _MODES:
        raise ShapeError(f"interpolate: x must be (N, C, L) or (N, C, H, W), got shape {shape}")
    if mode not in _MODES[len(shape)]:
        raise ValueError(
            f"interpolate: mode for a {len(shape)}-d input must be one of {_MODES[len(shape)]}, got {mode!r}"
        )
    linear = mode in ("linear", "bilinear")
    if align_corners is not None and not linear:
        raise ValueError(f"interpolate: align_corners applies to the linear modes only, got it with mode {mode!r}")
    spatial = shape[2:]
    outs, scales = _output_sizes(spatial, size, scale_factor)
    out = x
    for k, (length, target, scale) in enumerate(zip(spatial, outs, scales, strict=True)):
        if length == target and scale in (None, 1.0):
            continue
        axis = 2 + k
        tensors = _axis_tensors(x.device, x.dtype, length, target, mode, scale, bool(align_corners))
        if not linear:
            out = index_select(out, axis, tensors[0])
            continue
        lower, upper, w_lower, w_upper = tensors
        ones = (1,) * (len(shape) - axis - 1)
        out = add(
            mul(index_select(out, axis, lower), reshape(w_lower, (target, *ones))),
            mul(index_select(out, axis, upper), reshape(w_upper, (target, *ones))),
        )
    return out if isinstance(out, Node) else untracked(out, "interpolate")


def _output_sizes(
    spatial: tuple[int, ...], size: Any, scale_factor: Any
) -> tuple[tuple[int, ...], tuple[float | None, ...]]:
    """(output sizes, the scale factor per axis or None) from exactly one of ``size`` and ``scale_factor``."""
    n = len(spatial)
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    if size is not None:
        sizes = (size,) * n if isinstance(size, (int, np.integer)) else tuple(size)
        if len(sizes) != n or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0 for s in sizes
        ):
            raise ValueError(f"interpolate: size must be {n} positive int(s), got {size!r}")
        return tuple(int(s) for s in sizes), (None,) * n
    factors = (scale_factor,) * n if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
    if len(factors) != n or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors):
        raise ValueError(f"interpolate: scale_factor must be {n} positive number(s), got {scale_factor!r}")
    outs = tuple(math.floor(length * float(f)) for length, f in zip(spatial, factors, strict=True))
    if min(outs) < 1:
        raise ValueError(f"interpolate: scale_factor {scale_factor!r} leaves an empty axis for input sizes {spatial}")
    return outs, tuple(float(f) for f in factors)


def _axis_tensors(
    device: Any, dtype: Any, length: int, target: int, mode: str, scale: float | None, align: bool
) -> tuple:
    """The index tensor (nearest) or the two index and two weight tensors (weights in ``dtype``: linear) of one
    axis, on ``device``."""
    key = (device, np.dtype(dtype), length, target, mode, scale, align)
    found = _AXES.get(key)
    if found is None:
        arrays = _axis_arrays(length, target, mode, scale, align)
        tensors = tuple(Tensor.from_host(device, a, None if a.dtype.kind == "i" else dtype) for a in arrays)
        found = remember(_AXES, key, tensors, DEVICE_CONSTANTS)
    return found


def _axis_arrays(length: int, target: int, mode: str, scale: float | None, align: bool) -> list[np.ndarray]:
    """torch's source positions along one axis (float32 arithmetic): nearest indices, or the two neighbours and
    their weights."""
    f32 = np.float32
    dst = np.arange(target, dtype=f32)
    ratio = f32(1.0 / scale) if scale is not None else f32(length / target)
    last = length - 1
    if mode == "nearest":
        return [np.minimum(np.floor(dst * ratio), last).astype(np.int32)]
    if mode == "nearest-exact":
        return [np.minimum(np.floor((dst + f32(0.5)) * ratio), last).astype(np.int32)]
    if align:
        src = dst * (f32(last / (target - 1)) if target > 1 else f32(0))
    else:
        src = np.maximum((dst + f32(0.5)) * ratio - f32(0.5), f32(0))
    lower = np.minimum(np.floor(src).astype(np.int32), last)
    upper = np.minimum(lower + 1, last).astype(np.int32)
    w_upper = (src - lower.astype(f32)).astype(f32)
    return [lower, upper, (f32(1) - w_upper).astype(f32), w_upper]


__all__ = ["interpolate"]
