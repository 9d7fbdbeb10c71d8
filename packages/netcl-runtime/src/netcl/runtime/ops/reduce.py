"""Reductions ``sum``, ``mean``, ``max``, ``min``, ``prod`` over all elements or given axes, with ``keepdims``.

Layout: the reduced axes are moved last *conceptually*: an output index ``o`` and a reduced
index ``r`` map to an input offset through the original strides (adjacent axes of the same
class are merged first, so a trailing-axis reduction reads ``o * R + r``).

Scheme on OpenCL: each work-group reduces one chunk (at most ``CHUNK`` elements) of one output: every thread
accumulates a strided partial of at most ``PER_THREAD`` elements, then a tree in local memory combines the
partials. When the outputs are contiguous in memory (the last axis is kept, as in ``sum(x, axis=0)``), a
work-group instead takes 32 neighbouring outputs x 8 lanes along the reduced axes, so loads stay coalesced,
and the tree runs over the 8 lanes. When an output needs several chunks, the partials go to a scratch tensor
that the next stage reduces the same way; in the "cols" scheme, the last work-group of each block of 32
outputs to finish sums that block's partials inside the same launch instead, where they are at most
``COL_CHUNK`` (a ticket counter a block, no second launch). Reductions of at most ``SERIAL_MAX`` elements
(``SERIAL_MAX_CPU`` on CPU devices) into several outputs use one thread per output (a short loop beats a tree
there). A float32 sum of n elements thus adds at most ~16 terms (64 on CPU devices) serially per stage and log2
terms in every tree, so its error grows like log(n) rather than n. On CPU devices, reduced axes with kept ones
between them and the last of them innermost (a bias gradient's N, H and W) reduce that innermost run first, then
the rest.

Programs are shape-generic: sizes, strides, chunk counts and the tree's work-group size are
kernel arguments, so a program is built once per (op, mode, number of kept/reduced axes after
merging, dtypes, index type); a new batch size reuses it.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor
from netcl.core.dtypes import STORAGE_ONLY, float32, float64, int64, is_floating
from netcl.core.errors import ShapeError
from netcl.runtime import recording, results
from netcl.runtime.cache import register_cache
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import (
    ARG_DTYPES,
    FASTDIV_SOURCE,
    MAX_LOCAL,
    compute_ctype,
    device_of,
    div_expr,
    fast_divisor,
    get_kernel,
    index_type,
    normalize_axes,
    pow2_ceil,
    pow2_floor,
    remember,
    storage_ctype,
    storage_pragmas,
)
from netcl.runtime.ops._rows import tree_loop_c, tree_reduce_c
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.pointwise import add, fill_
from netcl.runtime.ops.storage_io import load_c, store_c

_TWINS = "netcl.runtime.numpy_twins.reduce"

PER_THREAD = 16
CHUNK = MAX_LOCAL * PER_THREAD
SERIAL_MAX = 16
#: ``SERIAL_MAX`` on CPU devices, where a work-group runs as a loop over its work-items and a tree's barriers split
#: that loop: one work-item per output up to 64 elements (benchmarks/RESULTS.md, "Thirty-fourth session").
SERIAL_MAX_CPU = 64
COLS, ROWS = 32, 8  # "cols" work-group: 32 neighbouring outputs x 8 lanes along the reduced axis
COL_CHUNK = ROWS * PER_THREAD
COLS_MIN = 8

Axis = int | Sequence[int] | None
Dims = tuple[tuple[int, int], ...]


def sum(x: Tensor, axis: Axis = None, keepdims: bool = False, addend: Tensor | None = None) -> Tensor:
    """Sum over ``axis`` (None: all; int or tuple, negatives allowed). Integer inputs give int64.

    ``addend`` (a tensor of the result's shape and dtype): the result is ``addend + the sum``, added
    in the last stage's store for float results (the bits of an ``add`` after the sum)."""
    return _reduce("sum", x, axis, keepdims, addend)


def mean(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis``; float32 for integer inputs, NaN over an empty axis."""
    return _reduce("mean", x, axis, keepdims)


def max(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Maximum over ``axis``; NaN anywhere in a slice gives NaN (as NumPy). Empty slices raise."""
    return _reduce("max", x, axis, keepdims)


def min(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Minimum over ``axis``; NaN anywhere in a slice gives NaN (as NumPy). Empty slices raise."""
    return _reduce("min", x, axis, keepdims)


def prod(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Product over ``axis``; 1 over an empty axis. Integer inputs give int64 (as ``sum``)."""
    return _reduce("prod", x, axis, keepdims)


def reduce_dtypes(op: str, dtype: np.dtype) -> tuple[np.dtype, np.dtype]:
    """(accumulator dtype, result dtype) of reducing ``dtype`` with ``op``."""
    if is_floating(dtype):
        return (float64 if dtype == float64 else float32), dtype
    if op == "mean":
        return float32, float32
    if op in ("sum", "prod"):
        return int64, int64
    return dtype, dtype


def _reduce(op: str, x: Tensor, axis: Axis, keepdims: bool, addend: Tensor | None = None) -> Tensor:
    """``op`` over ``axis``, plus ``addend`` (sum only) in the last stage's store where the result is
    a float on OpenCL; elsewhere an ``add`` after the reduction (the same float add)."""
    if addend is None and type(x) is Tensor and (axis is None or type(axis) is int or _int_tuple(axis)):
        plan = _PLANS.get((op, x.shape, x.dtype, axis, keepdims, x.device))
        if plan is not None:  # a shape, dtype and axis this op reduced before on this OpenCL device
            out_shape, out_dtype, nbytes, kept, reduced, acc, scale, single = plan
            device = x.device
            out = results.tensor(device.allocator(device, nbytes), out_shape, out_dtype, device)
            if single is not None:  # one stage: its prepared launch
                single.call(x.data, out.data)
            else:
                _reduce_cl(op, x, kept, reduced, acc, out, scale, device)
            return out
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if addend is not None and not isinstance(addend, Tensor):
        raise TypeError(f"{op}: addend must be a Tensor, got {type(addend).__name__}")
    device = device_of((x,) if addend is None else (x, addend), op)
    axes = normalize_axes(axis, x.ndim, op)
    out_shape = tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keepdims or i not in axes)
    acc, out_dtype = reduce_dtypes(op, x.dtype)
    if addend is not None:
        if tuple(addend.shape) != out_shape or addend.dtype != out_dtype:
            raise ShapeError(
                f"{op}: addend must have the result's shape {out_shape} and dtype {out_dtype}, "
                f"got {tuple(addend.shape)} {addend.dtype}"
            )
        if not is_floating(out_dtype) or x.size == 0:
            return add(addend, _reduce(op, x, axis, keepdims))
    device.check_dtype(acc)
    R = math.prod(x.shape[a] for a in axes)
    if R == 0 and op in ("max", "min") and math.prod(out_shape):
        word = "maximum" if op == "max" else "minimum"
        raise ValueError(f"{op}: reducing axes {axes} of shape {x.shape} covers zero elements, which has no {word}")
    if R == 0 or math.prod(out_shape) == 0:
        out = Tensor.empty(out_shape, out_dtype, device)
        empty_value = {"sum": 0, "prod": 1}.get(op, float("nan"))
        return fill_(out, empty_value) if out.size else out
    return reduce_nonempty(op, x, axis, axes, keepdims, out_shape, out_dtype, acc, addend)


@backend_op(_TWINS, device_arg="x")
def reduce_nonempty(
    op: str,
    x: Tensor,
    axis: Axis,
    axes: tuple[int, ...],
    keepdims: bool,
    out_shape: tuple[int, ...],
    out_dtype: np.dtype,
    acc: np.dtype,
    addend: Tensor | None,
) -> Tensor:
    """``_reduce`` of a checked call over at least one element into a non-empty result (``axes``: ``axis``
    normalized), plus ``addend`` (a float result's, or None)."""
    device = x.device
    kept, reduced = merged_layout(x.shape, axes)
    out = Tensor.empty(out_shape, out_dtype, device)
    scale = 1.0 / math.prod(x.shape[a] for a in axes) if op == "mean" else 1.0
    single = _reduce_cl(op, x, kept, reduced, acc, out, scale, device, addend)
    if addend is None and (axis is None or type(axis) is int or _int_tuple(axis)):
        plan = (out.shape, out_dtype, out.nbytes, kept, reduced, acc, scale, single)
        remember(_PLANS, (op, x.shape, x.dtype, axis, keepdims, device), plan)
    return out


#: (op, shape, dtype, axis as given, keepdims, device) -> what ``_reduce`` derives from them on OpenCL
#: (out shape, out dtype, out bytes, kept, reduced, accumulator dtype, scale, the prepared launch when it is one
#: stage else None): the checks passed once
_PLANS: dict[tuple, tuple] = {}
#: the prepared launch of each stage (its kernel, sizes and size arguments bound; input, output and addend per call)
_STAGES: dict[tuple, PreparedLaunch] = {}
register_cache(_PLANS.clear)
register_cache(_STAGES.clear)


def _int_tuple(axis: object) -> bool:
    """Whether ``axis`` is a tuple of exact ints (a memo key that equals only itself: no bools, no NumPy ints)."""
    if type(axis) is not tuple:
        return False
    for a in axis:  # noqa: SIM110 (a loop, not all(genexpr): this runs on every eager reduction)
        if type(a) is not int:
            return False
    return True


def merged_layout(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[Dims, Dims]:
    """(kept, reduced) lists of (size, stride); size-1 axes dropped, adjacent same-class axes merged."""
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    groups: list[list[int | bool]] = []  # [is_reduced, size, stride]
    for i, size in enumerate(shape):
        if size == 1:
            continue
        is_reduced = i in axes
        if groups and groups[-1][0] == is_reduced:
            groups[-1][1] = int(groups[-1][1]) * size
            groups[-1][2] = strides[i]
        else:
            groups.append([is_reduced, size, strides[i]])
    kept = tuple((int(g[1]), int(g[2])) for g in groups if not g[0])
    reduced = tuple((int(g[1]), int(g[2])) for g in groups if g[0])
    return kept, reduced


def _reduce_cl(
    op: str,
    x: Tensor,
    kept: Dims,
    reduced: Dims,
    acc: np.dtype,
    out: Tensor,
    scale: float,
    device: Device,
    addend: Tensor | None = None,
) -> PreparedLaunch | None:
    """Reduce in stages into ``out``; the stage that writes ``out`` adds ``addend`` in its store. Returns the
    prepared launch when one stage did it all (input and output its per-call arguments), else None."""
    K = R = 1
    for d, _ in kept:  # plain loops: this runs on every eager reduction
        K *= d
    for d, _ in reduced:
        R *= d
    gpu = device.is_gpu
    short = R <= SERIAL_MAX or (not gpu and R <= SERIAL_MAX_CPU)
    if short and K > 1:  # one output takes the tree below: the same program as a longer sum
        return _launch_stage(op, x, kept, reduced, acc, out, scale, device, "serial", chunks=1, local=1, addend=addend)
    if len(reduced) > 1 and reduced[-1][1] == 1 and not gpu:
        return _innermost_first(op, x, kept, reduced, acc, out, scale, device, addend)
    if kept and kept[-1][1] == 1 and kept[-1][0] >= COLS_MIN:
        # Outputs are contiguous in memory: neighbouring threads take neighbouring outputs.
        mode, chunks, local = "cols", -(-R // COL_CHUNK), COLS * ROWS
    else:
        limit = _TREE_LIMIT.get(device)
        if limit is None:  # a driver query: once per device, not per reduction
            limit = _TREE_LIMIT[device] = builtins.min(MAX_LOCAL, pow2_floor(device.cl_device.max_work_group_size))
        chunks = -(-R // CHUNK)
        per_group = -(-R // chunks)
        mode, local = "tree", builtins.min(limit, builtins.max(16, pow2_ceil(-(-per_group // PER_THREAD))))
    if chunks == 1:
        return _launch_stage(op, x, kept, reduced, acc, out, scale, device, mode, chunks=1, local=local, addend=addend)
    partial = Tensor.empty((K * chunks,), acc, device)  # partial[o * chunks + c]
    if mode == "cols" and chunks <= COL_CHUNK:  # one launch: each column block's last work-group sums its partials
        _launch_stage(op, x, kept, reduced, acc, out, scale, device, "cols_last", chunks, local, addend, partial)
        return None
    _launch_stage(op, x, kept, reduced, acc, partial, 1.0, device, mode, chunks=chunks, local=local)
    next_kept = ((K, chunks),) if K > 1 else ()
    _reduce_cl(op, partial, next_kept, ((chunks, 1),), acc, out, scale, device, addend)
    return None


def _innermost_first(
    op: str,
    x: Tensor,
    kept: Dims,
    reduced: Dims,
    acc: np.dtype,
    out: Tensor,
    scale: float,
    device: Device,
    addend: Tensor | None,
) -> None:
    """On a CPU device, reduced axes split by kept ones with the last of them innermost (a bias gradient's
    (N, C, H, W) over N, H and W): the contiguous innermost run first, every other axis kept, then the rest of
    the reduction on those partials, faster on PoCL than one strided stage (benchmarks/RESULTS.md, "Issue 33 on
    the CPU: reductions across a kept axis")."""
    inner = reduced[-1][0]
    rest = sorted(kept + reduced[:-1], key=lambda group: -group[1])  # the other axes, outermost first
    partial = Tensor.empty(tuple(size for size, _ in rest), acc, device)
    _reduce_cl(op, x, ((partial.size, inner),), ((inner, 1),), acc, partial, 1.0, device)
    later = set(reduced[:-1])
    next_kept, next_reduced = merged_layout(partial.shape, tuple(i for i, group in enumerate(rest) if group in later))
    _reduce_cl(op, partial, next_kept, next_reduced, acc, out, scale, device, addend)


#: device -> the tree mode's work-group limit (``MAX_LOCAL`` or the device's power-of-two maximum)
_TREE_LIMIT: dict[Device, int] = {}


def _launch_stage(
    op: str,
    x: Tensor,
    kept: Dims,
    reduced: Dims,
    acc: np.dtype,
    out: Tensor,
    scale: float,
    device: Device,
    mode: str,
    chunks: int,
    local: int,
    addend: Tensor | None = None,
    partial: Tensor | None = None,
) -> PreparedLaunch | None:
    """One stage (returns its prepared launch when it takes no addend, else None); the program depends on
    (op, mode, ranks of kept/reduced, dtypes, index type, with an addend or not) only: sizes, strides, chunk
    counts and the tree's work-group size are kernel arguments. ``addend`` (final stage only: ``chunks`` is 1,
    or mode "cols_last") is added to each output in its store. Mode "cols_last" takes ``partial`` (``K *
    chunks`` accumulator values) for its work-groups' partial sums."""
    plus = addend is not None
    key = (op, mode, kept, reduced, x.dtype, acc, out.dtype, chunks, local, scale, plus, device)
    prepared = _STAGES.get(key)
    if prepared is None:
        prepared = remember(
            _STAGES, key, _prepare_stage(op, x, kept, reduced, acc, out, scale, device, mode, chunks, local, plus)
        )
    if partial is not None:
        tickets = _stage_tickets(key, device, kept)
        if plus:
            prepared.call(x.data, out.data, partial.data, tickets, addend.data)
        else:
            prepared.call(x.data, out.data, partial.data, tickets)
        return None
    if plus:
        prepared.call(x.data, out.data, addend.data)
        return None
    prepared.call(x.data, out.data)
    return prepared


def _prepare_stage(
    op: str,
    x: Tensor,
    kept: Dims,
    reduced: Dims,
    acc: np.dtype,
    out: Tensor,
    scale: float,
    device: Device,
    mode: str,
    chunks: int,
    local: int,
    plus: bool,
) -> PreparedLaunch:
    """The launch of one stage with its scale and size arguments bound; per call: input, output (and addend)."""
    K = math.prod(d for d, _ in kept)
    R = math.prod(d for d, _ in reduced)
    op = "sum" if op == "mean" else op  # mean is a sum scaled by the ``scale`` argument
    idx = index_type(x.shape, (K * chunks * builtins.max(local, COLS * ROWS),))
    # Per axis: does it have stride 1? (a layout class: only the input's innermost axis does)
    layout = (tuple(st == 1 for _, st in kept), tuple(st == 1 for _, st in reduced))
    key = ("reduce", op, mode, layout, x.dtype.str, acc.str, out.dtype.str, idx, plus)
    acc_ctype = compute_ctype(acc)

    def source() -> str:
        return _source(op, mode, x.dtype, layout, acc, out.dtype, idx, plus)

    sizes = [K, R, chunks, -(-R // chunks)]
    arg_dtypes = [None, None, ARG_DTYPES[acc_ctype]] + [ARG_DTYPES[idx]] * 4
    for dims in (kept, reduced):
        for pos, (size, stride) in enumerate(dims):
            if pos > 0:
                sizes += [size, *fast_divisor(size)]
                arg_dtypes += [ARG_DTYPES[idx], ARG_DTYPES["uint"], ARG_DTYPES["uint"]]
            if stride != 1:
                sizes.append(stride)
                arg_dtypes.append(ARG_DTYPES[idx])
    bound = {2: scale, **{3 + i: size for i, size in enumerate(sizes)}}
    if mode == "cols_last":  # partial and tickets, per call
        arg_dtypes += [None, None]
    if plus:
        arg_dtypes.append(None)
    resolved = get_kernel(key, device, source, "netcl_reduce", arg_dtypes)
    if mode == "serial":
        step = resolved.max_local
        gsize, lsize = -(-K // step) * step, step
    elif mode in ("cols", "cols_last"):
        gsize, lsize = (-(-K // COLS) * COLS, chunks * ROWS), (COLS, ROWS)
    else:
        local = builtins.min(local, resolved.max_local)
        gsize, lsize = K * chunks * local, local
    return PreparedLaunch.binding(resolved.kernel, gsize, lsize, bound, device.queue)


def _stage_tickets(key: tuple, device: Device, kept: Dims) -> cl.Buffer:
    """The tickets of a "cols_last" launch over the outputs ``kept``: an int per block of 32 outputs, zero before
    and after it (a column block's work-groups count themselves in its ticket, and the last one sets it back to
    0). Eager launches of one stage share the stage's tickets: ops run on the device's in-order queue, one launch
    at a time. A launch that a capture records gets tickets of its own, so a replay on another queue
    (``Graph.execute(queue=)``) never shares them with eager work."""
    recorded = recording.RECORDING and recording.is_recording(device.queue)
    tickets = None if recorded else _TICKETS.get(key)
    if tickets is None:
        tickets = _zeroed_ints(device, -(-math.prod(d for d, _ in kept) // COLS))
        if not recorded:
            remember(_TICKETS, key, tickets)
    return tickets


def _zeroed_ints(device: Device, count: int) -> cl.Buffer:
    zeros = np.zeros(count, np.int32)
    return cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=zeros)


#: stage key -> the tickets its eager "cols_last" launches share
_TICKETS: dict[tuple, cl.Buffer] = {}
register_cache(_TICKETS.clear)


def _axis_params(prefix: str, unit: Sequence[bool], idx: str) -> list[str]:
    """Parameter declarations of one class of axes (as ``_launch_stage`` passes them): per axis
    ``pos`` > 0 its size ``{prefix}n{pos}`` with fast-division magic and shift; the stride
    ``{prefix}s{pos}`` unless it is 1."""
    params = []
    for pos, is_unit in enumerate(unit):
        if pos > 0:
            params.append(f"const {idx} {prefix}n{pos}, const uint {prefix}n{pos}m, const uint {prefix}n{pos}s")
        if not is_unit:
            params.append(f"const {idx} {prefix}s{pos}")
    return params


def _index_lines(prefix: str, unit: Sequence[bool], var: str, idx: str) -> list[str]:
    """C lines adding to ``off`` the offset of flat index ``var`` over the axes ``_axis_params``
    declares, row-major."""
    lines = []
    for pos in range(len(unit) - 1, -1, -1):
        if pos > 0:
            size = f"{prefix}n{pos}"
            lines.append(f"q = {div_expr(var, size, idx)};")
            term = f"({var} - q * {size})"
        else:
            term = var
        lines.append(f"off += {term};" if unit[pos] else f"off += {term} * {prefix}s{pos};")
        if pos > 0:
            lines.append(f"{var} = q;")
    return lines


def _identity(op: str, acc: np.dtype) -> str:
    if op == "sum":
        return "0"
    if op == "prod":
        return "1"
    if acc.kind == "f":
        return "-INFINITY" if op == "max" else "INFINITY"
    if op == "max":
        return {"i4": "INT_MIN", "i8": "LONG_MIN"}.get(acc.str[1:], "0")
    return {"i4": "INT_MAX", "i8": "LONG_MAX", "u4": "UINT_MAX"}.get(acc.str[1:], "UCHAR_MAX")


def _combine(op: str, acc: np.dtype) -> str:
    if op == "sum":
        return "((a) + (b))"
    if op == "prod":
        return "((a) * (b))"
    if acc.kind == "f":
        cmp = ">" if op == "max" else "<"
        return f"(((a) {cmp} (b) || (a) != (a)) ? (a) : (b))"
    return f"{op}((a), (b))"


def _source(
    op: str,
    mode: str,
    in_dtype: np.dtype,
    layout: tuple[tuple[bool, ...], tuple[bool, ...]],
    acc: np.dtype,
    out_dtype: np.dtype,
    idx: str,
    plus: bool = False,
) -> str:
    acc_t = compute_ctype(acc)
    in_t = storage_ctype(in_dtype)
    out_t = storage_ctype(out_dtype)
    final = "acc * scale" if op == "sum" else "acc"
    store = f"(({final}) != 0)" if out_dtype.kind == "b" else f"({final})"
    params = _axis_params("k", layout[0], idx) + _axis_params("r", layout[1], idx)
    names = [p.rsplit(" ", 1)[1] for decl in params for p in decl.split(", ")]
    dim_params = "".join(f", {p}" for p in params)
    dim_args = "".join(f", {name}" for name in names)
    in_index = "\n    ".join(
        [f"{idx} off = 0, q = 0;", *_index_lines("k", layout[0], "o", idx), *_index_lines("r", layout[1], "r", idx)]
    )
    header = (
        f"{storage_pragmas([in_dtype, acc, out_dtype])}{FASTDIV_SOURCE}"
        f"#define COMBINE(a, b) {_combine(op, acc)}\n"
        f"inline {idx} in_index({idx} o, {idx} r{dim_params}) {{\n    {in_index}\n    return off;\n}}\n"
    )
    signature = (
        f"__global const {in_t}* x, __global {out_t}* out, const {acc_t} scale, "
        f"const {idx} K, const {idx} R, const {idx} chunks, const {idx} per_group{dim_params}"
        + (f", __global {acc_t}* partial, __global int* tickets" if mode == "cols_last" else "")
        + (f", __global const {out_t}* addend" if plus else "")
    )

    def put(at: str) -> str:  # the output's store; with an addend, the float add after the rounding
        if out_dtype in STORAGE_ONLY:  # only loaded and stored (storage_io): no cl_khr_fp16
            line = store_c(out_dtype, "out", at, store) + ";"
            both = f"{load_c(out_dtype, 'out', at)} + {load_c(out_dtype, 'addend', at)}"
            return line + (f" {store_c(out_dtype, 'out', at, both)};" if plus else "")
        value = f"({out_t}){store}"
        return f"out[{at}] = " + (f"({out_t})({value} + addend[{at}]);" if plus else f"{value};")

    at = f"in_index(o, r{dim_args})"
    read = load_c(in_dtype, "x", at)
    loop = f"acc = COMBINE(acc, ({acc_t}){read});"
    if mode == "cols_last":
        return header + _cols_last_kernel(signature, idx, acc_t, _identity(op, acc), loop, put("o"))
    if mode == "cols":
        head = _cols_chunk_c(signature, idx, acc_t, _identity(op, acc), loop)
        return header + head + f"    if (ly == 0 && o < K) {{ acc = scratch[0][lx]; {put('o * chunks + c')} }}\n}}\n"
    if mode == "serial":
        return header + (
            f"__kernel void netcl_reduce({signature}) {{\n"
            f"    const {idx} o = ({idx})get_global_id(0);\n"
            "    if (o >= K) return;\n"
            f"    {acc_t} acc = {_identity(op, acc)};\n"
            f"    for ({idx} r = 0; r < R; ++r) {{ {loop} }}\n"
            f"    {put('o')}\n"
            "}\n"
        )
    # tree: the work-group size (a power of two <= MAX_LOCAL) is chosen at launch
    header += tree_reduce_c(
        "netcl_tree_combine", acc_t, "s0[lid] = COMBINE(s0[lid], s0[lid + h]);", final_barrier=False
    )
    return header + (
        f"__kernel void netcl_reduce({signature}) {{\n"
        f"    __local {acc_t} scratch[{MAX_LOCAL}];\n"
        "    const int lid = get_local_id(0);\n"
        "    const int local_size = get_local_size(0);\n"
        f"    const {idx} g = ({idx})get_group_id(0);\n"
        f"    const {idx} o = g / chunks;\n"
        f"    const {idx} start = (g % chunks) * per_group;\n"
        f"    const {idx} stop = start + per_group < R ? start + per_group : R;\n"
        f"    {acc_t} acc = {_identity(op, acc)};\n"
        f"    for ({idx} r = start + lid; r < stop; r += local_size) {{ {loop} }}\n"
        "    acc = netcl_tree_combine(acc, scratch);\n"
        f"    if (lid == 0) {{ {put('g')} }}\n"
        "}\n"
    )


def _cols_chunk_c(signature: str, idx: str, acc_t: str, identity: str, loop: str, local_decls: str = "") -> str:
    """The opening of both column kernels, up to work-group (column block, chunk c)'s 32 sums of its chunk in
    ``scratch[0]``: 8 lanes along the rows, then a tree over the lanes."""
    return (
        f"__kernel __attribute__((reqd_work_group_size({COLS}, {ROWS}, 1)))\n"
        f"void netcl_reduce({signature}) {{\n"
        f"    __local {acc_t} scratch[{ROWS}][{COLS}];\n" + local_decls + "    const int lx = get_local_id(0);\n"
        "    const int ly = get_local_id(1);\n"
        f"    const {idx} o = ({idx})get_global_id(0);\n"
        f"    const {idx} c = ({idx})get_group_id(1);\n"
        f"    const {idx} start = c * per_group;\n"
        f"    const {idx} stop = start + per_group < R ? start + per_group : R;\n"
        f"    {acc_t} acc = {identity};\n"
        "    if (o < K) {\n"
        f"        for ({idx} r = start + ly; r < stop; r += {ROWS}) {{ {loop} }}\n"
        "    }\n"
        "    scratch[ly][lx] = acc;\n" + _LANE_TREE
    )


_LANE_TREE = tree_loop_c("scratch[ly][lx] = COMBINE(scratch[ly][lx], scratch[ly + h][lx]);", "ly", str(ROWS // 2))


def _cols_last_kernel(signature: str, idx: str, acc_t: str, identity: str, loop: str, put: str) -> str:
    """ "cols" over ``chunks`` > 1 chunks in one launch. Work-group (column block b, chunk c) sums its chunk as
    "cols" does and stores the 32 sums to ``partial[o * chunks + c]``; after a global fence, it takes a ticket of
    block b. The work-group that takes the block's last ticket reads the block's partials (volatile loads: not
    from a cache that may hold older values), sums them over chunks, 8 lanes and a tree (a fixed order, whoever
    is last), stores the outputs and sets the ticket back to 0 for the next launch."""
    return (
        _cols_chunk_c(signature, idx, acc_t, identity, loop, "    __local int last;\n")
        + "    if (ly == 0 && o < K) partial[o * chunks + c] = scratch[0][lx];\n"
        "    mem_fence(CLK_GLOBAL_MEM_FENCE);\n"
        "    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);\n"
        "    if (lx == 0 && ly == 0) last = atomic_inc(tickets + get_group_id(0)) == (int)chunks - 1;\n"
        "    barrier(CLK_LOCAL_MEM_FENCE);\n"
        "    if (!last) return;\n"
        "    mem_fence(CLK_GLOBAL_MEM_FENCE);\n"
        f"    const volatile __global {acc_t}* sums = partial;\n"
        f"    acc = {identity};\n"
        "    if (o < K) {\n"
        f"        for ({idx} k = ly; k < chunks; k += {ROWS}) {{ const {acc_t} a = acc, b = sums[o * chunks + k]; "
        "acc = COMBINE(a, b); }\n"
        "    }\n"
        "    scratch[ly][lx] = acc;\n" + _LANE_TREE + f"    if (ly == 0 && o < K) {{ acc = scratch[0][lx]; {put} }}\n"
        "    if (lx == 0 && ly == 0) tickets[get_group_id(0)] = 0;\n"
        "}\n"
    )


__all__ = ["max", "mean", "merged_layout", "min", "prod", "reduce_dtypes", "sum"]
