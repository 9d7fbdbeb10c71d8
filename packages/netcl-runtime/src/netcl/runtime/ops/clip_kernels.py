"""The total norm of many gradients and their scaling by a clip factor, on the device (no host read).

``grad_norm_clip_(grads, max_norm, norm_type)`` is what ``netcl.nn.utils.clip_grad_norm_`` launches:

1. partial sums: a multi-tensor kernel over up to ``MULTI_ARITY`` gradients of one dtype (the slot
   table of ``optim_kernels.multi_table``); a fixed grid of ``GROUPS`` work-groups of ``LOCAL`` items
   strides over all their elements, each group reduces in local memory and writes one partial
   (``sum |g|^p``, ``sum g*g`` for p = 2, ``max |g|`` for p = inf) to its own slot of ``partials``;
2. one work-group reduces every partial in a fixed order to the total norm (a 0-d float32 tensor)
   and writes the clip factor ``min(max_norm / (norm + 1e-6), 1)`` (torch's formula) to ``coef``;
3. a multi-tensor kernel multiplies every gradient by ``coef[0]``.

The grid and the reduction order are fixed, so the result is deterministic; every count is a kernel
argument and the factor stays on the device, so a captured step replays the whole clip. Partial
sums accumulate in float (double for float64 gradients). The NumPy backend computes the same
formulas in float64 and rounds the norm to float32.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import refuse_bfloat16
from netcl.core.errors import DTypeError
from netcl.core.writes import check_writable
from netcl.runtime.ops._common import compute_ctype, device_of, get_kernel, pragmas, storage_ctype
from netcl.runtime.ops._grid import launch_prepared
from netcl.runtime.ops._rows import tree_loop_c
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.optim_kernels import launch_multi, multi_chunks, multi_source, multi_table

_TWINS = "netcl.runtime.numpy_twins.clip_kernels"

#: work-items per group and groups per partial-sum launch (the grid strides over the elements)
LOCAL = 128
GROUPS = 64
#: added to the norm before dividing (torch's clip_grad_norm_)
EPS = 1e-6

_PARTIAL = """{pragmas}
__kernel __attribute__((reqd_work_group_size({local}, 1, 1)))
void netcl_norm_partial({buffers},
                        __global float* partials, const int part_offset, const float p,
                        __global const long* table, const long total) {{
    __local {acc} scratch[{local}];
    const int lid = get_local_id(0);
    {acc} acc = 0;
    for (long t_gid = get_global_id(0); t_gid < total; t_gid += get_global_size(0)) {{
        {acc} v;
{branches}
        {accumulate}
    }}
    scratch[lid] = acc;
{tree}    if (lid == 0) partials[part_offset + get_group_id(0)] = (float)scratch[0];
}}
"""

_FINISH = """
__kernel __attribute__((reqd_work_group_size({local}, 1, 1)))
void netcl_norm_finish(__global const float* partials, const int n, const float p, const float max_norm,
                       __global float* norm, __global float* coef) {{
    __local float scratch[{local}];
    const int lid = get_local_id(0);
    float acc = 0;
    for (int i = lid; i < n; i += {local}) {{
        const float v = partials[i];
        acc = {combine_acc};
    }}
    scratch[lid] = acc;
{tree}    if (lid == 0) {{
        const float total = {root};
        norm[0] = total;
        coef[0] = fmin(max_norm / (total + {eps}f), 1.0f);
    }}
}}
"""

#: per-element statements of the scaling kernel (``multi_source``) on the gradient buffer ``@G``
_SCALE_BODY = "@G[gid] = ({st})(({ct})@G[gid] * ({ct})coef[0]);"
_SCALE_PARAMS = "__global const float* coef"


def _mode(norm_type: float) -> str:
    if math.isinf(norm_type):
        return "inf"
    if norm_type == 2.0:
        return "two"
    if norm_type == 1.0:
        return "one"
    return "pow"


def _term(mode: str, value: str) -> str:
    """One element's contribution to the partial (before the combine)."""
    return {"inf": f"fabs({value})", "two": f"{value} * {value}", "one": f"fabs({value})"}.get(
        mode, f"pow(fabs({value}), p)"
    )


def _combine(mode: str, a: str, b: str) -> str:
    return f"fmax({a}, {b})" if mode == "inf" else f"{a} + {b}"


def _tree(mode: str) -> str:
    """The work-group tree over ``scratch`` (``_rows.tree_loop_c``, the tree of the row kernels)."""
    return tree_loop_c(f"scratch[lid] = {_combine(mode, 'scratch[lid]', 'scratch[lid + h]')};", half=f"{LOCAL} / 2")


def _partial_source(dtype: np.dtype, mode: str, arity: int) -> str:
    st, ct = storage_ctype(dtype), compute_ctype(dtype)
    acc = "double" if ct == "double" else "float"
    buffers = ",\n                        ".join(f"__global const {st}* G{j}" for j in range(arity))
    branches = []
    for j in range(arity):
        test = "if" if j == 0 else "else if"
        branches.append(f"        {test} (t_gid < table[{j + 1}]) v = ({acc})G{j}[t_gid - table[{j}]];")
    accumulate = f"acc = {_combine(mode, 'acc', _term(mode, 'v'))};"
    return _PARTIAL.format(
        pragmas=pragmas([dtype]),
        local=LOCAL,
        buffers=buffers,
        acc=acc,
        branches="\n".join(branches),
        accumulate=accumulate,
        tree=_tree(mode),
    )


def _finish_source(mode: str) -> str:
    root = {"inf": "scratch[0]", "two": "sqrt(scratch[0])", "one": "scratch[0]"}.get(mode, "pow(scratch[0], 1.0f / p)")
    return _FINISH.format(
        local=LOCAL,
        combine_acc=_combine(mode, "acc", "v"),
        tree=_tree(mode),
        root=root,
        eps=EPS,
    )


def _check(grads: list[Tensor], max_norm: float, norm_type: float) -> Device:
    op = "grad_norm_clip_"
    if not grads:
        raise ValueError(f"{op}: no gradients given")
    for i, g in enumerate(grads):
        if isinstance(g, Tensor):
            refuse_bfloat16(op, g.dtype)
        if not isinstance(g, Tensor) or g.dtype.kind != "f":
            raise DTypeError(f"{op}: gradient {i} must be a floating-point Tensor, got {getattr(g, 'dtype', type(g))}")
    if not (isinstance(norm_type, (int, float)) and not isinstance(norm_type, bool)) or not norm_type > 0:
        raise ValueError(f"{op}: norm_type must be a number > 0 (or inf), got {norm_type!r}")
    if not (isinstance(max_norm, (int, float)) and not isinstance(max_norm, bool)) or not max_norm >= 0:
        raise ValueError(f"{op}: max_norm must be a number >= 0, got {max_norm!r}")
    return device_of(grads, op)


def grad_norm_clip_(grads: list[Tensor], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Scale ``grads`` in place by ``min(max_norm / (norm + 1e-6), 1)``; returns their total ``norm_type``
    norm (the norm of the norms of each gradient) as a 0-d float32 Tensor on their device."""
    device = _check(grads, max_norm, norm_type)
    check_writable(*grads)  # before the norm's launches: nothing runs for a refused call
    norm, coef = norm_and_factor(grads, float(max_norm), float(norm_type), device)
    scale_by_(grads, coef)  # checked above (coef is the norm's, on the gradients' device)
    return norm


def grad_norm(grads: list[Tensor], max_norm: float, norm_type: float = 2.0) -> tuple[Tensor, Tensor]:
    """(the total ``norm_type`` norm of ``grads`` as a 0-d float32 Tensor, the clip factor
    ``min(max_norm / (norm + 1e-6), 1)`` as a one-element float32 Tensor), both on their device."""
    device = _check(grads, max_norm, norm_type)
    return norm_and_factor(grads, float(max_norm), float(norm_type), device)


@backend_op(_TWINS, device_arg="device")
def norm_and_factor(grads: list[Tensor], max_norm: float, norm_type: float, device: Device) -> tuple[Tensor, Tensor]:
    """``grad_norm`` of a checked call (``device``: the gradients')."""
    mode = _mode(norm_type)
    by_dtype: dict[np.dtype, list[Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    launches = [(dtype, chunk) for dtype, group in by_dtype.items() for chunk in multi_chunks(len(group))]
    partials = Tensor.empty((GROUPS * len(launches),), np.float32, device)
    for k, (dtype, (start, stop, arity)) in enumerate(launches):
        chunk = by_dtype[dtype][start:stop]
        slots = chunk + [chunk[0]] * (arity - len(chunk))  # unused slots cover no elements
        table = multi_table(device, tuple(t.size for t in chunk), (0,) * len(chunk), arity)
        st = storage_ctype(dtype)
        key = ("clip", "partial", st, mode, arity)
        source = functools.partial(_partial_source, dtype, mode, arity)
        types = [None] * (arity + 1) + [np.int32, np.float32, None, np.int64]
        resolved = get_kernel(key, device, source, "netcl_norm_partial", types)
        total = sum(t.size for t in chunk)
        args = [*slots, partials, np.int32(k * GROUPS), np.float32(norm_type), table, np.int64(total)]
        launch_prepared(key, device, resolved.kernel, (GROUPS * LOCAL,), (LOCAL,), args)
    norm = Tensor.empty((), np.float32, device)
    coef = Tensor.empty((1,), np.float32, device)
    key = ("clip", "finish", mode)
    types = [None, np.int32, np.float32, np.float32, None, None]
    resolved = get_kernel(key, device, functools.partial(_finish_source, mode), "netcl_norm_finish", types)
    args = [partials, np.int32(partials.size), np.float32(norm_type), np.float32(max_norm), norm, coef]
    launch_prepared(key, device, resolved.kernel, (LOCAL,), (LOCAL,), args)
    return norm, coef


def scale_many_(grads: list[Tensor], coef: Tensor) -> list[Tensor]:
    """``g *= coef[0]`` for each of ``grads`` (``coef``: one float32 on their device); one launch per
    dtype and ``MULTI_ARITY`` gradients. Returns ``grads``."""
    if not isinstance(coef, Tensor) or coef.dtype != np.float32 or coef.size != 1:
        raise DTypeError(f"scale_many_: coef must be a one-element float32 Tensor, got {getattr(coef, 'dtype', coef)}")
    device_of([*grads, coef], "scale_many_")  # one device (DeviceError naming both otherwise)
    check_writable(*grads)
    return scale_by_(grads, coef)


@backend_op(_TWINS, device_arg="coef")
def scale_by_(grads: list[Tensor], coef: Tensor) -> list[Tensor]:
    """``scale_many_`` of a checked call."""
    by_dtype: dict[np.dtype, list[Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for dtype, group in by_dtype.items():
        types = {"st": storage_ctype(dtype), "ct": compute_ctype(dtype), "pragmas": pragmas([dtype])}
        body = _SCALE_BODY.format(**types)
        for start, stop, arity in multi_chunks(len(group)):
            chunk = group[start:stop]
            slots = chunk + [chunk[0]] * (arity - len(chunk))
            source = functools.partial(multi_source, "netcl_clip_scale_multi", ("G",), _SCALE_PARAMS, "", body, types,
                                       arity, ())  # fmt: skip
            arg_types = [None] * (arity + 2) + [np.int64]
            key = ("clip", "scale_multi", types["st"], arity)
            launch_multi(key, source, "netcl_clip_scale_multi", arg_types, arity, chunk, [0] * len(chunk), slots,
                         (coef,))  # fmt: skip
    return grads
