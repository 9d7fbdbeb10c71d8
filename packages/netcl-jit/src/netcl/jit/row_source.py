"""Render a row program (``row_ir``) as ONE OpenCL kernel: one work-group per row.

Each of the ``L`` work-items of a row's group owns the same ``K`` chunks of ``VW`` neighbouring
elements (chunk ``kk`` starts at ``(kk * L + lid) * VW``). The elem and col inputs are loaded
once into private arrays (registers) when a row fits (``K * VW <= CACHE_MAX``), else re-read
each pass. The program's reductions are scheduled into passes: pass ``p`` accumulates every
reduction whose operand needs only row values from earlier passes, then one tree in local memory
combines the work-items' partials of all of them at once. Row statements run uniformly on every
work-item between passes; a last pass writes the elem outputs, and work-item 0 the row outputs.
The row length ``C`` is baked into the source (shapes are part of the JIT's cache key).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from netcl.core.kernels import PRIMITIVE_PREAMBLE
from netcl.jit.primitives import custom_preamble
from netcl.jit.row_ir import COL, ELEM, PARAM, ROW, RowProgram, names_in

#: Largest row slice (elements per work-item) kept in registers.
CACHE_MAX = 32
_COMBINE = {"sum": "({a}) + ({b})", "max": "MAX({a}, {b})", "min": "MIN({a}, {b})"}
_INIT = {"sum": "0.0f", "max": "-INFINITY", "min": "INFINITY"}


@dataclass(frozen=True)
class RowConfig:
    """Work-items per row (``local``) and elements per chunk (``vw``)."""

    local: int
    vw: int

    def chunks(self, C: int) -> int:
        return -(-C // (self.local * self.vw))


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def row_config(C: int, is_gpu: bool, max_local: int) -> RowConfig:
    """Defaults: float4 chunks when C allows; on a GPU up to 256 work-items (one chunk each at
    C = 1024), on a CPU device the fewest (>= 16) that keep a row slice in registers (PoCL runs
    a group's work-items as loops between barriers). ``NETCL_ROW_LOCAL`` / ``NETCL_ROW_VW``
    override (tuning)."""
    vw = int(os.environ.get("NETCL_ROW_VW", 4 if C % 4 == 0 else 1))
    if vw not in (1, 2, 4, 8, 16) or C % vw:
        vw = 1
    # CPU: the fewest work-items that keep a row slice in registers (at least 16)
    cpu = max(16, _pow2_ceil(-(-C // CACHE_MAX)))
    cap = int(os.environ.get("NETCL_ROW_LOCAL", 256 if is_gpu else cpu))
    local = min(_pow2_ceil(max(1, -(-C // vw))), _pow2_ceil(cap), max(1, max_local))
    while local > max_local:
        local //= 2
    return RowConfig(max(1, local), vw)


def online_pairs(program: RowProgram) -> dict[str, str]:
    """``sum(exp(x - m))`` with ``m = max(x)``: sum var -> max var. Both are taken in ONE pass and
    one tree (online softmax: each work-item sums ``exp(x - its own max)``, and the tree rescales
    the partial sums to the common max). ``NETCL_ROW_ONLINE=0`` turns this off."""
    if os.environ.get("NETCL_ROW_ONLINE", "1").strip() in ("0", ""):
        return {}
    by_var = {s.var: s for s in program.stmts}
    pairs = {}
    for stmt in program.stmts:
        exp = by_var.get(stmt.expr) if stmt.reduce == "sum" else None
        match = re.fullmatch(r"EXP\((\w+)\)", exp.expr) if exp is not None and not exp.reduce else None
        sub = by_var.get(match.group(1)) if match else None
        parts = re.fullmatch(r"SUB\((\w+), (\w+)\)", sub.expr) if sub is not None and not sub.reduce else None
        peak = by_var.get(parts.group(2)) if parts else None
        if peak is not None and peak.reduce == "max" and peak.expr == parts.group(1):
            pairs[stmt.var] = peak.var
    return pairs


def _schedule(program: RowProgram, pairs: dict[str, str]) -> tuple[dict[str, int], int]:
    """avail[var]: how many passes must end before ``var`` can be computed; and the pass count."""
    avail: dict[str, int] = {i.var: 0 for i in program.inputs}
    passes = 0
    for stmt in program.stmts:
        level = max((avail[n] for n in names_in(stmt.expr) if n in avail), default=0)
        if stmt.var in pairs:  # taken with its max
            avail[stmt.var] = avail[pairs[stmt.var]]
            continue
        if stmt.reduce:
            passes = max(passes, level + 1)
            level += 1
        avail[stmt.var] = level
    return avail, passes


def kernel_source(
    name: str,
    program: RowProgram,
    config: RowConfig,
    long_index: bool,
    column_sums: frozenset[int] = frozenset(),
    rows_per_group: int = 1,
) -> str:
    """The complete OpenCL program of ``program`` (kernel args: inputs, outputs, ``rows``).

    Outputs in ``column_sums`` (elem values) are summed over the ``rows_per_group`` rows each
    work-group takes, in registers, and written as one ``C``-row of partial sums per work-group
    (a weight's gradient: the caller sums the partials). Without them a work-group takes one row.
    """
    C, L, VW = program.C, config.local, config.vw
    K = config.chunks(C)
    idx = "long" if long_index else "int"
    kinds = program.kinds()
    pairs = online_pairs(program)
    avail, passes = _schedule(program, pairs)
    by_var = {s.var: s for s in program.stmts}
    tensor_inputs = [(k, i) for k, i in enumerate(program.inputs) if i.kind in (ELEM, COL)]
    cache = K * VW <= CACHE_MAX
    guard = C % (L * VW) != 0
    params = []
    for k, inp in enumerate(program.inputs):
        params.append(f"const float p{k}" if inp.kind == PARAM else f"__global const float* restrict in{k}")
    params += [f"__global float* restrict out{j}" for j in range(len(program.outputs))]
    params.append(f"const {idx} rows")
    head = [
        f"#define C {C}",
        f"#define L {L}",
        f"__kernel __attribute__((reqd_work_group_size({L}, 1, 1))) void {name}(",
        "    " + ",\n    ".join(params),
        ") {",
        "    const int lid = get_local_id(0);",
    ]
    if column_sums:
        head.append(f"    const {idx} first_row = ({idx})get_group_id(0) * {rows_per_group};")
        head += [f"    float cs{j}[{K * VW}];" for j in sorted(column_sums)]
        head += [f"    for (int q = 0; q < {K * VW}; ++q) cs{j}[q] = 0.0f;" for j in sorted(column_sums)]
    else:
        head.append(f"    const {idx} row = get_group_id(0);")
        head.append("    if (row >= rows) return;")
    lines = [f"    const {idx} base = row * ({idx})C;"]
    n_local = max(
        [sum(1 for s in program.stmts if s.reduce and avail[s.var] == p + 1) for p in range(passes)], default=0
    )
    if n_local:
        head.append(f"    __local float lred[{n_local * L}];")
    for k, inp in enumerate(program.inputs):
        if inp.kind == ROW:
            lines.append(f"    const float {inp.var} = in{k}[row];")
        elif inp.kind == PARAM:
            lines.append(f"    const float {inp.var} = p{k};")

    def src(k: int, inp) -> str:
        return f"in{k} + base" if inp.kind == ELEM else f"in{k}"

    def load_chunk(k: int, inp, indent: str, into: str) -> list[str]:
        """Lines putting chunk ``kk``'s VW values of input k into ``into[...]``."""
        if VW == 1:
            return [f"{indent}{into}[0] = ({src(k, inp)})[c0];"]
        out = [f"{indent}const float{VW} ld{k} = vload{VW}(0, {src(k, inp)} + c0);"]
        out += [f"{indent}{into}[{lane}] = ld{k}.s{lane:x};" for lane in range(VW)]
        return out

    if cache:
        for k, inp in tensor_inputs:
            lines.append(f"    float a{k}[{K * VW}];")
        if tensor_inputs:
            lines.append("    #pragma unroll")
            lines.append(f"    for (int kk = 0; kk < {K}; ++kk) {{")
            lines.append("        const int c0 = (kk * L + lid) * " + str(VW) + ";")
            if guard:
                lines.append("        if (c0 < C) {")
            for k, inp in tensor_inputs:
                lines.append(f"        float* dst{k} = a{k} + kk * {VW};")
                lines += load_chunk(k, inp, "        ", f"dst{k}")
            if guard:
                lines.append("        }")
            lines.append("    }")

    def closure(targets: list[str]) -> list[str]:
        """Elem statements (program order) the targets need, given every row value is known."""
        needed: set[str] = set()
        stack = list(targets)
        while stack:
            var = stack.pop()
            stmt = by_var.get(var)
            if stmt is None or stmt.reduce or stmt.kind != ELEM or var in needed:
                continue
            needed.add(var)
            stack.extend(names_in(stmt.expr))
        return [s.var for s in program.stmts if s.var in needed]

    def element_pass(targets: list[str], emit_tail) -> list[str]:
        """A loop over this work-item's chunks computing ``targets`` per element; ``emit_tail(lane)``
        gives the lines that consume them (accumulate or store)."""
        body_vars = closure(targets)
        reads = {n for v in body_vars for n in names_in(by_var[v].expr)} | set(targets)
        used_inputs = [(k, inp) for k, inp in tensor_inputs if inp.var in reads]
        out = [
            "    #pragma unroll",
            f"    for (int kk = 0; kk < {K}; ++kk) {{",
            f"        const int c0 = (kk * L + lid) * {VW};",
        ]
        if guard:
            out.append("        if (c0 < C) {")
        if not cache:
            for k, inp in used_inputs:
                out.append(f"        float a{k}[{VW}];")
                out += load_chunk(k, inp, "        ", f"a{k}")
        out += emit_tail("pre")
        for lane in range(VW):
            out.append("        {")
            out.append(f"            const int i = c0 + {lane};")
            slot = f"kk * {VW} + {lane}" if cache else str(lane)
            for k, inp in used_inputs:
                out.append(f"            const float {inp.var} = a{k}[{slot}];")
            for var in body_vars:
                out.append(f"            const float {var} = {by_var[var].expr};")
            out += emit_tail(lane)
            out.append("        }")
        out += emit_tail("post")
        if guard:
            out.append("        }")
        out.append("    }")
        return out

    def row_statements(level: int) -> list[str]:
        return [
            f"    const float {s.var} = {s.expr};"
            for s in program.stmts
            if s.kind == ROW and not s.reduce and avail[s.var] == level
        ]

    for p in range(passes + 1):
        lines += row_statements(p)
        if p == passes:
            break
        reds = [s for s in program.stmts if s.reduce and avail[s.var] == p + 1]
        for j, s in enumerate(reds):
            lines.append(f"    float acc{j}_{s.var} = {_INIT[s.reduce]};")

        slot = {s.var: j for j, s in enumerate(reds)}
        first = [(j, s) for j, s in enumerate(reds) if s.var not in pairs]
        second = [(j, s) for j, s in enumerate(reds) if s.var in pairs]

        def accumulate(lane, group):
            if lane == "pre":  # the online sums: exp(x - this work-item's max)
                return [
                    f"        const float {pairs[s.var]} = acc{slot[pairs[s.var]]}_{pairs[s.var]};" for _, s in group
                ]
            if lane == "post":
                return []
            return [
                f"            acc{j}_{s.var} = {_COMBINE[s.reduce].format(a=f'acc{j}_{s.var}', b=s.expr)};"
                for j, s in group
            ]

        lines += element_pass([s.expr for _, s in first], lambda lane: [] if lane == "pre" else accumulate(lane, first))
        if second:
            lines += element_pass([s.expr for _, s in second], lambda lane: accumulate(lane, second))
        for j, s in enumerate(reds):
            lines.append(f"    lred[{j * L} + lid] = acc{j}_{s.var};")
        lines.append("    barrier(CLK_LOCAL_MEM_FENCE);")
        lines.append("    for (int h = L / 2; h > 0; h >>= 1) {")
        lines.append("        if (lid < h) {")
        for j, s in second:  # rescale both partial sums to the larger max (before the max is combined)
            m = slot[pairs[s.var]]
            m1, m2 = f"lred[{m * L} + lid]", f"lred[{m * L} + lid + h]"
            s1, s2 = f"lred[{j * L} + lid]", f"lred[{j * L} + lid + h]"
            lines.append(f"            const float mx{j} = MAX({m1}, {m2});")
            lines.append(
                f"            {s1} = ({m1} == -INFINITY ? 0.0f : {s1} * exp({m1} - mx{j}))"
                f" + ({m2} == -INFINITY ? 0.0f : {s2} * exp({m2} - mx{j}));"
            )
        for j, s in first:
            a, b = f"lred[{j * L} + lid]", f"lred[{j * L} + lid + h]"
            lines.append(f"            {a} = {_COMBINE[s.reduce].format(a=a, b=b)};")
        lines.append("        }")
        lines.append("        barrier(CLK_LOCAL_MEM_FENCE);")
        lines.append("    }")
        for j, s in enumerate(reds):
            lines.append(f"    const float {s.var} = lred[{j * L}];")
        lines.append("    barrier(CLK_LOCAL_MEM_FENCE);")

    elem_outputs = [(j, v) for j, v in enumerate(program.outputs) if kinds[v] == ELEM and j not in column_sums]
    summed = [(j, program.outputs[j]) for j in sorted(column_sums)]
    if summed:

        def add_columns(lane):
            if lane in ("pre", "post"):
                return []
            slot = f"kk * {VW} + {lane}"
            return [f"            cs{j}[{slot}] += {v};" for j, v in summed]

        lines += element_pass([v for _, v in summed], add_columns)
    if elem_outputs:

        def store(lane):
            if lane == "pre":
                return [f"        float r{j}[{VW}];" for j, _ in elem_outputs]
            if lane == "post":
                if VW == 1:
                    return [f"        out{j}[base + c0] = r{j}[0];" for j, _ in elem_outputs]
                return [f"        vstore{VW}(vload{VW}(0, r{j}), 0, out{j} + base + c0);" for j, _ in elem_outputs]
            return [f"            r{j}[{lane}] = {v};" for j, v in elem_outputs]

        lines += element_pass([v for _, v in elem_outputs], store)
    row_outputs = [(j, v) for j, v in enumerate(program.outputs) if kinds[v] != ELEM]
    if row_outputs:
        lines.append("    if (lid == 0) {")
        lines += [f"        out{j}[row] = {v};" for j, v in row_outputs]
        lines.append("    }")
    if column_sums:
        body = ["        " + line for line in lines]
        lines = [f"    for ({idx} row = first_row; row < first_row + {rows_per_group}; ++row) {{"]
        lines += ["    if (row < rows) {", *body, "    }", "    }"]
        lines += [
            "    #pragma unroll",
            f"    for (int kk = 0; kk < {K}; ++kk) {{",
            f"        const int c0 = (kk * L + lid) * {VW};",
        ]
        lines += ["        if (c0 < C) {"] if guard else []
        for j, _ in summed:
            lines += [
                f"        out{j}[({idx})get_group_id(0) * C + c0 + {lane}] = cs{j}[kk * {VW} + {lane}];"
                for lane in range(VW)
            ]
        lines += ["        }"] if guard else []
        lines.append("    }")
    lines = head + lines
    lines.append("}")
    return PRIMITIVE_PREAMBLE + "\n" + custom_preamble() + "\n".join(lines) + "\n"


def needs_long(rows: int, C: int) -> bool:
    return rows * C >= 2**31 or rows >= 2**31 // 2


__all__ = ["CACHE_MAX", "RowConfig", "kernel_source", "needs_long", "row_config"]
