"""Render fused bodies into Python functions over NumPy arrays (the NumPy backend's JIT).

The generated function walks the output in cache-sized blocks and writes each block's result
into preallocated output arrays, so a long chain does not stream through memory once per op.
"""

from __future__ import annotations

import math
import re

import numpy as np

from netcl.jit.codegen import Body
from netcl.jit.errors import JitError
from netcl.jit.numpy_helpers import NAMESPACE
from netcl.jit.primitives import custom_numpy_helpers

BLOCK_ELEMENTS = 1 << 14
_FLOAT_SUFFIX = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[fF]\b")


def to_python(expr: str) -> str:
    """A C expression as Python: float literal suffixes dropped; C-only syntax is refused."""
    if any(token in expr for token in ("?", "&&", "||", "->", "++", "--")):
        raise JitError(f"expression {expr!r} uses C syntax the NumPy path cannot run")
    return _FLOAT_SUFFIX.sub(r"\1", expr)


def function_source(name: str, input_shapes: list, out_shape: tuple[int, ...], body: Body, has_gout: bool) -> str:
    """Source of ``def name(ins, outs, g_all)``; ``ins[k]`` is an array or a float32 scalar."""
    flat = all(s is None or math.prod(s) == math.prod(out_shape) for s in input_shapes)
    lines = [f"def {name}(ins, outs, g_all):"]
    if flat:
        lines.append("    total = outs[0].size")
        lines.append("    flat_in = [x.reshape(-1) if hasattr(x, 'reshape') else x for x in ins]")
        lines.append("    flat_out = [o.reshape(-1) for o in outs]")
        lines.append("    flat_g = g_all.reshape(-1) if g_all is not None else None")
        lines.append(f"    for s in range(0, total, {BLOCK_ELEMENTS}):")
        lines.append(f"        e = min(s + {BLOCK_ELEMENTS}, total)")
        for k, shape in enumerate(input_shapes):
            lines.append(f"        x{k} = flat_in[{k}][s:e]" if shape is not None else f"        x{k} = flat_in[{k}]")
        if has_gout:
            lines.append("        gout = flat_g[s:e]")
        target = "flat_out[{j}][s:e]"
    else:
        ndim = len(out_shape)
        rows = out_shape[0] if ndim else 1
        row_size = max(1, math.prod(out_shape[1:])) if ndim else 1
        step = max(1, BLOCK_ELEMENTS // row_size)
        pad = f"x.reshape((1,) * ({ndim} - x.ndim) + x.shape)"
        lines.append(f"    padded = [{pad} if hasattr(x, 'ndim') else x for x in ins]")
        lines.append(f"    for s in range(0, {rows}, {step}):")
        lines.append(f"        e = min(s + {step}, {rows})")
        for k, shape in enumerate(input_shapes):
            if shape is None:
                lines.append(f"        x{k} = padded[{k}]")
            else:
                lead = ((1,) * (ndim - len(shape)) + tuple(shape))[0] if ndim else 1
                lines.append(f"        x{k} = padded[{k}][s:e]" if lead != 1 else f"        x{k} = padded[{k}]")
        if has_gout:
            lines.append("        gout = g_all[s:e]" if ndim else "        gout = g_all")
        target = "outs[{j}][s:e]" if ndim else "outs[{j}][...]"
    for var, expr in body.lines:
        lines.append(f"        {var} = {to_python(expr)}")
    for j, var in enumerate(body.results):
        lines.append(f"        {target.format(j=j)} = {var}")
    return "\n".join(line for line in lines if line) + "\n"


def compile_function(name: str, source: str):
    """exec the generated source in the helper namespace and return the function."""
    namespace = {**NAMESPACE, **custom_numpy_helpers()}  # helpers of register_primitive(..., numpy_helpers=)
    try:
        exec(compile(source, f"<netcl-jit {name}>", "exec"), namespace)
    except SyntaxError as exc:
        raise JitError(f"generated NumPy source does not compile: {exc}\n{source}") from exc
    function = namespace[name]

    def run(ins, outs, gout=None):
        with np.errstate(all="ignore"):
            function(ins, outs, gout)

    run.source = source  # type: ignore[attr-defined]
    return run
