"""Render a row program (``row_ir``) as ONE OpenCL kernel for CPU devices: one work-item per row.

``row_source`` gives a row to a work-group and combines its lanes' partials by a tree in local memory; a CPU
compiler (PoCL) runs such a group's lanes as loops between the tree's barriers, one level after another, and
vectorizes neither a lane's loop nor its scalar ``exp``. Here a work-item walks its row alone: pass ``p``
accumulates every reduction whose operand needs only row values of earlier passes, in ``float{VW}`` vectors
with the body evaluated on vectors (``vector_primitives``: SIMD math builtins), the last ``C % VW`` elements
one at a time; each lane keeps its own partial, and the lanes join the tail's partial in lane order (a fixed
order: a result never depends on timing). A body the vector twins cannot express (a user primitive's own C)
runs element by element. A math helper's value that more than one loop needs (softmax's exponentials: summed,
then divided) is stored in a private row by the first and loaded by the others. Statement order, the pass
schedule and the outputs are ``row_source``'s.

Per-column gradients (``column_sums``): a work-item takes ``rows_per_item`` neighbouring rows and sums its
outputs over them into its own row of partial sums (the caller sums the partials).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from netcl.core.kernels import PRIMITIVE_PREAMBLE
from netcl.core.kernels.vector_primitives import MATH_HELPERS, vector_preamble, vectorize
from netcl.jit.primitive_registry import custom_preamble
from netcl.jit.row_ir import COL, COLIDX, ELEM, INDEX, PARAM, ROW, RowProgram, closure_past, elem_closure, names_in
from netcl.jit.row_source import schedule_passes

#: How a vector accumulator takes a new vector value, and how two lanes' partials merge (scalar).
_VECTOR_COMBINE = {"sum": "{a} + {b}", "max": "V_MAX({a}, {b})", "min": "V_MIN({a}, {b})"}
_COMBINE = {"sum": "({a}) + ({b})", "max": "MAX({a}, {b})", "min": "MIN({a}, {b})"}
_INIT = {"sum": "0.0f", "max": "-INFINITY", "min": "INFINITY"}
_NAME = re.compile(r"\b[a-z_][a-z_0-9]*\b")
_MATH_CALL = re.compile(r"\b(?:" + "|".join(MATH_HELPERS) + r")\(")
#: Rows of at most this many elements keep values several loops need (a math helper's result) in a private row
#: of the work-item, at most ``CACHE_VALUES`` of them: a later loop loads them instead of calling the helper again.
CACHE_ROW_MAX, CACHE_VALUES = 4096, 2


def vector_width(cols: int, device_width: int) -> int:
    """The ``floatN`` width of a row of ``cols``: the device's (2-16), narrowed to the row; 1 (scalar) below 2."""
    width = max(1, min(16, device_width))
    while width > 1 and (width > cols or width & (width - 1)):
        width -= 1
    return width if width >= 2 else 1


def serial_kernel_source(
    name: str,
    program: RowProgram,
    vw: int,
    long_index: bool,
    column_sums: frozenset[int] = frozenset(),
    rows_per_item: int = 1,
) -> str:
    """The complete OpenCL program of ``program`` (kernel args: inputs, outputs, ``rows``), a work-item a row.

    With ``column_sums`` (outputs summed over rows), work-item ``t`` takes rows ``t * rows_per_item`` onward and
    writes ``C`` partial sums of each such output to row ``t`` of it; otherwise it takes row ``t``."""
    C = program.C
    idx = "long" if long_index else "int"
    kinds = program.kinds()
    avail, passes = schedule_passes(program, {})
    by_var = {s.var: s for s in program.stmts}
    tensors = [(k, i) for k, i in enumerate(program.inputs) if i.kind in (ELEM, COL)]
    vnames: dict[str, str] = {}

    def vname(var: str) -> str:
        return vnames.setdefault(var, f"gin{len(vnames)}")  # a name vectorize() accepts

    def vector_expr(expr: str) -> str | None:
        return vectorize(_NAME.sub(lambda m: vname(m.group(0)) if m.group(0) in kinds else m.group(0), expr))

    # the row's target lists, loop by loop (each pass's reductions, the column sums, the elem outputs), and the
    # math-helper values more than one loop computes: the first stores them in a private row, the later ones load
    summed = [(j, program.outputs[j]) for j in sorted(column_sums)]
    elem_outputs = [(j, v) for j, v in enumerate(program.outputs) if kinds[v] == ELEM and j not in column_sums]
    loop_targets = [[s.expr for s in program.stmts if s.reduce and avail[s.var] == p + 1] for p in range(passes)]
    loop_targets += [[v for _, v in group] for group in (summed, elem_outputs) if group]
    cached = _recomputed_math(program, loop_targets) if C <= CACHE_ROW_MAX else []
    stored: set[str] = set()

    def element_loops(
        targets: list[str], vector_tail: Callable[[list[str]], list[str]], scalar_tail: Callable[[], list[str]]
    ) -> list[str]:
        """Loops over the row computing ``targets``: ``vector_tail(names)`` consumes them as vectors (``names``:
        their vector names) over the first ``C - C % VW`` elements, ``scalar_tail()`` one element at a time
        (under their own names) over the rest, or over the whole row when the body has no vector form. Cached
        values an earlier loop stored are loaded, the others stored as this loop computes them."""
        body, loads = closure_past(program, targets, stored)
        keep = [v for v in body if v in cached]
        reads = {n for v in body for n in names_in(by_var[v].expr)} | set(targets)
        used = [(k, inp) for k, inp in tensors if inp.var in reads]
        exprs = [vector_expr(by_var[v].expr) for v in body] if vw > 1 else [None]
        out = ["    {", "        int c = 0;"]
        if vw > 1 and all(e is not None for e in exprs):
            out.append(f"        for (; c + {vw} <= C; c += {vw}) {{")
            for k, inp in used:
                load = f"vload{vw}(0, {_pointer(k, inp)} + c)"
                out.append(f"            const VF {vname(inp.var)} = {_as_float(load, inp.ctype, vw)};")
            out += [f"            const VF {vname(v)} = vload{vw}(0, row_{v} + c);" for v in loads]
            if COLIDX in reads:
                lanes = ", ".join(f"{lane}.0f" for lane in range(vw))
                out.append(f"            const VF {vname(COLIDX)} = (VF)((float)c) + (VF)({lanes});")
            rows = sorted({n for n in reads if kinds.get(n) == ROW})
            out += [f"            const VF {vname(r)} = (VF)({r});" for r in rows]
            out += [f"            const VF {vname(v)} = {e};" for v, e in zip(body, exprs, strict=True)]
            out += [f"            vstore{vw}({vname(v)}, 0, row_{v} + c);" for v in keep]
            out += ["            " + line for line in vector_tail([vname(t) for t in targets])]
            out.append("        }")
        out.append("        for (; c < C; ++c) {")
        out += [f"            const float {inp.var} = (float)({_pointer(k, inp)})[c];" for k, inp in used]
        out += [f"            const float {v} = row_{v}[c];" for v in loads]
        if COLIDX in reads:
            out.append(f"            const float {COLIDX} = (float)c;")
        out += [f"            const float {v} = {by_var[v].expr};" for v in body]
        out += [f"            row_{v}[c] = {v};" for v in keep]
        out += ["            " + line for line in scalar_tail()]
        out += ["        }", "    }"]
        stored.update(keep)
        return out

    lines = [f"    const {idx} base = row * ({idx})C;"]
    lines += [f"    float row_{v}[C];" for v in cached]
    for k, inp in enumerate(program.inputs):
        if inp.kind in (ROW, INDEX):
            lines.append(f"    const float {inp.var} = (float)in{k}[row];")
        elif inp.kind == PARAM:
            lines.append(f"    const float {inp.var} = p{k};")
    for p in range(passes + 1):
        lines += [
            f"    const float {s.var} = {s.expr};"
            for s in program.stmts
            if s.kind == ROW and not s.reduce and avail[s.var] == p
        ]
        if p == passes:
            break
        reds = [s for s in program.stmts if s.reduce and avail[s.var] == p + 1]
        lines += [f"    float {s.var} = {_INIT[s.reduce]};" for s in reds]
        if vw > 1:
            lines += [f"    VF {s.var}_v = (VF)({_INIT[s.reduce]});" for s in reds]

        def vector_accumulate(names: list[str], reds=reds) -> list[str]:
            return [
                f"{s.var}_v = {_VECTOR_COMBINE[s.reduce].format(a=f'{s.var}_v', b=n)};"
                for s, n in zip(reds, names, strict=True)
            ]

        def scalar_accumulate(reds=reds) -> list[str]:
            return [f"{s.var} = {_COMBINE[s.reduce].format(a=s.var, b=s.expr)};" for s in reds]

        lines += element_loops([s.expr for s in reds], vector_accumulate, scalar_accumulate)
        if vw > 1:  # the vector lanes' partials join the scalar tail's, in lane order
            lines.append("    {")
            for s in reds:
                lines.append(f"        float lanes_{s.var}[{vw}];")
                lines.append(f"        vstore{vw}({s.var}_v, 0, lanes_{s.var});")
            lines.append(f"        for (int q = 0; q < {vw}; ++q) {{")
            lines += [
                f"            {s.var} = {_COMBINE[s.reduce].format(a=s.var, b=f'lanes_{s.var}[q]')};" for s in reds
            ]
            lines += ["        }", "    }"]

    if summed:  # this row's term of the work-item's partial column sums: the first row writes, the rest add
        partial = [f"out{j} + item * ({idx})C" for j, _ in summed]
        lines += element_loops(
            [v for _, v in summed],
            lambda names: [
                f"vstore{vw}((row == first_row ? (VF)(0.0f) : vload{vw}(0, {dst} + c)) + {n}, 0, {dst} + c);"
                for dst, n in zip(partial, names, strict=True)
            ],
            lambda: [
                f"({dst})[c] = (row == first_row ? 0.0f : ({dst})[c]) + {v};"
                for dst, (_, v) in zip(partial, summed, strict=True)
            ],
        )
    if elem_outputs:
        lines += element_loops(
            [v for _, v in elem_outputs],
            lambda names: [
                f"vstore{vw}({n}, 0, out{j} + base + c);" for (j, _), n in zip(elem_outputs, names, strict=True)
            ],
            lambda: [f"out{j}[base + c] = {v};" for j, v in elem_outputs],
        )
    lines += [f"    out{j}[row] = {v};" for j, v in enumerate(program.outputs) if kinds[v] != ELEM]

    params = [
        f"const float p{k}" if inp.kind == PARAM else f"__global const {inp.ctype}* restrict in{k}"
        for k, inp in enumerate(program.inputs)
    ]
    params += [f"__global float* restrict out{j}" for j in range(len(program.outputs))]
    params.append(f"const {idx} rows")
    head = [f"#define C {C}", f"__kernel void {name}(", "    " + ",\n    ".join(params), ") {"]
    head.append(f"    const {idx} item = get_global_id(0);")
    if column_sums:
        head += [
            f"    const {idx} first_row = item * {rows_per_item};",
            f"    const {idx} end = first_row + {rows_per_item} < rows ? first_row + {rows_per_item} : rows;",
            f"    for ({idx} row = first_row; row < end; ++row) {{",
        ]
        body = ["    " + line for line in lines] + ["    }"]
    else:
        head += [f"    const {idx} row = item;", "    if (row >= rows) return;"]
        body = lines
    preamble = PRIMITIVE_PREAMBLE + (vector_preamble(vw) if vw > 1 else "")
    return preamble + "\n" + custom_preamble() + "\n".join([*head, *body, "}"]) + "\n"


def _recomputed_math(program: RowProgram, loop_targets: list[list[str]]) -> list[str]:
    """The elem statements calling a math helper (a library call per element: ``exp``, ``log``, ``tanh``, ...)
    that more than one loop over the row computes, at most ``CACHE_VALUES`` of them, first computed first."""
    seen: dict[str, int] = {}
    for targets in loop_targets:
        for var in elem_closure(program, targets):
            seen[var] = seen.get(var, 0) + 1
    by_var = {s.var: s for s in program.stmts}
    math = [v for v, count in seen.items() if count > 1 and _MATH_CALL.search(by_var[v].expr)]
    order = [s.var for s in program.stmts]
    return sorted(math, key=order.index)[:CACHE_VALUES]


def _pointer(k: int, inp) -> str:
    return f"in{k} + base" if inp.kind == ELEM else f"in{k}"


def _as_float(load: str, ctype: str, vw: int) -> str:
    return load if ctype == "float" else f"convert_float{vw}({load})"


__all__ = ["serial_kernel_source", "vector_width"]
