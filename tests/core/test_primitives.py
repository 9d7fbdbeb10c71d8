"""``PRIMITIVE_PREAMBLE`` builds on the OpenCL device and every helper matches a float64 NumPy reference.

Tolerance. OpenCL 1.2 (section 7.4) bounds single-precision error at 2.5 ulp for ``/``, 3 ulp for
``exp``/``log``/``sqrt``, 2 for ``log1p``/``rsqrt``, 5 for ``tanh`` and 16 for ``pow``; one float32 ulp is
at most 2**-23 ~ 1.2e-7 relative. The composite helpers (SIGMOID, GELU, BCE_LOGITS, ...) chain a few
such steps (PoCL measures at most ~8 ulp for GELU/GELU_GRAD), so ``RTOL = 4e-6`` (~33 ulp) leaves room
for any conforming driver while a wrong formula or constant is off by far more. ``max(x, 0) - x*t``
in BCE_LOGITS subtracts terms of size ~|x|, and results that underflow float32 (EXP(-100)) are
compared absolutely, hence the absolute part ``ATOL_PER_MAGNITUDE * (1 + |x|)`` (~4 ulp of |x|).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.core.kernels import PRIMITIVE_NAMES, PRIMITIVE_PREAMBLE

RTOL = 4e-6
ATOL_PER_MAGNITUDE = 5e-7
K = math.sqrt(2 / math.pi)
C = 0.044715

# x: large magnitudes, zero, tiny, negative (NaN for LOG/SQRT) and NaN itself, then a dense grid.
# y: a second operand (NaN too, at another position), also for POW (negative base -> NaN).
X = np.concatenate(
    [
        np.array([-100, -80, -20, -5, -2, -1, -0.5, -1e-3, 0, 1e-3, 0.3, 0.5, 1, 2, 5, 20, 80, 100, np.nan, 3, -3]),
        np.linspace(-6, 6, 49),
    ]
).astype(np.float32)
Y = np.concatenate(
    [
        np.array([3, -2, 0.5, 2, -1, 0, 20, 1, -5, 80, -80, 5, 1e-3, -0.5, 100, -100, 1, 7, 2, np.nan, 0.5]),
        np.linspace(4, -4, 49),
    ]
).astype(np.float32)
T = np.resize(np.array([0.0, 0.25, 1.0], dtype=np.float32), X.shape)  # BCE targets in [0, 1]
BETA = 0.5


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * x))  # no overflow in float64 for any x


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(K * (x + C * x**3)))


_ERF = np.vectorize(math.erf)


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + _ERF(x / math.sqrt(2)))


def _gelu_erf_grad(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        tail = np.nan_to_num(x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))
    return 0.5 * (1 + _ERF(x / math.sqrt(2))) + tail


def _smooth_l1(d: np.ndarray, beta: float) -> np.ndarray:
    if beta == 0:
        return np.abs(d)
    return np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta)


def _smooth_l1_grad(d: np.ndarray, beta: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.abs(d) < beta, d / beta, np.sign(d))


# name -> (C expression over float a, b, t, float64 reference over x, y, t)
FLOAT_CASES: dict[str, tuple[str, Callable[..., np.ndarray]]] = {
    "ADD": ("ADD(a, b)", lambda x, y, t: x + y),
    "SUB": ("SUB(a, b)", lambda x, y, t: x - y),
    "MUL": ("MUL(a, b)", lambda x, y, t: x * y),
    "DIV": ("DIV(a, b)", lambda x, y, t: x / y),
    "NEG": ("NEG(a)", lambda x, y, t: -x),
    "LT": ("LT(a, b)", lambda x, y, t: (x < y) * 1.0),
    "LE": ("LE(a, b)", lambda x, y, t: (x <= y) * 1.0),
    "GT": ("GT(a, b)", lambda x, y, t: (x > y) * 1.0),
    "GE": ("GE(a, b)", lambda x, y, t: (x >= y) * 1.0),
    "EQ": ("EQ(a, a * (b > 0.0f))", lambda x, y, t: (x == x * (y > 0)) * 1.0),
    "WHERE": ("WHERE(LT(a, b), a, b)", lambda x, y, t: np.where(x < y, x, y)),
    "RELU": ("RELU(a)", lambda x, y, t: np.maximum(x, 0)),
    "RELU_GRAD": ("RELU_GRAD(a)", lambda x, y, t: (x > 0) * 1.0),
    "ABS": ("ABS(a)", lambda x, y, t: np.abs(x)),
    "SIGN": ("SIGN(a)", lambda x, y, t: np.sign(x)),
    "EXP": ("EXP(a)", lambda x, y, t: np.exp(x)),
    "LOG": ("LOG(a)", lambda x, y, t: np.log(x)),
    "LOG1P": ("LOG1P(a)", lambda x, y, t: np.log1p(x)),
    "SQRT": ("SQRT(a)", lambda x, y, t: np.sqrt(x)),
    "RSQRT": ("RSQRT(a)", lambda x, y, t: 1 / np.sqrt(x)),
    "POW": ("POW(a, b)", lambda x, y, t: np.power(x, y)),
    "TANH": ("TANH(a)", lambda x, y, t: np.tanh(x)),
    "MAX": ("MAX(a, b)", lambda x, y, t: np.maximum(x, y)),
    "MIN": ("MIN(a, b)", lambda x, y, t: np.minimum(x, y)),
    "CLAMP": ("CLAMP(a, -1.0f, 2.0f)", lambda x, y, t: np.clip(x, -1, 2)),
    "SIGMOID": ("SIGMOID(a)", lambda x, y, t: _sigmoid(x)),
    "GELU": ("GELU(a)", lambda x, y, t: _gelu(x)),
    "GELU_GRAD": (
        "GELU_GRAD(a)",
        lambda x, y, t: (
            0.5 * (1 + np.tanh(K * (x + C * x**3)))
            + 0.5 * x * (1 - np.tanh(K * (x + C * x**3)) ** 2) * K * (1 + 3 * C * x**2)
        ),
    ),
    "GELU_ERF": ("GELU_ERF(a)", lambda x, y, t: _gelu_erf(x)),
    "GELU_ERF_GRAD": ("GELU_ERF_GRAD(a)", lambda x, y, t: _gelu_erf_grad(x)),
    # softplus(x) - x*t, an independent form of -(t log s(x) + (1-t) log(1-s(x)))
    "BCE_LOGITS": ("BCE_LOGITS(a, t)", lambda x, y, t: np.logaddexp(0, x) - x * t),
    "BCE_LOGITS_GRAD": ("BCE_LOGITS_GRAD(a, t)", lambda x, y, t: _sigmoid(x) - t),
    "SMOOTH_L1": (f"SMOOTH_L1(a, {BETA}f)", lambda x, y, t: _smooth_l1(x, BETA)),
    "SMOOTH_L1_GRAD": (f"SMOOTH_L1_GRAD(a, {BETA}f)", lambda x, y, t: _smooth_l1_grad(x, BETA)),
    "SMOOTH_L1_BETA0": ("SMOOTH_L1(a, 0.0f)", lambda x, y, t: _smooth_l1(x, 0.0)),
    "SMOOTH_L1_GRAD_BETA0": ("SMOOTH_L1_GRAD(a, 0.0f)", lambda x, y, t: _smooth_l1_grad(x, 0.0)),
    "NE": ("NE(a, a * (b > 0.0f))", lambda x, y, t: (x != x * (y > 0)) * 1.0),
    "SIN": ("SIN(a)", lambda x, y, t: np.sin(x)),
    "COS": ("COS(a)", lambda x, y, t: np.cos(x)),
    "SILU": ("SILU(a)", lambda x, y, t: x * _sigmoid(x)),
    "SILU_GRAD": ("SILU_GRAD(a)", lambda x, y, t: _sigmoid(x) * (1 + x * (1 - _sigmoid(x)))),
    "LEAKY_RELU": ("LEAKY_RELU(a, 0.1f)", lambda x, y, t: np.where(x > 0, x, 0.1 * x)),
    "LEAKY_RELU_GRAD": (
        "LEAKY_RELU_GRAD(a, 0.1f)",
        lambda x, y, t: np.where(x > 0, 1.0, np.where(np.isnan(x), 0.1, 0.1)),
    ),
    "ELU": ("ELU(a, 0.5f)", lambda x, y, t: np.where(x > 0, x, 0.5 * np.expm1(x))),
    "ELU_GRAD": ("ELU_GRAD(a, 0.5f)", lambda x, y, t: np.where(x > 0, 1.0, 0.5 * np.exp(x))),
    # softplus as logaddexp(0, beta x) / beta (an independent form), x above the threshold
    "SOFTPLUS": ("SOFTPLUS(a, 2.0f, 20.0f)", lambda x, y, t: np.where(2 * x > 20, x, np.logaddexp(0, 2 * x) / 2)),
    "SOFTPLUS_GRAD": ("SOFTPLUS_GRAD(a, 2.0f, 20.0f)", lambda x, y, t: np.where(2 * x > 20, 1.0, _sigmoid(2 * x))),
}

# The arithmetic/comparison macros are type-generic: check them on int too (exact).
INT_CASES: dict[str, tuple[str, Callable[..., np.ndarray]]] = {
    "ADD": ("ADD(a, b)", lambda x, y: x + y),
    "SUB": ("SUB(a, b)", lambda x, y: x - y),
    "MUL": ("MUL(a, b)", lambda x, y: x * y),
    "NEG": ("NEG(a)", lambda x, y: -x),
    "LT": ("LT(a, b)", lambda x, y: (x < y) * 1),
    "GE": ("GE(a, b)", lambda x, y: (x >= y) * 1),
    "EQ": ("EQ(a, b)", lambda x, y: (x == y) * 1),
    "WHERE": ("WHERE(GT(a, b), a, b)", lambda x, y: np.maximum(x, y)),
}
XI = np.array([-7, -1, 0, 1, 3, 5, 100, -100], dtype=np.int32)
YI = np.array([2, -1, 0, 4, 3, -5, 100, 7], dtype=np.int32)


def _kernel_source() -> str:
    float_body = "\n    ".join(f"out[{row} * n + i] = {expr};" for row, (expr, _) in enumerate(FLOAT_CASES.values()))
    int_body = "\n    ".join(f"out[{row} * n + i] = {expr};" for row, (expr, _) in enumerate(INT_CASES.values()))
    return f"""{PRIMITIVE_PREAMBLE}
__kernel void eval_float(__global const float* x, __global const float* y, __global const float* tt,
                         __global float* out, const int n) {{
    int i = get_global_id(0);
    float a = x[i], b = y[i], t = tt[i];
    {float_body}
}}
__kernel void eval_int(__global const int* x, __global const int* y, __global int* out, const int n) {{
    int i = get_global_id(0);
    int a = x[i], b = y[i];
    {int_body}
}}
"""


@pytest.fixture(scope="module")
def results() -> dict[str, np.ndarray]:
    """Build the preamble once and run both kernels; rows keyed by case name."""
    if not nc.usable_opencl_devices():
        pytest.skip("no OpenCL device on this machine")
    device = nc.get_device("opencl")
    program = cl.Program(device.context, _kernel_source()).build()
    queue = device.queue
    out = {}
    for kernel, inputs, cases, dtype in (
        (program.eval_float, (X, Y, T), FLOAT_CASES, np.float32),
        (program.eval_int, (XI, YI), INT_CASES, np.int32),
    ):
        n = inputs[0].size
        bufs = [nc.Tensor.from_host(device, v) for v in inputs]
        res = nc.Tensor.empty((len(cases), n), dtype, device)
        kernel(queue, (n,), None, *[b.data for b in bufs], res.data, np.int32(n))
        rows = res.to_host()
        prefix = "float" if dtype == np.float32 else "int"
        out.update({f"{prefix}:{name}": rows[r] for r, name in enumerate(cases)})
    return out


def _reference(name: str) -> np.ndarray:
    x, y, t = (v.astype(np.float64) for v in (X, Y, T))
    with np.errstate(all="ignore"):
        return FLOAT_CASES[name][1](x, y, t)


def test_every_required_helper_is_defined_and_tested() -> None:
    required = "ADD SUB MUL DIV NEG RELU SIGMOID TANH EXP LOG SQRT RSQRT GELU MAX MIN WHERE LT LE GT GE EQ ABS SIGN POW"
    assert set(required.split()) <= set(PRIMITIVE_NAMES)
    assert {"BCE_LOGITS", "BCE_LOGITS_GRAD", "SMOOTH_L1", "SMOOTH_L1_GRAD"} <= set(PRIMITIVE_NAMES)
    for name in PRIMITIVE_NAMES:
        assert f"{name}(" in PRIMITIVE_PREAMBLE, name
        assert any(f"{name}(" in expr for expr, _ in FLOAT_CASES.values()), f"{name} has no test"


@pytest.mark.parametrize("name", list(FLOAT_CASES))
def test_float_helper_matches_float64_reference(results: dict[str, np.ndarray], name: str) -> None:
    got = results[f"float:{name}"].astype(np.float64)
    ref = _reference(name)
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32).astype(np.float64)  # what float32 can represent: 1e40 -> inf
    nan = np.isnan(ref32)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{name}: NaN where NumPy gives NaN, and only there")
    inf = np.isinf(ref32)
    np.testing.assert_array_equal(got[inf], ref32[inf], err_msg=f"{name}: infinities")
    finite = ~nan & ~inf
    scale = 1 + np.nan_to_num(np.abs(X.astype(np.float64)))
    with np.errstate(invalid="ignore"):  # inf - inf outside the finite mask
        err = np.abs(got - ref)[finite]
    bound = (RTOL * np.abs(ref) + ATOL_PER_MAGNITUDE * scale)[finite]
    worst = int(np.argmax(err - bound)) if err.size else 0
    assert np.all(err <= bound), (
        f"{name}: x={X[finite][worst]} y={Y[finite][worst]} got {got[finite][worst]!r}, want {ref[finite][worst]!r}"
    )


def test_nan_semantics(results: dict[str, np.ndarray]) -> None:
    nan_x, nan_y = int(np.flatnonzero(np.isnan(X))[0]), int(np.flatnonzero(np.isnan(Y))[0])
    for name in ("MAX", "MIN"):  # propagate NaN from either side, as np.maximum/np.minimum
        assert np.isnan(results[f"float:{name}"][nan_x]) and np.isnan(results[f"float:{name}"][nan_y])
    for name in ("RELU", "SIGN", "CLAMP", "SIGMOID", "TANH", "GELU", "SMOOTH_L1"):
        assert np.isnan(results[f"float:{name}"][nan_x]), name
    negative = X < 0
    for name in ("LOG", "SQRT", "RSQRT"):
        assert np.all(np.isnan(results[f"float:{name}"][negative])), name
    assert results["float:LOG"][X == 0][0] == -np.inf and results["float:RSQRT"][X == 0][0] == np.inf


def test_large_logits_do_not_overflow(results: dict[str, np.ndarray]) -> None:
    big = np.abs(X) >= 80
    for name in ("SIGMOID", "BCE_LOGITS", "BCE_LOGITS_GRAD", "GELU", "GELU_GRAD", "TANH"):
        assert np.all(np.isfinite(results[f"float:{name}"][big])), name
    sigmoid = results["float:SIGMOID"]
    assert np.all(sigmoid[X >= 80] == 1.0) and np.all((sigmoid[X <= -80] >= 0) & (sigmoid[X <= -80] < 1e-30))
    bce = results["float:BCE_LOGITS"]
    at = {float(x): (float(v), float(t)) for x, v, t in zip(X, bce, T, strict=True) if abs(x) >= 80}
    for x, (value, t) in at.items():
        assert value == pytest.approx(max(x, 0) - x * t, rel=RTOL, abs=1e-30), x


@pytest.mark.parametrize("name", list(INT_CASES))
def test_int_macros_are_exact(results: dict[str, np.ndarray], name: str) -> None:
    expected = INT_CASES[name][1](XI.astype(np.int64), YI.astype(np.int64))
    np.testing.assert_array_equal(results[f"int:{name}"], expected)


def test_gelu_grad_reference_is_the_derivative() -> None:
    """The analytic GELU_GRAD reference above agrees with a central difference of GELU in float64."""
    x = np.linspace(-6, 6, 241)
    h = 1e-6
    numeric = (_gelu(x + h) - _gelu(x - h)) / (2 * h)
    analytic = FLOAT_CASES["GELU_GRAD"][1](x, None, None)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(_sigmoid(x) - 0.25, FLOAT_CASES["BCE_LOGITS_GRAD"][1](x, None, 0.25))
    # d/dx of the BCE reference is the BCE_LOGITS_GRAD reference
    bce = FLOAT_CASES["BCE_LOGITS"][1]
    numeric_bce = (bce(x + h, None, 0.25) - bce(x - h, None, 0.25)) / (2 * h)
    np.testing.assert_allclose(numeric_bce, _sigmoid(x) - 0.25, rtol=1e-6, atol=1e-8)


def test_preamble_builds_with_strict_options(cl_device: nc.Device) -> None:
    """Codegen may add these flags; the preamble alone (no kernels) must still build."""
    cl.Program(cl_device.context, PRIMITIVE_PREAMBLE + "\n__kernel void k(void) {}\n").build(
        options=["-cl-std=CL1.2", "-cl-mad-enable", "-cl-opt-disable"]
    )
