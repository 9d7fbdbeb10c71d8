"""Row programs: elementwise work around reductions along the last axis, as straight-line statements.

A row program runs once per row of ``C`` elements. Its values are ``elem`` (one per element of
the row) or ``row`` (one per row: a reduction's result, a per-row input, a scalar). Statements are
elementwise C expressions (the primitives' templates, so the same text runs as NumPy) or
reductions (``sum``/``max``/``min`` of an elem value over the row). ``row_source`` renders a
program as one OpenCL kernel (one work-group per row; ``row_serial``: one work-item per row, on CPU
devices), ``row_numpy`` as NumPy over all rows.

``backward_program`` derives, from a forward program, the program of one output's gradient:
the forward recomputed from the saved reduction results (``stat`` inputs), then reverse mode,
where the gradient of a row value fed to elem consumers is itself a row reduction.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from netcl.jit.errors import JitError
from netcl.jit.primitive_registry import get_primitive

ELEM, COL, ROW, PARAM, INDEX = "elem", "col", "row", "param", "index"
#: The column index of the element (a float), readable by any elem statement.
COLIDX = "colidx"
_IDENT = re.compile(r"\b[a-z_][a-z_0-9]*\b")


@dataclass
class Stmt:
    """``var = expr`` (elementwise), or ``var = reduce(expr)`` over the row when ``reduce`` is set.

    ``op``/``args``/``attrs``: the primitive an elementwise statement applies (its gradient rule);
    "" for a copy or a statement without a gradient. ``grad``: False for a reduction the gradient
    does not flow through (the max a softmax subtracts: the result does not depend on it).
    """

    var: str
    kind: str
    expr: str
    reduce: str = ""
    op: str = ""
    args: tuple[str, ...] = ()
    attrs: dict = field(default_factory=dict)
    grad: bool = True


@dataclass
class RowInput:
    """An input: ``elem`` (the row's elements), ``col`` (one value per column, shared by all rows),
    ``row`` (one value per row), ``index`` (one int32 per row, read as a float: a class target) or
    ``param`` (a scalar kernel argument)."""

    var: str
    kind: str
    #: C type of the buffer (elem / col / row inputs other than float32 - a mask - are read and converted to float)
    ctype: str = "float"


@dataclass
class RowProgram:
    """Inputs, statements in dependency order, and outputs (variable names) of one row program."""

    C: int
    inputs: list[RowInput]
    stmts: list[Stmt]
    outputs: list[str]

    def kinds(self) -> dict[str, str]:
        kinds = {i.var: (ROW if i.kind in (ROW, PARAM, INDEX) else ELEM) for i in self.inputs}
        kinds[COLIDX] = ELEM
        kinds.update({s.var: s.kind for s in self.stmts})
        return kinds

    def output_kinds(self) -> list[str]:
        kinds = self.kinds()
        return [kinds[o] for o in self.outputs]


def names_in(expr: str) -> list[str]:
    """The variable names an expression reads (lower-case identifiers; helpers are upper case)."""
    return _IDENT.findall(expr)


def elem_closure(program: RowProgram, targets: list[str]) -> list[str]:
    """The elem statements (in program order) computing ``targets`` takes, every row value being known."""
    return closure_past(program, targets, ())[0]


def closure_past(program: RowProgram, targets: list[str], known: Collection[str]) -> tuple[list[str], list[str]]:
    """``elem_closure`` when the values in ``known`` are known too: (the elem statements it takes, the ``known``
    values it reads), each in program order."""
    by_var = {s.var: s for s in program.stmts}
    needed: set[str] = set()
    reads: set[str] = set()
    stack = list(targets)
    while stack:
        var = stack.pop()
        if var in known:
            reads.add(var)
            continue
        stmt = by_var.get(var)
        if stmt is None or stmt.reduce or stmt.kind != ELEM or var in needed:
            continue
        needed.add(var)
        stack.extend(names_in(stmt.expr))
    order = [s.var for s in program.stmts]
    return [v for v in order if v in needed], [v for v in order if v in reads]


def copies(exprs: Mapping[str, str], var: str, source: str) -> bool:
    """Whether ``var`` holds ``source`` itself: a chain of statements (``exprs``: variable -> expression) each
    copying one name, ending at ``source``."""
    while var != source:
        var = exprs.get(var, "").strip()
        if var != source and var not in exprs:
            return False
    return True


def kind_of(expr: str, kinds: dict[str, str]) -> str:
    return ELEM if any(kinds.get(n) == ELEM for n in names_in(expr)) else ROW


class Builder:
    """Appends statements with fresh names (``t0``, ``t1``, ...) and tracks each value's kind."""

    def __init__(self, cols: int, inputs: list[RowInput], prefix: str = "t") -> None:
        self.C = cols
        self.inputs = inputs
        self.stmts: list[Stmt] = []
        self.kinds = {i.var: (ROW if i.kind in (ROW, PARAM, INDEX) else ELEM) for i in inputs}
        self.kinds[COLIDX] = ELEM
        self._prefix = prefix
        self._count = 0

    def fresh(self) -> str:
        self._count += 1
        return f"{self._prefix}{self._count - 1}"

    def add(self, stmt: Stmt) -> str:
        self.stmts.append(stmt)
        self.kinds[stmt.var] = stmt.kind
        return stmt.var

    def prim(self, op: str, args: list[str], attrs: dict | None = None, var: str | None = None) -> str:
        primitive = get_primitive(op)
        if primitive is None:
            raise JitError(f"no primitive registered for {op!r}")
        attrs = dict(attrs or {})
        expr = primitive.forward(list(args), attrs)
        kind = ELEM if any(self.kinds[a] == ELEM for a in args) else ROW
        return self.add(Stmt(var or self.fresh(), kind, expr, op=op, args=tuple(args), attrs=attrs))

    def scalar(self, op: str, arg: str, value: float, var: str | None = None) -> str:
        """``op`` of ``arg`` and a Python constant (``mul`` -> ``mul_scalar_right``)."""
        return self.prim(f"{op}_scalar_right", [arg], {"scalar": float(value)}, var=var)

    def expr(self, expr: str, kind: str | None = None, var: str | None = None) -> str:
        """A statement with no gradient rule (the backward's own arithmetic)."""
        kind = kind or kind_of(expr, self.kinds)
        return self.add(Stmt(var or self.fresh(), kind, expr))

    def reduce(self, how: str, arg: str, grad: bool = True, var: str | None = None) -> str:
        if self.kinds[arg] != ELEM:
            raise JitError(f"internal error: reduction of a row value {arg}")
        return self.add(Stmt(var or self.fresh(), ROW, arg, reduce=how, grad=grad))

    def mean(self, arg: str) -> str:
        return self.scalar("mul", self.reduce("sum", arg), 1.0 / self.C)


def _is_zero(expr: str) -> bool:
    return expr.strip() in ("0.0f", "0", "0.0", "(0.0f)")


def backward_program(forward: RowProgram, output: int, wants: list[bool]) -> tuple[RowProgram, list[int], list[int]]:
    """The program of one output's gradient: (program, forward-input index per gradient output, stat statements).

    Its inputs are the forward's inputs, then one ``row`` input per forward reduction (the saved
    result, ``s{j}``; the list returned names which reductions), then ``gout`` (the output's
    upstream gradient, of the output's kind). Its outputs are the gradients of the inputs that
    want one and that the output reaches through a non-zero term.
    """
    reductions = [s for s in forward.stmts if s.reduce]
    stat_vars = {s.var: f"s{j}" for j, s in enumerate(reductions)}
    out_var = forward.outputs[output]
    out_kind = forward.kinds()[out_var]
    inputs = [*forward.inputs, *(RowInput(stat_vars[s.var], ROW) for s in reductions)]
    inputs.append(RowInput("gout", ELEM if out_kind == ELEM else ROW))
    b = Builder(forward.C, inputs, prefix="b")
    for stmt in forward.stmts:  # the forward again, reductions read from the saved results
        if stmt.reduce:
            b.add(Stmt(stmt.var, ROW, stat_vars[stmt.var]))
        else:
            b.add(Stmt(stmt.var, stmt.kind, stmt.expr))
    needs = {i.var: w and i.kind not in (PARAM, INDEX) for i, w in zip(forward.inputs, wants, strict=True)}
    for stmt in forward.stmts:
        deps = [stmt.expr] if stmt.reduce else list(stmt.args)
        needs[stmt.var] = stmt.grad and any(needs.get(d, False) for d in deps)
    terms: dict[str, list[str]] = {out_var: ["gout"]}

    def finish(var: str) -> str | None:
        """One variable holding the gradient of ``var`` (a row value's elem terms reduced over the row)."""
        parts = [t for t in terms.get(var, []) if not _is_zero(t)]
        if not parts:
            return None
        if b.kinds[var] == ELEM:  # ELEM also when every term is a row value (gout of a sum broadcast back)
            return b.expr(" + ".join(f"({t})" for t in parts) if len(parts) > 1 else parts[0], ELEM)
        elem = [t for t in parts if kind_of(t, b.kinds) == ELEM]
        row = [t for t in parts if kind_of(t, b.kinds) != ELEM]
        if elem:
            total = b.expr(" + ".join(f"({t})" for t in elem) if len(elem) > 1 else elem[0], ELEM)
            row.append(b.reduce("sum", total))
        return b.expr(" + ".join(f"({t})" for t in row) if len(row) > 1 else row[0], ROW)

    for stmt in reversed(forward.stmts):
        if not needs.get(stmt.var) or stmt.var not in terms:
            continue
        grad = finish(stmt.var)
        if grad is None:
            continue
        if stmt.reduce:
            if stmt.reduce == "sum":
                terms.setdefault(stmt.expr, []).append(grad)
            else:  # max / min: shared equally among the tied elements, as the eager op (0 elsewhere, also
                # where the share is NaN: WHERE, not MUL)
                hit = b.expr(f"EQ({stmt.expr}, {stmt.var})", ELEM)
                count = b.reduce("sum", hit)
                terms.setdefault(stmt.expr, []).append(f"WHERE({hit}, DIV({grad}, {count}), 0.0f)")
            continue
        if not stmt.op:
            continue
        exprs = get_primitive(stmt.op).backward(list(stmt.args), grad, stmt.attrs, stmt.var)
        for arg, expr in zip(stmt.args, exprs, strict=True):
            if needs.get(arg) and not _is_zero(expr):
                terms.setdefault(arg, []).append(expr)
    outputs, which = [], []
    for k, inp in enumerate(forward.inputs):
        if not needs[inp.var]:
            continue
        grad = finish(inp.var)
        if grad is None:
            continue
        if b.kinds[grad] != (ELEM if inp.kind in (ELEM, COL) else ROW):  # e.g. an elem input's gradient is a row value
            grad = b.expr(f"ADD({grad}, 0.0f)", ELEM if inp.kind in (ELEM, COL) else ROW)
        outputs.append(grad)
        which.append(k)
    program = RowProgram(forward.C, inputs, b.stmts, outputs)
    return program, which, [j for j, _ in enumerate(reductions)]
