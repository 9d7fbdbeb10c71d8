"""Data movement and construction: transpose, broadcast_to, copy, cast, full, one_hot, sum_to_shape.

Every result is a new, materialized C-contiguous tensor (but a transpose that only moves length-1 axes is a
view: a reshape); on OpenCL every copy is a kernel
launched through ``launch`` (so captures record it), never ``enqueue_copy``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor, contiguous_strides, get_device
from netcl.core.broadcast import normalize_shape
from netcl.core.dtypes import as_dtype, float32, float64, is_floating
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime import results
from netcl.runtime.cache import register_cache
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import (
    ARG_DTYPES,
    FASTDIV_SOURCE,
    compute_ctype,
    coordinate_lines,
    device_of,
    dim_arg_dtypes,
    dim_args,
    dim_params,
    dot_expr,
    get_kernel,
    index_type,
    remember,
    round_up,
    storage_ctype,
    storage_only,
    storage_pragmas,
)
from netcl.runtime.ops._grid import prepared_for
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.pointwise import fill_, run_elementwise
from netcl.runtime.ops.reduce import sum as reduce_sum
from netcl.runtime.ops.storage_io import bits_ctype, load_c, store_c
from netcl.runtime.ops.strided import strided_copy

_TWINS = "netcl.runtime.numpy_twins.layout"


def _require_tensor(x: Any, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    return x


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(shape[::-1], target[::-1], strict=False))


def copy(x: Tensor) -> Tensor:
    """A new tensor with x's shape, dtype and contents."""
    return cast(x, _require_tensor(x, "copy").dtype)


#: (shape, dtype, target, device) -> (bytes, prepared launch, element count) of a storage cast done before: the
#: same call again skips the checks and the kernel lookup (autocast's attention casts q, k, v every call)
_CAST_PLANS: dict[tuple, tuple[int, PreparedLaunch, int]] = {}
register_cache(_CAST_PLANS.clear)


def cast(x: Tensor, dtype: Any) -> Tensor:
    """A new tensor with x's values converted to ``dtype`` (C conversion rules: floats truncate to ints)."""
    if type(x) is Tensor and isinstance(dtype, np.dtype):
        plan = _CAST_PLANS.get((x.shape, x.dtype, dtype, x.device))
        if plan is not None:  # this cast on this device before: checks and kernel done
            nbytes, prepared, size = plan
            device = x.device
            out = results.tensor(device.allocator(device, nbytes), x.shape, dtype, device)
            prepared.call(x.data, out.data, size)
            return out
    x = _require_tensor(x, "cast")
    return convert(x, x.device.check_dtype(dtype))


@backend_op(_TWINS)
def convert(x: Tensor, target: np.dtype) -> Tensor:
    """``cast`` of a checked call (``target``: a dtype x's device holds)."""
    if storage_only(x.device, x.dtype) or storage_only(x.device, target):
        return _storage_cast(x, target)
    ctype = storage_ctype(target) if target.kind != "b" else compute_ctype(x.dtype)
    if target.kind == "f" and x.dtype.kind == "f":
        ctype = compute_ctype(target if target.itemsize >= x.dtype.itemsize else x.dtype)
    return run_elementwise("{0}", (x,), [ctype], x.shape, target, x.device)


def _storage_cast(x: Tensor, target: np.dtype) -> Tensor:
    """``cast`` on a device where float16 or bfloat16 is storage-only: their values are loaded and
    stored through ``storage_io`` (rounded to nearest even, as their NumPy conversions do)."""
    out = Tensor.empty(x.shape, target, x.device)
    if out.size == 0:
        return out
    idx = index_type(x.shape)
    key = ("cast-storage", x.dtype.str, target.str, idx)
    resolved = get_kernel(
        key, x.device, lambda: _storage_cast_source(x.dtype, target, idx), "netcl_cast", [None, None, ARG_DTYPES[idx]]
    )
    local = resolved.max_local
    prepared = prepared_for(key, x.device, resolved.kernel, round_up(out.size, local), local)
    prepared.call(x.data, out.data, out.size)
    remember(_CAST_PLANS, (x.shape, x.dtype, target, x.device), (out.nbytes, prepared, out.size))
    return out


def _storage_cast_source(source: np.dtype, target: np.dtype, idx: str) -> str:
    """One element per work-item: a storage-only dtype to itself copies the bits; from one, its float
    value converts (C rules); to one, the value is rounded once (float16 from float64 directly, the
    rest via float, exact for every value float16 can hold; bfloat16 always via float, as ml_dtypes)."""
    if source == target:
        types, body = ("ushort", "ushort"), "out[i] = x[i];"
    else:
        value = load_c(source, "x", "i")
        if target.kind == "b":
            body = f"out[i] = {value} != 0;"
        else:
            wide = "double" if source == float64 else "float"
            body = store_c(target, "out", "i", value if is_floating(source) else f"(float){value}", wide) + ";"
        types = (storage_ctype(source), storage_ctype(target))
    return (
        f"{storage_pragmas([source, target])}"
        f"__kernel void netcl_cast(__global const {types[0]}* x, __global {types[1]}* out, const {idx} n) {{\n"
        f"    const {idx} i = ({idx})get_global_id(0);\n"
        f"    if (i < n) {{ {body} }}\n"
        "}\n"
    )


def broadcast_to(x: Tensor, shape: Sequence[int] | int) -> Tensor:
    """x repeated along broadcast dimensions to ``shape`` (a materialized copy)."""
    x = _require_tensor(x, "broadcast_to")
    target = normalize_shape(shape)
    if not _broadcasts_to(x.shape, target):
        raise ShapeError(f"broadcast_to: shape {x.shape} cannot broadcast to {target}")
    return broadcast_copy(x, target)


@backend_op(_TWINS)
def broadcast_copy(x: Tensor, target: tuple[int, ...]) -> Tensor:
    """``broadcast_to`` of a checked call."""
    if storage_only(x.device, x.dtype):  # a strided move of the bits
        own = (1,) * (len(target) - x.ndim) + tuple(x.shape)
        steps = contiguous_strides(own)
        return strided_copy(x, target, [0 if d == 1 else step for d, step in zip(own, steps, strict=True)])
    return run_elementwise("{0}", (x,), [storage_ctype(x.dtype)], target, x.dtype, x.device)


def transpose(x: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    """x with its axes permuted (default: reversed). When the permutation keeps the order of x's axes longer
    than 1 (it only moves length-1 axes) the result is a view sharing x's memory (a reshape, no launch);
    otherwise a new, materialized tensor."""
    plannable = type(x) is Tensor and (axes is None or type(axes) is tuple)
    if plannable:
        plan = _TRANSPOSE_PLANS.get((x.shape, x.dtype, axes, x.device))
        if plan is not None:  # OpenCL, a shape, dtype and axes transposed before: checks and sizes done
            out_shape, nbytes, prepared = plan
            device = x.device
            if prepared is None:  # only length-1 axes move: x's buffer under the new shape
                return Tensor(x.data, out_shape, x.dtype, device, base=x.base if x.base is not None else x)
            out = results.tensor(device.allocator(device, nbytes), out_shape, x.dtype, device)
            prepared.call(x.data, out.data)
            return out
    x = _require_tensor(x, "transpose")
    perm = tuple(range(x.ndim))[::-1] if axes is None else tuple(int(a) for a in axes)
    if sorted(a % x.ndim if -x.ndim <= a < x.ndim else a + 2 * x.ndim + 1 for a in perm) != list(range(x.ndim)):
        raise ValueError(f"transpose: axes {axes} are not a permutation of the {x.ndim} axes of shape {x.shape}")
    perm = tuple(a % x.ndim for a in perm)
    if moves_only_unit_axes(x.shape, perm):
        out_shape = tuple(x.shape[a] for a in perm)
        if plannable and x.device.is_opencl:
            remember(_TRANSPOSE_PLANS, (x.shape, x.dtype, axes, x.device), (out_shape, 0, None))
        return x.reshape(out_shape)
    return permute(x, perm, axes, plannable)


def moves_only_unit_axes(shape: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """Whether permuting ``shape`` by ``perm`` keeps the order of its axes longer than 1 (so the C-contiguous
    result has the same element order: a reshape)."""
    kept = [a for a in perm if shape[a] != 1]
    return kept == sorted(kept)


@backend_op(_TWINS)
def permute(x: Tensor, perm: tuple[int, ...], axes: Sequence[int] | None, plannable: bool) -> Tensor:
    """``transpose`` of a checked call: x's axes in the order of the permutation ``perm`` (``axes`` as given,
    the key of the OpenCL plan remembered when ``plannable``)."""
    out_shape = tuple(x.shape[a] for a in perm)
    out = Tensor.empty(out_shape, x.dtype, x.device)
    if out.size == 0:
        return out
    if x.ndim >= 2 and perm == (*range(x.ndim - 2), x.ndim - 1, x.ndim - 2):
        prepared, sizes = _swap_last_two(x)
    else:
        idx = index_type(x.shape)
        key = ("transpose", x.ndim, x.dtype.str, idx)

        def source() -> str:
            return _transpose_source(x.ndim, x.dtype, idx)

        in_strides = contiguous_strides(x.shape)
        sizes = (out.size, *dim_args(out_shape), *(in_strides[a] for a in perm))
        arg_dtypes = [None, None, ARG_DTYPES[idx], *dim_arg_dtypes(x.ndim, idx)] + [ARG_DTYPES[idx]] * x.ndim
        resolved = get_kernel(key, x.device, source, "netcl_transpose", arg_dtypes)
        local = resolved.max_local
        prepared = prepared_for(key, x.device, resolved.kernel, round_up(out.size, local), local)
    prepared.call(x.data, out.data, *sizes)
    if plannable:
        plan = (out_shape, out.nbytes, prepared.with_trailing(sizes))
        remember(_TRANSPOSE_PLANS, (x.shape, x.dtype, axes, x.device), plan)
    return out


#: (shape, dtype, axes as given, device) -> (out shape, out bytes, prepared launch with its sizes set) of an
#: OpenCL transpose that ran before (prepared None: a view, ``moves_only_unit_axes``)
_TRANSPOSE_PLANS: dict[tuple, tuple] = {}
register_cache(_TRANSPOSE_PLANS.clear)


_TILE, _ROWS = 32, 8


_bits_ctype = bits_ctype  # float16 and bfloat16 moved as their 16 bits (no extension, no helpers)


def _swap_last_two(x: Tensor) -> tuple[PreparedLaunch, tuple[int, ...]]:
    """The launch of (..., R, C) -> (..., C, R) (``tiled_transpose`` of the batch of x's leading axes) and its
    size arguments: ``prepared.call(x, out, *sizes)``."""
    batch, R, C = math.prod(x.shape[:-2]), x.shape[-2], x.shape[-1]
    return tiled_transpose(x.device, x.dtype, R, C, C, (batch, 1, 1), (R * C, 0, 0), index_type(x.shape))


def tiled_transpose(
    device: Device,
    dtype: np.dtype,
    rows: int,
    cols: int,
    ld: int,
    batch: tuple[int, int, int],
    strides: tuple[int, int, int],
    idx: str,
) -> tuple[PreparedLaunch, tuple[int, ...]]:
    """The launch that writes each matrix z of a batch (dims ``batch`` = n0 x n1 x n2, outermost first, at element
    ``strides`` s0, s1, s2 of the source; stride 0 repeats a matrix) of ``rows`` x ``cols`` at row stride ``ld``
    to ``out[z]`` as a dense ``cols`` x ``rows`` matrix, through a 32x32 tile in local memory (reads and writes
    coalesced), and its size arguments: ``prepared.call(x, out, *sizes)``. ``idx``: the C index type, wide
    enough for the source's and the output's extents."""
    t = _bits_ctype(dtype)
    key = ("transpose2", dtype.str, idx)

    def source() -> str:
        return f"""{storage_pragmas([dtype])}
__kernel __attribute__((reqd_work_group_size({_TILE}, {_ROWS}, 1)))
void netcl_transpose(__global const {t}* x, __global {t}* out, const {idx} R, const {idx} C, const {idx} ld,
                     const {idx} n1, const {idx} n2, const {idx} s0, const {idx} s1, const {idx} s2) {{
    __local {t} tile[{_TILE}][{_TILE} + 1];
    const int lx = get_local_id(0);
    const int ly = get_local_id(1);
    const {idx} z = ({idx})get_group_id(2);
    const {idx} src = (z / (n2 * n1)) * s0 + ((z / n2) % n1) * s1 + (z % n2) * s2;
    const {idx} base = z * R * C;
    const {idx} c = ({idx})get_group_id(0) * {_TILE} + lx;
    const {idx} r0 = ({idx})get_group_id(1) * {_TILE};
    for (int j = ly; j < {_TILE}; j += {_ROWS}) {{
        if (c < C && r0 + j < R) {{ tile[j][lx] = x[src + (r0 + j) * ld + c]; }}
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
    const {idx} r = r0 + lx;
    const {idx} c0 = ({idx})get_group_id(0) * {_TILE};
    for (int j = ly; j < {_TILE}; j += {_ROWS}) {{
        if (r < R && c0 + j < C) {{ out[base + (c0 + j) * R + r] = tile[lx][j]; }}
    }}
}}
"""

    resolved = get_kernel(key, device, source, "netcl_transpose", [None, None] + [ARG_DTYPES[idx]] * 8)
    gsize = (-(-cols // _TILE) * _TILE, -(-rows // _TILE) * _ROWS, math.prod(batch))
    sizes = (rows, cols, ld, batch[1], batch[2], *strides)
    return prepared_for(key, device, resolved.kernel, gsize, (_TILE, _ROWS, 1)), sizes


def _transpose_source(rank: int, dtype: np.dtype, idx: str) -> str:
    """Gather kernel of any permutation of ``rank`` axes: out dims ``d1..`` and the input strides
    ``s0..`` of each output axis are arguments (``n`` elements in all)."""
    dims = "".join(f", {p}" for p in dim_params(rank, idx))
    strides = "".join(f", const {idx} s{a}" for a in range(rank))
    body = "\n    ".join(coordinate_lines(rank, "gid", idx))
    t = _bits_ctype(dtype)
    return (
        f"{storage_pragmas([dtype])}{FASTDIV_SOURCE}"
        f"__kernel void netcl_transpose(__global const {t}* x, __global {t}* out, const {idx} n{dims}{strides}) {{\n"
        f"    const {idx} gid = ({idx})get_global_id(0);\n"
        "    if (gid >= n) return;\n"
        f"    {body}\n"
        f"    out[gid] = x[{dot_expr(rank, 's')}];\n"
        "}\n"
    )


def full(shape: Sequence[int] | int, value: Any, dtype: Any = float32, device: Device | str | None = None) -> Tensor:
    """A new tensor of ``shape`` with every element ``value``."""
    target = get_device(device)
    return fill_(Tensor.empty(normalize_shape(shape), as_dtype(dtype), target), value)


def zeros_like(x: Tensor) -> Tensor:
    """Zeros with x's shape, dtype and device."""
    x = _require_tensor(x, "zeros_like")
    return full(x.shape, 0, x.dtype, x.device)


def ones_like(x: Tensor) -> Tensor:
    """Ones with x's shape, dtype and device."""
    x = _require_tensor(x, "ones_like")
    return full(x.shape, 1, x.dtype, x.device)


def one_hot(labels: Tensor, num_classes: int) -> Tensor:
    """float32 tensor of shape ``labels.shape + (num_classes,)``: 1.0 at each label, else 0.0.

    Labels outside ``[0, num_classes)`` give an all-zero row (no error, no host sync).
    """
    labels = _require_tensor(labels, "one_hot")
    if labels.dtype.kind not in "iu":
        raise DTypeError(f"one_hot: labels must be an integer tensor (int32/int64), got dtype {labels.dtype}")
    if int(num_classes) <= 0:
        raise ValueError(f"one_hot: num_classes must be positive, got {num_classes}")
    return encode_one_hot(labels, int(num_classes))


@backend_op(_TWINS)
def encode_one_hot(labels: Tensor, num_classes: int) -> Tensor:
    """``one_hot`` of a checked call."""
    device = device_of((labels,), "one_hot")
    C = num_classes
    expr = "(({0}) == (long)(gid % {1}) ? 1.0f : 0.0f)"  # C is a kernel argument: one program for all C
    out_shape = (*labels.shape, C)
    # Read labels at gid / C: broadcasting labels[..., None] to out_shape gives exactly that index.
    expanded = labels.reshape(*labels.shape, 1)
    return run_elementwise(expr, (expanded, C), ["long", "long"], out_shape, float32, device)


def sum_to_shape(x: Tensor, shape: Sequence[int] | int) -> Tensor:
    """Sum x over the axes that broadcasting added or stretched, giving ``shape``.

    ``shape`` must broadcast to ``x.shape``; when they are equal, x itself is returned.
    """
    x = _require_tensor(x, "sum_to_shape")
    target = normalize_shape(shape)
    if target == x.shape:
        return x
    if not _broadcasts_to(target, x.shape):
        raise ShapeError(f"sum_to_shape: shape {target} does not broadcast to {x.shape}, so x cannot sum to it")
    lead = x.ndim - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(target) if d == 1 and x.shape[lead + i] != 1)
    return reduce_sum(x, axes, keepdims=True).reshape(target)
