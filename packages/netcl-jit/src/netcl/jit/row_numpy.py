"""A row program (``row_ir``) as a Python function over NumPy arrays: the NumPy backend's twin.

Elem values are ``(rows, C)`` arrays (col inputs ``(1, C)``), row values ``(rows, 1)``, params
float32 scalars; a reduction is ``np.sum``/``np.max``/``np.min`` along the last axis. The same C
expressions as the OpenCL kernel run through ``numpy_source.to_python`` and the helper namespace.
Rows are independent, so blocks of rows run on the host thread pool.
"""

from __future__ import annotations

import numpy as np

from netcl.core.host_pool import block_elements, run_blocks
from netcl.jit.errors import JitError
from netcl.jit.numpy_helpers import NAMESPACE
from netcl.jit.numpy_source import to_python
from netcl.jit.primitive_registry import custom_numpy_helpers
from netcl.jit.row_ir import COL, COLIDX, ELEM, INDEX, PARAM, ROW, RowProgram, names_in

_REDUCE = {"sum": "np.sum", "max": "np.max", "min": "np.min"}


def function_source(name: str, program: RowProgram) -> str:
    """``def name(ins, outs, s, e)``: the rows ``s:e`` (inputs as (rows, C) / (1, C) / (rows, 1) / scalars)."""
    lines = [f"def {name}(ins, outs, s, e):"]
    for k, inp in enumerate(program.inputs):
        if inp.kind in (ELEM, ROW, INDEX):
            lines.append(f"    {inp.var} = ins[{k}][s:e]")
        else:
            lines.append(f"    {inp.var} = ins[{k}]")
    if any(COLIDX in names_in(stmt.expr) for stmt in program.stmts):
        lines.append(f"    {COLIDX} = np.arange({program.C}, dtype=np.float32)[None, :]")
    per_column = {i.var for i in program.inputs if i.kind in (ELEM, COL)} | {COLIDX}
    for stmt in program.stmts:
        if stmt.reduce:
            lines.append(f"    {stmt.var} = {_REDUCE[stmt.reduce]}({stmt.expr}, axis=-1, keepdims=True)")
        elif stmt.kind == ELEM and not per_column.intersection(names_in(stmt.expr)):
            # an elem value computed from row values only (a row's gradient broadcast back): (rows, C)
            lines.append(f"    {stmt.var} = np.broadcast_to({to_python(stmt.expr)}, (e - s, {program.C}))")
            per_column.add(stmt.var)
        else:
            lines.append(f"    {stmt.var} = {to_python(stmt.expr)}")
            if stmt.kind == ELEM:
                per_column.add(stmt.var)
    for j, var in enumerate(program.outputs):
        lines.append(f"    outs[{j}][s:e] = {var}")
    return "\n".join(lines) + "\n"


def compile_function(name: str, program: RowProgram):
    """``run(ins, outs, rows)``: ``ins`` arrays shaped as ``function_source`` says, ``outs`` (rows, C) / (rows, 1)."""
    source = function_source(name, program)
    namespace = {**NAMESPACE, **custom_numpy_helpers()}
    try:
        exec(compile(source, f"<netcl-jit {name}>", "exec"), namespace)
    except SyntaxError as exc:
        raise JitError(f"generated NumPy source does not compile: {exc}\n{source}") from exc
    block_fn = namespace[name]
    live = sum(i.kind in (ELEM, COL) for i in program.inputs) + len(program.stmts) + len(program.outputs)
    step = max(1, block_elements(live) // max(1, program.C))

    def run(ins, outs, rows: int) -> None:
        run_blocks(rows, step, lambda s, e: block_fn(ins, outs, s, e))

    run.source = source  # type: ignore[attr-defined]
    return run


def shaped_inputs_for(inputs: list, values: list, rows: int, cols: int) -> list:
    """Arrays of the forms ``function_source`` reads (params as float32 scalars)."""
    out = []
    for inp, v in zip(inputs, values, strict=True):
        if inp.kind == PARAM:
            out.append(np.float32(v))
        elif inp.kind == ELEM:
            out.append(_as_float(v).reshape(rows, cols))
        elif inp.kind == COL:
            out.append(_as_float(v).reshape(1, cols))
        elif inp.kind == INDEX:
            out.append(np.asarray(v).reshape(rows, 1).astype(np.float32))
        else:
            out.append(_as_float(v).reshape(rows, 1))
    return out


def _as_float(v) -> np.ndarray:
    """An input as the float32 values the program computes with (a mask or integer codes converted)."""
    return np.asarray(v).astype(np.float32, copy=False)
