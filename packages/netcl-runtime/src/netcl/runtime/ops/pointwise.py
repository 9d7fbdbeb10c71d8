"""Broadcasting elementwise ops: one generated kernel per (expression, dtypes, layout class).

The source is shape-generic: the element count, the collapsed output dims and each broadcast
operand's strides are kernel arguments (``_common.broadcast_layout``), so a new batch size
builds nothing. The source depends only on the expression, the dtypes, how each operand is read
(at the output index, at 0, or through strides), the collapsed rank and the index type. Scalar
operands are kernel arguments too (a new scalar value never rebuilds anything). The body
evaluates one C expression over ``PRIMITIVE_PREAMBLE`` helpers and stores the result.

On a CPU OpenCL device a float32 op whose operands are read at the output index (or are scalars or
single elements) evaluates its expression on ``floatN`` vectors (``vector_primitives``, N the
device's ``vector_width``), the jit's CPU form: PoCL then calls its vector ``exp`` / ``tanh``, where
the per-lane kernel made one scalar call an element (``exp`` on 262,144 floats 1.0 -> 0.1 ms,
benchmarks/RESULTS.md, "isnan on PoCL").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor, broadcast_shapes
from netcl.core.dtypes import float32
from netcl.core.errors import ShapeError
from netcl.core.kernels.vector_primitives import MATH_HELPERS, vector_preamble, vectorize
from netcl.core.strided_view import StridedView
from netcl.core.writes import written
from netcl.runtime import results
from netcl.runtime.launch import PreparedLaunch, enqueue_fill
from netcl.runtime.ops import _table
from netcl.runtime.ops._common import (
    ARG_DTYPES,
    CLEAR_HOOKS,
    FASTDIV_SOURCE,
    FLAT,
    STRIDED,
    ResolvedKernel,
    broadcast_layout,
    compute_ctype,
    device_of,
    dim_arg_dtypes,
    dim_args,
    dim_params,
    div_expr,
    dot_expr,
    float_dtype,
    get_kernel,
    index_type,
    pow2_ceil,
    promote,
    remember,
    scalar_dtype,
    storage_ctype,
    storage_only,
    storage_pragmas,
)
from netcl.runtime.ops._table import F64_SOURCE, OpDef, f64_expr
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.elementwise_defs import OPDEFS, OPDEFS_BY_ARITY, derivative_opdef
from netcl.runtime.ops.storage_io import load_c, store_c

#: name -> OpDef by operand count (inputs, then attributes): the defined ops, then the helper kernels.
UNARY = {**OPDEFS_BY_ARITY[1], **_table.UNARY}
BINARY = {**OPDEFS_BY_ARITY[2], **_table.BINARY}
TERNARY = {**OPDEFS_BY_ARITY[3], **_table.TERNARY}
WHERE, CLAMP = OPDEFS["where"], OPDEFS["clamp"]

_TWINS = "netcl.runtime.numpy_twins.pointwise"
_PLACEHOLDER = re.compile(r"\{(\d+)\}")
_CTYPE_TO_DTYPE = {"float": float32, "double": np.dtype(np.float64), "int": np.dtype(np.int32)}


class Plan:
    """Everything one (expression, operand signature, device) needs at launch, computed once.

    ``shape_args`` are the kernel's trailing size arguments (n, collapsed dims, strides); the
    source (``make_source``) does not depend on them, so plans of other shapes share the program.
    """

    __slots__ = (
        "expr",
        "ctypes",
        "out_shape",
        "out_dtype",
        "n",
        "nbytes",
        "arg_types",
        "resolved",
        "make_source",
        "shape_args",
        "idx",
        "rank",
        "grid",
        "prepared",
        "vector",
        "reads_views",
    )

    def __init__(
        self,
        expr: str,
        operands: Sequence[Any],
        ctypes: Sequence[str],
        out_shape: tuple[int, ...],
        out_dtype: np.dtype,
        preamble: str = "",
        vector_width: int = 1,
    ) -> None:
        self.expr = expr
        self.ctypes = tuple(ctypes)
        self.out_shape = out_shape
        self.out_dtype = out_dtype
        self.n = math.prod(out_shape)
        self.nbytes = self.n * out_dtype.itemsize
        self.arg_types = tuple(
            None if isinstance(v, Tensor) else ARG_DTYPES[c].type for v, c in zip(operands, ctypes, strict=True)
        )
        self.resolved: ResolvedKernel | None = None
        shapes = [v.shape if isinstance(v, Tensor) else None for v in operands]
        #: whether an operand is a strided view, read in place through its strides and offset (``execute``
        #: passes its source's buffer)
        self.reads_views = any(type(v) is StridedView for v in operands)
        views = [v if type(v) is StridedView else None for v in operands]
        classes, dims, strides = broadcast_layout(
            out_shape, shapes, [None if v is None else v.strides for v in views] if self.reads_views else None
        )
        if len(dims) == 1:  # a view alone collapses to one axis: the strided grid is 2-D at least
            dims, strides = (1, *dims), tuple((0, *per) for per in strides)
        # a view's indices run over its source's memory
        covered = [v.source.shape if type(v) is StridedView else v.shape for v in operands if isinstance(v, Tensor)]
        self.idx = index_type(out_shape, *covered)
        # Stride 0 (broadcast axis) and 1 (nothing inner spans) follow from the layout class alone:
        # baked into the source; the other strides are arguments, then the offsets of views that start past 0.
        patterns = tuple(tuple(0 if st == 0 else 1 if st == 1 else 2 for st in per) for per in strides)
        free = [st for per in strides for st in per if st not in (0, 1)]  # a view's may be negative
        offsets = [v.offset for v in views if v is not None and v.offset]
        offset_of = [v is not None and v.offset != 0 for v, cls in zip(views, classes, strict=True) if cls == STRIDED]
        self.shape_args = (self.n, dims[0], *dim_args(dims), *free, *offsets) if dims else (self.n,)
        self.grid = dims  # strided operands: a 2-D/3-D grid over the collapsed dims (see ``launch_sizes``)
        #: the launch prepared once for this plan's kernel and sizes (``execute``)
        self.prepared: PreparedLaunch | None = None
        dtypes = [v.dtype if isinstance(v, Tensor) else None for v in operands]
        rank = self.rank = len(dims)
        #: elements a work-item evaluates as one ``floatN`` (1: one element, the per-lane kernel)
        vectors = self.n < _VECTOR_MAX_N and _vectorizes(expr, classes, dtypes, self.ctypes, out_dtype, preamble)
        self.vector = vector_width if vectors else 1
        if self.vector > 1:
            width = self.vector
            self.make_source = lambda: _vector_source(expr, classes, self.ctypes, width, self.idx)
        else:
            self.make_source = lambda: (
                preamble + _source(expr, classes, dtypes, self.ctypes, rank, patterns, out_dtype, self.idx, offset_of)
            )

    def kernel(self, device: Device) -> ResolvedKernel:
        resolved = self.resolved
        if resolved is None or not resolved.current:
            key = ("ew", self.expr, self.ctypes, self.make_source())
            scalar_dtypes = [None] + [
                None if t is None else ARG_DTYPES[c] for t, c in zip(self.arg_types, self.ctypes, strict=True)
            ]
            size_dtypes = [ARG_DTYPES[self.idx]]
            if self.rank:
                size_dtypes += [ARG_DTYPES[self.idx], *dim_arg_dtypes(self.rank, self.idx)]
            size_dtypes += [ARG_DTYPES[self.idx]] * (len(self.shape_args) - len(size_dtypes))  # the free strides
            scalar_dtypes += size_dtypes
            resolved = self.resolved = get_kernel(key, device, self.make_source, "netcl_ew", scalar_dtypes)
        return resolved


_RAW_PLANS: dict[tuple, Plan] = {}
_OP_PLANS: dict[tuple, tuple[Plan, tuple[np.dtype, ...]]] = {}
#: ``_launch_key`` -> (the OpDef, its OpenCL plan with the launch prepared, the argument setter): an ``apply``
#: of a signature that ran before allocates and calls, no device or dtype checks (they passed the first time)
_LAUNCHES: dict[tuple, tuple[OpDef, Plan, Callable[..., None]]] = {}
CLEAR_HOOKS.extend([_RAW_PLANS.clear, _OP_PLANS.clear, _LAUNCHES.clear])


def signature(operands: Sequence[Any]) -> tuple:
    """Per operand: (shape, dtype) of a Tensor, (shape, dtype, strides, offset) of a strided view, or the kind
    ('b', 'i', 'f') of a scalar."""
    return tuple([(v.shape, v.dtype) if type(v) is Tensor else _signature_of(v) for v in operands])


def _signature_of(v: Any) -> Any:
    """``signature``'s entry of an operand that is not a plain Tensor."""
    if type(v) is StridedView:
        return (v.shape, v.dtype, v.strides, v.offset)
    return (v.shape, v.dtype) if isinstance(v, Tensor) else scalar_dtype(v).kind


def run_elementwise(
    expr: str,
    operands: Sequence[Any],
    value_ctypes: Sequence[str],
    out_shape: tuple[int, ...],
    out_dtype: np.dtype,
    device: Device,
    out: Tensor | None = None,
) -> Tensor:
    """Evaluate ``expr`` ({i} = operand i as ``value_ctypes[i]``) into a new tensor (or ``out``).

    OpenCL only; the caller has checked devices and shapes.
    """
    key = (expr, signature(operands), tuple(value_ctypes), out_shape, out_dtype, device)
    plan = _RAW_PLANS.get(key)
    if plan is None:
        plan = Plan(expr, operands, value_ctypes, out_shape, out_dtype, vector_width=_vector_width(device))
        plan = remember(_RAW_PLANS, key, plan)
    return execute(plan, operands, device, out)


def execute(plan: Plan, operands: Sequence[Any], device: Device, out: Tensor | None = None) -> Tensor:
    """Launch ``plan`` over ``operands`` (OpenCL), into a new tensor or ``out``."""
    if out is None:
        out = results.tensor(device.allocator(device, plan.nbytes), plan.out_shape, plan.out_dtype, device)
    if plan.n == 0:
        return out
    prepared = plan.prepared
    if prepared is None:
        prepared = plan.prepared = _prepare(plan, device)
    arg_types = plan.arg_types
    if plan.reads_views:  # a view is read in place: its source's buffer
        prepared.call(
            out.data, *[_buffer(v) if t is None else _scalar(v, t) for v, t in zip(operands, arg_types, strict=True)]
        )
    elif arg_types == _ONE_BUFFER:  # the common signatures: every operand a Tensor
        prepared.call(out.data, operands[0].data)
    elif arg_types == _TWO_BUFFERS:
        prepared.call(out.data, operands[0].data, operands[1].data)
    else:
        prepared.call(
            out.data, *[v.data if t is None else _scalar(v, t) for v, t in zip(operands, arg_types, strict=True)]
        )
    return out


_ONE_BUFFER, _TWO_BUFFERS = (None,), (None, None)


def _prepare(plan: Plan, device: Device) -> PreparedLaunch:
    """``plan``'s launch on ``device`` with its size arguments bound: per call only the output and the operands
    are set (no size checks, no event)."""
    resolved = plan.kernel(device)
    local = resolved.max_local
    if plan.grid:
        gsize, lsize = launch_sizes(plan.grid, local)
    else:
        items = -(-plan.n // plan.vector)
        gsize, lsize = -(-items // local) * local, local
    first = 1 + len(plan.arg_types)  # out, the operands, then the size arguments
    bound = {first + k: value for k, value in enumerate(plan.shape_args)}
    return PreparedLaunch.binding(resolved.kernel, gsize, lsize, bound, device.queue)


def launch_sizes(dims: tuple[int, ...], max_local: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global, local) sizes of a strided kernel: x runs along the innermost collapsed axis, y along
    the next, z over the rest. Work-items adjacent in x touch adjacent elements, which a CPU
    driver vectorizes (a 1-D grid peeling ``gid`` with ``%`` is slower: see benchmarks/RESULTS.md,
    "Measurements moved out of source docstrings", pointwise.py)."""
    inner, outer = dims[-1], dims[-2]
    lx = min(max_local, pow2_ceil(inner))
    ly = min(max_local // lx, pow2_ceil(outer))
    gsize = (-(-inner // lx) * lx, -(-outer // ly) * ly)
    if len(dims) > 2:
        return (*gsize, math.prod(dims[:-2])), (lx, ly, 1)
    return gsize, (lx, ly)


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.ndarray) else value


def _scalar(value: Any, scalar_type: type) -> Any:
    """A scalar operand as its kernel argument of ``scalar_type``: a Python float for a float or double argument as
    it is (the prepared call packs it as ``scalar_type`` would hold it, without NumPy's overflow warning, as
    ``_FLOAT_SETTERS`` pass it on later calls), anything else converted."""
    if type(value) is float and scalar_type in _FLOAT_TYPES:
        return value
    return scalar_type(_plain(value))


_FLOAT_TYPES = (np.float32, np.float64)


#: The vector kernel's element index ``w * width`` (w up to the grid rounded to a work-group) stays well inside the
#: plan's index type below this many elements; larger ops keep the per-lane kernel.
_VECTOR_MAX_N = 1 << 30


def _vector_width(device: Device) -> int:
    """The ``floatN`` width of ``device``'s vector kernels: its ``vector_width`` on a CPU OpenCL device, else 1."""
    return device.vector_width if device.is_opencl and not device.is_gpu else 1


def _vectorizes(
    expr: str,
    classes: Sequence[str | None],
    dtypes: Sequence[np.dtype | None],
    ctypes: Sequence[str],
    out_dtype: np.dtype,
    preamble: str,
) -> bool:
    """Whether a plan's kernel evaluates ``expr`` on vectors: float32 in and out, every operand read at the output
    index or a single value, a math call in the expression (``_MATH_CALL``) and only helpers with a ``V_`` twin."""
    return (
        not preamble
        and out_dtype == float32
        and all(c == "float" for c in ctypes)
        and all(cls != STRIDED and (d is None or d == float32) for cls, d in zip(classes, dtypes, strict=True))
        and _MATH_CALL.search(expr) is not None
        and vectorize(_PLACEHOLDER.sub(lambda m: f"v{m.group(1)}", expr)) is not None
    )


#: A call of a helper the per-lane kernel evaluates by one scalar library call per element on a CPU (arithmetic,
#: comparisons and selects the CPU compiler vectorizes across work-items as they are).
_MATH_CALL = re.compile(rf"\b(?:{'|'.join(MATH_HELPERS)})\(")


def _vector_source(expr: str, classes: Sequence[str | None], ctypes: Sequence[str], width: int, idx: str) -> str:
    """The kernel of a plan that ``_vectorizes``: work-item ``w`` evaluates elements ``[w * width, w * width +
    width)`` as one ``VF`` (``vload`` / ``vstore``); the last, partial vector, element by element with the
    scalar helpers. Arguments as ``_source``'s for a rank-0 layout: ``out``, the operands, ``n``."""
    params = ["__global float* out"]
    vector_reads, scalar_reads = [], []
    for i, (cls, ctype) in enumerate(zip(classes, ctypes, strict=True)):
        if cls is None:
            params.append(f"const {ctype} s{i}")
            vector_reads.append(f"const VF v{i} = (VF)(s{i});")
            scalar_reads.append(f"const float v{i} = s{i};")
            continue
        params.append(f"__global const float* in{i}")
        if cls == FLAT:
            vector_reads.append(f"const VF v{i} = vload{width}(w, in{i});")
            scalar_reads.append(f"const float v{i} = in{i}[gid];")
        else:  # one element, read by every work-item
            vector_reads.append(f"const VF v{i} = (VF)(in{i}[0]);")
            scalar_reads.append(f"const float v{i} = in{i}[0];")
    params.append(f"const {idx} n")
    value = _PLACEHOLDER.sub(lambda m: f"v{m.group(1)}", expr)
    vector_lines = "\n        ".join(vector_reads)
    scalar_lines = "\n            ".join(scalar_reads)
    return f"""{vector_preamble(width)}__kernel void netcl_ew({", ".join(params)}) {{
    const {idx} w = ({idx})get_global_id(0);
    const {idx} first = w * {width};
    if (first >= n) return;
    if (n - first >= {width}) {{
        {vector_lines}
        vstore{width}(({vectorize(value)}), w, out);
    }} else {{
        for ({idx} gid = first; gid < n; ++gid) {{
            {scalar_lines}
            out[gid] = ({value});
        }}
    }}
}}
"""


def _source(
    expr: str,
    classes: Sequence[str | None],
    dtypes: Sequence[np.dtype | None],
    value_ctypes: Sequence[str],
    rank: int,
    patterns: Sequence[Sequence[int]],
    out_dtype: np.dtype,
    idx: str,
    offset_of: Sequence[bool] = (),
) -> str:
    """Kernel source of one layout class: per operand its read class (None: scalar) and dtype;
    per strided operand, per collapsed axis, 0 / 1 for a stride of 0 / 1 and 2 for an argument, and
    (``offset_of``, per strided operand; none by default) whether it starts at an offset argument.

    Arguments: ``out``, one per operand (buffer or scalar), ``n``, the collapsed dims ``d1 ..
    d{rank-1}`` (each with its fast-division magic and shift), the strides marked 2, then the offsets.
    """
    out_t = storage_ctype(out_dtype)
    params = [f"__global {out_t}* out"]
    body = (
        _grid_lines(rank, idx)
        if STRIDED in classes
        else [f"const {idx} gid = ({idx})get_global_id(0);", "if (gid >= n) return;"]
    )
    stride_params = []
    offset_params = []
    used = [out_dtype]
    pattern_of = iter(patterns)
    offsets = iter(offset_of)
    for i, (cls, dtype, ctype) in enumerate(zip(classes, dtypes, value_ctypes, strict=True)):
        if cls is None:
            params.append(f"const {ctype} s{i}")
            body.append(f"const {ctype} v{i} = s{i};")
            continue
        used.append(dtype)
        params.append(f"__global const {storage_ctype(dtype)}* in{i}")
        if cls == STRIDED:
            kinds = next(pattern_of)
            zero = [a for a, k in enumerate(kinds) if k == 0]
            unit = [a for a, k in enumerate(kinds) if k == 1]
            stride_params += [f"const {idx} st{i}_{a}" for a, k in enumerate(kinds) if k == 2]
            where = dot_expr(rank, f"st{i}_", unit=unit, zero=zero)
            if next(offsets, False):
                offset_params.append(f"const {idx} off{i}")
                where = f"off{i} + {where}"
        else:
            where = "gid" if cls == FLAT else "0"
        read = load_c(dtype, f"in{i}", where)
        body.append(f"const {ctype} v{i} = ({ctype}){read};")
    params += [
        f"const {idx} n",
        *([f"const {idx} d0", *dim_params(rank, idx)] if rank else []),
        *stride_params,
        *offset_params,
    ]
    used.extend(_CTYPE_TO_DTYPE.get(c, float32) for c in value_ctypes)
    extra = FASTDIV_SOURCE
    if "double" in value_ctypes:
        expr, extra = f64_expr(expr), extra + F64_SOURCE
    value = _PLACEHOLDER.sub(lambda m: f"v{m.group(1)}", expr)
    store = f"(({value}) != 0)" if out_dtype.kind == "b" else f"({value})"
    # float16 and bfloat16 rounded once, to nearest even, from the float (float16: or double) value
    write = store_c(out_dtype, "out", "gid", store, "double" if "double" in value_ctypes else "float") + ";"
    lines = "\n    ".join(body)
    # float16 and bfloat16 only loaded and stored (storage_io, computing in float): no cl_khr_fp16, so
    # elementwise ops run where they are storage-only
    head = f"{storage_pragmas(used)}{extra}__kernel void netcl_ew({', '.join(params)}) {{"
    return f"{head}\n    {lines}\n    {write}\n}}\n"


def _grid_lines(rank: int, idx: str) -> list[str]:
    """Coordinates ``c0 .. c{rank-1}`` and the flat output index ``gid`` of a ``launch_sizes`` grid."""
    inner, outer = rank - 1, rank - 2
    lines = [
        f"const {idx} c{inner} = ({idx})get_global_id(0);",
        f"const {idx} c{outer} = ({idx})get_global_id(1);",
        f"if (c{inner} >= d{inner} || c{outer} >= d{outer}) return;",
    ]
    if rank > 2:
        lines.append(f"{idx} rest_ = ({idx})get_global_id(2);")
        for axis in range(rank - 3, 0, -1):
            lines.append(f"const {idx} q{axis}_ = {div_expr('rest_', f'd{axis}', idx)};")
            lines.append(f"const {idx} c{axis} = rest_ - q{axis}_ * d{axis}; rest_ = q{axis}_;")
        lines.append(f"const {idx} c0 = rest_;")
    flat = "c0"
    for axis in range(1, rank):
        flat = f"({flat}) * d{axis} + c{axis}"
    return [*lines, f"const {idx} gid = {flat};"]


# ---- dtype rules ------------------------------------------------------------------------------
def result_dtypes(op: OpDef, operands: Sequence[Any]) -> tuple[np.dtype, np.dtype]:
    """(compute dtype, result dtype) of ``op`` over ``operands`` (see ``_table``'s kinds)."""
    promoted = promote(operands)
    if op.kind == "float":
        result = float_dtype(promoted)
        return result, result
    if op.kind == "compare":
        return promoted, float32
    result = float32 if promoted.kind == "b" else promoted
    return result, result


def value_dtypes(op: OpDef, operands: Sequence[Any]) -> tuple[list[np.dtype], np.dtype, np.dtype]:
    """(dtype each operand is read as, compute dtype, result dtype); ``where`` reads cond as itself."""
    if op.kind == "where":
        compute, result = result_dtypes(OpDef("", "", op.numpy_fn, "arith"), operands[1:])
        cond = operands[0]
        cond_dtype = cond.dtype if isinstance(cond, Tensor) else promote((cond,))
        return [cond_dtype] + [compute] * (len(operands) - 1), compute, result
    compute, result = result_dtypes(op, operands)
    return [compute] * len(operands), compute, result


def _expr_for(op: OpDef, compute: np.dtype) -> str:
    return op.int_expr if compute.kind in "iub" and op.int_expr is not None else op.expr


def apply(op: OpDef, operands: Sequence[Any]) -> Tensor:
    """Run ``op`` over ``operands`` (broadcast) on their device; a new tensor."""
    # a launch of this op over operands of these kinds, shapes, dtypes and device made before (``_LAUNCHES``): the
    # common kinds keyed and launched inline, without ``_launch_key``'s frame and tests
    fast: tuple | None = None
    count = len(operands)
    if count == 2:
        a, b = operands
        kind_a, kind_b = type(a), type(b)
        if kind_a is Tensor and kind_b is Tensor:  # the common call
            fast = (id(op), a.shape, a.dtype, a.device, b.shape, b.dtype, b.device)
            hit = _LAUNCHES.get(fast)
            if hit is not None and hit[0] is op:
                plan = hit[1]
                device = a.device
                out = results.tensor(device.allocator(device, plan.nbytes), plan.out_shape, plan.out_dtype, device)
                plan.prepared.call(out.data, a.data, b.data)
                return out
        elif kind_a is Tensor and kind_b in _PLAIN_SCALARS:  # ``x * 2.0``
            fast = (id(op), a.shape, a.dtype, a.device, kind_b)
            hit = _LAUNCHES.get(fast)
            if hit is not None and hit[0] is op:
                plan = hit[1]
                device = a.device
                out = results.tensor(device.allocator(device, plan.nbytes), plan.out_shape, plan.out_dtype, device)
                hit[2](plan.prepared.call, out.data, a, b)
                return out
        elif kind_a is StridedView or kind_b is StridedView:
            fast = _view_launch_key(op, a, b)  # a view read in place: its strides and offset in the key
        else:
            fast = _launch_key(op, operands)
    elif count == 1 and type(operands[0]) is Tensor:
        (a,) = operands
        fast = (id(op), a.shape, a.dtype, a.device)
        hit = _LAUNCHES.get(fast)
        if hit is not None and hit[0] is op:
            plan = hit[1]
            device = a.device
            out = results.tensor(device.allocator(device, plan.nbytes), plan.out_shape, plan.out_dtype, device)
            plan.prepared.call(out.data, a.data)
            return out
    else:
        fast = _launch_key(op, operands)
    if fast is not None:  # the other keyed kinds (views, a number on the left, a strided view alone)
        hit = _LAUNCHES.get(fast)
        if hit is not None and hit[0] is op:
            plan = hit[1]
            device = operands[0].device if isinstance(operands[0], Tensor) else operands[1].device
            out = results.tensor(device.allocator(device, plan.nbytes), plan.out_shape, plan.out_dtype, device)
            hit[2](plan.prepared.call, out.data, *operands)
            return out
    device = device_of(operands, op.name)
    if StridedView in map(type, operands):  # read in place through its strides, but a single element: gathered
        operands = [v.contiguous() if type(v) is StridedView and v.size <= 1 else v for v in operands]
    key = (op.expr, op.int_expr, op.kind, op.preamble, signature(operands), device)
    cached = _OP_PLANS.get(key)
    if cached is None:
        dtypes, compute, result = value_dtypes(op, operands)
        out_shape = broadcast_shapes(*[v.shape for v in operands if isinstance(v, Tensor)])
        device.check_dtype(result)
        ctypes = [compute_ctype(d) for d in dtypes]
        plan = Plan(_expr_for(op, compute), operands, ctypes, out_shape, result, op.preamble, _vector_width(device))
        cached = remember(_OP_PLANS, key, (plan, tuple(dtypes)))
    plan, dtypes = cached
    out = apply_plan(op, plan, dtypes, operands, device)
    if fast is not None and plan.prepared is not None and device.is_opencl:
        setter = _view_setter(operands) if plan.reads_views else _setter(plan.arg_types, operands)
        if setter is not None:
            remember(_LAUNCHES, fast, (op, plan, setter))
    return out


_PLAIN_SCALARS = frozenset({float, int, bool})


def _launch_key(op: OpDef, operands: Sequence[Any]) -> tuple | None:
    """The key of ``_LAUNCHES`` for one Tensor (or strided view of more than one element), two Tensors, or a
    Tensor and a Python number (either order); None for other operands (two operands with a view:
    ``_view_launch_key``). Devices are part of it: operands of two devices never share a key with a launch that ran
    (``device_of`` raised for them)."""
    if len(operands) == 1:
        (a,) = operands
        if type(a) is StridedView and a.size > 1:
            return (id(op), a.shape, a.dtype, a.device, a.strides, a.offset)
        return (id(op), a.shape, a.dtype, a.device) if type(a) is Tensor else None
    if len(operands) != 2:
        return None
    a, b = operands
    if type(a) is Tensor:
        if type(b) is Tensor:
            return (id(op), a.shape, a.dtype, a.device, b.shape, b.dtype, b.device)
        if type(b) in _PLAIN_SCALARS:
            return (id(op), a.shape, a.dtype, a.device, type(b))
    elif type(b) is Tensor and type(a) in _PLAIN_SCALARS:
        return (id(op), type(a), b.shape, b.dtype, b.device)
    return None


def _view_launch_key(op: OpDef, a: Any, b: Any) -> tuple | None:
    """``_launch_key`` of two operands at least one of which is a strided view: each view's strides and offset are
    part of it, and which operands are views (a key of one layout never hits a launch of another); None for a view
    of one element (which ``apply`` gathers) or an operand that is neither a Tensor nor a view."""
    kind_a, kind_b = type(a), type(b)
    if kind_a is StridedView:
        if a.size <= 1:
            return None
        if kind_b is Tensor:
            return (id(op), 1, a.shape, a.dtype, a.device, a.strides, a.offset, b.shape, b.dtype, b.device)
        if kind_b is StridedView and b.size > 1:
            return (id(op), 3, a.shape, a.dtype, a.device, a.strides, a.offset, *_view_fields(b))
        return None
    if kind_a is Tensor and kind_b is StridedView and b.size > 1:
        return (id(op), 2, a.shape, a.dtype, a.device, b.shape, b.dtype, b.device, b.strides, b.offset)
    return None


def _view_fields(v: StridedView) -> tuple:
    return (v.shape, v.dtype, v.device, v.strides, v.offset)


def _view_setter(operands: Sequence[Any]) -> Callable[..., None] | None:
    """The setter of a plan that reads views in place: each view's source buffer, each Tensor's own (None for
    operand kinds ``_launch_key`` and ``_view_launch_key`` never key)."""
    kinds = tuple(type(v) is StridedView for v in operands)
    return _VIEW_SETTERS.get(kinds)


def _buffer(v: Tensor) -> Any:
    """The buffer a kernel reads for ``v``: a view's source's (read through its strides), a Tensor's own."""
    return v.source.data if type(v) is StridedView else v.data


#: the setters of plans that read views in place, by which operands are views (the view's source buffer)
_VIEW_SETTERS: dict[tuple[bool, ...], Callable[..., None]] = {
    (True,): lambda call, out, a: call(out, a.source.data),
    (True, False): lambda call, out, a, b: call(out, a.source.data, b.data),
    (False, True): lambda call, out, a, b: call(out, a.data, b.source.data),
    (True, True): lambda call, out, a, b: call(out, a.source.data, b.source.data),
}


def _scalar_right(convert: Callable[[Any], Any]) -> Callable[..., None]:
    def set_args(call: Callable[..., None], out: Any, a: Tensor, b: Any) -> None:
        call(out, a.data, convert(b))

    return set_args


def _scalar_left(convert: Callable[[Any], Any]) -> Callable[..., None]:
    def set_args(call: Callable[..., None], out: Any, a: Any, b: Tensor) -> None:
        call(out, convert(a), b.data)

    return set_args


_SCALAR_TYPES = {d.type for d in ARG_DTYPES.values()}
#: what ``execute`` passes to the prepared call, per ``Plan.arg_types`` of the ``_launch_key`` operand kinds
#: (the one- and two-Tensor calls are inlined in ``apply``)
_SETTERS: dict[tuple, Callable[..., None]] = {
    (None,): lambda call, out, a: call(out, a.data),
    (None, None): lambda call, out, a, b: call(out, a.data, b.data),
    **{(None, t): _scalar_right(t) for t in _SCALAR_TYPES},
    **{(t, None): _scalar_left(t) for t in _SCALAR_TYPES},
}
#: the setters of a Python float for a float or double argument: passed as it is, since the prepared call packs a
#: float as ``(float)`` / ``(double)`` of its value, which is what ``np.float32(x)`` / ``np.float64(x)`` hold
_FLOAT_SETTERS: dict[tuple, Callable[..., None]] = {
    **{(None, t): lambda call, out, a, b: call(out, a.data, b) for t in _FLOAT_TYPES},
    **{(t, None): lambda call, out, a, b: call(out, a, b.data) for t in _FLOAT_TYPES},
}


def _setter(arg_types: tuple, operands: Sequence[Any]) -> Callable[..., None] | None:
    """The setter of a plan with ``arg_types`` for ``_launch_key``'s operand kinds (whose key holds a number's
    Python type, so a float's launch never serves an int's)."""
    if arg_types in _FLOAT_SETTERS and float in map(type, operands):
        return _FLOAT_SETTERS[arg_types]
    return _SETTERS.get(arg_types)


@backend_op(_TWINS, device_arg="device")
def apply_plan(op: OpDef, plan: Plan, dtypes: tuple[np.dtype, ...], operands: Sequence[Any], device: Device) -> Tensor:
    """``apply``'s computation of ``op`` over checked ``operands`` (``dtypes``: each operand's value dtype)."""
    return execute(plan, operands, device)


def _unary(name: str, x: Tensor) -> Tensor:
    return apply(UNARY[name], (x,))


def _binary(name: str, a: Any, b: Any) -> Tensor:
    return apply(BINARY[name], (a, b))


# ---- unary ------------------------------------------------------------------------------------
def neg(x: Tensor) -> Tensor:
    """-x."""
    return _unary("neg", x)


def exp(x: Tensor) -> Tensor:
    """e**x."""
    return _unary("exp", x)


def log(x: Tensor) -> Tensor:
    """Natural logarithm."""
    return _unary("log", x)


def log1p(x: Tensor) -> Tensor:
    """log(1 + x), accurate for small x."""
    return _unary("log1p", x)


def sqrt(x: Tensor) -> Tensor:
    """Square root."""
    return _unary("sqrt", x)


def rsqrt(x: Tensor) -> Tensor:
    """1 / sqrt(x)."""
    return _unary("rsqrt", x)


def abs(x: Tensor) -> Tensor:
    """|x|."""
    return _unary("abs", x)


def sign(x: Tensor) -> Tensor:
    """-1, 0 or 1 (NaN stays NaN)."""
    return _unary("sign", x)


def relu(x: Tensor) -> Tensor:
    """max(x, 0) (NaN stays NaN)."""
    return _unary("relu", x)


def relu_grad(x: Tensor) -> Tensor:
    """1.0 where x > 0 else 0.0."""
    return _unary("relu_grad", x)


def relu_backward(g: Tensor, x: Tensor) -> Tensor:
    """g * relu_grad(x) in one kernel: relu's gradient for upstream ``g``."""
    return derivative("relu", 0, {"g": g, "a": x})


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh approximation."""
    return _unary("gelu", x)


def gelu_grad(x: Tensor) -> Tensor:
    """d gelu(x) / dx for the tanh approximation."""
    return _unary("gelu_grad", x)


def gelu_backward(g: Tensor, x: Tensor) -> Tensor:
    """g * gelu_grad(x) in one kernel: gelu's gradient for upstream ``g``."""
    return derivative("gelu", 0, {"g": g, "a": x})


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + e**-x), without overflow for large |x|."""
    return _unary("sigmoid", x)


def sigmoid_backward(g: Tensor, y: Tensor) -> Tensor:
    """g * y * (1 - y) in one kernel: sigmoid's gradient for upstream ``g`` from its output ``y``."""
    return derivative("sigmoid", 0, {"g": g, "out": y})


def tanh(x: Tensor) -> Tensor:
    """Hyperbolic tangent."""
    return _unary("tanh", x)


def tanh_backward(g: Tensor, y: Tensor) -> Tensor:
    """g * (1 - y * y) in one kernel: tanh's gradient for upstream ``g`` from its output ``y``."""
    return derivative("tanh", 0, {"g": g, "out": y})


# ---- binary -----------------------------------------------------------------------------------
def add(a: Any, b: Any) -> Tensor:
    """a + b (NumPy broadcasting; either side may be a scalar)."""
    return _binary("add", a, b)


def sub(a: Any, b: Any) -> Tensor:
    """a - b."""
    return _binary("sub", a, b)


def squared_difference(a: Any, b: Any) -> Tensor:
    """(a - b) ** 2 in one kernel (broadcasting)."""
    return _binary("squared_difference", a, b)


def scaled_difference(a: Any, b: Any, c: Any) -> Tensor:
    """(a - b) * c in one kernel (broadcasting)."""
    return apply(TERNARY["scaled_difference"], (a, b, c))


def mul(a: Any, b: Any) -> Tensor:
    """a * b."""
    return _binary("mul", a, b)


def div(a: Any, b: Any) -> Tensor:
    """a / b (true division; integer operands give float32)."""
    return _binary("div", a, b)


def pow(a: Any, b: Any) -> Tensor:
    """a ** b."""
    return _binary("pow", a, b)


def maximum(a: Any, b: Any) -> Tensor:
    """Elementwise max; NaN on either side gives NaN (as NumPy)."""
    return _binary("maximum", a, b)


def minimum(a: Any, b: Any) -> Tensor:
    """Elementwise min; NaN on either side gives NaN (as NumPy)."""
    return _binary("minimum", a, b)


def lt(a: Any, b: Any) -> Tensor:
    """1.0 where a < b else 0.0 (float32)."""
    return _binary("lt", a, b)


def le(a: Any, b: Any) -> Tensor:
    """1.0 where a <= b else 0.0 (float32)."""
    return _binary("le", a, b)


def gt(a: Any, b: Any) -> Tensor:
    """1.0 where a > b else 0.0 (float32)."""
    return _binary("gt", a, b)


def ge(a: Any, b: Any) -> Tensor:
    """1.0 where a >= b else 0.0 (float32)."""
    return _binary("ge", a, b)


def eq(a: Any, b: Any) -> Tensor:
    """1.0 where a == b else 0.0 (float32)."""
    return _binary("eq", a, b)


def sin(x: Tensor) -> Tensor:
    """Sine."""
    return _unary("sin", x)


def cos(x: Tensor) -> Tensor:
    """Cosine."""
    return _unary("cos", x)


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return _unary("silu", x)


def silu_grad(x: Tensor) -> Tensor:
    """d silu / dx = s (1 + x (1 - s)), s = sigmoid(x)."""
    return _unary("silu_grad", x)


def silu_backward(g: Tensor, x: Tensor) -> Tensor:
    """g * silu_grad(x) in one kernel: silu's gradient for upstream ``g``."""
    return derivative("silu", 0, {"g": g, "a": x})


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0, else negative_slope * x."""
    return _binary("leaky_relu", x, float(negative_slope))


def leaky_relu_grad(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """1 where x > 0, else negative_slope."""
    return _binary("leaky_relu_grad", x, float(negative_slope))


def leaky_relu_backward(g: Tensor, x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """g * leaky_relu_grad(x, negative_slope) in one kernel."""
    return derivative("leaky_relu", 0, {"g": g, "a": x, "negative_slope": float(negative_slope)})


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """x where x > 0, else alpha * (exp(x) - 1)."""
    return _binary("elu", x, float(alpha))


def elu_grad(x: Tensor, alpha: float = 1.0) -> Tensor:
    """1 where x > 0, else alpha * exp(x)."""
    return _binary("elu_grad", x, float(alpha))


def elu_backward(g: Tensor, x: Tensor, alpha: float = 1.0) -> Tensor:
    """g * elu_grad(x, alpha) in one kernel."""
    return derivative("elu", 0, {"g": g, "a": x, "alpha": float(alpha)})


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta x)) / beta, and x where beta x > threshold (PyTorch's softplus)."""
    return apply(TERNARY["softplus"], (x, float(beta), float(threshold)))


def softplus_grad(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """sigmoid(beta x), and 1 where beta x > threshold."""
    return apply(TERNARY["softplus_grad"], (x, float(beta), float(threshold)))


def ne(a: Any, b: Any) -> Tensor:
    """1.0 where a != b else 0.0 (float32)."""
    return _binary("ne", a, b)


# ---- ternary and generic ----------------------------------------------------------------------
def where(cond: Any, a: Any, b: Any) -> Tensor:
    """a where cond != 0, else b (all three broadcast)."""
    return apply(WHERE, (cond, a, b))


def clamp(x: Any, lo: Any, hi: Any) -> Tensor:
    """min(max(x, lo), hi); lo and hi are scalars or tensors. NaN in x stays NaN."""
    return apply(CLAMP, (x, lo, hi))


def derivative(name: str, index: int, named: dict[str, Any]) -> Tensor:
    """Op ``name``'s derivative for input ``index`` (``elementwise_defs``; the upstream gradient
    included) as one kernel over ``named``: input letters, ``g``, ``out`` and attribute names -> values.
    Not reduced to the input's shape."""
    op, params = derivative_opdef(name, index)
    if op.expr == "{0}" and params == ("g",):  # the gradient passes through: no kernel
        return named["g"]
    return apply(op, [named[p] for p in params])


def elementwise(c_expr: str, numpy_fn: Callable[..., Any], *operands: Any, preamble: str = "") -> Tensor:
    """A custom elementwise op: ``c_expr`` uses ``{0}``, ``{1}``, ... for the operands' values.

    The expression may call ``PRIMITIVE_PREAMBLE`` helpers (``"BCE_LOGITS({0}, {1})"``) and the
    C helpers that ``preamble`` defines (placed before the kernel).
    Operands are read as float (double for float64 results); the result is float32 unless every
    tensor operand is float64. ``numpy_fn`` computes the same on NumPy arrays for the cpu device.
    """
    if not operands:
        raise TypeError("elementwise: needs at least one operand")
    op = OpDef(f"elementwise({c_expr!r})", c_expr, numpy_fn, "float", preamble=preamble)
    return apply(op, operands)


# ---- in place -----------------------------------------------------------------------------------
def add_(dst: Tensor, src: Any) -> Tensor:
    """dst += src in place (src broadcast to dst's shape); returns dst."""
    device = device_of((dst, src), "add_")
    if not isinstance(dst, Tensor):
        raise TypeError(f"add_: destination must be a Tensor, got {type(dst).__name__}")
    src_shape = src.shape if isinstance(src, Tensor) else ()
    if broadcast_shapes(dst.shape, src_shape) != dst.shape:
        raise ShapeError(f"add_: source shape {src_shape} does not broadcast to destination shape {dst.shape}")
    compute, _ = result_dtypes(BINARY["add"], (dst, src))
    written(dst)
    return add_into(dst, src, compute, device)


@backend_op(_TWINS, device_arg="device")
def add_into(dst: Tensor, src: Any, compute: np.dtype, device: Device) -> Tensor:
    """``add_`` of a checked call: dst += src computed in ``compute``."""
    ctype = compute_ctype(compute)
    expr = _expr_for(BINARY["add"], compute)
    return run_elementwise(expr, (dst, src), [ctype, ctype], dst.shape, dst.dtype, device, out=dst)


def fill_(dst: Tensor, value: Any) -> Tensor:
    """Set every element of dst to ``value``; returns dst."""
    device = device_of((dst, value), "fill_")
    written(dst)
    return fill_into(dst, value, device)


@backend_op(_TWINS, device_arg="device")
def fill_into(dst: Tensor, value: Any, device: Device) -> Tensor:
    """``fill_`` on ``device`` (dst's and a Tensor value's)."""
    if storage_only(device, dst.dtype) and not isinstance(value, Tensor):
        if dst.nbytes:  # a fill command with the value's bits in dst's dtype
            enqueue_fill(device.queue, dst, value, dst.dtype)
        return dst
    return run_elementwise("{0}", (value,), [compute_ctype(dst.dtype)], dst.shape, dst.dtype, device, out=dst)
