"""Broadcasting elementwise ops: one generated kernel per (expression, shapes, dtypes).

Each kernel reads every tensor operand at its broadcast index (``broadcast_index_lines``),
receives scalar operands as kernel arguments (a new scalar value never rebuilds anything),
evaluates one C expression over ``PRIMITIVE_PREAMBLE`` helpers and stores the result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor, broadcast_index_lines, broadcast_shapes
from netcl.core.dtypes import float32
from netcl.core.errors import ShapeError
from netcl.runtime.launch import launch
from netcl.runtime.ops import numpy_backend
from netcl.runtime.ops._common import (
    ARG_DTYPES,
    compute_ctype,
    device_of,
    float_dtype,
    get_kernel,
    index_type,
    pragmas,
    promote,
    round_up,
    storage_ctype,
)
from netcl.runtime.ops._table import BINARY, CLAMP, CLAMP_SOURCE, UNARY, WHERE, OpDef

_PLACEHOLDER = re.compile(r"\{(\d+)\}")
_CTYPE_TO_DTYPE = {"float": float32, "double": np.dtype(np.float64), "int": np.dtype(np.int32)}


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
    if out is None:
        out = Tensor.empty(out_shape, out_dtype, device)
    n = math.prod(out_shape)
    if n == 0:
        return out
    signature = tuple((v.shape, v.dtype.str) if isinstance(v, Tensor) else None for v in operands)
    key = ("ew", expr, signature, tuple(value_ctypes), out_shape, out_dtype.str)
    scalar_dtypes = [None] + [
        None if s is not None else ARG_DTYPES[c] for s, c in zip(signature, value_ctypes, strict=True)
    ]
    resolved = get_kernel(
        key,
        device,
        lambda: _source(expr, operands, value_ctypes, out_shape, out_dtype),
        "netcl_ew",
        scalar_dtypes,
    )
    local = resolved.max_local
    args = [
        v.data if isinstance(v, Tensor) else ARG_DTYPES[c].type(_plain(v))
        for v, c in zip(operands, value_ctypes, strict=True)
    ]
    launch(resolved.kernel, round_up(n, local), local, out.data, *args, queue=device.queue)
    return out


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, (np.ndarray, np.generic)) else value


def _source(
    expr: str, operands: Sequence[Any], value_ctypes: Sequence[str], out_shape: tuple[int, ...], out_dtype: np.dtype
) -> str:
    shapes = [v.shape for v in operands if isinstance(v, Tensor)]
    idx = index_type(out_shape, *shapes)
    out_t = storage_ctype(out_dtype)
    params = [f"__global {out_t}* out"]
    body = []
    dtypes = [out_dtype]
    for i, (value, ctype) in enumerate(zip(operands, value_ctypes, strict=True)):
        if isinstance(value, Tensor):
            dtypes.append(value.dtype)
            params.append(f"__global const {storage_ctype(value.dtype)}* in{i}")
            body.extend(broadcast_index_lines(value.shape, out_shape, "gid", f"i{i}", idx))
            body.append(f"const {ctype} v{i} = ({ctype})in{i}[i{i}];")
        else:
            params.append(f"const {ctype} s{i}")
            body.append(f"const {ctype} v{i} = s{i};")
    dtypes.extend(_CTYPE_TO_DTYPE.get(c, float32) for c in value_ctypes)
    value = _PLACEHOLDER.sub(lambda m: f"v{m.group(1)}", expr)
    store = f"(({value}) != 0)" if out_dtype.kind == "b" else f"({value})"
    lines = "\n    ".join(body)
    return (
        f"{pragmas(dtypes)}{CLAMP_SOURCE}"
        f"__kernel void netcl_ew({', '.join(params)}) {{\n"
        f"    const {idx} gid = ({idx})get_global_id(0);\n"
        f"    if (gid >= {math.prod(out_shape)}) return;\n"
        f"    {lines}\n"
        f"    out[gid] = ({out_t}){store};\n"
        "}\n"
    )


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


def _expr_for(op: OpDef, compute: np.dtype) -> str:
    return op.int_expr if compute.kind in "iub" and op.int_expr is not None else op.expr


def apply(op: OpDef, operands: Sequence[Any], value_dtypes: Sequence[np.dtype] | None = None) -> Tensor:
    """Run ``op`` over ``operands`` (broadcast) on their device; a new tensor."""
    device = device_of(operands, op.name)
    compute, result = result_dtypes(op, operands)
    dtypes = list(value_dtypes) if value_dtypes is not None else [compute] * len(operands)
    out_shape = broadcast_shapes(*[v.shape for v in operands if isinstance(v, Tensor)])
    device.check_dtype(result)
    if device.kind == "cpu":
        return numpy_backend.elementwise(op.numpy_fn, operands, dtypes, out_shape, result, device)
    ctypes = [compute_ctype(d) for d in dtypes]
    return run_elementwise(_expr_for(op, compute), operands, ctypes, out_shape, result, device)


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


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh approximation."""
    return _unary("gelu", x)


def gelu_grad(x: Tensor) -> Tensor:
    """d gelu(x) / dx for the tanh approximation."""
    return _unary("gelu_grad", x)


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + e**-x), without overflow for large |x|."""
    return _unary("sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    """Hyperbolic tangent."""
    return _unary("tanh", x)


# ---- binary -----------------------------------------------------------------------------------
def add(a: Any, b: Any) -> Tensor:
    """a + b (NumPy broadcasting; either side may be a scalar)."""
    return _binary("add", a, b)


def sub(a: Any, b: Any) -> Tensor:
    """a - b."""
    return _binary("sub", a, b)


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


# ---- ternary and generic ----------------------------------------------------------------------
def where(cond: Any, a: Any, b: Any) -> Tensor:
    """a where cond != 0, else b (all three broadcast)."""
    compute, _ = result_dtypes(WHERE, (a, b))
    cond_dtype = cond.dtype if isinstance(cond, Tensor) else promote((cond,))
    return apply_with_result(WHERE, (cond, a, b), [cond_dtype, compute, compute], compute)


def clamp(x: Any, lo: Any, hi: Any) -> Tensor:
    """min(max(x, lo), hi); lo and hi are scalars or tensors. NaN in x stays NaN."""
    return apply(CLAMP, (x, lo, hi))


def apply_with_result(op: OpDef, operands: Sequence[Any], value_dtypes: Sequence[np.dtype], result: np.dtype) -> Tensor:
    """Like ``apply`` with explicit per-operand value dtypes and result dtype."""
    device = device_of(operands, op.name)
    out_shape = broadcast_shapes(*[v.shape for v in operands if isinstance(v, Tensor)])
    device.check_dtype(result)
    if device.kind == "cpu":
        return numpy_backend.elementwise(op.numpy_fn, operands, value_dtypes, out_shape, result, device)
    ctypes = [compute_ctype(d) for d in value_dtypes]
    return run_elementwise(_expr_for(op, result), operands, ctypes, out_shape, result, device)


def elementwise(c_expr: str, numpy_fn: Callable[..., Any], *operands: Any) -> Tensor:
    """A custom elementwise op: ``c_expr`` uses ``{0}``, ``{1}``, ... for the operands' values.

    The expression may call ``PRIMITIVE_PREAMBLE`` helpers (``"BCE_LOGITS({0}, {1})"``).
    Operands are read as float (double for float64 results); the result is float32 unless every
    tensor operand is float64. ``numpy_fn`` computes the same on NumPy arrays for the cpu device.
    """
    if not operands:
        raise TypeError("elementwise: needs at least one operand")
    op = OpDef(f"elementwise({c_expr!r})", c_expr, numpy_fn, "float")
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
    if device.kind == "cpu":
        with np.errstate(all="ignore"):
            total = numpy_backend.value(dst, compute) + numpy_backend.value(src, compute)
        return numpy_backend.assign(dst, total)
    ctype = compute_ctype(compute)
    expr = _expr_for(BINARY["add"], compute)
    return run_elementwise(expr, (dst, src), [ctype, ctype], dst.shape, dst.dtype, device, out=dst)


def fill_(dst: Tensor, value: Any) -> Tensor:
    """Set every element of dst to ``value``; returns dst."""
    device = device_of((dst, value), "fill_")
    if device.kind == "cpu":
        return numpy_backend.assign(dst, numpy_backend.value(value, dst.dtype))
    return run_elementwise("{0}", (value,), [compute_ctype(dst.dtype)], dst.shape, dst.dtype, device, out=dst)
