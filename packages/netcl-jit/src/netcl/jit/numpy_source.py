"""Render fused bodies into Python functions over NumPy arrays (the NumPy backend's JIT).

The generated function computes ONE block of the output: flat same-shape work in blocks of
elements, broadcasting work in blocks of rows, sized so that a block's arrays stay in one
core's share of the cache (``host_pool.block_elements``). Ops with a NumPy ufunc twin write
into per-thread scratch buffers (``out=``), reused block after block, so a long chain allocates
nothing the size of the tensor and streams through memory once. ``compile_function`` runs the blocks on a thread pool
(``netcl.core.host_pool``): blocks are independent, so results are bit-identical for any
thread count.
"""

from __future__ import annotations

import ast
import math
import threading
from dataclasses import dataclass, field

import numpy as np

from netcl.core.host_pool import block_elements, run_blocks
from netcl.jit.codegen import Body
from netcl.jit.errors import JitError
from netcl.jit.numpy_helpers import NAMESPACE
from netcl.jit.numpy_ranges import specialize
from netcl.jit.primitive_registry import custom_numpy_helpers
from netcl.runtime.ops import c_expr

#: Helpers (and C builtins) that are exactly one NumPy ufunc on their arguments, so they can
#: write into a scratch buffer. numpy_helpers defines each of them as that same ufunc.
_UFUNCS = {
    "ADD": "add",
    "SUB": "subtract",
    "MUL": "multiply",
    "DIV": "divide",
    "NEG": "negative",
    "ABS": "absolute",
    "SIGN": "sign",
    "EXP": "exp",
    "LOG": "log",
    "LOG1P": "log1p",
    "SQRT": "sqrt",
    "TANH": "tanh",
    "MAX": "maximum",
    "MIN": "minimum",
    "POW": "power",
    "LT": "less",
    "LE": "less_equal",
    "GT": "greater",
    "GE": "greater_equal",
    "EQ": "equal",
    "NE": "not_equal",
    "SIN": "sin",
    "COS": "cos",
    "fmax": "fmax",
    "fmin": "fmin",
    "fabs": "absolute",
    "exp": "exp",
    "log": "log",
    "log1p": "log1p",
    "sqrt": "sqrt",
    "tanh": "tanh",
    "pow": "power",
}
#: Helpers with an ``out=`` twin in numpy_helpers: name -> (twin, extra scratch slots it needs).
_OUT_HELPERS = {
    "SIGMOID": ("SIGMOID_OUT", 1),
    "SIGMOID_NONNEG": ("SIGMOID_NONNEG_OUT", 0),
    "GELU": ("GELU_OUT", 2),
    "RELU_GRAD": ("RELU_GRAD_OUT", 0),
}
#: ufuncs that are several times slower with a scalar operand than with an array one (NumPy
#: 2.x has no SIMD loop for a broadcast scalar there): their literal operands become arrays.
_SLOW_SCALAR = {"maximum", "minimum", "fmax", "fmin"}
_BINOPS = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply", ast.Div: "divide"}


def to_python(expr: str) -> str:
    """A C expression as Python (``netcl.runtime.ops.c_expr.to_python``); JitError for C-only syntax."""
    try:
        return c_expr.to_python(expr)
    except ValueError as exc:
        raise JitError(str(exc)) from None


@dataclass
class _Emitter:
    """Turns body lines into statements, giving every ufunc result a scratch slot, freed after its last use."""

    uses: dict[str, int]
    statements: list[str] = field(default_factory=list)
    free: list[int] = field(default_factory=list)
    slots: int = 0
    owner: dict[str, int] = field(default_factory=dict)
    #: slot -> how many live variables hold it
    holders: dict[int, int] = field(default_factory=dict)
    #: literal value -> name of the per-thread array filled with it
    constants: dict[float, str] = field(default_factory=dict)

    def _take(self) -> int:
        if self.free:
            return self.free.pop()
        self.slots += 1
        return self.slots - 1

    def expression(self, node: ast.expr, temps: list[int], read: list[str], target: str | None = None) -> str:
        """Python source for ``node``; its result's slot (if any) is appended to ``temps``.

        Variables read are appended to ``read``; their slots are freed only after the whole line,
        so no temporary of this line overwrites a variable it still has to read. ``target``: the
        array the top-level ufunc writes into instead of a slot (an output block).
        """
        if isinstance(node, ast.Name):
            read.append(node.id)
            return node.id
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _OUT_HELPERS:
            return self._out_helper(node, temps, read, target)
        ufunc, args = _as_ufunc(node)
        if ufunc is None:  # a call NumPy has no single ufunc for: evaluated as is (block-sized result)
            read.extend(child.id for child in ast.walk(node) if isinstance(child, ast.Name))
            return ast.unparse(node)
        operand_temps: list[int] = []
        parts = [self._operand(arg, operand_temps, read, ufunc) for arg in args]
        # the operands' temporaries die here; the result may reuse one (a ufunc reads element i
        # before it writes element i, so out= may alias an input)
        self.free.extend(operand_temps)
        return f"np.{ufunc}({', '.join(parts)}, out={target or self._result_slot(temps)})"

    def _result_slot(self, temps: list[int]) -> str:
        slot = self._take()
        temps.append(slot)
        return f"S{slot}"

    def _operand(self, node: ast.expr, temps: list[int], read: list[str], ufunc: str) -> str:
        if ufunc in _SLOW_SCALAR and isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return self.constants.setdefault(float(node.value), f"K{len(self.constants)}")
        return self.expression(node, temps, read)

    def _out_helper(self, node: ast.Call, temps: list[int], read: list[str], target: str | None = None) -> str:
        """``TWIN(args..., out, scratch...)``: the scratch slots differ from the operands and the result."""
        twin, extra = _OUT_HELPERS[node.func.id]
        operand_temps: list[int] = []
        parts = [self.expression(arg, operand_temps, read) for arg in node.args]
        scratch = [self._take() for _ in range(extra)]
        self.free.extend(operand_temps)
        out = target or self._result_slot(temps)
        self.free.extend(scratch)
        return f"{twin}({', '.join(parts + [out] + [f'S{k}' for k in scratch])})"

    def line(self, var: str, expr: str, target: str | None = None) -> bool:
        """Emit ``var = expr``; True when the value was written straight into ``target``."""
        temps: list[int] = []
        read: list[str] = []
        node = ast.parse(to_python(expr), mode="eval").body
        if isinstance(node, ast.Name):  # the same array under a second name (a slot counts its holders)
            source = node.id
            read.append(node.id)
            if node.id in self.owner and self.uses.get(var, 0) > 0:
                self._hold(var, self.owner[node.id])
            target = None
        else:
            if not (
                _as_ufunc(node)[0] or (isinstance(node, ast.Call) and getattr(node.func, "id", "") in _OUT_HELPERS)
            ):
                target = None
            source = self.expression(node, temps, read, target)
        self.statements.append(f"{var} = {source}")
        for name in read:
            if name in self.uses:
                self.uses[name] -= 1
                if self.uses[name] == 0 and name in self.owner:
                    self._release(name)
        if temps:  # the result's slot now belongs to ``var``
            if self.uses.get(var, 0) > 0:
                self._hold(var, temps[0])
            else:
                self.free.append(temps[0])
        return target is not None

    def _hold(self, var: str, slot: int) -> None:
        self.owner[var] = slot
        self.holders[slot] = self.holders.get(slot, 0) + 1

    def _release(self, var: str) -> None:
        slot = self.owner.pop(var)
        self.holders[slot] -= 1
        if self.holders[slot] == 0:
            self.free.append(slot)


def _as_ufunc(node: ast.expr) -> tuple[str | None, list[ast.expr]]:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id == "RELU" and len(node.args) == 1:
            return "maximum", [node.args[0], ast.Constant(0.0)]
        if node.func.id in _UFUNCS:
            return _UFUNCS[node.func.id], list(node.args)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)], [node.left, node.right]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return "negative", [node.operand]
    return None, []


def _live_lines(body: Body) -> list[tuple[str, str]]:
    """The lines some result depends on (a backward recomputes the forward up to its output, which
    it may never read)."""
    live = set(body.results)
    kept = []
    for var, expr in reversed(body.lines):
        if var in live:
            kept.append((var, expr))
            live.update(n.id for n in ast.walk(ast.parse(to_python(expr), mode="eval")) if isinstance(n, ast.Name))
    return kept[::-1]


def _count_uses(body: Body) -> dict[str, int]:
    uses = {var: 0 for var, _ in body.lines}
    for _, expr in body.lines:
        for child in ast.walk(ast.parse(to_python(expr), mode="eval")):
            if isinstance(child, ast.Name) and child.id in uses:
                uses[child.id] += 1
    for var in body.results:
        uses[var] = uses.get(var, 0) + 1
    return uses


def function_source(name: str, input_shapes: list, out_shape: tuple[int, ...], body: Body, has_gout: bool) -> str:
    """Source of ``def name(ins, outs, g, s, e, S)`` (one block) and its ``LAYOUT``.

    ``ins[k]`` is an array (flattened or rank-padded by the caller) or a float32 scalar;
    ``S`` are this thread's scratch buffers; ``LAYOUT`` says how ``compile_function`` blocks.
    """
    flat = all(s is None or math.prod(s) == math.prod(out_shape) for s in input_shapes)
    ndim = len(out_shape)
    body = Body(specialize([(var, to_python(expr)) for var, expr in _live_lines(body)]), body.results)
    emitter = _Emitter(_count_uses(body))
    first_output = {}
    for j, var in enumerate(body.results):
        first_output.setdefault(var, j)
    in_place = set()
    for var, expr in body.lines:
        if emitter.line(var, expr, f"O{first_output[var]}" if var in first_output else None):
            in_place.add(var)
    scratch = emitter.slots if ndim else 0
    live = sum(s is not None for s in input_shapes) + len(body.results) + scratch + int(has_gout)
    block = block_elements(live)
    lines = [f"def {name}(ins, outs, g, s, e, S):"]
    if flat:
        layout = {"flat": True, "ndim": ndim, "block": block, "slots": scratch, "slot_shape": (block,)}
        for k, shape in enumerate(input_shapes):
            lines.append(f"    x{k} = ins[{k}][s:e]" if shape is not None else f"    x{k} = ins[{k}]")
        target = "outs[{j}][s:e]"
    else:
        row_size = max(1, math.prod(out_shape[1:])) if ndim else 1
        step = max(1, block // row_size)
        layout = {"flat": False, "ndim": ndim, "block": step, "slots": scratch, "slot_shape": (step, *out_shape[1:])}
        for k, shape in enumerate(input_shapes):
            if shape is None:
                lines.append(f"    x{k} = ins[{k}]")
            else:
                lead = ((1,) * (ndim - len(shape)) + tuple(shape))[0] if ndim else 1
                lines.append(f"    x{k} = ins[{k}][s:e]" if lead != 1 else f"    x{k} = ins[{k}]")
        target = "outs[{j}][s:e]" if ndim else "outs[{j}][...]"
    if has_gout:
        lines.append("    gout = g[s:e]" if (flat or ndim) else "    gout = g")
    constants = sorted(emitter.constants.items(), key=lambda item: int(item[1][1:])) if ndim else []
    layout["constants"] = [value for value, _ in constants]
    if ndim:
        names = [f"S{i}" for i in range(scratch)] + [name for _, name in constants]
        lines.append("    m = e - s")
        if names:
            lines.append("    " + ", ".join(names) + ", = [t[:m] for t in S]")
        lines += [f"    O{j} = {target.format(j=j)}" for j in sorted(set(first_output.values()))]
        statements = emitter.statements
    else:  # 0-d output: plain expressions, no scratch
        statements = [f"{var} = {to_python(expr)}" for var, expr in body.lines]
        in_place = set()
    lines += ["    " + statement for statement in statements]
    for j, var in enumerate(body.results):
        if not (var in in_place and first_output[var] == j):
            lines.append(f"    {target.format(j=j)} = {var}")
    return f"LAYOUT = {layout!r}\n" + "\n".join(lines) + "\n"


def compile_function(name: str, source: str):
    """exec the generated source in the helper namespace; return ``run(ins, outs, gout=None)``."""
    namespace = {**NAMESPACE, **custom_numpy_helpers()}  # helpers of register_primitive(..., numpy_helpers=)
    try:
        exec(compile(source, f"<netcl-jit {name}>", "exec"), namespace)
    except SyntaxError as exc:
        raise JitError(f"generated NumPy source does not compile: {exc}\n{source}") from exc
    block_fn = namespace[name]
    layout = namespace["LAYOUT"]
    local = threading.local()

    def scratch() -> list[np.ndarray]:
        buffers = getattr(local, "buffers", None)
        if buffers is None:
            shape = layout["slot_shape"]
            buffers = [np.empty(shape, np.float32) for _ in range(layout["slots"])]
            buffers += [np.full(shape, value, np.float32) for value in layout["constants"]]
            local.buffers = buffers
        return buffers

    def run(ins, outs, gout=None):
        if layout["flat"]:
            ins = [x.reshape(-1) if hasattr(x, "reshape") else x for x in ins]
            outs = [o.reshape(-1) for o in outs]
            gout = gout.reshape(-1) if gout is not None else None
            total = outs[0].size
        else:
            ndim = layout["ndim"]
            ins = [x.reshape((1,) * (ndim - x.ndim) + x.shape) if hasattr(x, "ndim") else x for x in ins]
            total = outs[0].shape[0] if ndim else 1

        def one_block(start: int, stop: int) -> None:
            block_fn(ins, outs, gout, start, stop, scratch())

        run_blocks(total, layout["block"], one_block)

    run.source = source  # type: ignore[attr-defined]
    run.layout = layout  # type: ignore[attr-defined]
    return run
