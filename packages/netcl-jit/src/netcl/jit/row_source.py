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
from netcl.core.kernels.vector_primitives import vector_preamble, vectorize
from netcl.jit.primitive_registry import custom_preamble
from netcl.jit.row_ir import COL, COLIDX, ELEM, INDEX, PARAM, ROW, RowProgram, elem_closure, names_in
from netcl.runtime.ops._common import index_ctype
from netcl.runtime.ops._rows import tree_loop_c

#: Largest row slice (elements per work-item) kept in registers.
CACHE_MAX = 32
_COMBINE = {"sum": "({a}) + ({b})", "max": "MAX({a}, {b})", "min": "MIN({a}, {b})"}
_INIT = {"sum": "0.0f", "max": "-INFINITY", "min": "INFINITY"}


@dataclass(frozen=True)
class RowConfig:
    """Work-items per row (``local``) and elements per chunk (``vw``)."""

    local: int
    vw: int

    def chunks(self, cols: int) -> int:
        return -(-cols // (self.local * self.vw))


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def row_config(cols: int, is_gpu: bool, max_local: int) -> RowConfig:
    """Defaults: float4 chunks when C allows; on a GPU eight chunks per work-item, 32 to 256 of them
    (32, one warp, at C = 1024: fewer work-items mean fewer tree steps, each a barrier and, for
    layer_norm's (count, sum, M2) merge, two divisions; `benchmarks/tune_rows.py`, see
    benchmarks/RESULTS.md, "Row kernels re-tuned the same day"), on a CPU device the fewest (>= 16) that
    keep a row slice in registers (PoCL runs a group's work-items as loops between barriers).
    ``NETCL_ROW_LOCAL`` / ``NETCL_ROW_VW`` override (tuning)."""
    C = cols
    vw = int(os.environ.get("NETCL_ROW_VW", 4 if C % 4 == 0 else 1))
    if vw not in (1, 2, 4, 8, 16) or C % vw:
        vw = 1
    # CPU: the fewest work-items that keep a row slice in registers (at least 16)
    cpu = max(16, _pow2_ceil(-(-C // CACHE_MAX)))
    gpu = min(256, max(32, _pow2_ceil(-(-C // (8 * vw)))))
    cap = int(os.environ.get("NETCL_ROW_LOCAL", gpu if is_gpu else cpu))
    local = min(_pow2_ceil(max(1, -(-C // vw))), _pow2_ceil(cap), max(1, max_local))
    while local > max_local:
        local //= 2
    return RowConfig(max(1, local), vw)


def online_pairs(program: RowProgram, enabled: bool = True) -> dict[str, tuple[str, str, str]]:
    """Second reductions taken in the SAME pass (and tree) as the first one they depend on.

    sum var -> (partner reduction, row value to shadow, how):

    - ``"exp"``: ``sum(exp(x - m))`` with ``m = max(x)`` (online softmax: each work-item sums
      ``exp(x - its own max)``; the tree rescales the partial sums to the common max);
    - ``"centered"``: ``sum((x - mu) ** 2)`` with ``mu = sum(x) / C`` (each work-item centres on its
      own mean; the tree merges (count, sum, M2) as Chan et al.).

    ``enabled`` is the default (on for GPUs: one tree less; off for CPU devices, where PoCL runs
    the two-pass forms faster: see benchmarks/RESULTS.md, "Measurements moved out of source docstrings",
    row_source.py); ``NETCL_ROW_ONLINE=0/1`` overrides.
    """
    if os.environ.get("NETCL_ROW_ONLINE", "1" if enabled else "0").strip() in ("0", ""):
        return {}
    by_var = {s.var: s for s in program.stmts}

    def op(var: str, pattern: str):
        stmt = by_var.get(var)
        return re.fullmatch(pattern, stmt.expr) if stmt is not None and not stmt.reduce else None

    pairs = {}
    for stmt in program.stmts:
        if stmt.reduce != "sum":
            continue
        exp = op(stmt.expr, r"EXP\((\w+)\)")
        sub = op(exp.group(1), r"SUB\((\w+), (\w+)\)") if exp else None
        peak = by_var.get(sub.group(2)) if sub else None
        if peak is not None and peak.reduce == "max" and peak.expr == sub.group(1):
            pairs[stmt.var] = (peak.var, peak.var, "exp")
            continue
        square = op(stmt.expr, r"MUL\((\w+), (\w+)\)")
        if square is None or square.group(1) != square.group(2):
            continue
        sub = op(square.group(1), r"SUB\((\w+), (\w+)\)")
        mean = op(sub.group(2), r"MUL\((\w+), \(?([0-9.e+-]+)f\)?\)") if sub else None
        total = by_var.get(mean.group(1)) if mean else None
        if (
            total is not None
            and total.reduce == "sum"
            and total.expr == sub.group(1)
            and abs(float(mean.group(2)) * program.C - 1.0) < 1e-6
        ):
            pairs[stmt.var] = (total.var, sub.group(2), "centered")
    return pairs


def schedule_passes(program: RowProgram, pairs: dict[str, str]) -> tuple[dict[str, int], int]:
    """avail[var]: how many passes must end before ``var`` can be computed; and the pass count."""
    avail: dict[str, int] = {i.var: 0 for i in program.inputs}
    passes = 0
    for stmt in program.stmts:
        level = max((avail[n] for n in names_in(stmt.expr) if n in avail), default=0)
        if stmt.var in pairs:  # taken with its partner
            avail[stmt.var] = avail[pairs[stmt.var][0]]
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
    online: bool = True,
    vector_body: bool = False,
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
    pairs = online_pairs(program, online)
    avail, passes = schedule_passes(program, pairs)
    by_var = {s.var: s for s in program.stmts}
    tensor_inputs = [(k, i) for k, i in enumerate(program.inputs) if i.kind in (ELEM, COL)]
    cache = K * VW <= CACHE_MAX
    guard = C % (L * VW) != 0
    params = []
    for k, inp in enumerate(program.inputs):
        if inp.kind == PARAM:
            params.append(f"const float p{k}")
        else:
            params.append(f"__global const {inp.ctype}* restrict in{k}")
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
    # elements of a row this work-item holds (for the per-work-item means of "centered" pairs)
    head.append(f"    const float n_t = (float)({VW} * (lid < {C // VW} ? ({C // VW} - 1 - lid) / L + 1 : 0));")
    n_local = max(
        [
            sum(
                1 + (s.var in pairs and pairs[s.var][2] == "centered")
                for s in program.stmts
                if s.reduce and avail[s.var] == p + 1
            )
            for p in range(passes)
        ],
        default=0,
    )
    if n_local:
        head.append(f"    __local float lred[{n_local * L}];")
    for k, inp in enumerate(program.inputs):
        if inp.kind in (ROW, INDEX):
            lines.append(f"    const float {inp.var} = (float)in{k}[row];")
        elif inp.kind == PARAM:
            lines.append(f"    const float {inp.var} = p{k};")

    def src(k: int, inp) -> str:
        return f"in{k} + base" if inp.kind == ELEM else f"in{k}"

    def load_chunk(k: int, inp, indent: str, into: str) -> list[str]:
        """Lines putting chunk ``kk``'s VW values of input k into ``into[...]``."""
        if VW == 1:
            return [f"{indent}{into}[0] = (float)({src(k, inp)})[c0];"]
        load = f"vload{VW}(0, {src(k, inp)} + c0)"
        if inp.ctype != "float":
            load = f"convert_float{VW}({load})"
        out = [f"{indent}const float{VW} ld{k} = {load};"]
        out += [f"{indent}{into}[{lane}] = ld{k}.s{lane:x};" for lane in range(VW)]
        return out

    if cache:
        for k, _ in tensor_inputs:
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

    def element_pass(targets: list[str], emit_tail) -> list[str]:
        """A loop over this work-item's chunks computing ``targets`` per element; ``emit_tail(lane)``
        gives the lines that consume them (accumulate or store)."""
        body_vars = elem_closure(program, targets)
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
        vector = vector_body and VW > 1 and _vector_lines(body_vars, targets, reads, used_inputs)
        if vector:
            out += vector
        for lane in range(VW):
            out.append("        {")
            if vector:  # the consumers read each lane of the vector results
                out += [f"            const float {t} = {_vname(t)}.s{lane:x};" for t in dict.fromkeys(targets)]
            else:
                out.append(f"            const int i = c0 + {lane};")
                slot = f"kk * {VW} + {lane}" if cache else str(lane)
                for k, inp in used_inputs:
                    out.append(f"            const float {inp.var} = a{k}[{slot}];")
                if COLIDX in reads:
                    out.append(f"            const float {COLIDX} = (float)i;")
                for var in body_vars:
                    out.append(f"            const float {var} = {by_var[var].expr};")
            out += emit_tail(lane)
            out.append("        }")
        out += emit_tail("post")
        if guard:
            out.append("        }")
        out.append("    }")
        return out

    vnames: dict[str, str] = {}

    def _vname(name: str) -> str:
        return vnames.setdefault(name, f"gin{len(vnames)}")  # a name vectorize() accepts

    def _rename(expr: str) -> str:
        return re.sub(
            r"\b[a-z_][a-z_0-9]*\b", lambda m: _vname(m.group(0)) if m.group(0) in kinds else m.group(0), expr
        )

    def _vector_lines(body_vars, targets, reads, used_inputs) -> list[str] | None:
        """The body once on ``float{VW}`` values (CPU devices: SIMD math), or None if it cannot be."""
        exprs = [vectorize(_rename(by_var[v].expr)) for v in body_vars]
        if any(e is None for e in exprs):
            return None
        out = []
        for k, inp in used_inputs:
            source = f"vload{VW}(kk, a{k})" if cache else f"vload{VW}(0, a{k})"
            out.append(f"        const VF {_vname(inp.var)} = {source};")
        if COLIDX in reads:
            lanes = ", ".join(f"{lane}.0f" for lane in range(VW))
            out.append(f"        const VF {_vname(COLIDX)} = (VF)((float)c0) + (VF)({lanes});")
        rows = {n for v in body_vars for n in names_in(by_var[v].expr) if kinds.get(n) == ROW}
        rows |= {t for t in targets if kinds.get(t) == ROW}
        out += [f"        const VF {_vname(r)} = (VF)({r});" for r in sorted(rows)]
        out += [f"        const VF {_vname(v)} = {e};" for v, e in zip(body_vars, exprs, strict=True)]
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

        count = {s.var: len(reds) + c for c, (_, s) in enumerate(x for x in second if pairs[x[1].var][2] == "centered")}

        def accumulate(lane, group, slot=slot):
            if lane == "pre":  # the partner reductions' values shadowed by this work-item's partials
                out = []
                for _, s in group:
                    partner, shadow, how = pairs[s.var]
                    acc = f"acc{slot[partner]}_{partner}"
                    out.append(
                        f"        const float {shadow} = {acc};"
                        if how == "exp"
                        else f"        const float {shadow} = {acc} / n_t;"
                    )
                return out
            if lane == "post":
                return []
            return [
                f"            acc{j}_{s.var} = {_COMBINE[s.reduce].format(a=f'acc{j}_{s.var}', b=s.expr)};"
                for j, s in group
            ]

        lines += element_pass(
            [s.expr for _, s in first], lambda lane, first=first: [] if lane == "pre" else accumulate(lane, first)
        )
        if second:
            lines += element_pass([s.expr for _, s in second], lambda lane, second=second: accumulate(lane, second))
        for j, s in enumerate(reds):
            lines.append(f"    lred[{j * L} + lid] = acc{j}_{s.var};")
        for c in count.values():
            lines.append(f"    lred[{c * L} + lid] = n_t;")
        combine = []  # one tree for every reduction of the pass (runtime's tree_loop_c)
        for j, s in second:  # combined before their partners are
            m = slot[pairs[s.var][0]]
            m1, m2 = f"lred[{m * L} + lid]", f"lred[{m * L} + lid + h]"
            s1, s2 = f"lred[{j * L} + lid]", f"lred[{j * L} + lid + h]"
            if pairs[s.var][2] == "exp":  # rescale both partial sums to the larger max
                combine.append(f"const float mx{j} = MAX({m1}, {m2});")
                combine.append(
                    f"{s1} = ({m1} == -INFINITY ? 0.0f : {s1} * exp({m1} - mx{j}))"
                    f" + ({m2} == -INFINITY ? 0.0f : {s2} * exp({m2} - mx{j}));"
                )
                continue
            c = count[s.var]  # (count, sum, M2) of two halves merged
            na, nb = f"lred[{c * L} + lid]", f"lred[{c * L} + lid + h]"
            combine.append(f"const float na{j} = {na}, nb{j} = {nb}, n{j} = na{j} + nb{j};")
            combine.append(f"const float d{j} = (na{j} > 0.0f && nb{j} > 0.0f) ? {m2} / nb{j} - {m1} / na{j} : 0.0f;")
            combine.append(f"{s1} = {s1} + {s2} + (n{j} > 0.0f ? d{j} * d{j} * (na{j} * nb{j} / n{j}) : 0.0f);")
            combine.append(f"{na} = n{j};")
        for j, s in first:
            a, b = f"lred[{j * L} + lid]", f"lred[{j * L} + lid + h]"
            combine.append(f"{a} = {_COMBINE[s.reduce].format(a=a, b=b)};")
        lines += tree_loop_c(combine, "lid", "L / 2").rstrip("\n").split("\n")
        for j, s in enumerate(reds):
            lines.append(f"    const float {s.var} = lred[{j * L}];")
        lines.append("    barrier(CLK_LOCAL_MEM_FENCE);")

    elem_outputs = [(j, v) for j, v in enumerate(program.outputs) if kinds[v] == ELEM and j not in column_sums]
    when = "if (live) " if column_sums else ""
    summed = [(j, program.outputs[j]) for j in sorted(column_sums)]
    if summed:

        def add_columns(lane):
            if lane in ("pre", "post"):
                return []
            slot = f"kk * {VW} + {lane}"
            return [f"            cs{j}[{slot}] += live ? {v} : 0.0f;" for j, v in summed]

        lines += element_pass([v for _, v in summed], add_columns)
    if elem_outputs:

        def store(lane):
            if lane == "pre":
                return [f"        float r{j}[{VW}];" for j, _ in elem_outputs]
            if lane == "post":
                if VW == 1:
                    return [f"        {when}out{j}[base + c0] = r{j}[0];" for j, _ in elem_outputs]
                return [
                    f"        {when}vstore{VW}(vload{VW}(0, r{j}), 0, out{j} + base + c0);" for j, _ in elem_outputs
                ]
            return [f"            r{j}[{lane}] = {v};" for j, v in elem_outputs]

        lines += element_pass([v for _, v in elem_outputs], store)
    row_outputs = [(j, v) for j, v in enumerate(program.outputs) if kinds[v] != ELEM]
    if row_outputs:
        lines.append("    if (lid == 0 && live) {" if column_sums else "    if (lid == 0) {")
        lines += [f"        out{j}[row] = {v};" for j, v in row_outputs]
        lines.append("    }")
    if column_sums:
        body = ["        " + line for line in lines]
        # a fixed trip count and no branch around the barriers: a group's rows past the end
        # recompute the last row and store nothing
        lines = [f"    for (int rr = 0; rr < {rows_per_group}; ++rr) {{"]
        lines += [
            "        const int live = first_row + rr < rows;",
            f"        const {idx} row = live ? first_row + rr : rows - 1;",
            *body,
            "    }",
        ]
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
    preamble = PRIMITIVE_PREAMBLE + (vector_preamble(VW) if vector_body and VW in (2, 4, 8, 16) else "")
    return preamble + "\n" + custom_preamble() + "\n".join(lines) + "\n"


def needs_long(rows: int, cols: int) -> bool:
    """64-bit indices when the rows hold 2**31 elements or ``2 * rows`` reaches 2**31 (``index_ctype``)."""
    return index_ctype(rows * cols, 2 * rows, headroom=0) == "long"


__all__ = ["CACHE_MAX", "RowConfig", "kernel_source", "needs_long", "row_config", "schedule_passes"]
