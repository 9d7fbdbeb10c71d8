"""Fused, in-place optimizer updates: multi-tensor kernels of up to ``update_arity`` parameters a launch (SGD,
Adam/AdamW, RMSprop, Adagrad; ``sgd_step_`` and ``adam_step_`` run them on one parameter), plus the helpers an
optimizer and a gradient scaler need (per-parameter step counters, gradient unscaling).

Everything an update reads that may change between steps lives in device memory, so a captured
step replays correctly: the hyperparameters (``hyper``: learning rate, betas, ...) are a small
float32 buffer the optimizer rewrites when they change, and the step count is an int32 entry of
``steps`` (one per parameter) that the update reads (``t = steps[index] + 1``) and
``count_steps_`` advances with a recorded launch, so Adam's bias correction and SGD's first
momentum step follow the replays. Sizes are kernel arguments (one program per dtype and variant).
Each OpenCL kernel has a NumPy twin that runs the same formulas on the NumPy backend. On CPU OpenCL
devices the multi-tensor updates give each work-item a chunk of ``CPU_CHUNK`` elements of one parameter,
a loop the compiler vectorizes; on GPUs a work-item takes ``GPU_VECTOR`` elements as one vector load and
store of each buffer (``ItemSplit``, ``update_split``). What depends only on the parameter (Adam's step and
its two ``pow`` bias corrections, Adagrad's decayed rate) runs once a work-item, before its elements
(per element, on a CPU, the two ``pow`` had cost more than the rest of the update together).

Every update and ``count_steps_`` also read ``skip``, one int32 on the device: where it is non-zero
they change nothing (a gradient scaler's inf/NaN flag skips a step with no host read, as torch's
fused optimizers do with ``found_inf``); without one they read a zero flag.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from netcl.core import Tensor
from netcl.core.dtypes import refuse_bfloat16
from netcl.core.errors import DTypeError, ShapeError
from netcl.core.writes import check_writable, written
from netcl.runtime.cache import register_cache
from netcl.runtime.ops._common import compute_ctype, device_of, get_kernel, pragmas, storage_ctype
from netcl.runtime.ops._grid import prepared_for, run_1d
from netcl.runtime.ops.backend import backend_op

_TWINS = "netcl.runtime.numpy_twins.optim_kernels"

#: Layout of the ``hyper`` buffer of each update.
SGD_HYPER = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
ADAM_HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay")

RMSPROP_HYPER = ("lr", "alpha", "eps", "weight_decay", "momentum")
ADAGRAD_HYPER = ("lr", "lr_decay", "weight_decay", "eps")

#: The per-element statements of each update, on the buffers ``@P`` (param), ``@G`` (grad) and
#: ``@B`` (momentum) / ``@M``, ``@V`` (Adam's moments) at element ``gid``: every slot of a multi-tensor kernel runs
#: this same text (``_on`` names the buffers) in the same split, so a parameter gets the same bits whichever
#: launch, and however many parameters beside it, update it.
_SGD_HYPER_LINE = "const {ct} lr = hyper[0], momentum = hyper[1], dampening = hyper[2], wd = hyper[3];"
_SGD_BODY = """const {ct} w = ({ct})@P[gid];
    {ct} d = ({ct})@G[gid];
    if (wd != 0) d += wd * w;
    {momentum}
    @P[gid] = ({st})(w - lr * d);"""
_SGD_MOMENTUM = """if (momentum != 0) {{
        const {ct} b = steps[index] == 0 ? d : momentum * ({ct})@B[gid] + (1 - dampening) * d;
        @B[gid] = ({st})b;
        d = hyper[4] != 0 ? d + momentum * b : b;
    }}"""
_ADAM_HYPER_LINE = "const {ct} lr = hyper[0], beta1 = hyper[1], beta2 = hyper[2], eps = hyper[3], wd = hyper[4];"
#: what Adam's statements need once per parameter: the step and the bias corrections (``multi_source``'s
#: ``slot_prologue``: once per work-item, not per element)
_ADAM_SLOT = """const {ct} t = ({ct})(steps[index] + 1);
    const {ct} bc1 = 1 - pow(beta1, t);
    const {ct} bc2 = 1 - pow(beta2, t);"""
_ADAM_BODY = """{ct} w = ({ct})@P[gid];
    {ct} d = ({ct})@G[gid];
    {decay}
    const {ct} m1 = beta1 * ({ct})@M[gid] + (1 - beta1) * d;
    const {ct} v1 = beta2 * ({ct})@V[gid] + (1 - beta2) * d * d;
    @M[gid] = ({st})m1;
    @V[gid] = ({st})v1;
    {second}
    const {ct} denom = sqrt(v2) / sqrt(bc2) + eps;
    @P[gid] = ({st})(w - (lr / bc1) * m1 / denom);"""
#: the second moment Adam divides by: this step's, or (amsgrad) the largest so far, kept in @X (a NaN wins, as
#: in torch.maximum)
_ADAM_SECOND = "const {ct} v2 = v1;"
_AMSGRAD_SECOND = (
    "const {ct} vx = ({ct})@X[gid];\n    const {ct} v2 = (vx > v1 || vx != vx) ? vx : v1;\n    @X[gid] = ({st})v2;"
)
#: RMSprop (torch's): the running mean of squares @S, with ``centered`` the running mean @A subtracted from it,
#: with ``momentum`` a buffer @B of the scaled steps
_RMSPROP_HYPER_LINE = "const {ct} lr = hyper[0], alpha = hyper[1], eps = hyper[2], wd = hyper[3], momentum = hyper[4];"
_RMSPROP_BODY = """const {ct} w = ({ct})@P[gid];
    {ct} d = ({ct})@G[gid];
    if (wd != 0) d += wd * w;
    const {ct} sq = alpha * ({ct})@S[gid] + (1 - alpha) * d * d;
    @S[gid] = ({st})sq;
    {average}
    {apply}"""
_RMSPROP_AVERAGE = "const {ct} avg = sqrt(sq) + eps;"
_RMSPROP_CENTERED = """const {ct} ga = alpha * ({ct})@A[gid] + (1 - alpha) * d;
    @A[gid] = ({st})ga;
    const {ct} avg = sqrt(sq - ga * ga) + eps;"""
_RMSPROP_STEP = "@P[gid] = ({st})(w - lr * (d / avg));"
_RMSPROP_MOMENTUM = """const {ct} b = momentum * ({ct})@B[gid] + d / avg;
    @B[gid] = ({st})b;
    @P[gid] = ({st})(w - lr * b);"""
#: Adagrad (torch's): the sum of squares @S, the learning rate decayed by the step count
_ADAGRAD_HYPER_LINE = "const {ct} lr = hyper[0], lr_decay = hyper[1], wd = hyper[2], eps = hyper[3];"
_ADAGRAD_SLOT = """const {ct} t = ({ct})(steps[index] + 1);
    const {ct} clr = lr / (1 + (t - 1) * lr_decay);"""
_ADAGRAD_BODY = """const {ct} w = ({ct})@P[gid];
    {ct} d = ({ct})@G[gid];
    if (wd != 0) d += wd * w;
    const {ct} s = ({ct})@S[gid] + d * d;
    @S[gid] = ({st})s;
    @P[gid] = ({st})(w - clr * (d / (sqrt(s) + eps)));"""
_ADAM_L2 = "if (wd != 0) d += wd * w;"
_ADAMW_DECAY = "w *= 1 - lr * wd;"


def _on(body: str, **buffers: str) -> str:
    """``body`` with each ``@NAME`` placeholder replaced by the buffer ``buffers[NAME]``."""
    for name, buffer in buffers.items():
        body = body.replace(f"@{name}", buffer)
    return body


def _sgd_body(types: dict[str, str], has_momentum: bool) -> str:
    return _SGD_BODY.format(momentum=_SGD_MOMENTUM.format(**types) if has_momentum else "", **types)


def _adam_body(types: dict[str, str], decoupled_weight_decay: bool, amsgrad: bool = False) -> str:
    second = (_AMSGRAD_SECOND if amsgrad else _ADAM_SECOND).format(**types)
    return _ADAM_BODY.format(decay=_ADAMW_DECAY if decoupled_weight_decay else _ADAM_L2, second=second, **types)


_COUNT = """
__kernel void netcl_count_steps(__global int* steps, __global const uchar* mask, __global const int* skip,
                                const int n) {
    const int gid = get_global_id(0);
    if (gid < n && mask[gid] && !skip[0]) steps[gid] += 1;
}
"""

_UNSCALE = """{pragmas}
__kernel void netcl_unscale(__global {st}* g, __global int* found, const float inv_scale, const long n) {{
    const long gid = get_global_id(0);
    if (gid >= n) return;
    const {ct} v = ({ct})g[gid] * ({ct})inv_scale;
    if (!isfinite(v)) found[0] = 1;
    g[gid] = ({st})v;
}}
"""

#: per device, the zero flag an update reads when no ``skip`` is given
_NEVER: dict[Any, Tensor] = {}
register_cache(_NEVER.clear)


def _skip_flag(skip: Tensor | None, like: Tensor, op: str) -> Tensor:
    """``skip`` checked (one int32 on ``like``'s device), or the device's zero flag."""
    if skip is None:
        flag = _NEVER.get(like.device)
        if flag is None:
            flag = _NEVER[like.device] = Tensor.zeros((1,), np.int32, like.device)
        return flag
    if not isinstance(skip, Tensor) or skip.dtype != np.int32 or skip.size != 1:
        got = (skip.shape, skip.dtype) if isinstance(skip, Tensor) else type(skip).__name__
        raise DTypeError(f"{op}: skip must be one int32 on the device (a flag), got {got}")
    device_of([like, skip], op)
    return skip


# ---- checks ---------------------------------------------------------------------------------------------
def _check_update(
    op: str,
    param: Tensor,
    grad: Tensor,
    buffers: dict[str, Tensor | None],
    steps: Tensor,
    index: int,
    hyper: Tensor,
    hyper_names: tuple[str, ...],
) -> None:
    for name, value in (("param", param), ("grad", grad), ("steps", steps), ("hyper", hyper)):
        if not isinstance(value, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(value).__name__}")
    refuse_bfloat16(op, param.dtype)
    if param.dtype.kind != "f":
        raise DTypeError(f"{op}: param must be a floating-point tensor, got dtype {param.dtype}")
    for name, value in (("grad", grad), *buffers.items()):
        if value is None:
            continue
        if value.shape != param.shape or value.dtype != param.dtype:
            raise ShapeError(
                f"{op}: {name} has shape {value.shape} {value.dtype}, expected the param's {param.shape} {param.dtype}"
            )
    if steps.dtype != np.int32 or steps.ndim != 1:
        raise DTypeError(f"{op}: steps must be a 1-d int32 tensor, got {steps.shape} {steps.dtype}")
    if not 0 <= int(index) < steps.shape[0]:
        raise IndexError(f"{op}: index {index} is out of range for steps of length {steps.shape[0]}")
    if hyper.dtype != np.float32 or hyper.shape != (len(hyper_names),):
        raise ShapeError(f"{op}: hyper must be float32 of shape ({len(hyper_names)},) {hyper_names}, got {hyper.shape}")
    device_of([param, grad, steps, hyper, *(b for b in buffers.values() if b is not None)], op)


@functools.lru_cache(maxsize=16)
def _dtype_types(dtype: np.dtype) -> dict[str, str]:
    return {"st": storage_ctype(dtype), "ct": compute_ctype(dtype), "pragmas": pragmas([dtype])}


def _types(param: Tensor) -> dict[str, str]:
    return _dtype_types(param.dtype)


# ---- SGD ------------------------------------------------------------------------------------------------
def sgd_step_(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor | None,
    steps: Tensor,
    index: int,
    hyper: Tensor,
    skip: Tensor | None = None,
) -> Tensor:
    """PyTorch's SGD on ``param`` in place (``hyper`` = lr, momentum, dampening, weight_decay, nesterov).

    ``momentum_buffer`` is required when ``hyper``'s momentum is non-zero; the first step
    (``steps[index] == 0``) sets it to the gradient, as torch does. Nothing changes where the
    ``skip`` flag is up. Returns ``param``.
    """
    _check_update("sgd_step_", param, grad, {"momentum_buffer": momentum_buffer}, steps, index, hyper, SGD_HYPER)
    skip = _skip_flag(skip, param, "sgd_step_")
    written(param)
    return sgd_update(param, grad, momentum_buffer, steps, index, hyper, skip)


@backend_op(_TWINS)
def sgd_update(
    param: Tensor, grad: Tensor, momentum_buffer: Tensor | None, steps: Tensor, index: int, hyper: Tensor, skip: Tensor
) -> Tensor:
    """``sgd_step_`` of a checked call (``skip``: the flag, never None): the multi-tensor kernel on one parameter,
    each element's code the same as in a launch of many, hence the same bits."""
    sgd_multi_update([param], [grad], [momentum_buffer], steps, [index], hyper, skip)
    return param


# ---- Adam / AdamW ---------------------------------------------------------------------------------------
def adam_step_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    steps: Tensor,
    index: int,
    hyper: Tensor,
    decoupled_weight_decay: bool = False,
    skip: Tensor | None = None,
    max_exp_avg_sq: Tensor | None = None,
) -> Tensor:
    """PyTorch's Adam (AdamW with ``decoupled_weight_decay``) on ``param`` in place.

    ``hyper`` = lr, beta1, beta2, eps, weight_decay; the step is ``t = steps[index] + 1``.
    ``exp_avg`` / ``exp_avg_sq`` are updated in place; with ``max_exp_avg_sq`` (amsgrad) the step divides by
    the largest second moment so far, kept there. Nothing changes where the ``skip`` flag is up. Returns
    ``param``.
    """
    buffers = {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    for name, value in buffers.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"adam_step_: {name} must be a Tensor, got {type(value).__name__}")
    if max_exp_avg_sq is not None and not isinstance(max_exp_avg_sq, Tensor):
        raise TypeError(f"adam_step_: max_exp_avg_sq must be a Tensor or None, got {type(max_exp_avg_sq).__name__}")
    buffers["max_exp_avg_sq"] = max_exp_avg_sq
    _check_update("adam_step_", param, grad, buffers, steps, index, hyper, ADAM_HYPER)
    skip = _skip_flag(skip, param, "adam_step_")
    written(param)
    return adam_update(
        param, grad, exp_avg, exp_avg_sq, steps, index, hyper, decoupled_weight_decay, skip, max_exp_avg_sq
    )


@backend_op(_TWINS)
def adam_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    steps: Tensor,
    index: int,
    hyper: Tensor,
    decoupled_weight_decay: bool,
    skip: Tensor,
    max_exp_avg_sq: Tensor | None = None,
) -> Tensor:
    """``adam_step_`` of a checked call (``skip``: the flag, never None): the multi-tensor kernel on one parameter,
    as ``sgd_update``."""
    maxima = None if max_exp_avg_sq is None else [max_exp_avg_sq]
    adam_multi_update([param], [grad], [exp_avg], [exp_avg_sq], steps, [index], hyper, decoupled_weight_decay, skip,
                      maxima)  # fmt: skip
    return param


# ---- multi-tensor updates ---------------------------------------------------------------------------------
#: parameters one multi-tensor launch updates (a fixed arity: OpenCL 1.2 has no table of pointers)
MULTI_ARITY = 16

_MULTI = """{pragmas}
__kernel void {name}({buffers},
                     {params},
                     __global const long* table, const long total) {{
    const long t_gid = get_global_id(0);
    if (t_gid >= total{stop}) return;
    {prologue}
{branches}
}}
"""


class ItemSplit(NamedTuple):
    """How a multi-tensor kernel's work-items split a slot's elements: ``chunk`` consecutive elements each, in a
    loop (``vector`` False: a CPU's vectorizing compiler) or as vectors of ``chunk`` (``vector`` True: GPUs)."""

    chunk: int
    vector: bool = False


def _vector_chunk(
    body: str, slots: tuple[str, ...], read_only: tuple[str, ...], j: int, width: int, st: str, tail: str
) -> str:
    """Slot ``j``'s statements on the ``width`` elements from ``lo`` as vectors: each buffer loaded into a private
    array, ``body`` on its elements, the buffers it assigns (``@X[gid] = ...``) stored back (a slot the body only
    reads may alias another: SGD without momentum passes the parameter again); the ``tail`` loop where fewer
    remain."""
    vec = f"{st}{width}"
    loads = " ".join(
        f"{st} {slot}_[{width}]; vstore{width}(*((__global const {vec}*)({slot}{j} + lo)), 0, {slot}_);"
        for slot in slots
    )
    written = [slot for slot in slots if slot not in read_only and f"@{slot}[gid] =" in body]
    stores = " ".join(f"*((__global {vec}*)({slot}{j} + lo)) = vload{width}(0, {slot}_);" for slot in written)
    statements = _on(body, **{slot: f"{slot}_" for slot in slots}).replace("\n", "\n            ")
    return (
        f"if (lo + {width} <= size) {{\n"
        f"            {loads}\n"
        f"            for (int gid = 0; gid < {width}; ++gid) {{\n"
        f"                {statements}\n            }}\n"
        f"            {stores}\n"
        f"        }} else {tail}"
    )


#: the optimizers' arguments after the slots (their multi-tensor kernels stop where ``skip`` is up)
_OPTIM_PARAMS = "__global const int* steps, __global const int* skip, __global const float* hyper"


def multi_source(
    name: str,
    slots: tuple[str, ...],
    params: str,
    prologue: str,
    body: str,
    types: dict[str, str],
    arity: int,
    read_only: tuple[str, ...] = ("G",),
    stop: str = "",
    split: ItemSplit | None = None,
    slot_prologue: str = "",
) -> str:
    """A kernel over ``arity`` tensor slots: ``table`` holds each slot's first element (slot j covers
    [table[j], table[j+1]) of the launch) and, after those ``arity + 1`` offsets, each slot's
    ``index`` (into an optimizer's ``steps``). A work-item finds its slot and runs the per-tensor
    statements (``body``, with ``@`` placeholders for the ``slots`` buffers; those in ``read_only``
    are const) after ``prologue``, and after ``slot_prologue`` (statements on the slot's ``index``, no
    buffers) once per work-item. ``params``: the arguments between the slots and ``table``; ``stop``: a
    condition under which every work-item returns at once.

    ``split`` (``ItemSplit``; None: one element a work-item): a work-item runs the statements on up to
    ``split.chunk`` consecutive elements of one slot; ``table`` (``multi_table`` of the same chunk) then
    counts chunks, and holds each slot's size after the indices. In a loop the compiler vectorizes (CPU
    devices: one element per work-item, each finding its slot through the branches, stays scalar there),
    or with ``split.vector`` as one vector load of each slot's buffer into a private array, the statements
    on its elements and one vector store of each written buffer (GPUs), a slot's last, partial chunk
    element by element. The buffers must be aligned to the vector (an OpenCL buffer's base is) and
    ``body`` must touch its slots only at ``[gid]``."""
    buffers = ",\n                     ".join(
        f"__global {'const ' if slot in read_only else ''}{types['st']}* {slot}{j}"
        for j in range(arity)
        for slot in slots
    )
    branches, nl = [], "\n"
    per_slot = f"\n        {slot_prologue.replace(nl, nl + '    ')}" if slot_prologue else ""
    for j in range(arity):
        test = "if" if j == 0 else "else if"
        statements = _on(body, **{slot: f"{slot}{j}" for slot in slots})
        if split is None or not split.chunk:
            branches.append(
                f"    {test} (t_gid < table[{j + 1}]) {{\n"
                f"        const long gid = t_gid - table[{j}];\n"
                f"        const int index = (int)table[{arity + 1 + j}];{per_slot}\n"
                f"        {statements.replace(nl, nl + '    ')}\n    }}"
            )
            continue
        chunk = split.chunk
        loop = (
            f"for (long gid = lo; gid < min(lo + {chunk}, size); ++gid) {{\n"
            f"            {statements.replace(nl, nl + '        ')}\n        }}"
        )
        if split.vector:
            loop = _vector_chunk(body, slots, read_only, j, chunk, types["st"], loop)
        branches.append(
            f"    {test} (t_gid < table[{j + 1}]) {{\n"
            f"        const int index = (int)table[{arity + 1 + j}];{per_slot}\n"
            f"        const long lo = (t_gid - table[{j}]) * {chunk}, size = table[{2 * arity + 1 + j}];\n"
            f"        {loop}\n    }}"
        )
    return _MULTI.format(
        name=name,
        buffers=buffers,
        params=params,
        stop=f" || {stop}" if stop else "",
        prologue=prologue,
        branches="\n".join(branches),
        pragmas=types["pragmas"],
    )


_TABLES: dict[tuple[Any, ...], Tensor] = {}
_MAX_TABLES = 256


def multi_table(device: Any, sizes: tuple[int, ...], indices: tuple[int, ...], arity: int, chunk: int = 0) -> Tensor:
    """The offsets-and-indices table of one launch (uploaded once per parameter set, then reused);
    ``chunk`` > 0: offsets in chunks of that many elements, and the slots' sizes after the indices."""
    key = (device, sizes, indices, arity, chunk)
    table = _TABLES.get(key)
    if table is None:
        counts = [-(-n // chunk) for n in sizes] if chunk else list(sizes)
        offsets = np.zeros(arity + 1, np.int64)
        offsets[1 : len(sizes) + 1] = np.cumsum(counts)
        offsets[len(sizes) + 1 :] = offsets[len(sizes)]  # unused slots cover no elements
        slots = np.zeros(arity, np.int64)
        slots[: len(indices)] = indices
        parts = [offsets, slots]
        if chunk:
            parts.append(np.asarray(list(sizes) + [0] * (arity - len(sizes)), np.int64))
        if len(_TABLES) >= _MAX_TABLES:
            _TABLES.clear()
        table = _TABLES[key] = Tensor.from_host(device, np.concatenate(parts))
    return table


register_cache(_TABLES.clear)


def multi_chunks(n: int, most: int = MULTI_ARITY) -> list[tuple[int, int, int]]:
    """(start, stop, arity) of each launch: ``most`` parameters (a power of two), the last launch's arity the
    power of two that holds the rest (fewer unused slots: an enqueue's cost grows with its arguments)."""
    chunks = []
    for start in range(0, n, most):
        stop = min(n, start + most)
        chunks.append((start, stop, min(most, 1 << (stop - start - 1).bit_length())))
    return chunks


#: the most parameters one optimizer update takes where the device's kernel arguments have room (``update_arity``)
UPDATE_ARITY = 32


def update_arity(device: Any, slots: int) -> int:
    """Parameters one optimizer update of ``slots`` buffers a parameter takes on ``device``: ``UPDATE_ARITY`` where
    the pointers fit the device's ``max_parameter_size`` with the four arguments after them (NVIDIA's 4,352
    bytes), else ``MULTI_ARITY`` (OpenCL's minimum of 1,024 bytes holds 16 x 5 pointers and those)."""
    cl = getattr(device, "cl_device", None)
    if cl is None:
        return MULTI_ARITY
    pointer = cl.address_bits // 8
    fits = UPDATE_ARITY * slots * pointer + 4 * pointer + 8 <= cl.max_parameter_size
    return UPDATE_ARITY if fits else MULTI_ARITY


def _check_multi(
    op: str,
    params: list[Any],
    others: dict[str, list[Any]],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    hyper_names: tuple[str, ...],
) -> None:
    """What ``_check_update`` checks for each parameter, in one pass (this runs at every step)."""
    n = len(indices)
    for name, values in {"params": params, **others}.items():
        if len(values) != n:
            raise ValueError(f"{op}: {name} has {len(values)} entries, indices has {n}; give one per parameter")
    if not params:
        return
    first = params[0]
    if not isinstance(first, Tensor):
        raise TypeError(f"{op}: param must be a Tensor, got {type(first).__name__}")
    dtype, device = first.dtype, first.device
    for k, (p, index) in enumerate(zip(params, indices, strict=True)):
        if not isinstance(p, Tensor) or p.dtype != dtype or p.device is not device:
            _check_update(op, p, p, {}, steps, index, hyper, hyper_names)  # raises the per-parameter error
            if p.dtype != dtype:
                raise DTypeError(f"{op}: all parameters of one call must share a dtype, got {dtype} and {p.dtype}")
            device_of([first, p], op)
        for name, values in others.items():
            v = values[k]
            if v is not None and (
                not isinstance(v, Tensor) or v.shape != p.shape or v.dtype != dtype or v.device is not device
            ):
                _check_update(op, p, p, {name.rstrip("s"): v}, steps, index, hyper, hyper_names)
                device_of([p, v], op)
        if not 0 <= index < steps.shape[0]:
            raise IndexError(f"{op}: index {index} is out of range for steps of length {steps.shape[0]}")
    _check_update(op, first, first, {}, steps, indices[0], hyper, hyper_names)  # kinds, steps, hyper, devices


def _checked_multi(
    op: str,
    hyper_names: tuple[str, ...],
    params: list[Tensor],
    others: dict[str, list[Tensor]],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    skip: Tensor | None,
) -> Tensor | None:
    """The checks of a multi-tensor update whose buffers ``others`` are all required; with a parameter to update,
    the parameters marked written and the ``skip`` flag the kernels read (``_skip_flag``), else None."""
    _check_multi(op, params, others, steps, indices, hyper, hyper_names)
    for name, values in others.items():
        if any(v is None for v in values):
            raise TypeError(f"{op}: {name.rstrip('s')} must be a Tensor, got NoneType")
    if not params:
        return None
    flag = _skip_flag(skip, params[0], op)
    written(*params)
    return flag


def sgd_multi_step_(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffers: list[Tensor | None],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    skip: Tensor | None = None,
) -> list[Tensor]:
    """``sgd_step_`` on many parameters of one dtype: one launch per ``MULTI_ARITY`` of them.

    Each parameter gets exactly the arithmetic of ``sgd_step_`` (bit-identical results).
    ``momentum_buffers`` are all Tensors or all None; nothing changes where ``skip`` is up. Returns ``params``.
    """
    others = {"grads": grads, "momentum_buffers": momentum_buffers}
    _check_multi("sgd_multi_step_", params, others, steps, indices, hyper, SGD_HYPER)
    if any(g is None for g in grads):
        raise TypeError("sgd_multi_step_: grad must be a Tensor, got NoneType")
    has = [b is not None for b in momentum_buffers]
    if any(has) and not all(has):
        raise ValueError("sgd_multi_step_: momentum_buffers must be all Tensors or all None")
    if not params:
        return params
    skip = _skip_flag(skip, params[0], "sgd_multi_step_")
    written(*params)
    return sgd_multi_update(params, grads, momentum_buffers, steps, indices, hyper, skip)


@backend_op(_TWINS)
def sgd_multi_update(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffers: list[Tensor | None],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    skip: Tensor,
) -> list[Tensor]:
    """``sgd_multi_step_`` of a checked call on at least one parameter (``skip``: the flag, never None)."""
    types = _types(params[0])
    has_momentum = all(b is not None for b in momentum_buffers)
    split = update_split(params[0].device)
    most = update_arity(params[0].device, 3)

    def source(arity: int) -> str:
        hyper_line, body = _SGD_HYPER_LINE.format(**types), _sgd_body(types, has_momentum)
        slots = ("P", "G", "B")
        return multi_source(
            "netcl_sgd_multi", slots, _OPTIM_PARAMS, hyper_line, body, types, arity, stop="skip[0]", split=split
        )

    for start, stop, arity in multi_chunks(len(params), most):
        key = ("optim", "sgd_multi", arity, types["st"], has_momentum, split)
        arg_types = [None] * (3 * arity) + [None, None, None, None, np.int64]
        slots: list[Any] = []
        for j in range(arity):
            k = start + j if start + j < stop else start
            slots += [params[k], grads[k], momentum_buffers[k] if has_momentum else params[k]]
        chunk, chunk_indices = params[start:stop], indices[start:stop]
        make = functools.partial(source, arity)
        launch_multi(
            key, make, "netcl_sgd_multi", arg_types, arity, chunk, chunk_indices, slots, (steps, skip, hyper), split
        )
    return params


def adam_multi_step_(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    decoupled_weight_decay: bool = False,
    skip: Tensor | None = None,
    max_exp_avg_sqs: list[Tensor] | None = None,
) -> list[Tensor]:
    """``adam_step_`` on many parameters of one dtype: one launch per ``MULTI_ARITY`` of them.

    Each parameter gets exactly the arithmetic of ``adam_step_`` (bit-identical results), with
    ``max_exp_avg_sqs`` (one per parameter) for amsgrad; nothing changes where ``skip`` is up. Returns
    ``params``.
    """
    others = {"grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}
    if max_exp_avg_sqs is not None:
        others["max_exp_avg_sqs"] = max_exp_avg_sqs
    flag = _checked_multi("adam_multi_step_", ADAM_HYPER, params, others, steps, indices, hyper, skip)
    if flag is None:
        return params
    return adam_multi_update(
        params, grads, exp_avgs, exp_avg_sqs, steps, indices, hyper, decoupled_weight_decay, flag, max_exp_avg_sqs
    )


@backend_op(_TWINS)
def adam_multi_update(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    decoupled_weight_decay: bool,
    skip: Tensor,
    max_exp_avg_sqs: list[Tensor] | None = None,
) -> list[Tensor]:
    """``adam_multi_step_`` of a checked call on at least one parameter (``skip``: the flag, never None)."""
    types = _types(params[0])
    split = update_split(params[0].device)
    amsgrad = max_exp_avg_sqs is not None
    names = ("P", "G", "M", "V", "X") if amsgrad else ("P", "G", "M", "V")
    most = update_arity(params[0].device, len(names))

    def source(arity: int) -> str:
        hyper_line = _ADAM_HYPER_LINE.format(**types)
        body = _adam_body(types, decoupled_weight_decay, amsgrad)
        return multi_source("netcl_adam_multi", names, _OPTIM_PARAMS, hyper_line, body, types, arity,
                            stop="skip[0]", split=split, slot_prologue=_ADAM_SLOT.format(**types))  # fmt: skip

    for start, stop, arity in multi_chunks(len(params), most):
        key = ("optim", "adam_multi", arity, types["st"], bool(decoupled_weight_decay), split, amsgrad)
        arg_types = [None] * (len(names) * arity) + [None, None, None, None, np.int64]
        slots: list[Any] = []
        for j in range(arity):
            k = start + j if start + j < stop else start
            slots += [params[k], grads[k], exp_avgs[k], exp_avg_sqs[k]]
            if amsgrad:
                slots.append(max_exp_avg_sqs[k])
        chunk, chunk_indices = params[start:stop], indices[start:stop]
        make = functools.partial(source, arity)
        launch_multi(
            key,
            make,
            "netcl_adam_multi",
            arg_types,
            arity,
            chunk,
            chunk_indices,
            slots,
            (steps, skip, hyper),
            split,
        )
    return params


def rmsprop_multi_step_(
    params: list[Tensor],
    grads: list[Tensor],
    square_avgs: list[Tensor],
    grad_avgs: list[Tensor] | None,
    momentum_buffers: list[Tensor] | None,
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    skip: Tensor | None = None,
) -> list[Tensor]:
    """PyTorch's RMSprop on ``params`` in place (``hyper`` = lr, alpha, eps, weight_decay, momentum), one launch per
    ``MULTI_ARITY`` of them: ``square_avgs`` always, ``grad_avgs`` when centered and ``momentum_buffers`` when the
    momentum is non-zero (one per parameter, or None). Nothing changes where ``skip`` is up. Returns ``params``."""
    others = {"grads": grads, "square_avgs": square_avgs}
    for name, values in (("grad_avgs", grad_avgs), ("momentum_buffers", momentum_buffers)):
        if values is not None:
            others[name] = values
    flag = _checked_multi("rmsprop_multi_step_", RMSPROP_HYPER, params, others, steps, indices, hyper, skip)
    if flag is None:
        return params
    return rmsprop_multi_update(params, grads, square_avgs, grad_avgs, momentum_buffers, steps, indices, hyper, flag)


@backend_op(_TWINS)
def rmsprop_multi_update(
    params: list[Tensor],
    grads: list[Tensor],
    square_avgs: list[Tensor],
    grad_avgs: list[Tensor] | None,
    momentum_buffers: list[Tensor] | None,
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    skip: Tensor,
) -> list[Tensor]:
    """``rmsprop_multi_step_`` of a checked call on at least one parameter (``skip``: the flag, never None)."""
    types = _types(params[0])
    centered, momentum = grad_avgs is not None, momentum_buffers is not None
    average = (_RMSPROP_CENTERED if centered else _RMSPROP_AVERAGE).format(**types)
    apply = (_RMSPROP_MOMENTUM if momentum else _RMSPROP_STEP).format(**types)
    body = _RMSPROP_BODY.format(average=average, apply=apply, **types)
    lists = {"P": params, "G": grads, "S": square_avgs}
    if centered:
        lists["A"] = grad_avgs
    if momentum:
        lists["B"] = momentum_buffers
    key = ("rmsprop_multi", types["st"], centered, momentum)
    _launch_update(key, "netcl_rmsprop_multi", _RMSPROP_HYPER_LINE.format(**types), body, types, lists, steps,
                   indices, hyper, skip)  # fmt: skip
    return params


def adagrad_multi_step_(
    params: list[Tensor],
    grads: list[Tensor],
    sums: list[Tensor],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    skip: Tensor | None = None,
) -> list[Tensor]:
    """PyTorch's Adagrad on ``params`` in place (``hyper`` = lr, lr_decay, weight_decay, eps; the step ``t =
    steps[index] + 1``), ``sums`` the running sums of squared gradients; one launch per ``MULTI_ARITY``
    parameters. Nothing changes where ``skip`` is up. Returns ``params``."""
    others = {"grads": grads, "sums": sums}
    flag = _checked_multi("adagrad_multi_step_", ADAGRAD_HYPER, params, others, steps, indices, hyper, skip)
    if flag is None:
        return params
    return adagrad_multi_update(params, grads, sums, steps, indices, hyper, flag)


@backend_op(_TWINS)
def adagrad_multi_update(
    params: list[Tensor], grads: list[Tensor], sums: list[Tensor], steps: Tensor, indices: list[int], hyper: Tensor,
    skip: Tensor,
) -> list[Tensor]:  # fmt: skip
    """``adagrad_multi_step_`` of a checked call on at least one parameter (``skip``: the flag, never None)."""
    types = _types(params[0])
    body = _ADAGRAD_BODY.format(**types)
    _launch_update(("adagrad_multi", types["st"]), "netcl_adagrad_multi", _ADAGRAD_HYPER_LINE.format(**types), body,
                   types, {"P": params, "G": grads, "S": sums}, steps, indices, hyper, skip,
                   _ADAGRAD_SLOT.format(**types))  # fmt: skip
    return params


def _launch_update(
    key: tuple[Any, ...],
    name: str,
    hyper_line: str,
    body: str,
    types: dict[str, str],
    lists: dict[str, list[Tensor]],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    skip: Tensor,
    slot_prologue: str = "",
) -> None:
    """Launch the multi-tensor kernel ``name`` running ``body`` (after ``slot_prologue``, once a work-item) over the
    slots ``lists`` (slot -> one buffer per parameter; "P" the parameters), ``update_arity`` parameters a launch
    (the arithmetic of every parameter the same whichever launch holds it)."""
    params = lists["P"]
    split = update_split(params[0].device)
    slots = tuple(lists)
    most = update_arity(params[0].device, len(slots))

    def source(arity: int) -> str:
        return multi_source(name, slots, _OPTIM_PARAMS, hyper_line, body, types, arity, stop="skip[0]", split=split,
                            slot_prologue=slot_prologue)  # fmt: skip

    for start, stop, arity in multi_chunks(len(params), most):
        arg_types = [None] * (len(slots) * arity) + [None, None, None, None, np.int64]
        buffers: list[Any] = []
        for j in range(arity):
            k = start + j if start + j < stop else start
            buffers += [lists[slot][k] for slot in slots]
        launch_multi(
            ("optim", *key, arity, split),
            functools.partial(source, arity),
            name,
            arg_types,
            arity,
            params[start:stop],
            indices[start:stop],
            buffers,
            (steps, skip, hyper),
            split,
        )


def launch_multi(
    key: tuple[Any, ...],
    source: Any,
    name: str,
    arg_types: list[Any],
    arity: int,
    tensors: list[Tensor],
    indices: list[int],
    slots: list[Any],
    params: tuple[Any, ...],
    split: ItemSplit | None = None,
) -> None:
    """Launch a ``multi_source`` kernel (of this ``split``) over ``tensors`` (their ``indices`` in its
    table): ``slots`` the buffers slot by slot, ``params`` its arguments between the slots and the table.
    Chunked in a loop, each work-item is a work-group of its own (its loop is the vector code)."""
    chunk = split.chunk if split is not None else 0
    sizes = tuple(t.size for t in tensors)
    total = sum(-(-n // chunk) for n in sizes) if chunk else sum(sizes)
    if total == 0:
        return
    device = tensors[0].device
    table = multi_table(device, sizes, tuple(int(i) for i in indices), arity, chunk)
    args = (*slots, *params, table, np.int64(total))
    if not chunk or split.vector:
        run_1d(key, device, source, name, arg_types, total, *args)
        return
    full = ("layers", *key)
    resolved = get_kernel(full, device, source, name, arg_types)
    prepared_for(full, device, resolved.kernel, total, 1).call(*[a.data if isinstance(a, Tensor) else a for a in args])


#: Elements a work-item of a multi-tensor update takes on a CPU device (a loop the compiler vectorizes).
CPU_CHUNK = 2048
#: Elements a work-item of a multi-tensor update takes on a GPU: one vector load and store of each buffer, the
#: slot search and whatever the statements compute once per step (Adam's bias corrections) once per vector.
GPU_VECTOR = 4


def update_split(device: Any) -> ItemSplit | None:
    """``multi_source``'s ``split`` for the optimizers' updates on ``device``: ``CPU_CHUNK`` elements a work-item
    on a CPU OpenCL device (PoCL vectorizes the chunk loop, not the branchy one-element work-items), a vector of
    ``GPU_VECTOR`` on a GPU (measurements: benchmarks/RESULTS.md, "AdamW's update")."""
    if device.kind != "opencl":
        return None
    return ItemSplit(GPU_VECTOR, vector=True) if device.is_gpu else ItemSplit(CPU_CHUNK)


# ---- step counters, unscaling, host writes ----------------------------------------------------------------
def count_steps_(steps: Tensor, mask: Tensor, skip: Tensor | None = None) -> Tensor:
    """``steps[i] += 1`` where ``mask[i]`` (uint8) is non-zero, on the device, unless the ``skip`` flag
    is up; returns ``steps``."""
    if steps.dtype != np.int32 or steps.ndim != 1:
        raise DTypeError(f"count_steps_: steps must be a 1-d int32 tensor, got {steps.shape} {steps.dtype}")
    if mask.dtype != np.uint8 or mask.shape != steps.shape:
        raise ShapeError(f"count_steps_: mask must be uint8 of shape {steps.shape}, got {mask.shape} {mask.dtype}")
    device_of([steps, mask], "count_steps_")
    skip = _skip_flag(skip, steps, "count_steps_")
    return count_masked(steps, mask, skip)


@backend_op(_TWINS)
def count_masked(steps: Tensor, mask: Tensor, skip: Tensor) -> Tensor:
    """``count_steps_`` of a checked call (``skip``: the flag, never None)."""
    n = steps.shape[0]
    run_1d(
        ("optim", "count"),
        steps.device,
        lambda: _COUNT,
        "netcl_count_steps",
        [None, None, None, np.int32],
        n,
        steps,
        mask,
        skip,
        np.int32(n),
    )
    return steps


def unscale_(grad: Tensor, inv_scale: float, found_inf: Tensor) -> Tensor:
    """``grad *= inv_scale`` in place; sets ``found_inf[0] = 1`` (int32) if any result is inf or NaN."""
    if not isinstance(grad, Tensor) or grad.dtype.kind != "f":
        raise DTypeError(f"unscale_: grad must be a floating-point Tensor, got {getattr(grad, 'dtype', type(grad))}")
    if not isinstance(found_inf, Tensor) or found_inf.dtype != np.int32 or found_inf.size < 1:
        raise DTypeError("unscale_: found_inf must be an int32 Tensor with at least one element")
    device_of([grad, found_inf], "unscale_")
    check_writable(grad)
    return unscale_grad(grad, inv_scale, found_inf)


@backend_op(_TWINS)
def unscale_grad(grad: Tensor, inv_scale: float, found_inf: Tensor) -> Tensor:
    """``unscale_`` of a checked call."""
    types = _types(grad)
    run_1d(
        ("optim", "unscale", types["st"]),
        grad.device,
        lambda: _UNSCALE.format(**types),
        "netcl_unscale",
        [None, None, np.float32, np.int64],
        grad.size,
        grad,
        found_inf,
        np.float32(inv_scale),
        np.int64(grad.size),
    )
    return grad
