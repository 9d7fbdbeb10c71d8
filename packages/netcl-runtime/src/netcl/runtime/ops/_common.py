"""Shared plumbing of the eager ops: operands, devices, dtype promotion, kernel lookup."""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor, get_device, same_device
from netcl.core.dtypes import (
    C_TYPES,
    REQUIRED_EXTENSION,
    STORAGE_ONLY,
    as_dtype,
    bfloat16,
    float16,
    float32,
    float64,
    is_floating,
)
from netcl.core.errors import DTypeError
from netcl.core.kernels.primitives import PRIMITIVE_PREAMBLE
from netcl.runtime.cache import program_cache, register_cache
from netcl.runtime.ops.storage_io import helpers_c

Scalar = int | float | bool | np.generic
Operand = Tensor | Scalar

#: Largest work-group the eager kernels ask for.
MAX_LOCAL = 256

#: OpenCL C type -> numpy dtype of a scalar kernel argument of that type.
ARG_DTYPES: dict[str, np.dtype] = {
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "int": np.dtype(np.int32),
    "long": np.dtype(np.int64),
    "uchar": np.dtype(np.uint8),
    "uint": np.dtype(np.uint32),
}


_PLAIN_NUMBERS = frozenset({int, float, bool})


def is_scalar(value: Any) -> bool:
    """True for Python numbers, NumPy scalars and 0-d NumPy arrays (passed as kernel arguments)."""
    if type(value) in _PLAIN_NUMBERS:  # the common operands, without the abstract-class check
        return True
    if isinstance(value, (numbers.Number, np.generic)):
        return not isinstance(value, complex)
    return isinstance(value, np.ndarray) and value.ndim == 0


def check_operand(value: Any, op: str) -> None:
    if not isinstance(value, Tensor) and not is_scalar(value):
        raise TypeError(
            f"{op}: operand of type {type(value).__name__} is neither a netcl Tensor nor a real scalar; "
            "wrap arrays with netcl.core.tensor(...)"
        )


def device_of(operands: Sequence[Any], op: str, device: Device | str | None = None) -> Device:
    """The one device the Tensor operands share (DeviceError naming both when they differ)."""
    found = get_device(device) if device is not None else None
    for value in operands:
        if isinstance(value, Tensor):
            if found is None:
                found = value.device
            elif value.device is not found:
                same_device(found, value.device)  # raises, naming both
        else:
            check_operand(value, op)
    return found if found is not None else get_device()


_BOOL, _INT64, _FLOAT64 = np.dtype(np.bool_), np.dtype(np.int64), np.dtype(np.float64)
_SCALAR_DTYPES = {float: _FLOAT64, int: _INT64, bool: _BOOL}


def scalar_dtype(value: Any) -> np.dtype:
    """The dtype a scalar operand "wants": bool, int64 or float64 (weak, see ``promote``)."""
    known = _SCALAR_DTYPES.get(type(value))
    if known is not None:
        return known
    value = value.item() if isinstance(value, (np.generic, np.ndarray)) else value
    if isinstance(value, bool):
        return np.dtype(np.bool_)
    if isinstance(value, numbers.Integral):
        return np.dtype(np.int64)
    return np.dtype(np.float64)


def promote(operands: Sequence[Any]) -> np.dtype:
    """Result dtype of combining ``operands``: NumPy promotion of the tensors; scalars are weak.

    Float tensors win over integer ones (int32 + float32 -> float32, not NumPy's float64); a
    float scalar makes an integer/bool result float32; an int scalar never widens a tensor's
    dtype; with no tensors at all the result is float32 (int32 for ints only, bool for bools).
    """
    tensor_dtypes = [v.dtype for v in operands if isinstance(v, Tensor)]
    scalar_kinds = {scalar_dtype(v).kind for v in operands if not isinstance(v, Tensor)}
    if tensor_dtypes:
        floats = [d for d in tensor_dtypes if is_floating(d)]
        result = _result_type(floats or tensor_dtypes)
        if result == bfloat16:  # (NumPy's kind "V")
            return result
        if "f" in scalar_kinds and result.kind != "f":
            return float32
        if "i" in scalar_kinds and result.kind == "b":
            return np.dtype(np.int32)
        return as_dtype(result)
    if "f" in scalar_kinds:
        return float32
    if "i" in scalar_kinds:
        return np.dtype(np.int32)
    return np.dtype(np.bool_)


def _result_type(dtypes: Sequence[np.dtype]) -> np.dtype:
    """``np.result_type`` of tensor dtypes, with torch's rules for bfloat16 (which NumPy promotes
    with float32 and float64 only): bfloat16 with float16 is float32, with integers bfloat16."""
    if bfloat16 in dtypes and any(d != bfloat16 for d in dtypes):
        floats = [d for d in dtypes if is_floating(d) and d != bfloat16]
        if not floats:
            return bfloat16
        return float32 if all(d in (float16, float32) for d in floats) else float64
    return np.result_type(*dtypes)


def float_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` when it is a float type, else float32."""
    return dtype if is_floating(dtype) else float32


def compute_ctype(dtype: np.dtype) -> str:
    """The C type values are computed in: ``float`` for half and bfloat16 (the preamble helpers are float)."""
    if dtype in (float16, bfloat16):
        return "float"
    if dtype == np.dtype(np.bool_):
        return "uchar"
    return C_TYPES[as_dtype(dtype)]


def storage_ctype(dtype: np.dtype) -> str:
    return C_TYPES[as_dtype(dtype)]


def check_device_dtype(device: Device, dtype: np.dtype) -> np.dtype:
    return device.check_dtype(dtype)


def pragmas(dtypes: Sequence[np.dtype]) -> str:
    """Extension pragmas for the dtypes a kernel touches."""
    lines = []
    if any(d == float64 for d in dtypes):
        lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if any(d == float16 for d in dtypes):
        lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    if any(d == bfloat16 for d in dtypes):  # refused before the build (no device computes in bfloat16)
        lines.append(f"#pragma OPENCL EXTENSION {REQUIRED_EXTENSION[bfloat16]} : enable")
    return "\n".join(lines) + "\n" if lines else ""


def storage_only(device: Device, dtype: np.dtype) -> bool:
    """Whether ``device`` holds ``dtype`` without computing in it (float16 without ``cl_khr_fp16``):
    such tensors take only kernels that move, fill, convert or multiply them (``STORAGE_ONLY``)."""
    return dtype in STORAGE_ONLY and not device.computes(dtype)


def storage_pragmas(dtypes: Sequence[np.dtype]) -> str:
    """``pragmas`` of a kernel that only loads and stores float16 and bfloat16 (``vload_half`` /
    ``vstore_half``, core OpenCL, and ``storage_io``'s bfloat16 helpers, computing in float): no
    ``cl_khr_fp16``, so it runs where they are storage-only. Includes the helpers it needs."""
    return pragmas([d for d in dtypes if d not in STORAGE_ONLY]) + helpers_c(dtypes)


#: How far below 2**31 ``index_ctype`` switches to 64-bit indices by default: a grid rounded up to whole
#: work-groups and a kernel's largest offset reach a little past the element count.
INDEX_HEADROOM = 1024


def index_ctype(*counts: int, headroom: int = INDEX_HEADROOM) -> str:
    """THE index-width rule of every generated kernel: ``long`` when some count (an element count, a
    largest offset or grid size) is within ``headroom`` of 2**31 (C ``int`` arithmetic could overflow),
    else ``int``. Callers with another margin pass their ``headroom`` (0: exactly 2**31)."""
    return "long" if any(abs(int(c)) >= 2**31 - headroom for c in counts) else "int"


def index_type(*shapes: Sequence[int]) -> str:
    """``index_ctype`` of the shapes' element counts, with ``MAX_LOCAL`` (one work-group) of headroom."""
    return index_ctype(*(math.prod(s) for s in shapes), headroom=MAX_LOCAL)


def new_tensor(shape: tuple[int, ...], dtype: np.dtype, device: Device) -> Tensor:
    return Tensor.empty(shape, dtype, device)


def wrap_numpy(array: np.ndarray, device: Device, dtype: Any = None) -> Tensor:
    """A NumPy-backend Tensor holding ``array`` (cast to ``dtype``), C-contiguous, never a NumPy scalar."""
    target = as_dtype(dtype if dtype is not None else array.dtype)
    data = np.asarray(array, dtype=target, order="C")
    if not data.flags.c_contiguous:
        data = data.copy(order="C")
    return Tensor(data, data.shape, target, device)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def pow2_floor(value: int) -> int:
    return 1 << (max(int(value), 1).bit_length() - 1)


def pow2_ceil(value: int) -> int:
    return 1 << (max(int(value), 1) - 1).bit_length()


class ResolvedKernel:
    """A built kernel plus the largest power-of-two work-group it allows (capped at 256), its program's handle
    (kept alive: a program the LRU of the program cache drops stays usable while it is remembered here) and the
    cache's ``generation`` it was resolved in (``current``: no ``clear`` or ``evict`` since)."""

    __slots__ = ("kernel", "handle", "generation", "max_local")

    def __init__(self, kernel: cl.Kernel, handle: Any, generation: int, max_local: int) -> None:
        self.kernel = kernel
        self.handle = handle
        self.generation = generation
        self.max_local = max_local

    @property
    def current(self) -> bool:
        return self.generation == program_cache.generation


#: Bound of every per-signature dict of the op library (kernel memo, launch plans).
MAX_MEMO = 4096
#: Bound of a dict of constant device tensors an op builds once per shape (interpolate's and pad's index tensors).
DEVICE_CONSTANTS = 256
_MEMO: dict[tuple[Hashable, Device], ResolvedKernel] = {}
CLEAR_HOOKS: list[Callable[[], None]] = []
_MEMO_LOCK = threading.Lock()


def get_kernel(
    key: Hashable,
    device: Device,
    make_source: Callable[[], str],
    name: str,
    scalar_dtypes: Sequence[Any],
    build_flags: Sequence[str] = (),
) -> ResolvedKernel:
    """The kernel ``name`` for ``key`` on ``device``: a dict lookup after the first call.

    The first call generates the source (``PRIMITIVE_PREAMBLE`` + ``make_source()``) and builds it
    through ``program_cache``. A remembered kernel keeps its program: the program cache's LRU dropping it (a
    process that built more programs than the cache holds) does not make the next call load it again, while
    ``program_cache.clear()`` / ``evict`` (a new ``generation``) make the next call go back to the cache.
    """
    memo_key = (key, device)
    entry = _MEMO.get(memo_key)
    if entry is not None and entry.current:
        return entry
    generation = program_cache.generation
    source = PRIMITIVE_PREAMBLE + make_source()
    handle = program_cache.get_or_compile(("netcl.runtime.ops", key), source, device.context, build_flags)
    kernel = handle.kernel(name, scalar_dtypes)
    limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device.cl_device)
    entry = ResolvedKernel(kernel, handle, generation, min(MAX_LOCAL, pow2_floor(limit)))
    with _MEMO_LOCK:
        if len(_MEMO) >= MAX_MEMO:  # bounded like the program cache; a miss only costs a lookup there
            _MEMO.clear()
        _MEMO[memo_key] = entry
    return entry


def clear_kernel_memo() -> None:
    """Forget every resolved eager kernel and launch plan (the program cache is left alone)."""
    with _MEMO_LOCK:
        _MEMO.clear()
    for hook in CLEAR_HOOKS:
        hook()


def remember(table: dict, key: Hashable, value: Any, limit: int = MAX_MEMO) -> Any:
    """``table[key] = value``, emptying ``table`` first when it holds ``limit`` entries (tables of device
    tensors pass a smaller bound: their entries hold device memory)."""
    if len(table) >= limit:
        table.clear()
    table[key] = value
    return value


register_cache(clear_kernel_memo)


def normalize_axes(axis: int | Sequence[int] | None, ndim: int, op: str) -> tuple[int, ...]:
    """Sorted non-negative axes; ``None`` means all. Rejects out-of-range and repeated axes."""
    if axis is None:
        return tuple(range(ndim))
    items = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    result = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
            raise TypeError(f"{op}: axis {item!r} is not an int")
        value = int(item)
        if not -ndim <= value < max(ndim, 1) or (ndim == 0 and value not in (0, -1)):
            raise np.exceptions.AxisError(f"{op}: axis {value} is out of range for a {ndim}-d tensor")
        result.append(value % ndim if ndim else 0)
    if len(set(result)) != len(result):
        raise ValueError(f"{op}: repeated axis in {items}")
    return tuple(sorted(result)) if ndim else ()


def require_dtype_kind(tensor: Tensor, kinds: str, op: str) -> None:
    if tensor.dtype.kind not in kinds:
        raise DTypeError(f"{op}: expected a tensor of kind {kinds!r}, got dtype {tensor.dtype}")


# ---- shape-generic indexing ----------------------------------------------------------------------
#: How an elementwise kernel reads a tensor operand: at the output's index, at 0, or through strides.
FLAT, ONE, STRIDED = "flat", "one", "strided"


def broadcast_layout(
    out_shape: tuple[int, ...],
    shapes: Sequence[tuple[int, ...] | None],
    element_strides: Sequence[tuple[int, ...] | None] | None = None,
) -> tuple[tuple[str | None, ...], tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(read class per operand, collapsed output dims, per STRIDED operand its element strides).

    ``shapes`` holds each operand's shape (None for a scalar, class None). An operand with the
    output's element count reads at the output index (FLAT), one with a single element at 0 (ONE);
    the others are STRIDED: the output axes are collapsed (size-1 axes dropped, neighbours merged
    where every strided operand is contiguous across them, so ``(B, F) + (F,)`` is rank 2 for every
    B) and each strided operand gets one stride per collapsed axis (0 where it broadcasts). The dims
    and strides are kernel arguments; only the classes and the collapsed rank shape the source.
    ``element_strides`` (optional, one entry per operand) gives an operand read through strides of its own
    (a strided view: None for the others): it is STRIDED whatever its element count.
    """
    total = math.prod(out_shape)
    classes: list[str | None] = []
    strided: list[tuple[int, ...]] = []
    for k, shape in enumerate(shapes):
        own = element_strides[k] if element_strides is not None else None
        if shape is None:
            classes.append(None)
        elif own is None and math.prod(shape) == total:
            classes.append(FLAT)
        elif own is None and math.prod(shape) == 1:
            classes.append(ONE)
        else:
            classes.append(STRIDED)
            pad = len(out_shape) - len(shape)
            padded = (1,) * pad + tuple(shape)
            if own is not None:  # the view's strides, 0 where it broadcasts (a padded or length-1 axis)
                strided.append(tuple(0 if dim == 1 else st for dim, st in zip(padded, (0,) * pad + own, strict=True)))
                continue
            step, steps = 1, []
            for dim in reversed(padded):
                steps.append(0 if dim == 1 else step)
                step *= dim
            strided.append(tuple(reversed(steps)))
    if not strided:
        return tuple(classes), (), ()
    dims: list[int] = []
    columns: list[list[int]] = []  # per collapsed axis, the strides of every strided operand
    for axis, size in enumerate(out_shape):
        if size == 1:
            continue
        column = [s[axis] for s in strided]
        if dims and all(prev == cur * size for prev, cur in zip(columns[-1], column, strict=True)):
            dims[-1] *= size
            columns[-1] = column
        else:
            dims.append(size)
            columns.append(column)
    per_operand = tuple(tuple(col[k] for col in columns) for k in range(len(strided)))
    return tuple(classes), tuple(dims), per_operand


def fast_divisor(d: int) -> tuple[int, int]:
    """(magic, shift) with ``n // d == (mul_hi(n, magic) + n) >> shift`` for 0 <= n, d < 2**31.

    Division by a runtime divisor is a slow instruction on GPUs and does not vectorize on CPUs
    (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", _common.py):
    a multiply-high and a shift do it (Granlund and Montgomery, as PyTorch's ``IntDivider``).
    """
    d = int(d)
    if d <= 1:  # 1 (and 0: an empty tensor, never launched): the quotient is n itself
        return 1, 0
    shift = (d - 1).bit_length()  # smallest shift with 2**shift >= d
    magic = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return magic, shift


#: C helper of ``fast_divisor``; the sum cannot overflow because n < 2**31.
FASTDIV_SOURCE = "inline uint netcl_udiv(uint n, uint m, uint s) { return (mul_hi(n, m) + n) >> s; }\n"


def dim_params(rank: int, idx: str, prefix: str = "d") -> list[str]:
    """Kernel parameters of dims 1 .. rank-1 of a peeled index: size, magic and shift of each."""
    return [f"const {idx} {prefix}{a}, const uint {prefix}{a}m, const uint {prefix}{a}s" for a in range(1, rank)]


def dim_args(dims: Sequence[int]) -> tuple[int, ...]:
    """The arguments ``dim_params`` declares for ``dims`` (dim 0 is not needed to peel)."""
    return tuple(v for d in dims[1:] for v in (d, *fast_divisor(d)))


def dim_arg_dtypes(rank: int, idx: str) -> list[np.dtype]:
    return [ARG_DTYPES[idx], ARG_DTYPES["uint"], ARG_DTYPES["uint"]] * max(rank - 1, 0)


def div_expr(var: str, divisor: str, idx: str) -> str:
    """``var / divisor`` (both >= 0) through the divisor's magic ``{divisor}m`` and shift ``{divisor}s``."""
    if idx == "long":  # past 2**31 elements: plain 64-bit division
        return f"({var} / {divisor})"
    return f"(int)netcl_udiv((uint)({var}), {divisor}m, {divisor}s)"


def coordinate_lines(rank: int, index_var: str, idx: str, prefix: str = "d", coord: str = "c") -> list[str]:
    """C lines peeling flat ``index_var`` into ``c0 .. c{rank-1}`` over runtime dims ``d1 ..``
    (declared by ``dim_params``); needs ``FASTDIV_SOURCE`` in the program."""
    if rank == 0:
        return []
    lines = [f"{idx} rest_ = {index_var};"]
    for axis in range(rank - 1, 0, -1):
        dim = f"{prefix}{axis}"
        lines.append(f"const {idx} q{axis}_ = {div_expr('rest_', dim, idx)};")
        lines.append(f"const {idx} {coord}{axis} = rest_ - q{axis}_ * {dim}; rest_ = q{axis}_;")
    lines.append(f"const {idx} {coord}0 = rest_;")
    return lines


def dot_expr(
    rank: int, stride_prefix: str, coord: str = "c", unit: Sequence[int] = (), zero: Sequence[int] = ()
) -> str:
    """``c0 * s_0 + c1 * s_1 + ...`` over ``rank`` axes (``0`` for none); axes in ``unit`` have stride
    1 and those in ``zero`` stride 0, baked into the source (a layout class, not a size)."""
    terms = [f"{coord}{a}" if a in unit else f"{coord}{a} * {stride_prefix}{a}" for a in range(rank) if a not in zero]
    return " + ".join(terms) or "0"
