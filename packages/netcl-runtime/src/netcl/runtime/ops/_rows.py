"""The row-kernel skeleton (cumsum, argmax/argmin) and THE local-memory reduction tree of every row kernel.

The tree: ``tree_loop_c`` (the halving loop: lanes below ``h`` merge slot ``lane + h`` into slot
``lane``, a barrier a level) and ``tree_reduce_c`` (an inline C function that stores each lane's
value(s), runs the loop and hands every lane the result) generate every work-group reduction of
the row kernels: the helpers below, softmax / logsumexp / the norms (``rowwise.tree_source``), the
class losses (through rowwise), batch_norm's channel sums, the reductions' "tree" and "cols" stages
(``reduce``), argmax/argmin, clip_grad_norm's partial norms, the JIT's fused row kernels
(``netcl.jit.row_source``, several reductions merged in one loop) and its fused detection loss. The
pairing is fixed, so results depend only on the lane count.

A *row* is the set of elements one statistic is taken over: the ``R`` elements along one axis (or a
block of neighbouring axes) of a C-contiguous tensor, or, for batch_norm, every element of one
channel. Each kernel of the skeleton (``source``/``run``) handles one row per work-group ("group"
mode: the threads stride through the row and combine their partials by the tree) or, for rows of at
most ``SERIAL_MAX`` elements, one row per work-item ("serial" mode: a plain loop, no tree). An op
writes its body once over these macros, and both modes compile from it:

- ``ROW`` (this row's index), ``LID``/``LSIZE`` (this thread's lane and the lane count: 0 and 1 in
  serial mode), so ``for (IDX i = LID; i < R; i += LSIZE)`` visits the row;
- ``AT(i)``: the flat offset of the row's element ``i``;
- ``ROW_SUM(v)`` (an expression: the row-wide sum of every lane's ``v``), ``ROW_SUM2(a, b)`` (two sums
  at once, in place), ``ROW_MAXSUM(m, s)`` (combine online-softmax pairs: max ``m`` and the sum
  ``s`` of ``exp(v - m)``, in place);
- ``ACC``: the compute type (``float``; ``double`` for float64 data; ``long`` for integer scans and
  arg-reductions, which have no ``ROW_MAXSUM``), ``IDX``: the index type;
- in group mode, ``scratch_a``/``scratch_b``: two ``__local ACC[MAX_LOCAL]`` arrays a body may use.

Layouts (a layout class, baked into the source): ``contig`` (rows of ``R`` neighbours: the last
axis), ``strided`` (element ``i`` of row ``g`` at ``(g / inner) * R * inner + g % inner + i * inner``:
an inner axis, e.g. the class axis of (N, C, H, W) logits), ``channel`` (row ``c`` of batch_norm:
element ``i`` at ``((i / inner) * rows + c) * inner + i % inner``). ``rows``, ``R`` and ``inner`` are
kernel arguments, so a new batch size or row length builds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float64, is_floating
from netcl.core.errors import DTypeError
from netcl.runtime.cache import register_cache
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import ARG_DTYPES, MAX_LOCAL, get_kernel, pow2_ceil, pragmas, remember, round_up

#: Rows of at most this many elements take one work-item each.
SERIAL_MAX = 32
#: Elements each lane of a work-group handles at least (the group is no wider than R / this).
PER_LANE = 4

CONTIG, STRIDED, CHANNEL = "contig", "strided", "channel"


def tree_loop_c(
    combine: str | Sequence[str], lane: str = "lid", half: str = "get_local_size(0) / 2", indent: str = "    "
) -> str:
    """THE local-memory reduction tree of every row kernel, as C statements: a barrier, then for
    ``h = half, half / 2, ..., 1`` the lanes below ``h`` run ``combine`` (statements that merge slot
    ``lane + h`` into slot ``lane``, reading ``h``), with a barrier after each level. The pairing is fixed,
    so a result depends only on the lane count (``half`` is half of it, a power of two), never on timing.
    Slot 0 holds the result after it; the lanes' partials must be stored before it."""
    lines = [combine] if isinstance(combine, str) else list(combine)
    body = "".join(f"{indent}        {line}\n" for line in lines)
    return (
        f"{indent}barrier(CLK_LOCAL_MEM_FENCE);\n"
        f"{indent}for (int h = {half}; h > 0; h >>= 1) {{\n"
        f"{indent}    if ({lane} < h) {{\n{body}{indent}    }}\n"
        f"{indent}    barrier(CLK_LOCAL_MEM_FENCE);\n"
        f"{indent}}}\n"
    )


def sum_combine(slots: int = 1) -> list[str]:
    """``tree_reduce_c``'s combine of plain sums over ``slots`` values."""
    return [f"s{k}[lid] += s{k}[lid + h];" for k in range(slots)]


def tree_reduce_c(
    name: str,
    ctypes: str | Sequence[str],
    combine: str | Sequence[str],
    final_barrier: bool = True,
    half: str = "get_local_size(0) / 2",
) -> str:
    """An inline C function that every lane of a work-group calls with its partial(s); each gets the
    group's result (``tree_loop_c`` over the ``__local`` arrays ``s0, s1, ...``, one per value, each at
    least the lane count long). One ctype: ``T name(T v0, __local T* s0)`` returns the result; several:
    ``void name(T0* v0, T1* v1, ..., __local T0* s0, __local T1* s1, ...)`` updates the values in place.
    ``combine`` merges slot ``lid + h`` into slot ``lid`` of every array (``sum_combine``). With
    ``final_barrier`` the arrays may be reused right after the call. ``half``: half the lane count (a
    compile-time constant where the work-group size is fixed)."""
    types = [ctypes] if isinstance(ctypes, str) else list(ctypes)
    one = len(types) == 1
    values = [f"v{k}" if one else f"*v{k}" for k in range(len(types))]
    params = [f"{t} v{k}" if one else f"{t}* v{k}" for k, t in enumerate(types)]
    params += [f"__local {t}* s{k}" for k, t in enumerate(types)]
    lines = [
        f"inline {types[0] if one else 'void'} {name}({', '.join(params)}) {{\n",
        "    const int lid = get_local_id(0);\n",
    ]
    lines += [f"    s{k}[lid] = {v};\n" for k, v in enumerate(values)]
    lines.append(tree_loop_c(combine, half=half))
    lines += [f"    {v} = s{k}[0];\n" for k, v in enumerate(values)]
    lines += ["    barrier(CLK_LOCAL_MEM_FENCE);\n"] if final_barrier else []
    lines += ["    return v0;\n"] if one else []
    return "".join([*lines, "}\n"])


#: Merge two online-softmax partials (max in s0, sum of exp(v - max) in s1) at the larger max.
MAXSUM_COMBINE = (
    "const ACC m1 = s0[lid], m2 = s0[lid + h];",
    "const ACC mx = m1 > m2 ? m1 : m2;",
    "s1[lid] = MAXSUM_TERM(m1, s1[lid], mx) + MAXSUM_TERM(m2, s1[lid + h], mx);",
    "s0[lid] = mx;",
)

_GROUP_HELPERS = (
    tree_reduce_c("netcl_row_sum", "ACC", sum_combine())
    + tree_reduce_c("netcl_row_sum2", ["ACC", "ACC"], sum_combine(2))
    + "#ifdef NETCL_FLOAT_ACC\n"
    + tree_reduce_c("netcl_row_maxsum", ["ACC", "ACC"], MAXSUM_COMBINE)
    + "#endif\n"
)

#: An online-softmax partial (max m, sum s of exp(v - m)) rescaled to the max ``mx``; a partial
#: that saw only -inf (s == 0) adds 0, never exp(-inf + inf) = NaN.
_MAXSUM_TERM = "#define MAXSUM_TERM(m, s, mx) ((m) == -INFINITY ? (ACC)0 : (s) * exp((m) - (mx)))\n"
#: Fold one value ``v`` into a thread's running (m, s).
MAXSUM_STEP = "if (v > m) { s = s * exp(m - v) + (ACC)1; m = v; } else if (v != -INFINITY) { s += exp(v - m); }"


def source(
    name: str,
    params: Sequence[str],
    body: str,
    layout: str,
    mode: str,
    acc: str,
    idx: str,
    dtypes: Sequence[np.dtype],
    helpers: str = "",
) -> str:
    """The kernel ``name(params..., rows, R, inner)`` running ``body`` once per row."""
    group = mode == "group"
    lines = [pragmas(list(dtypes)), f"#define ACC {acc}\n#define IDX {idx}\n", _MAXSUM_TERM]
    if acc in ("float", "double"):
        lines.append("#define NETCL_FLOAT_ACC\n")
    if group:
        lines += [
            "#define LID ((IDX)get_local_id(0))\n#define LSIZE ((IDX)get_local_size(0))\n",
            "#define ROW ((IDX)get_group_id(0))\n",
            _GROUP_HELPERS,
            "#define ROW_SUM(v) netcl_row_sum((v), scratch_a)\n",
            "#define ROW_SUM2(a, b) netcl_row_sum2(&(a), &(b), scratch_a, scratch_b)\n",
            "#define ROW_MAXSUM(m, s) netcl_row_maxsum(&(m), &(s), scratch_a, scratch_b)\n",
        ]
    else:
        lines += [
            "#define LID ((IDX)0)\n#define LSIZE ((IDX)1)\n#define ROW ((IDX)get_global_id(0))\n",
            "#define ROW_SUM(v) (v)\n#define ROW_SUM2(a, b)\n#define ROW_MAXSUM(m, s)\n",
        ]
    base, at = {
        CONTIG: ("row * R", "(base + (i))"),
        STRIDED: ("(row / inner) * R * inner + row % inner", "(base + (i) * inner)"),
        CHANNEL: ("row * inner", "(base + ((i) / inner) * rows * inner + (i) % inner)"),
    }[layout]
    lines.append(f"#define AT(i) {at}\n")
    lines.append(helpers)
    scratch = f"    __local ACC scratch_a[{MAX_LOCAL}], scratch_b[{MAX_LOCAL}];\n" if group else ""
    signature = ", ".join([*params, "const IDX rows", "const IDX R", "const IDX inner"])
    lines.append(
        f"__kernel void {name}({signature}) {{\n{scratch}"
        "    const IDX row = ROW;\n"
        "    if (row >= rows) return;\n"
        f"    const IDX base = {base};\n"
        f"{body}\n}}\n"
    )
    return "".join(lines)


def pick_mode(length: int) -> str:
    return "serial" if length <= SERIAL_MAX else "group"


def run(
    key: Hashable,
    device: Device,
    make_source: Callable[[str], str],
    name: str,
    arg_dtypes: Sequence[Any],
    rows: int,
    length: int,
    inner: int,
    idx: str,
    *args: Any,
    mode: str | None = None,
    lanes: int | None = None,
) -> None:
    """Launch ``name`` over ``rows`` rows of ``length`` elements (``make_source(mode)`` builds it once per
    ``key`` and mode). ``arg_dtypes`` covers ``args``; the row sizes follow as ``idx`` arguments. ``lanes``
    (group mode): the work-group size (a power of two, capped by the kernel's limit) instead of the
    default ``PER_LANE`` elements a lane; a kernel family keeps its lane count, so its sums keep their order."""
    if rows <= 0:
        return
    prepared = prepare(key, device, make_source, name, arg_dtypes, rows, length, inner, idx, mode, lanes)
    prepared.call(*[a.data if isinstance(a, Tensor) else a for a in args])


#: prepared row launches by (kernel key, mode, device, rows, length, inner, lanes): the sizes bound
_PREPARED: dict[tuple, PreparedLaunch] = {}
register_cache(_PREPARED.clear)


def prepare(
    key: Hashable,
    device: Device,
    make_source: Callable[[str], str],
    name: str,
    arg_dtypes: Sequence[Any],
    rows: int,
    length: int,
    inner: int,
    idx: str,
    mode: str | None = None,
    lanes: int | None = None,
) -> PreparedLaunch:
    """The launch ``run`` makes (``rows`` > 0), its row sizes bound: ``prepared.call(*raw_args)`` passes
    the ``arg_dtypes`` arguments (``cl.Buffer``s and numbers) per call. One per key, mode and sizes; the
    program is shared by every size (shape-generic), only the bound size arguments differ."""
    mode = mode or pick_mode(length)
    full = ("rows", name, mode, *key)
    size_key = (full, device, rows, length, inner, lanes)
    prepared = _PREPARED.get(size_key)
    if prepared is not None:
        return prepared
    types = [*arg_dtypes, *[ARG_DTYPES[idx]] * 3]
    resolved = get_kernel(full, device, lambda: make_source(mode), name, types)
    n = len(arg_dtypes)
    bound = {n: rows, n + 1: length, n + 2: inner}
    if mode == "group":
        local = min(resolved.max_local, lanes or max(16, pow2_ceil(-(-length // PER_LANE))))
        gsize = rows * local
    else:
        local = min(resolved.max_local, 64)
        gsize = round_up(rows, local)
    return remember(_PREPARED, size_key, PreparedLaunch.binding(resolved.kernel, gsize, local, bound, device.queue))


def acc_ctype(dtype: np.dtype) -> str:
    return "double" if dtype == float64 else "float"


def acc_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype row statistics are kept in: float64 for float64 data, else float32."""
    return float64 if dtype == float64 else np.dtype(np.float32)


def require_float(x: Any, op: str, arg: str = "x") -> None:
    """DTypeError unless ``x`` holds floating-point values."""
    if not is_floating(x.dtype):
        raise DTypeError(
            f"{op}: {arg} must be a floating-point tensor (float16/bfloat16/float32/float64), got dtype {x.dtype}"
        )


def row_split(shape: Sequence[int], first: int, last: int) -> tuple[int, int, int]:
    """(outer, R, inner) of the axes ``first..last`` (inclusive) of a C-contiguous ``shape``."""
    return (
        math.prod(shape[:first]),
        math.prod(shape[first : last + 1]),
        math.prod(shape[last + 1 :]),
    )


def layout_of(inner: int) -> str:
    return CONTIG if inner == 1 else STRIDED


__all__ = [
    "CHANNEL",
    "CONTIG",
    "MAXSUM_COMBINE",
    "MAXSUM_STEP",
    "SERIAL_MAX",
    "STRIDED",
    "acc_ctype",
    "acc_dtype",
    "layout_of",
    "pick_mode",
    "require_float",
    "row_split",
    "run",
    "source",
    "sum_combine",
    "tree_loop_c",
    "tree_reduce_c",
]
