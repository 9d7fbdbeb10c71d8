"""A float64 interval reference for float32 elementwise programs (the fuzzer's oracle).

Every value is an interval ``[lo, hi]`` (float64 arrays) plus two NaN flags: ``may`` (the
float32 result may be NaN) and ``must`` (it is NaN). An interval holds every value a correct
float32 implementation can produce, so checking ``lo <= got <= hi`` never fails on rounding,
however ill-conditioned the program, and always fails on a wrong formula where the interval is
narrow (most elements: inputs are exact, each op adds a few ulps).

How an op is evaluated: the exact float64 function at the interval's corners (every op here is
monotone in each argument on the pieces we split at, or we add its interior extrema), then the
result is widened by the op's rounding slack and mapped onto the float32 range (past FLT_MAX it
can only be +-inf). The slack per op, in float32 ulps of the result (1 ulp = 2**-23 relative, so
every bound carries a factor 2 over the unit roundoff):

==============  =====  ======================================================================
op              ulps   why
==============  =====  ======================================================================
+ - *           1      correctly rounded (0.5 ulp) in IEEE and OpenCL
/               3      OpenCL 1.2 full profile allows 2.5 ulp
exp log sqrt    4      OpenCL allows 3 ulp; NumPy's float32 libm is within 1
tanh            6      OpenCL allows 5 ulp
pow             16     OpenCL allows 16 ulp
sigmoid         8      exp (3) + add (0.5) + div (2.5) ulp, no cancellation in either branch
gelu            see    x*sigmoid(2u), u = K(x + C x^3): u carries ~3 ulp, which sigmoid(2u)
                ``gelu`` amplifies by 2|u| where u < 0 (relative); the NumPy tanh form
                       0.5x(1 + tanh u) cancels, adding 8 ulp(1) * |x| absolute
gelu_grad       64     |gelu'| <= 1.13 and every error term of either form is a bounded factor
                ulp(1) times ulp(1) (x e^{-x^2}-type products), so an absolute 64 ulp(1) bound
max min abs     0      exact (also relu, neg, comparisons, where, sign, relu_grad)
==============  =====  ======================================================================

Every rounded op also adds ``ulps * FLT_MIN`` absolute (flush-to-zero of subnormal results).
Sums (broadcast reductions, gradient accumulation) of n terms get ``n ulp * sum(|terms|)``,
which covers any summation order, and become [-inf, inf] (may be NaN) when the terms could
overflow a partial sum. Division by an interval that holds 0, and ``pow`` of a base that holds
0 with a negative exponent, are unknown ([-inf, inf]): intervals do not know the sign of zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)
ULP = 2.0**-23
GELU_K = 0.7978845608028654
GELU_C = 0.044715
INF = math.inf

ULPS = {"add": 1, "sub": 1, "mul": 1, "div": 3, "exp": 4, "log": 4, "sqrt": 4, "tanh": 6, "pow": 16, "sigmoid": 8}


class Iv:
    """An interval array: float32 results lie in [lo, hi], or are NaN where ``may`` (``must``: always)."""

    __slots__ = ("hi", "lo", "may", "must")

    def __init__(self, lo, hi, may=None, must=None) -> None:
        lo = np.asarray(lo, dtype=np.float64)
        hi = np.asarray(hi, dtype=np.float64)
        shape = np.broadcast_shapes(lo.shape, hi.shape)
        must = np.zeros(shape, bool) if must is None else np.broadcast_to(np.asarray(must, bool), shape)
        may = np.zeros(shape, bool) if may is None else np.broadcast_to(np.asarray(may, bool), shape)
        self.must = np.array(must)
        self.may = np.array(may | must)
        self.lo = np.where(self.must, np.nan, np.broadcast_to(lo, shape))
        self.hi = np.where(self.must, np.nan, np.broadcast_to(hi, shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.lo.shape

    @staticmethod
    def point(values) -> Iv:
        """The exact values (a float32 input, an upstream gradient); NaN entries are NaN."""
        values = np.asarray(values, dtype=np.float64)
        nan = np.isnan(values)
        return Iv(values, values, nan, nan)

    @staticmethod
    def scalar(value: float) -> Iv:
        """A Python scalar as a kernel sees it: the double or its float32 rounding."""
        rounded = float(np.float32(value)) if abs(value) <= F32_MAX else math.copysign(INF, value)
        return Iv(min(value, rounded), max(value, rounded))

    def is_point(self) -> bool:
        return bool(np.all((self.lo == self.hi) & ~self.may))

    def unknown_like(self) -> Iv:
        return Iv(np.full(self.shape, -INF), np.full(self.shape, INF), np.ones(self.shape, bool))

    def contains(self, got: np.ndarray) -> np.ndarray:
        """Elementwise: is the float32 result ``got`` one this interval allows?"""
        got = np.broadcast_to(np.asarray(got, dtype=np.float64), self.shape)
        nan = np.isnan(got)
        with np.errstate(invalid="ignore"):
            inside = (got >= self.lo) & (got <= self.hi)
        return np.where(self.must, nan, np.where(nan, self.may, inside))

    def describe(self, got: np.ndarray, limit: int = 6) -> str:
        """The first elements ``got`` violates, for assertion messages."""
        bad = np.argwhere(~self.contains(got))[:limit]
        got = np.broadcast_to(np.asarray(got, dtype=np.float64), self.shape)
        rows = [
            f"  at {tuple(int(i) for i in idx)}: got {got[tuple(idx)]!r}, allowed [{self.lo[tuple(idx)]!r}, "
            f"{self.hi[tuple(idx)]!r}] may_nan={bool(self.may[tuple(idx)])} must_nan={bool(self.must[tuple(idx)])}"
            for idx in bad
        ]
        return "\n".join(rows)

    def __repr__(self) -> str:
        return f"Iv(lo={self.lo}, hi={self.hi}, may={self.may}, must={self.must})"


def _finish(lo, hi, may, must, ulps: float = 0.0, absolute=0.0) -> Iv:
    """Turn exact bounds into float32 result bounds: NaN bounds, rounding slack, float32 range."""
    with np.errstate(all="ignore"):
        lo = np.asarray(lo, np.float64)
        hi = np.asarray(hi, np.float64)
        nan = np.isnan(lo) | np.isnan(hi)
        may = np.asarray(may) | nan
        lo = np.where(nan, -INF, lo)
        hi = np.where(nan, INF, hi)
        if ulps or np.any(absolute):
            slack_lo = ulps * ULP * np.abs(lo) + ulps * F32_TINY + absolute
            slack_hi = ulps * ULP * np.abs(hi) + ulps * F32_TINY + absolute
            lo = np.where(np.isfinite(lo), lo - np.where(np.isfinite(slack_lo), slack_lo, INF), lo)
            hi = np.where(np.isfinite(hi), hi + np.where(np.isfinite(slack_hi), slack_hi, INF), hi)
        lo = np.where(lo > F32_MAX, INF, np.where(lo < -F32_MAX, -INF, lo))
        hi = np.where(hi > F32_MAX, INF, np.where(hi < -F32_MAX, -INF, hi))
        return Iv(lo, hi, may, must)


def _hull(values: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(min, max ignoring NaN, any NaN, all NaN) over candidate arrays."""
    stack = np.stack(np.broadcast_arrays(*values))
    nan = np.isnan(stack)
    with np.errstate(all="ignore"):
        lo = np.where(nan, INF, stack).min(axis=0)
        hi = np.where(nan, -INF, stack).max(axis=0)
    allnan = nan.all(axis=0)
    return np.where(allnan, np.nan, lo), np.where(allnan, np.nan, hi), nan.any(axis=0), allnan


def _contains_zero(x: Iv) -> np.ndarray:
    return (x.lo <= 0) & (x.hi >= 0)


# ---- elementwise ops ------------------------------------------------------------------------------
def monotone(fn: Callable[[np.ndarray], np.ndarray], x: Iv, ulps: float, extrema: Sequence[float] = ()) -> Iv:
    """``fn`` over ``x``: the hull of fn at the bounds and at each interior extremum in ``extrema``."""
    with np.errstate(all="ignore"):
        candidates = [fn(x.lo), fn(x.hi)]
        for point in extrema:
            inside = (x.lo <= point) & (x.hi >= point)
            candidates.append(np.where(inside, fn(np.float64(point)), np.nan))
    lo, hi, anynan, allnan = _hull(candidates[:2])
    if extrema:
        extra_lo, extra_hi, _, _ = _hull(candidates[2:])
        lo = np.fmin(lo, extra_lo)
        hi = np.fmax(hi, extra_hi)
    return _finish(lo, hi, x.may | anynan, x.must | allnan, ulps)


def corners(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], a: Iv, b: Iv, ulps: float) -> Iv:
    """A binary op monotone in each argument: the hull of its four corners."""
    with np.errstate(all="ignore"):
        values = [fn(a.lo, b.lo), fn(a.lo, b.hi), fn(a.hi, b.lo), fn(a.hi, b.hi)]
    lo, hi, anynan, allnan = _hull(values)
    # every corner NaN (inf - inf, inf / inf) means NaN only for point intervals; inside a box the
    # finite values give anything
    points = (a.lo == a.hi) & (b.lo == b.hi)
    must = a.must | b.must | (allnan & points)
    unknown = allnan & ~must
    lo = np.where(unknown, -INF, lo)
    hi = np.where(unknown, INF, hi)
    return _finish(lo, hi, a.may | b.may | anynan, must, ulps)


def neg(x: Iv) -> Iv:
    return Iv(-x.hi, -x.lo, x.may, x.must)


def add(a: Iv, b: Iv) -> Iv:
    return corners(np.add, a, b, ULPS["add"])


def sub(a: Iv, b: Iv) -> Iv:
    return corners(np.subtract, a, b, ULPS["sub"])


def _mul_bound(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x * y for bounds: 0 * inf counts as 0 (finite values next to the infinite end give 0)."""
    product = x * y
    return np.where(np.isnan(product) & ~np.isnan(x) & ~np.isnan(y), 0.0, product)


def mul(a: Iv, b: Iv) -> Iv:
    out = corners(_mul_bound, a, b, ULPS["mul"])
    # 0 * inf gives NaN: possible when one side holds 0 and the other reaches inf; certain when both are points
    zero_inf = (_contains_zero(a) & (np.isinf(b.lo) | np.isinf(b.hi))) | (
        _contains_zero(b) & (np.isinf(a.lo) | np.isinf(a.hi))
    )
    certain = ((a.lo == 0) & (a.hi == 0) & np.isinf(b.lo) & (b.lo == b.hi)) | (
        (b.lo == 0) & (b.hi == 0) & np.isinf(a.lo) & (a.lo == a.hi)
    )
    return Iv(out.lo, out.hi, out.may | zero_inf, out.must | certain)


def div(a: Iv, b: Iv) -> Iv:
    out = corners(np.divide, a, b, ULPS["div"])
    unknown = _contains_zero(b) & ~(a.must | b.must)
    return Iv(np.where(unknown, -INF, out.lo), np.where(unknown, INF, out.hi), out.may | unknown, out.must)


def maximum(a: Iv, b: Iv) -> Iv:
    return corners(np.maximum, a, b, 0)


def minimum(a: Iv, b: Iv) -> Iv:
    return corners(np.minimum, a, b, 0)


def _compare(strict_true, strict_false, a: Iv, b: Iv) -> Iv:
    """1.0/0.0: certain where the intervals decide it; [0, 1] where they overlap; 0 for NaN."""
    with np.errstate(invalid="ignore"):
        true = strict_true(a, b)
        false = strict_false(a, b)
    nan_must = a.must | b.must
    nan_may = (a.may | b.may) & ~nan_must
    lo = np.where(true & ~nan_may & ~nan_must, 1.0, 0.0)
    hi = np.where((false & ~nan_may) | nan_must, 0.0, 1.0)
    return Iv(lo, hi)


def lt(a: Iv, b: Iv) -> Iv:
    return _compare(lambda a, b: a.hi < b.lo, lambda a, b: a.lo >= b.hi, a, b)


def le(a: Iv, b: Iv) -> Iv:
    return _compare(lambda a, b: a.hi <= b.lo, lambda a, b: a.lo > b.hi, a, b)


def gt(a: Iv, b: Iv) -> Iv:
    return lt(b, a)


def ge(a: Iv, b: Iv) -> Iv:
    return le(b, a)


def where(c: Iv, a: Iv, b: Iv) -> Iv:
    """``a`` where c != 0 (NaN counts as true), ``b`` where c == 0, the hull where undecided."""
    take_a = (c.lo > 0) | (c.hi < 0) | c.must
    take_b = (c.lo == 0) & (c.hi == 0) & ~c.may
    shape = np.broadcast_shapes(c.shape, a.shape, b.shape)
    a_lo, a_hi, a_may, a_must = (np.broadcast_to(v, shape) for v in (a.lo, a.hi, a.may, a.must))
    b_lo, b_hi, b_may, b_must = (np.broadcast_to(v, shape) for v in (b.lo, b.hi, b.may, b.must))
    with np.errstate(invalid="ignore"):
        lo = np.where(take_a, a_lo, np.where(take_b, b_lo, np.fmin(a_lo, b_lo)))
        hi = np.where(take_a, a_hi, np.where(take_b, b_hi, np.fmax(a_hi, b_hi)))
    may = np.where(take_a, a_may, np.where(take_b, b_may, a_may | b_may))
    must = np.where(take_a, a_must, np.where(take_b, b_must, a_must & b_must))
    # where one side must be NaN and the other is not decided, the hull is the other side's
    lo = np.where(~must & np.isnan(lo), np.where(np.isnan(a_lo), b_lo, a_lo), lo)
    hi = np.where(~must & np.isnan(hi), np.where(np.isnan(a_hi), b_hi, a_hi), hi)
    return Iv(lo, hi, may, must)


def relu(x: Iv) -> Iv:
    return maximum(x, Iv.point(0.0))


def abs_(x: Iv) -> Iv:
    return monotone(np.abs, x, 0, extrema=(0.0,))


def sign(x: Iv) -> Iv:
    return monotone(np.sign, x, 0)


def relu_grad(x: Iv) -> Iv:
    """1 where x > 0 else 0; NaN gives 0."""
    lo = np.where(x.lo > 0, 1.0, 0.0)
    hi = np.where(x.hi > 0, 1.0, 0.0)
    lo = np.where(x.may, 0.0, lo)
    hi = np.where(x.must, 0.0, np.where(x.may, 1.0, hi))
    return Iv(lo, hi)


def _domain(fn: Callable[[np.ndarray], np.ndarray], x: Iv, ulps: float) -> Iv:
    """log/sqrt: NaN below 0 (must when all of x is below 0, may when part is)."""
    below = x.hi < 0
    part = (x.lo < 0) & ~below
    clipped = Iv(np.where(part, 0.0, x.lo), x.hi, x.may, x.must)
    out = monotone(fn, clipped, ulps)
    return Iv(out.lo, out.hi, out.may | part | below, out.must | below)


def exp(x: Iv) -> Iv:
    return monotone(np.exp, x, ULPS["exp"])


def log(x: Iv) -> Iv:
    return _domain(np.log, x, ULPS["log"])


def sqrt(x: Iv) -> Iv:
    return _domain(np.sqrt, x, ULPS["sqrt"])


def tanh(x: Iv) -> Iv:
    return monotone(np.tanh, x, ULPS["tanh"])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def sigmoid(x: Iv) -> Iv:
    return monotone(_sigmoid, x, ULPS["sigmoid"])


def _gelu(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x * _sigmoid(2.0 * GELU_K * (x + GELU_C * x**3))


def _gelu_grad(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        u = GELU_K * (x + GELU_C * x**3)
        e = np.exp(-2.0 * np.abs(u))
        sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e))
        tail = 0.5 * x * sech2 * GELU_K * (1.0 + 3.0 * GELU_C * x * x)
        return _sigmoid(2.0 * u) + np.where(sech2 == 0, 0.0, tail)  # the limits 1 and 0 at +-inf


def _extrema(fn: Callable[[np.ndarray], np.ndarray], low: float, high: float) -> tuple[float, ...]:
    """Interior local extrema of a smooth function on [low, high] (grid + golden refinement)."""
    grid = np.linspace(low, high, 200_001)
    values = fn(grid)
    d = np.diff(values)
    found = []
    for i in np.nonzero(np.sign(d[:-1]) != np.sign(d[1:]))[0]:
        a, b = grid[i], grid[i + 2]
        sign = 1.0 if d[i] < 0 else -1.0  # minimum: minimize fn; maximum: minimize -fn
        for _ in range(80):
            m1, m2 = a + (b - a) * 0.382, a + (b - a) * 0.618
            if sign * fn(np.float64(m1)) < sign * fn(np.float64(m2)):
                b = m2
            else:
                a = m1
        found.append(float((a + b) / 2))
    return tuple(found)


GELU_EXTREMA = _extrema(_gelu, -6.0, 6.0)
GELU_GRAD_EXTREMA = _extrema(_gelu_grad, -6.0, 6.0)


def gelu(x: Iv) -> Iv:
    out = monotone(_gelu, x, 0, extrema=GELU_EXTREMA)
    with np.errstate(all="ignore"):
        m = np.fmax(np.abs(x.lo), np.abs(x.hi))
        u_neg = np.maximum(-GELU_K * (x.lo + GELU_C * x.lo**3), 0.0)
        rel = (10.0 + 6.0 * u_neg) * ULP
        mag = np.fmax(np.abs(out.lo), np.abs(out.hi))
        absolute = np.where(mag == 0, 0.0, rel * mag) + 8.0 * ULP * np.where(np.isfinite(m), m, 0.0) + F32_TINY
        absolute = np.where(np.isfinite(absolute), absolute, INF)
    return _finish(out.lo, out.hi, out.may, out.must, 0, absolute)


def gelu_grad(x: Iv) -> Iv:
    out = monotone(_gelu_grad, x, 0, extrema=GELU_GRAD_EXTREMA)
    return _finish(out.lo, out.hi, out.may, out.must, 0, 64.0 * ULP)


def pow_(a: Iv, b: Iv) -> Iv:
    """a ** b as C ``pow``: exact corners where the pieces are monotone; unknown elsewhere."""
    if b.is_point() and np.ndim(b.lo) == 0:
        return pow_point_exponent(a, [float(b.lo)])
    shape = np.broadcast_shapes(a.shape, b.shape)
    positive = np.broadcast_to((a.lo > 0) & ~a.may & np.isfinite(a.hi), shape)
    out = corners(np.power, a, b, ULPS["pow"])
    return Iv(
        np.where(positive, out.lo, -INF),
        np.where(positive, out.hi, INF),
        np.where(positive, out.may, True),
        np.where(positive, out.must, False),
    )


def pow_point_exponent(a: Iv, exponents: Sequence[float]) -> Iv:
    """a ** e for a known exponent (the hull over ``exponents``: double and float32 roundings)."""
    parts = [_pow_point(a, e) for e in exponents]
    result = parts[0]
    for part in parts[1:]:
        with np.errstate(invalid="ignore"):
            result = Iv(
                np.fmin(result.lo, part.lo),
                np.fmax(result.hi, part.hi),
                result.may | part.may,
                result.must & part.must,
            )
    return result


def _pow_point(a: Iv, e: float) -> Iv:
    if e == 0:
        return Iv(np.ones(a.shape), np.ones(a.shape))  # pow(x, 0) is 1 even for NaN x
    shape = a.shape
    if math.isinf(e):  # pow(x, +-inf) depends on |x| only (0, 1 or inf), monotone in |x|
        return monotone(lambda v: np.power(v, e), abs_(a), ULPS["pow"])
    with np.errstate(all="ignore"):
        if float(e).is_integer():
            zero = _contains_zero(a)
            candidates = [np.power(a.lo, e), np.power(a.hi, e), np.where(zero, 0.0, np.nan)]
            lo, hi, anynan, allnan = _hull(candidates)
            unknown = zero & (e < 0)  # a pole at 0 with a sign we cannot tell
            out = _finish(lo, hi, a.may | (anynan & ~allnan), a.must | allnan, ULPS["pow"])
            return Iv(np.where(unknown, -INF, out.lo), np.where(unknown, INF, out.hi), out.may, out.must)
        below = a.hi < 0
        part = (a.lo < 0) & ~below
        low = np.where(part, 0.0, a.lo)
        lo, hi, anynan, allnan = _hull([np.power(low, e), np.power(a.hi, e)])
        neg_inf = a.lo == -INF  # pow(-inf, y) is +inf or +0, not NaN
        out = _finish(lo, hi, a.may | part | below | anynan, a.must | below, ULPS["pow"])
        return Iv(
            np.where(neg_inf, -INF, out.lo),
            np.where(neg_inf, INF, out.hi),
            np.broadcast_to(out.may | neg_inf, shape),
            np.broadcast_to(out.must & ~neg_inf, shape),
        )


def pow_point_base(s: float, x: Iv) -> Iv:
    """s ** x for a known base."""
    shape = x.shape
    if s == 1.0:
        return Iv(np.ones(shape), np.ones(shape))
    if s > 0:
        return corners(np.power, Iv.scalar(s), x, ULPS["pow"])
    if s == 0:
        lo = np.where(x.hi < 0, INF, 0.0)
        hi = np.where(x.lo > 0, 0.0, np.where(x.hi < 0, INF, INF))
        lo = np.where((x.lo <= 0) & (x.hi >= 0), 0.0, lo)
        hi = np.where((x.lo <= 0) & (x.hi >= 0), INF, hi)
        return Iv(np.where(x.must, np.nan, lo), np.where(x.must, np.nan, hi), x.may, x.must)
    if x.is_point():
        with np.errstate(all="ignore"):
            values = np.power(s, x.lo)
        return _finish(values, values, np.isnan(values), np.isnan(values), ULPS["pow"])
    return Iv(np.full(shape, -INF), np.full(shape, INF), np.ones(shape, bool))


def clamp(x: Iv, lo: Iv, hi: Iv) -> Iv:
    return minimum(maximum(x, lo), hi)


# ---- reductions ------------------------------------------------------------------------------------
def total(terms: Sequence[Iv]) -> Iv:
    """The sum of same-shape intervals (gradient accumulation), any order."""
    if len(terms) == 1:
        return terms[0]
    stacked = Iv(
        np.stack([t.lo for t in terms]),
        np.stack([t.hi for t in terms]),
        np.stack([t.may for t in terms]),
        np.stack([t.must for t in terms]),
    )
    return reduce_sum(stacked, (0,), keepdims=False)


def reduce_sum(x: Iv, axes: tuple[int, ...], keepdims: bool) -> Iv:
    """Sum over ``axes``: exact bounds plus n ulp * sum(|terms|); overflowing partial sums are unknown."""
    n = max(1, math.prod(x.shape[a] for a in axes))
    with np.errstate(all="ignore"):
        lo = np.sum(x.lo, axis=axes, keepdims=keepdims)
        hi = np.sum(x.hi, axis=axes, keepdims=keepdims)
        mag_terms = np.fmax(np.abs(x.lo), np.abs(x.hi))
        finite_mag = np.sum(np.where(np.isfinite(mag_terms), mag_terms, 0.0), axis=axes, keepdims=keepdims)
        may = np.any(x.may, axis=axes, keepdims=keepdims)
        must = np.any(x.must, axis=axes, keepdims=keepdims)
        overflow = finite_mag > F32_MAX / 2
        lo = np.where(overflow, -INF, lo)
        hi = np.where(overflow, INF, hi)
        may = may | overflow
        return _finish(lo, hi, may, must, 0, n * ULP * finite_mag + n * F32_TINY)


def reduce_mean(x: Iv, axes: tuple[int, ...], keepdims: bool) -> Iv:
    """Mean over ``axes``: the sum divided by the count (NaN over zero elements, as 0 / 0)."""
    count = math.prod(x.shape[a] for a in axes)
    total_ = reduce_sum(x, axes, keepdims)
    if count == 0:
        nan = np.ones(total_.shape, bool)
        return Iv(np.full(total_.shape, np.nan), np.full(total_.shape, np.nan), nan, nan)
    return div(total_, Iv.point(float(count)))


def reduce_max(x: Iv, axes: tuple[int, ...], keepdims: bool) -> Iv:
    """Maximum over ``axes`` (exact; NaN anywhere in the slice makes it NaN). Needs >= 1 element."""
    with np.errstate(invalid="ignore"):
        lo = np.max(np.where(x.may, -INF, x.lo), axis=axes, keepdims=keepdims)
        hi = np.max(np.where(x.may, INF, x.hi), axis=axes, keepdims=keepdims)
    may = np.any(x.may, axis=axes, keepdims=keepdims)
    must = np.any(x.must, axis=axes, keepdims=keepdims)
    return Iv(lo, hi, may, must)


def reduce_min(x: Iv, axes: tuple[int, ...], keepdims: bool) -> Iv:
    """Minimum over ``axes`` (exact; NaN anywhere in the slice makes it NaN). Needs >= 1 element."""
    with np.errstate(invalid="ignore"):
        lo = np.min(np.where(x.may, -INF, x.lo), axis=axes, keepdims=keepdims)
        hi = np.min(np.where(x.may, INF, x.hi), axis=axes, keepdims=keepdims)
    may = np.any(x.may, axis=axes, keepdims=keepdims)
    must = np.any(x.must, axis=axes, keepdims=keepdims)
    return Iv(lo, hi, may, must)


def reduction_grad(op: str, g: Iv, x: Iv, out: Iv, axes: tuple[int, ...]) -> Iv:
    """Gradient of a keepdims reduction of ``x`` (shape kept by ``g``/``out``) for upstream ``g``.

    sum: g broadcast (exact); mean: g / count; max (min): g / ties on the maxima (minima) and 0
    elsewhere where the slice's values are exact; 0 for the whole slice where it holds a NaN (the
    result is NaN, which no element equals: the ops share the gradient among the elements equal to
    the result and give the others 0, NaN shares too); else anything (which element wins is not
    decided by intervals).
    """
    shape = x.shape
    grad = broadcast(g, shape)
    if op == "sum" or not axes:
        return grad
    count = math.prod(shape[a] for a in axes)
    if op == "mean":
        return grad if count == 0 else div(grad, Iv.point(float(count)))
    exact = np.all((x.lo == x.hi) & ~x.may, axis=axes, keepdims=True)
    nan_slice = np.broadcast_to(np.any(x.must, axis=axes, keepdims=True), shape)
    with np.errstate(invalid="ignore"):
        extreme = np.max if op == "max" else np.min
        mask = (x.lo == extreme(x.lo, axis=axes, keepdims=True)).astype(np.float64)
    ties = np.maximum(np.sum(mask, axis=axes, keepdims=True), 1.0)
    shared = div(grad, Iv.point(np.broadcast_to(ties, shape)))
    picked = where(Iv.point(mask), shared, Iv.point(np.zeros(shape)))
    decided = np.broadcast_to(exact, shape)
    unknown = grad.unknown_like()
    lo = np.where(nan_slice, 0.0, np.where(decided, picked.lo, unknown.lo))
    hi = np.where(nan_slice, 0.0, np.where(decided, picked.hi, unknown.hi))
    may = np.where(nan_slice, False, np.where(decided, picked.may, True))
    return Iv(lo, hi, may, np.zeros(shape, bool))


def sum_to_shape(x: Iv, shape: tuple[int, ...]) -> Iv:
    """Reduce a broadcast gradient back to an input's ``shape``."""
    if x.shape == tuple(shape):
        return x
    lead = len(x.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    out = reduce_sum(x, axes, keepdims=True) if axes else x
    if lead:
        out = Iv(*(np.reshape(v, shape) for v in (out.lo, out.hi, out.may, out.must)))
    return out


def max_abs(x: Iv) -> np.ndarray:
    """The largest |value| x can take: inf where it may be NaN, 0 where it is NaN for sure."""
    with np.errstate(invalid="ignore"):
        m = np.fmax(np.abs(x.lo), np.abs(x.hi))
    return np.where(x.must, 0.0, np.where(x.may, INF, m))


def widen(x: Iv, absolute: np.ndarray, unknown: np.ndarray) -> Iv:
    """``x`` widened by ``absolute`` on both sides; any value (or NaN) where ``unknown``."""
    with np.errstate(invalid="ignore"):
        lo = np.where(np.isfinite(x.lo), x.lo - absolute, x.lo)
        hi = np.where(np.isfinite(x.hi), x.hi + absolute, x.hi)
    unknown = unknown & ~x.must
    return Iv(np.where(unknown, -INF, lo), np.where(unknown, INF, hi), x.may | unknown, x.must)


def broadcast(x: Iv, shape: tuple[int, ...]) -> Iv:
    return Iv(*(np.broadcast_to(v, shape) for v in (x.lo, x.hi, x.may, x.must)))
