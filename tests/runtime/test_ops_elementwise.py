"""Eager elementwise ops against float64 NumPy references, on PoCL and on the NumPy backend.

Tolerances: inputs are float32, so references are computed in float64 from the exact float32
values; a correctly rounded float32 result is within 0.5 ulp (rtol 6e-8). OpenCL allows its
builtins a few ulps (exp/log 3, tanh 5, pow 16), and composed helpers (gelu, sigmoid) add one
rounding per step, so transcendental ops are checked at rtol 2e-6 (~16 ulp) plus atol 1e-6
for results near zero, where a relative bound is meaningless (log near 1, gelu near 0).
Exact ops (add, mul, comparisons, where, abs, relu, ...) are checked at rtol 1.2e-7 (1 ulp).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops, program_cache
from netcl.runtime.ops import pointwise

EXACT = {"rtol": 1.2e-7, "atol": 0.0}
TRANSCENDENTAL = {"rtol": 2e-6, "atol": 1e-6}
SHAPE = (4, 33)


def _data(shape: tuple[int, ...], seed: int = 0, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def _check(result: nc.Tensor, expected: np.ndarray, tol: dict, dtype: object = np.float32) -> None:
    host = result.to_host()
    assert host.dtype == np.dtype(dtype), (host.dtype, dtype)
    assert host.shape == np.shape(expected)
    np.testing.assert_allclose(host.astype(np.float64), expected, **tol)


GELU_K, GELU_C = 0.7978845608028654, 0.044715


def _gelu64(x: np.ndarray) -> np.ndarray:
    """Reference GELU (tanh form) in float64."""
    return 0.5 * x * (1.0 + np.tanh(GELU_K * (x + GELU_C * x**3)))


def _gelu_grad64(x: np.ndarray) -> np.ndarray:
    t = np.tanh(GELU_K * (x + GELU_C * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x)


UNARY_CASES = {
    # name: (float64 reference, input range, tolerance)
    "neg": (np.negative, (-3, 3), EXACT),
    "exp": (np.exp, (-10, 10), TRANSCENDENTAL),
    "log": (np.log, (1e-3, 10), TRANSCENDENTAL),
    "log1p": (np.log1p, (-0.9, 10), TRANSCENDENTAL),
    "sqrt": (np.sqrt, (0, 10), TRANSCENDENTAL),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (1e-2, 10), TRANSCENDENTAL),
    "abs": (np.abs, (-3, 3), EXACT),
    "sign": (np.sign, (-3, 3), EXACT),
    "relu": (lambda x: np.maximum(x, 0), (-3, 3), EXACT),
    "relu_grad": (lambda x: (x > 0).astype(np.float64), (-3, 3), EXACT),
    "gelu": (_gelu64, (-6, 6), TRANSCENDENTAL),
    "gelu_grad": (_gelu_grad64, (-6, 6), TRANSCENDENTAL),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-30, 30), TRANSCENDENTAL),
    "tanh": (np.tanh, (-6, 6), TRANSCENDENTAL),
}


@pytest.mark.parametrize("name", sorted(UNARY_CASES))
def test_unary(device: nc.Device, name: str) -> None:
    reference, (low, high), tol = UNARY_CASES[name]
    x = _data(SHAPE, seed=1, low=low, high=high)
    _check(getattr(ops, name)(nc.tensor(x, device=device)), reference(x.astype(np.float64)), tol)


BINARY_CASES = {
    "add": (np.add, EXACT),
    "sub": (np.subtract, EXACT),
    "mul": (np.multiply, EXACT),
    "div": (np.divide, EXACT),  # IEEE division is correctly rounded on PoCL; OpenCL allows 2.5 ulp
    "pow": (np.power, TRANSCENDENTAL),
    "maximum": (np.maximum, EXACT),
    "minimum": (np.minimum, EXACT),
    "lt": (np.less, EXACT),
    "le": (np.less_equal, EXACT),
    "gt": (np.greater, EXACT),
    "ge": (np.greater_equal, EXACT),
    "eq": (np.equal, EXACT),
}


@pytest.mark.parametrize("name", sorted(BINARY_CASES))
def test_binary_same_shape(device: nc.Device, name: str) -> None:
    reference, tol = BINARY_CASES[name]
    a = _data(SHAPE, seed=2, low=0.5, high=3.0)
    b = _data(SHAPE, seed=3, low=0.5, high=3.0)
    b[0, :5] = a[0, :5]  # some equal pairs for the comparisons
    if name == "div":
        tol = {"rtol": 3e-7, "atol": 0.0}
    expected = reference(a.astype(np.float64), b.astype(np.float64)).astype(np.float64)
    _check(getattr(ops, name)(nc.tensor(a, device=device), nc.tensor(b, device=device)), expected, tol)


#: sigmoid's y (1 - y) and tanh's 1 - y^2 from a float32 y: three roundings of at most 2**-24 relative
#: each (4.8e-7 with the last), and 1 - y^2 near |y| = 1 cancels y^2's rounding to an absolute
#: 2**-24 at most, times |g| <= 3: atol 1e-6
OUTPUT_FORM = {"rtol": 4.8e-7, "atol": 1e-6}


def _silu_grad64(x: np.ndarray) -> np.ndarray:
    s = 1 / (1 + np.exp(-x))
    return s * (1 + x * (1 - s))


@pytest.mark.parametrize(
    ("name", "derivative", "tol", "parameter"),
    [
        ("relu_backward", lambda x: (x > 0).astype(np.float64), EXACT, None),
        ("gelu_backward", _gelu_grad64, TRANSCENDENTAL, None),
        ("silu_backward", _silu_grad64, TRANSCENDENTAL, None),
        ("sigmoid_backward", lambda y: y * (1 - y), OUTPUT_FORM, None),  # of the output: y in (0, 1)
        ("tanh_backward", lambda y: 1 - y * y, OUTPUT_FORM, None),  # of the output: y in (-1, 1)
        ("leaky_relu_backward", lambda x: np.where(x > 0, 1.0, 0.125), EXACT, 0.125),
        ("elu_backward", lambda x: np.where(x > 0, 1.0, 1.5 * np.exp(x)), TRANSCENDENTAL, 1.5),
    ],
)
def test_activation_backward_is_one_kernel_of_both_ops(
    device: nc.Device, name: str, derivative, tol: dict, parameter: float | None
) -> None:
    """g * act'(.) in one launch, against float64: relu's, gelu's, silu's, leaky_relu's (slope 0.125) and
    elu's (alpha 1.5) of the input (relu's 0 at 0, exact), sigmoid's and tanh's of the output
    (``OUTPUT_FORM``); relu's bits are those of mul(g, relu_grad(x))."""
    g = _data(SHAPE, seed=6)
    low, high = {"sigmoid_backward": (0.01, 0.99), "tanh_backward": (-0.99, 0.99)}.get(name, (-6.0, 6.0))
    x = _data(SHAPE, seed=7, low=low, high=high)
    if name == "relu_backward":
        x[0, :3] = 0.0  # relu's gradient at 0 is 0
    tg, tx = nc.tensor(g, device=device), nc.tensor(x, device=device)
    got = getattr(ops, name)(tg, tx, *(() if parameter is None else (parameter,)))
    _check(got, g.astype(np.float64) * derivative(x.astype(np.float64)), tol)
    if name == "relu_backward":
        np.testing.assert_array_equal(got.to_host(), ops.mul(tg, ops.relu_grad(tx)).to_host())


def test_squared_and_scaled_difference(device: nc.Device) -> None:
    """The mean squared error's terms (a - b)^2 and gradient (a - b) * c in one kernel each, b and c
    broadcast: the bits of the two-op compositions (the same float32 roundings), and float64 within
    3 * 2**-24 * (|a| + |b|)^2 (a - b rounded once relative to |a| + |b|, then squared) and one more
    rounding for the scale."""
    a, b, c = _data((4, 33), seed=8), _data((33,), seed=9), _data((), seed=10)
    ta, tb, tc = (nc.tensor(v, device=device) for v in (a, b, c))
    squared, scaled = ops.squared_difference(ta, tb).to_host(), ops.scaled_difference(ta, tb, tc).to_host()
    d = ops.sub(ta, tb)
    np.testing.assert_array_equal(squared, ops.mul(d, d).to_host())
    np.testing.assert_array_equal(scaled, ops.mul(d, tc).to_host())
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = 3 * 2.0**-24 * (np.abs(a64) + np.abs(b64)) ** 2
    assert np.all(np.abs(squared - (a64 - b64) ** 2) <= bound)
    assert np.all(np.abs(scaled - (a64 - b64) * float(c)) <= 2 * 2.0**-24 * (np.abs(a64) + np.abs(b64)) * abs(float(c)))


BROADCAST_SHAPES = [
    ((5, 1), (1, 7)),  # (B, 1) vs (1, F)
    ((3, 1, 4), (2, 4)),  # rank difference and a stretched middle axis
    ((), (3, 4)),  # 0-d tensor on the left
    ((3, 4), ()),  # ... and on the right
    ((), ()),
    ((0, 4), (1, 4)),  # zero-size
]


@pytest.mark.parametrize(("sa", "sb"), BROADCAST_SHAPES)
def test_add_broadcasting(device: nc.Device, sa: tuple, sb: tuple) -> None:
    a, b = _data(sa, seed=4), _data(sb, seed=5)
    result = ops.add(nc.tensor(a, device=device), nc.tensor(b, device=device))
    _check(result, a.astype(np.float64) + b, EXACT)


def test_sub_broadcast_both_sides(device: nc.Device) -> None:
    a, b = _data((5, 1), seed=6), _data((1, 7), seed=7)
    _check(ops.sub(nc.tensor(b, device=device), nc.tensor(a, device=device)), b.astype(np.float64) - a, EXACT)


@pytest.mark.parametrize("scalar", [2.5, 3, np.float32(-1.25), np.float64(0.5)])
def test_scalar_on_either_side(device: nc.Device, scalar: object) -> None:
    x = _data(SHAPE, seed=8)
    t = nc.tensor(x, device=device)
    s = float(np.float32(scalar))
    _check(ops.mul(t, scalar), x.astype(np.float64) * s, EXACT)
    _check(ops.sub(scalar, t), s - x.astype(np.float64), EXACT)
    _check(ops.maximum(scalar, t), np.maximum(s, x.astype(np.float64)), EXACT)


def test_new_scalar_value_reuses_the_kernel(cl_device: nc.Device) -> None:
    t = nc.tensor(_data(SHAPE, seed=9), device=cl_device)
    ops.mul(t, 1.5).to_host()
    builds = program_cache.stats().builds + program_cache.stats().disk_hits
    for value in (2.0, -7.25, 1e-3):
        np.testing.assert_allclose(ops.mul(t, value).to_host(), t.to_host() * np.float32(value), rtol=1.2e-7)
    assert program_cache.stats().builds + program_cache.stats().disk_hits == builds


@pytest.mark.parametrize("scalar", [1e40, -1e40, 3.4028235677973366e38 * (1 + 2**-25), 1e-50, 1e-45, -0.0, np.nan, 0.1])
def test_a_python_float_scalar_rounds_as_np_float32_on_every_call(cl_device: nc.Device, scalar: float) -> None:
    """The hot path passes a Python float to the launch as it is (no ``np.float32`` on the call): the kernel still
    gets float32 of it, overflow to inf, underflow and signed zero included, on the first call and the repeats."""
    x = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    t = nc.tensor(x, device=cl_device)
    with np.errstate(over="ignore", invalid="ignore"):
        right, left = x * np.float32(scalar), np.float32(scalar) - x
    for _ in range(3):
        np.testing.assert_array_equal(ops.mul(t, scalar).to_host(), right)
        np.testing.assert_array_equal(ops.sub(scalar, t).to_host(), left)


def test_math_ops_on_a_cpu_run_on_vectors_with_a_scalar_tail(cl_device: nc.Device) -> None:
    """On a CPU device an op with a math call evaluates whole ``floatN`` vectors and the last partial one lane by
    lane; scalars and one-element operands are splatted. 4 x 33 (and 7) elements leave a tail at every width."""
    if cl_device.is_gpu:
        pytest.skip("the vector form is the CPU devices' (a GPU runs one element a work-item)")
    from netcl.runtime import clear_caches

    clear_caches()  # every plan below is made (and listed in _OP_PLANS) by this test
    x, y = _data(SHAPE, seed=13, low=0.1, high=3.0), _data((1, 1), seed=14, low=0.5, high=2.0)
    tx, ty, tail = nc.tensor(x, device=cl_device), nc.tensor(y, device=cl_device), nc.tensor(x[0, :7], device=cl_device)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    _check(ops.exp(tx), np.exp(x64), TRANSCENDENTAL)
    _check(ops.exp(tail), np.exp(x64[0, :7]), TRANSCENDENTAL)
    _check(ops.pow(tx, ty), x64**y64, TRANSCENDENTAL)
    _check(ops.pow(tx, 1.5), x64**1.5, TRANSCENDENTAL)
    _check(ops.pow(2.0, tx), 2.0**x64, TRANSCENDENTAL)
    ops.add(tx, tx)
    plans = [plan for plan, _ in pointwise._OP_PLANS.values() if plan.out_shape == SHAPE and plan.ctypes == ("float",)]
    assert {plan.vector for plan in plans if plan.expr == "EXP({0})"} == {cl_device.vector_width}
    plans = [plan for plan, _ in pointwise._OP_PLANS.values() if plan.ctypes == ("float", "float")]
    assert {plan.vector for plan in plans if plan.expr == "ADD({0}, {1})" and plan.out_shape == SHAPE} == {1}
    assert cl_device.vector_width > 1  # the compiler vectorizes arithmetic across work-items as it is


def test_nan_propagation(device: nc.Device) -> None:
    x = np.array([np.nan, 1.0, -1.0, np.nan], np.float32)
    y = np.array([0.0, np.nan, 2.0, np.nan], np.float32)
    tx, ty = nc.tensor(x, device=device), nc.tensor(y, device=device)
    np.testing.assert_array_equal(ops.maximum(tx, ty).to_host(), np.maximum(x, y))
    np.testing.assert_array_equal(ops.minimum(tx, ty).to_host(), np.minimum(x, y))
    np.testing.assert_array_equal(ops.relu(tx).to_host(), [np.nan, 1.0, 0.0, np.nan])


def test_where(device: nc.Device) -> None:
    cond = (_data((4, 1), seed=10) > 0).astype(np.float32)
    a, b = _data((4, 6), seed=11), _data((1, 6), seed=12)
    result = ops.where(nc.tensor(cond, device=device), nc.tensor(a, device=device), nc.tensor(b, device=device))
    _check(result, np.where(cond != 0, a, b).astype(np.float64), EXACT)
    scalar_b = ops.where(nc.tensor(cond, device=device), nc.tensor(a, device=device), -1.0)
    _check(scalar_b, np.where(cond != 0, a, -1.0).astype(np.float64), EXACT)


def test_clamp(device: nc.Device) -> None:
    x = _data(SHAPE, seed=13)
    t = nc.tensor(x, device=device)
    _check(ops.clamp(t, -0.5, 1.0), np.clip(x, -0.5, 1.0).astype(np.float64), EXACT)
    lo, hi = _data((1, 33), seed=14, low=-2, high=0), _data((4, 1), seed=15, low=0, high=2)
    result = ops.clamp(t, nc.tensor(lo, device=device), nc.tensor(hi, device=device))
    _check(result, np.minimum(np.maximum(x, lo), hi).astype(np.float64), EXACT)


def test_generic_elementwise(device: nc.Device) -> None:
    x, t = _data(SHAPE, seed=16), (_data(SHAPE, seed=17) > 0).astype(np.float32)

    def bce(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.maximum(a, 0) - a * b + np.log1p(np.exp(-np.abs(a)))

    result = ops.elementwise("BCE_LOGITS({0}, {1})", bce, nc.tensor(x, device=device), nc.tensor(t, device=device))
    _check(result, bce(x.astype(np.float64), t.astype(np.float64)), TRANSCENDENTAL)
    scaled = ops.elementwise("{0} * {1} + {0}", lambda a, s: a * s + a, nc.tensor(x, device=device), 0.25)
    _check(scaled, x.astype(np.float64) * 1.25, {"rtol": 2.4e-7, "atol": 0.0})


def test_in_place(device: nc.Device) -> None:
    dst = nc.tensor(_data((3, 5), seed=18), device=device)
    expected = dst.to_host().astype(np.float64)
    row = _data((1, 5), seed=19)
    assert ops.add_(dst, nc.tensor(row, device=device)) is dst
    ops.add_(dst, 2.0)
    _check(dst, expected + row + 2.0, {"rtol": 2.4e-7, "atol": 0.0})
    assert ops.fill_(dst, -3.5) is dst
    np.testing.assert_array_equal(dst.to_host(), np.full((3, 5), -3.5, np.float32))
    with pytest.raises(nc.ShapeError, match=r"\(3, 5\)"):
        ops.add_(nc.tensor(np.zeros((1, 5), np.float32), device=device), dst)


def test_dtype_rules(device: nc.Device) -> None:
    i = nc.tensor(np.array([1, -2, 3], np.int32), device=device)
    f = nc.tensor(np.array([0.5, 1.5, 2.5], np.float32), device=device)
    assert ops.add(i, 2).dtype == np.int32
    np.testing.assert_array_equal(ops.add(i, 2).to_host(), [3, 0, 5])
    np.testing.assert_array_equal(ops.maximum(i, 0).to_host(), [1, 0, 3])
    assert ops.add(i, 0.5).dtype == np.float32
    assert ops.add(i, f).dtype == np.float32
    np.testing.assert_array_equal(ops.add(i, f).to_host(), [1.5, -0.5, 5.5])
    assert ops.div(i, 2).dtype == np.float32
    np.testing.assert_array_equal(ops.div(i, 2).to_host(), [0.5, -1.0, 1.5])
    assert ops.lt(i, 2).dtype == np.float32
    assert ops.exp(i).dtype == np.float32


def test_device_mixing_names_both(cl_device: nc.Device) -> None:
    a = nc.tensor(np.ones(3, np.float32), device=cl_device)
    b = nc.tensor(np.ones(3, np.float32), device="cpu")
    with pytest.raises(nc.DeviceError) as info:
        ops.add(a, b)
    assert cl_device.name in str(info.value) and "cpu" in str(info.value)


def test_bad_operands(device: nc.Device) -> None:
    t = nc.tensor(np.ones(3, np.float32), device=device)
    with pytest.raises(TypeError, match="neither a netcl Tensor"):
        ops.add(t, np.ones(3))
    with pytest.raises(nc.ShapeError):
        ops.add(t, nc.tensor(np.ones(4, np.float32), device=device))


def test_results_are_new_tensors(device: nc.Device) -> None:
    t = nc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    out = ops.add(t, 0.0)
    assert out is not t and out.data is not t.data
    ops.fill_(out, 1.0)
    np.testing.assert_array_equal(t.to_host(), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert math.prod(out.shape) == 6


def test_float64_keeps_double_precision(device: nc.Device) -> None:
    """float64 tensors compute in double (not through the float helpers): agreement to 1e-13."""
    if not device.supports(np.float64):
        pytest.skip("device has no float64")
    x = np.random.default_rng(20).uniform(0.1, 3.0, (2, 9))
    t = nc.tensor(x, dtype=np.float64, device=device)
    for name, reference in [("exp", np.exp), ("log", np.log), ("tanh", np.tanh), ("gelu", _gelu64)]:
        result = getattr(ops, name)(t)
        assert result.dtype == np.float64
        np.testing.assert_allclose(result.to_host(), reference(x), rtol=1e-13, atol=0)
    np.testing.assert_allclose(ops.maximum(t, 1.5).to_host(), np.maximum(x, 1.5), rtol=0, atol=0)
    bce = ops.elementwise("BCE_LOGITS({0}, {1})", lambda a, b: np.maximum(a, 0) - a * b + np.log1p(np.exp(-a)), t, 0.25)
    np.testing.assert_allclose(bce.to_host(), np.maximum(x, 0) - x * 0.25 + np.log1p(np.exp(-x)), rtol=1e-13)


def test_clear_caches_rebuilds_through_the_program_cache(cl_device: nc.Device) -> None:
    from netcl.runtime import clear_caches

    t = nc.tensor(_data(SHAPE, seed=21), device=cl_device)
    expected = ops.mul(t, 3.0).to_host()
    clear_caches()
    before = program_cache.stats()
    np.testing.assert_array_equal(ops.mul(t, 3.0).to_host(), expected)
    after = program_cache.stats()
    assert after.misses == before.misses + 1  # the memoized kernel was dropped, not used stale


def test_gelu_extremes_have_no_nan(device: nc.Device) -> None:
    x = nc.tensor(np.array([-1e30, -100.0, -10.0, 10.0, 100.0, 1e30], np.float32), device=device)
    np.testing.assert_allclose(ops.gelu_grad(x).to_host(), [0, 0, 0, 1, 1, 1], atol=1e-6)
    np.testing.assert_allclose(ops.gelu(x).to_host(), [0, 0, 0, 10, 100, 1e30], rtol=1e-6, atol=1e-6)
