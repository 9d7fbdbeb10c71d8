"""Random elementwise programs for the JIT fuzzer: generation, the netcl function, the interval reference.

A ``Case`` is a straight-line program over tensor inputs of one broadcast family (every shape of
a family broadcasts with every other), an optional boolean mask input over the last axis (used by
``where(mask, x, fill)`` followed by a reduction over the last axis, as a user's masked softmax),
an optional Python-scalar argument, 1-12 instructions that may reuse any earlier value (shared
sub-expressions), 1-3 outputs and one upstream gradient per output. ``make_function`` turns it
into a Python function of ``netcl.autograd`` ops (what a user would decorate with
``jit_compile``; its arguments: the inputs, the mask if any, the scalar if any); ``reference``
evaluates it on intervals (``interval_reference``) forward and in reverse mode, with the gradient
formulas the ops document, so float32 results of any correct implementation lie inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import file_modules
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import netcl.autograd as ag


def _load_interval() -> Any:
    return file_modules.load("tests/reliability/interval_reference.py", "netcl_reliability_interval_reference")


R = _load_interval()  # the interval reference
Iv = R.Iv

#: (output shape, member shapes): every pair of members broadcasts to a member or the output.
FAMILIES: list[tuple[tuple[int, ...], list[tuple[int, ...]]]] = [
    ((9,), [(9,)]),  # same shape everywhere: the float4 path with a scalar tail
    ((6,), [(6,), (1,), ()]),
    ((3, 4), [(3, 4), (1, 4), (3, 1), (4,), ()]),
    ((2, 3, 4), [(2, 3, 4), (3, 4), (2, 1, 4), (1, 3, 1), ()]),
    ((0, 4), [(0, 4), (1, 4), (4,), ()]),  # zero-size output, broadcast inputs
    ((3, 0), [(3, 0), (1, 0), (3, 1), (0,), ()]),  # reducing the last axis reduces zero elements
    ((2, 0, 3), [(2, 0, 3), (0, 3), (2, 1, 3), (1, 0, 1), ()]),  # a zero-size middle axis
    ((), [()]),
]
#: Input magnitudes: mostly O(1), sometimes tiny, large, or near float32's limit; 0 means small
#: integers (-2..2), which make ties (maximum, comparisons) and exact zeros (relu, abs, where) common.
SCALES = [0.0, 1.0, 1.0, 3.0, 30.0, 1e-3, 1e4, 1e19, 3e38, math.inf]
#: The elements of the ``math.inf`` scale: the special bases of pow (zeros, negatives, infinities).
SPECIAL_ELEMENTS = [0.0, -0.0, -1.0, -2.0, -0.5, 0.5, 2.0, math.inf, -math.inf]
#: Reductions (keepdims=True, so the result still broadcasts with the family) and their axes;
#: ``max`` and ``min`` over zero elements are errors (tested in test_bad_inputs), so not drawn there.
REDUCTIONS = ["sum", "mean", "max", "min"]
EXTREMES = {"max", "min"}
#: The else-value of a masked ``where`` (-inf: a masked softmax's; a masked-out row then reduces to
#: -inf, or to NaN once it meets -inf - -inf).
MASK_FILLS = [-math.inf, -math.inf, 0.0, -1e30, 1.0]
REDUCE_AXES = [-1, -1, 0, None]
UNARY = ["neg", "exp", "log", "sqrt", "abs", "relu", "gelu", "sigmoid", "tanh"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "lt", "le", "gt", "ge"]
COMPARE = {"lt", "le", "gt", "ge"}
#: Comparisons cut gradients: drawn half as often as the differentiable binary ops.
BINARY_WEIGHTED = [op for op in BINARY for _ in range(1 if op in COMPARE else 2)]
SPECIAL_SCALARS = [0.0, 1.0, -1.0, 0.5, 2.0, 3.0, -2.0, 1e-3, 1e30, -1e30, 0.1, 2, -1, 0]


@dataclass(frozen=True)
class Instr:
    """One op. ``kind``: u (unary), b (binary), sr/sl (Python scalar right/left), pr/pl (the scalar
    argument right/left), where, where_s (scalar else-branch: an eager op), mwhere (``where(mask,
    x, consts[0])`` with the case's boolean mask), clamp_s, clamp_t, sum (a reduction ``op``)."""

    kind: str
    op: str
    args: tuple[int, ...]
    consts: tuple[Any, ...] = ()

    @property
    def axis(self) -> int | None:
        """The axis of a reduction (``sum``/``mean``/``max``/``min``, keepdims): the last one unless given."""
        return self.consts[0] if self.consts else -1


@dataclass
class Case:
    inputs: list[np.ndarray]
    requires_grad: list[bool]
    param: float | None
    program: list[Instr]
    outputs: list[int]
    upstream: list[np.ndarray] = field(default_factory=list)
    #: a boolean array over the family's last axis, the first argument after the inputs (or None)
    mask: np.ndarray | None = None

    @property
    def n_in(self) -> int:
        return len(self.inputs)

    def shapes(self) -> list[tuple[int, ...]]:
        shapes = [tuple(x.shape) for x in self.inputs]
        for ins in self.program:
            if ins.kind == "sum":
                shapes.append(_reduced_shape(shapes[ins.args[0]], ins.axis))
            elif ins.kind == "mwhere":
                shapes.append(tuple(np.broadcast_shapes(shapes[ins.args[0]], self.mask.shape)))
            else:
                shapes.append(tuple(np.broadcast_shapes(*(shapes[a] for a in ins.args))))
        return shapes

    def __repr__(self) -> str:
        lines = [f"Case(param={self.param!r}, outputs={self.outputs})"]
        if self.mask is not None:
            lines.append(f"  mask = {np.array2string(self.mask)}")
        for i, (x, rg) in enumerate(zip(self.inputs, self.requires_grad, strict=True)):
            lines.append(f"  v{i} = input {x.shape} requires_grad={rg}: {np.array2string(x, precision=9)}")
        for k, ins in enumerate(self.program):
            lines.append(f"  v{self.n_in + k} = {ins.kind}:{ins.op} {list(ins.args)} {list(ins.consts)}")
        for j, u in enumerate(self.upstream):
            lines.append(f"  upstream[{j}] = {np.array2string(u, precision=9)}")
        return "\n".join(lines)


def reduce_axes(shape: tuple[int, ...], axis: int | None) -> tuple[int, ...]:
    """The axes a reduction over ``axis`` covers (all for None; none for a 0-d value)."""
    if not shape:
        return ()
    return tuple(range(len(shape))) if axis is None else (axis % len(shape),)


def _reduced_shape(shape: tuple[int, ...], axis: int | None) -> tuple[int, ...]:
    """A keepdims reduction: still broadcasts with every shape of the family."""
    axes = reduce_axes(shape, axis)
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def reduces_nothing(shape: tuple[int, ...], axis: int | None) -> bool:
    """Does the reduction cover zero elements (non-empty output, empty reduced axes)?"""
    return math.prod(shape[a] for a in reduce_axes(shape, axis)) == 0


# ---- generation -----------------------------------------------------------------------------------
def _scalars() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(SPECIAL_SCALARS), st.floats(-100, 100, width=32, allow_subnormal=False))


def _array(draw: Any, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Every element drawn on its own (no fill value: hypothesis would make most of them equal)."""
    if scale == 0.0:
        elements = st.sampled_from([-2.0, -1.0, 0.0, 1.0, 2.0])
    elif math.isinf(scale):
        elements = st.sampled_from(SPECIAL_ELEMENTS)
    else:
        scale = float(np.float32(scale))
        elements = st.floats(-scale, scale, width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    return draw(hnp.arrays(np.float32, shape, elements=elements, fill=st.nothing()))


def _upstream(draw: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Upstream gradients: mostly of magnitude 0.5-4 (a zero gradient hides a wrong formula), some 0."""
    nonzero = st.builds(
        lambda sign, m: sign * m, st.sampled_from([-1.0, 1.0]), st.floats(0.5, 4.0, width=32, allow_subnormal=False)
    )
    elements = st.one_of(nonzero, nonzero, nonzero, st.just(0.0))
    return draw(hnp.arrays(np.float32, shape, elements=elements, fill=st.nothing()))


@st.composite
def cases(draw: Any, max_ops: int = 12) -> Case:
    """A random program (see the module docstring)."""
    out_shape, members = draw(st.sampled_from(FAMILIES))
    n_in = draw(st.integers(1, 3))
    shapes = [draw(st.sampled_from(members)) for _ in range(n_in)]
    inputs = [_array(draw, s, draw(st.sampled_from(SCALES))) for s in shapes]
    requires_grad = [True] + [draw(st.booleans()) for _ in range(n_in - 1)]
    param = draw(st.one_of(st.none(), _scalars()))
    n_ops = draw(st.integers(1, max_ops))
    program: list[Instr] = []
    mask: np.ndarray | None = None
    while len(program) < n_ops:
        count = n_in + len(program)
        pick = st.one_of(st.just(count - 1), st.integers(0, count - 1))  # favour chains, allow sharing
        other = st.integers(0, count - 1)  # a second operand: anything earlier (x - x is rare, not common)
        kinds = ["u", "u", "u", "b", "b", "b", "sr", "sl", "pr", "pl", "where", "clamp", "sum", "masked"]
        kind = draw(st.sampled_from(kinds))
        if kind == "masked" and not out_shape:
            kind = "where"  # a 0-d family has no last axis to mask
        if kind in ("pr", "pl") and param is None:
            kind = "sr" if kind == "pr" else "sl"
        if kind == "u":
            program.append(Instr("u", draw(st.sampled_from(UNARY)), (draw(pick),)))
        elif kind == "b":
            program.append(Instr("b", draw(st.sampled_from(BINARY_WEIGHTED)), (draw(pick), draw(other))))
        elif kind in ("sr", "sl"):
            program.append(Instr(kind, draw(st.sampled_from(BINARY_WEIGHTED)), (draw(pick),), (draw(_scalars()),)))
        elif kind in ("pr", "pl"):
            program.append(Instr(kind, draw(st.sampled_from(BINARY_WEIGHTED)), (draw(pick),)))
        elif kind == "sum":  # a reduction: an eager step between fused groups
            arg, axis = draw(pick), draw(st.sampled_from(REDUCE_AXES))
            op = draw(st.sampled_from(REDUCTIONS))
            if op in EXTREMES and reduces_nothing(Case(inputs, [], None, program, [], mask=mask).shapes()[arg], axis):
                op = "mean"  # max/min of zero elements raises (test_bad_inputs); mean gives NaN
            program.append(Instr("sum", op, (arg,), (axis,)))
        elif kind == "masked":  # where(mask, x, fill), then a reduction over the last axis
            if mask is None:
                mask = draw(hnp.arrays(np.bool_, out_shape[-1:], elements=st.booleans(), fill=st.nothing()))
            program.append(Instr("mwhere", "where", (draw(pick),), (draw(st.sampled_from(MASK_FILLS)),)))
            masked = n_in + len(program) - 1
            op = draw(st.sampled_from(REDUCTIONS))
            if op in EXTREMES and reduces_nothing(Case(inputs, [], None, program, [], mask=mask).shapes()[masked], -1):
                op = "mean"
            program.append(Instr("sum", op, (masked,), (-1,)))
        elif kind == "where":
            if draw(st.integers(0, 4)) == 0:
                program.append(Instr("where_s", "where", (draw(other), draw(pick)), (draw(_scalars()),)))
            else:
                program.append(Instr("where", "where", (draw(other), draw(pick), draw(other))))
        elif draw(st.booleans()):
            lo = draw(st.one_of(st.none(), _scalars()))
            hi = draw(st.one_of(st.none(), _scalars()))
            program.append(Instr("clamp_s", "clamp", (draw(pick),), (lo, hi)))
        else:
            program.append(Instr("clamp_t", "clamp", (draw(pick), draw(other), draw(other))))
    n_ops = len(program)  # a masked reduction adds two instructions
    candidates = list(range(n_in, n_in + n_ops))
    # the last value (most ops are its ancestors: outputs elsewhere leave dead code) and 0-2 others
    others = draw(st.lists(st.sampled_from(candidates[:-1]), max_size=2, unique=True)) if n_ops > 1 else []
    outputs = [candidates[-1], *others]
    case = Case(inputs, requires_grad, param, program, outputs, mask=mask)
    shapes_all = case.shapes()
    case.upstream = [_upstream(draw, shapes_all[o]) for o in outputs]
    return case


# ---- the function under test ----------------------------------------------------------------------
_BIN = {name: getattr(ag, name) for name in BINARY}
_UN = {name: getattr(ag, name) for name in UNARY}


def make_function(case: Case):
    """``fn(*inputs[, mask][, param])`` applying the program with netcl.autograd ops; returns the outputs."""
    n_in, program, outputs = case.n_in, case.program, case.outputs
    n_args = n_in + (case.mask is not None)

    def fn(*args: Any) -> Any:
        vals = list(args[:n_in])
        mask = args[n_in] if case.mask is not None else None
        s = args[n_args] if len(args) > n_args else None
        for ins in program:
            a = [vals[i] for i in ins.args]
            if ins.kind == "u":
                vals.append(_UN[ins.op](a[0]))
            elif ins.kind == "b":
                vals.append(_BIN[ins.op](a[0], a[1]))
            elif ins.kind == "sr":
                vals.append(_BIN[ins.op](a[0], ins.consts[0]))
            elif ins.kind == "sl":
                vals.append(_BIN[ins.op](ins.consts[0], a[0]))
            elif ins.kind == "pr":
                vals.append(_BIN[ins.op](a[0], s))
            elif ins.kind == "pl":
                vals.append(_BIN[ins.op](s, a[0]))
            elif ins.kind == "sum":
                reduce = getattr(ag, ins.op)
                vals.append(reduce(a[0], axis=ins.axis, keepdims=True) if a[0].ndim else reduce(a[0]))
            elif ins.kind == "where":
                vals.append(ag.where(a[0], a[1], a[2]))
            elif ins.kind == "where_s":
                vals.append(ag.where(a[0], a[1], ins.consts[0]))
            elif ins.kind == "mwhere":
                vals.append(ag.where(mask, a[0], ins.consts[0]))
            elif ins.kind == "clamp_s":
                vals.append(ag.clamp(a[0], ins.consts[0], ins.consts[1]))
            else:
                vals.append(ag.clamp(a[0], a[1], a[2]))
        result = [vals[o] for o in outputs]
        return tuple(result) if len(result) > 1 else result[0]

    return fn


# ---- the interval reference -------------------------------------------------------------------------
def _f32(value: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _exponents(s: float) -> list[float]:
    """``s - 1`` as the fused kernel (float32 s, then float32 subtraction) and the eager op (double) see it."""
    with np.errstate(over="ignore"):
        return sorted({_f32(_f32(s) - 1.0), _f32(float(s) - 1.0)})


def _forward_binary(op: str, a: Iv, b: Iv) -> Iv:
    if op == "pow":
        return R.pow_(a, b)
    table = {
        "add": R.add,
        "sub": R.sub,
        "mul": R.mul,
        "div": R.div,
        "maximum": R.maximum,
        "minimum": R.minimum,
        "lt": R.lt,
        "le": R.le,
        "gt": R.gt,
        "ge": R.ge,
    }
    return table[op](a, b)


def _scalar_iv(value: Any) -> Iv:
    return Iv.scalar(float(value))


def _forward(ins: Instr, vals: list[Iv], param: float | None, mask: Iv | None = None) -> Iv:
    a = [vals[i] for i in ins.args]
    if ins.kind == "u":
        table = {
            "neg": R.neg,
            "exp": R.exp,
            "log": R.log,
            "sqrt": R.sqrt,
            "abs": R.abs_,
            "relu": R.relu,
            "gelu": R.gelu,
            "sigmoid": R.sigmoid,
            "tanh": R.tanh,
        }
        return table[ins.op](a[0])
    if ins.kind == "b":
        return _forward_binary(ins.op, a[0], a[1])
    if ins.kind in ("sr", "pr", "sl", "pl"):
        s = ins.consts[0] if ins.kind in ("sr", "sl") else param
        right = ins.kind in ("sr", "pr")
        if ins.op == "pow":
            if right:
                return R.pow_point_exponent(a[0], sorted({_f32(s), float(s)}))
            return _pow_base_hull(float(s), a[0])
        return _forward_binary(ins.op, a[0], _scalar_iv(s)) if right else _forward_binary(ins.op, _scalar_iv(s), a[0])
    if ins.kind == "sum":
        x = a[0]
        axes = reduce_axes(x.shape, ins.axis)
        if not axes:
            return x
        table = {"sum": R.reduce_sum, "mean": R.reduce_mean, "max": R.reduce_max, "min": R.reduce_min}
        return table[ins.op](x, axes, keepdims=True)
    if ins.kind == "where":
        return R.where(a[0], a[1], a[2])
    if ins.kind == "where_s":
        return R.where(a[0], a[1], _scalar_iv(ins.consts[0]))
    if ins.kind == "mwhere":
        return R.where(mask, a[0], _scalar_iv(ins.consts[0]))
    if ins.kind == "clamp_s":
        lo = -math.inf if ins.consts[0] is None else ins.consts[0]
        hi = math.inf if ins.consts[1] is None else ins.consts[1]
        return R.clamp(a[0], _scalar_iv(lo), _scalar_iv(hi))
    return R.clamp(a[0], a[1], a[2])


def _pow_base_hull(s: float, x: Iv) -> Iv:
    parts = [R.pow_point_base(v, x) for v in sorted({s, _f32(s)})]
    if len(parts) == 1:
        return parts[0]
    p, q = parts
    with np.errstate(invalid="ignore"):
        return Iv(np.fmin(p.lo, q.lo), np.fmax(p.hi, q.hi), p.may | q.may, p.must & q.must)


def _differentiable(ins: Instr) -> bool:
    if ins.kind in ("b", "sr", "sl", "pr", "pl"):
        return ins.op not in COMPARE
    return True


def _log_scalar(s: float) -> Iv:
    """``log`` of a scalar base as both paths compute it: log(0) = -inf, log(<0) = NaN."""
    return R.log(_scalar_iv(s))


def _grads(ins: Instr, g: Iv, a: list[Iv], out: Iv, param: float | None, mask: Iv | None = None) -> list[Iv | None]:
    """One gradient interval per tensor argument (at the output's shape), None where there is none."""
    one, two = Iv.point(1.0), Iv.point(2.0)
    zero = Iv.point(0.0)
    if ins.kind == "u":
        x = a[0]
        return [
            {
                "neg": lambda: R.neg(g),
                "exp": lambda: R.mul(g, out),
                "log": lambda: R.div(g, x),
                "sqrt": lambda: R.div(g, R.mul(two, out)),
                "abs": lambda: R.mul(g, R.sign(x)),
                "relu": lambda: R.mul(g, R.relu_grad(x)),
                "gelu": lambda: R.mul(g, R.gelu_grad(x)),
                "sigmoid": lambda: R.mul(g, R.mul(out, R.sub(one, out))),
                "tanh": lambda: R.mul(g, R.sub(one, R.mul(out, out))),
            }[ins.op]()
        ]
    if ins.kind == "b":
        x, y = a
        op = ins.op
        if op in COMPARE:
            return [None, None]
        if op == "add":
            return [g, g]
        if op == "sub":
            return [g, R.neg(g)]
        if op == "mul":
            return [R.mul(g, y), R.mul(g, x)]
        if op == "div":
            return [R.div(g, y), R.neg(R.div(R.mul(g, out), y))]
        if op == "pow":  # d/dx is 0 where y == 0 (x ** 0 is constant; y * x ** (y - 1) is 0 * inf at x = 0)
            base = R.where(y, R.mul(y, R.pow_(x, R.sub(y, one))), zero)
            return [R.mul(g, base), R.mul(g, R.mul(out, R.log(x)))]
        if op == "maximum":
            return [R.mul(g, R.ge(x, y)), R.mul(g, R.lt(x, y))]
        return [R.mul(g, R.le(x, y)), R.mul(g, R.gt(x, y))]  # minimum
    if ins.kind in ("sr", "pr", "sl", "pl"):
        s = float(ins.consts[0] if ins.kind in ("sr", "sl") else param)
        si = _scalar_iv(s)
        x = a[0]
        op = ins.op
        if op in COMPARE:
            return [None]
        if ins.kind in ("sr", "pr"):  # x op s
            return [
                {
                    "add": lambda: g,
                    "sub": lambda: g,
                    "mul": lambda: R.mul(g, si),
                    "div": lambda: R.div(g, si),
                    "pow": lambda: R.mul(g, zero if s == 0 else R.mul(si, R.pow_point_exponent(x, _exponents(s)))),
                    "maximum": lambda: R.mul(g, R.ge(x, si)),
                    "minimum": lambda: R.mul(g, R.le(x, si)),
                }[op]()
            ]
        return [  # s op x
            {
                "add": lambda: g,
                "sub": lambda: R.neg(g),
                "mul": lambda: R.mul(g, si),
                "div": lambda: R.neg(R.div(R.mul(g, out), x)),
                "pow": lambda: R.mul(g, R.mul(out, _log_scalar(s))),
                "maximum": lambda: R.mul(g, R.lt(si, x)),
                "minimum": lambda: R.mul(g, R.gt(si, x)),
            }[op]()
        ]
    if ins.kind == "where":
        return [None, R.where(a[0], g, zero), R.where(a[0], zero, g)]
    if ins.kind == "where_s":
        return [None, R.where(a[0], g, zero)]
    if ins.kind == "mwhere":
        return [R.where(mask, g, zero)]
    if ins.kind == "clamp_s":
        lo = _scalar_iv(-math.inf if ins.consts[0] is None else ins.consts[0])
        hi = _scalar_iv(math.inf if ins.consts[1] is None else ins.consts[1])
        return [R.mul(g, R.mul(R.ge(a[0], lo), R.le(a[0], hi)))]
    x, lo, hi = a
    return [
        R.mul(g, R.mul(R.ge(x, lo), R.le(x, hi))),
        R.mul(g, R.lt(x, lo)),
        R.mul(g, R.mul(R.ge(x, lo), R.gt(x, hi))),
    ]


@dataclass
class Reference:
    outputs: list[Iv]
    #: per input (None when it does not require grad): the interval for the un-fused path, whose
    #: association (sum at each node, then multiply) is the reference's own
    grads: list[Iv | None]
    #: the same, widened for the fused path, which sums a value's gradients after multiplying
    #: (each group output runs its own backward kernel): its rounding error is bounded by
    #: ``REASSOCIATION_ULPS * (ops + 3)`` ulp of the sum of |path products|, and it is unknown where
    #: that sum could overflow
    fused_grads: list[Iv | None]
    differentiable: list[bool]  # per output: does it require grad on the un-fused path


#: Worst ulps one op of a gradient formula adds (pow), per op on the longest path.
REASSOCIATION_ULPS = 16


def _sum_to_shape_array(m: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    lead = m.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and m.shape[lead + i] != 1)
    return np.sum(m, axis=axes).reshape(shape) if axes else m


def _backward(case: Case, vals: list[Iv], requires: list[bool], shapes: list, seed: int, upstream: np.ndarray):
    """Reverse mode from one output: per input, (gradient interval, sum of |path products|) or None."""
    mask = _mask_iv(case)
    contributions: dict[int, list[tuple[Iv, np.ndarray]]] = {seed: [(Iv.point(upstream), np.abs(upstream))]}
    unit = Iv.point(1.0)
    for k in reversed(range(len(case.program))):
        index = case.n_in + k
        if index not in contributions:
            continue
        ins = case.program[k]
        items = contributions.pop(index)
        g = R.total([iv for iv, _ in items])
        magnitude = sum(m for _, m in items)
        arg_ivs = [vals[i] for i in ins.args]
        if ins.kind == "sum":  # the gradient is g broadcast back (divided by the count for mean)
            (arg,) = ins.args
            if requires[arg]:
                m = np.broadcast_to(magnitude, shapes[arg])
                grad = R.reduction_grad(ins.op, g, vals[arg], vals[index], reduce_axes(shapes[arg], ins.axis))
                contributions.setdefault(arg, []).append((grad, m))
            continue
        grads = _grads(ins, g, arg_ivs, vals[index], case.param, mask)
        local = _grads(ins, unit, arg_ivs, vals[index], case.param, mask)
        for arg, grad, d in zip(ins.args, grads, local, strict=True):
            if grad is None or not requires[arg]:
                continue
            grad = R.broadcast(grad, shapes[index]) if grad.shape != shapes[index] else grad
            with np.errstate(invalid="ignore", over="ignore"):
                m = magnitude * np.broadcast_to(R.max_abs(d), shapes[index])
            m = np.where(np.isnan(m), np.inf, m)
            reduced = (R.sum_to_shape(grad, shapes[arg]), _sum_to_shape_array(m, shapes[arg]))
            contributions.setdefault(arg, []).append(reduced)
    result = []
    for i in range(case.n_in):
        items = contributions.get(i)
        result.append((R.total([iv for iv, _ in items]), sum(m for _, m in items)) if items else None)
    return result


def _mask_iv(case: Case) -> Iv | None:
    return None if case.mask is None else Iv.point(case.mask.astype(np.float64))


def reference(case: Case) -> Reference:
    """Forward intervals of the outputs; gradient intervals of the inputs for the upstream gradients.

    Like the code under test, each differentiable output is its own backward pass and the inputs'
    gradients add up over the passes.
    """
    vals = [Iv.point(x) for x in case.inputs]
    requires = list(case.requires_grad)
    shapes = case.shapes()
    mask = _mask_iv(case)
    for ins in case.program:
        vals.append(_forward(ins, vals, case.param, mask))
        requires.append(_differentiable(ins) and any(requires[i] for i in ins.args))
    differentiable = [requires[o] for o in case.outputs]
    passes = [
        _backward(case, vals, requires, shapes, o, up)
        for o, up, diff in zip(case.outputs, case.upstream, differentiable, strict=True)
        if diff
    ]
    grads: list[Iv | None] = []
    fused: list[Iv | None] = []
    ops = len(case.program) + 3
    for i in range(case.n_in):
        if not case.requires_grad[i]:
            grads.append(None)
            fused.append(None)
            continue
        parts = [p[i] for p in passes if p[i] is not None]
        if not parts:
            zero = Iv.point(np.zeros(shapes[i]))
            grads.append(zero)
            fused.append(zero)
            continue
        total = R.total([iv for iv, _ in parts])
        magnitude = sum(m for _, m in parts)
        grads.append(total)
        with np.errstate(over="ignore", invalid="ignore"):
            slack = REASSOCIATION_ULPS * ops * R.ULP * magnitude
        fused.append(R.widen(total, np.where(np.isfinite(slack), slack, 0.0), ~(magnitude <= R.F32_MAX / 4)))
    return Reference([vals[o] for o in case.outputs], grads, fused, differentiable)
