"""Differential fuzzing of jit_compile: random elementwise DAGs, fused vs un-fused vs a float64 reference.

Each example is a random program (``fuzz_programs.cases``: up to 12 ops, shared sub-expressions,
1-3 outputs, broadcast shapes with size-1 and zero-size dims, Python scalars on either side, a
Python-scalar argument, inputs up to 3e38 in magnitude). It runs

* un-fused: the plain function of ``netcl.autograd`` ops, one eager kernel per op;
* fused: ``jit_compile`` of the same function (fresh per example, so fresh kernels), twice
  (the second call is a plan-cache hit and must give the same bits);

forward and backward (``Tape.backward`` of every differentiable output with its upstream
gradient, ``retain_graph`` so leaf gradients accumulate over the outputs). Every float32 result
must lie in the interval the float64 reference allows (``interval_reference``: the exact value
widened by each op's documented rounding slack; NaN exactly where the math gives NaN, e.g. log
of a negative, inf - inf, 0 * inf). The reference never fails on rounding, so a failure is a
wrong formula, a wrong index, a lost or doubled gradient, or a wrong NaN.

Programs also reduce (``sum``, ``mean``, ``max``, ``min`` over the last, the first or all axes,
keepdims) including over zero-size axes, and mask (``where`` of a boolean mask input over the last
axis and a fill such as -inf, then a reduction over the last axis: a user's masked softmax); a
reduction over the last axis fuses with the elementwise ops around it into one row kernel each way
(``netcl.jit.row_group``), the others are eager steps.
Some inputs come from pow's special bases (0, -0, negatives, +-inf). Examples: the ``ci``
profile runs ``max_examples`` (the same ones every run) on the NumPy backend and a quarter of
that on OpenCL (each OpenCL example builds 2-6 kernels);
``--hypothesis-profile=long`` runs thousands of new ones.
"""

from __future__ import annotations

from typing import Any

import file_modules
import numpy as np
import pytest
from hypothesis import given, settings

import netcl.autograd as ag
import netcl.core as nc
from netcl.jit import jit_compile


def _load(name: str) -> Any:
    return file_modules.load(f"tests/reliability/{name}.py", f"netcl_reliability_{name}")


fp = _load("fuzz_programs")
Case, Instr = fp.Case, fp.Instr


@pytest.fixture(scope="module", autouse=True)
def _no_disk_cache():
    """Fuzzed kernels are one-offs: keep them out of the user's disk cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NETCL_CACHE", "0")
        yield


def _has_opencl() -> bool:
    return nc.usable_opencl_devices()


def _check(label: str, what: str, interval: Any, got: np.ndarray, case: Any) -> None:
    assert tuple(got.shape) == interval.shape, f"{label} {what}: shape {got.shape}, expected {interval.shape}"
    if not interval.contains(got).all():
        raise AssertionError(f"{label} {what} outside the float64 reference:\n{interval.describe(got)}\n{case!r}")


def _extra(case: Any, device: nc.Device) -> tuple:
    """The arguments after the inputs: the boolean mask (a tensor), then the Python scalar."""
    mask = () if case.mask is None else (ag.tensor(case.mask, device=device),)
    return mask + (() if case.param is None else (case.param,))


def _run(fn: Any, case: Any, device: nc.Device, ref: Any, label: str) -> list[np.ndarray]:
    nodes = [
        ag.tensor(x, requires_grad=rg, device=device) for x, rg in zip(case.inputs, case.requires_grad, strict=True)
    ]
    extra = _extra(case, device)
    with ag.Tape() as tape:
        result = fn(*nodes, *extra)
    outs = result if isinstance(result, tuple) else (result,)
    values = [o.to_host() for o in outs]
    for j, (value, interval) in enumerate(zip(values, ref.outputs, strict=True)):
        _check(label, f"output {j}", interval, value, case)
    for j, (out, upstream, diff) in enumerate(zip(outs, case.upstream, ref.differentiable, strict=True)):
        if label == "unfused":
            assert out.requires_grad == diff, f"output {j}: requires_grad {out.requires_grad}, expected {diff}"
        if diff:
            tape.backward(out, grad=upstream, retain_graph=True)
    expected = ref.grads if label == "unfused" else ref.fused_grads
    for i, (node, interval) in enumerate(zip(nodes, expected, strict=True)):
        if interval is None:
            assert node.grad is None, f"{label}: input {i} does not require grad but got one"
            continue
        grad = node.grad.to_host() if node.grad is not None else np.zeros(node.shape, np.float32)
        _check(label, f"gradient of input {i}", interval, grad, case)
    return values


def run_case(case: Any, device: nc.Device | str) -> None:
    """Run ``case`` un-fused and fused on ``device`` and check both against the reference."""
    device = nc.get_device(device)
    ref = fp.reference(case)
    fn = fp.make_function(case)
    _run(fn, case, device, ref, "unfused")
    jitted = jit_compile(fn)
    first = _run(jitted, case, device, ref, "jit")
    nodes = [ag.tensor(x, device=device) for x in case.inputs]
    extra = _extra(case, device)
    again = jitted(*nodes, *extra)
    again = again if isinstance(again, tuple) else (again,)
    for j, (a, b) in enumerate(zip(first, again, strict=True)):
        np.testing.assert_array_equal(b.to_host(), a, err_msg=f"output {j}: plan-cache hit differs\n{case!r}")
    info = jitted.cache_info()
    assert info["fallbacks"] == 0, f"the jit fell back to the un-fused function\n{case!r}"


def _scaled(fraction: float) -> settings:
    return settings(max_examples=max(1, int(settings.default.max_examples * fraction)))


@pytest.mark.skipif(not _has_opencl(), reason="no OpenCL device")
@_scaled(0.25)
@given(case=fp.cases())
def test_fuzz_opencl(case):
    run_case(case, "opencl")


@pytest.mark.skipif(not _has_opencl(), reason="no OpenCL device")
@_scaled(0.1)
@given(case=fp.cases())
def test_fuzz_opencl_column_sums(case):
    """As above with the GPU default of summing a bias's gradient in the backward kernel (off on CPU
    devices), over 3 partial rows, so PoCL runs those kernels on the fuzzed programs too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NETCL_JIT_COLUMN_SUMS", "1")
        mp.setenv("NETCL_JIT_COLUMN_GROUPS", "3")
        run_case(case, "opencl")


@_scaled(1.0)
@given(case=fp.cases())
def test_fuzz_numpy_backend(case):
    run_case(case, "cpu")


# ---- regressions: every failure the fuzzer found, kept as explicit cases ---------------------------
def _f32(*values):
    return np.array(values, dtype=np.float32)


REGRESSIONS = {
    # jit_compile crashed in codegen (KeyError 'c'): where() with a Python value in a tensor slot
    # was put into a fused group although its primitive expects three tensors.
    "where_with_python_scalar_branch": Case(
        [_f32(0, 1, -2, 0, 3, 0)], [True], None, [Instr("where_s", "where", (0, 0), (0.0,))], [1], [_f32(*[1] * 6)]
    ),
    # GELU_GRAD was NaN for |x| > ~1.8e19: 0 * inf once 3 C x^2 overflowed (preamble and NumPy).
    "gelu_grad_of_huge_inputs": Case(
        [_f32(5.04e19, -5.04e19, 3e38, -3e38, 1.0, 0.0)],
        [True],
        None,
        [Instr("u", "gelu", (0,))],
        [1],
        [_f32(*[1] * 6)],
    ),
    # d(0 ** x)/dx: the un-fused op used log(0) = NaN, the fused kernel LOG(0) = -inf.
    "pow_scalar_base_zero": Case(
        [_f32(-1, 0, 1, 2, -2, 0.5)], [True], None, [Instr("sl", "pow", (0,), (0.0,))], [1], [_f32(*[1] * 6)]
    ),
    # A fused output sent an explicit zero gradient to where()'s condition, produced by another
    # fused group; there 0 * (1 / 0) turned it into NaN. The un-fused path sends nothing.
    "where_condition_from_another_group": Case(
        [np.ones((2, 3), np.float32), np.zeros((1, 3), np.float32)],
        [True, True],
        None,
        [Instr("u", "neg", (1,)), Instr("sr", "div", (2,), (0.0,)), Instr("where", "where", (3, 0, 0))],
        [4],
        [np.ones((2, 3), np.float32)],
    ),
    "where_condition_from_another_group_zero_size": Case(
        [np.ones((0, 4), np.float32), np.zeros((1, 4), np.float32)],
        [True, True],
        None,
        [Instr("u", "neg", (1,)), Instr("sr", "div", (2,), (0.0,)), Instr("where", "where", (3, 0, 0))],
        [4],
        [np.ones((0, 4), np.float32)],
    ),
}


# Issue 11, found by differential testing against PyTorch: d(x ** 0)/dx at x = 0 was NaN (0 * 0 ** -1),
# and mean's backward over a zero-size axis raised ZeroDivisionError.
REGRESSIONS["pow_zero_exponent_at_zero_base"] = Case(
    [_f32(0, -0.0, -2, 3, np.inf, -np.inf)], [True], None, [Instr("sr", "pow", (0,), (0.0,))], [1], [_f32(*[1] * 6)]
)
REGRESSIONS["pow_zero_tensor_exponent_at_zero_base"] = Case(
    [_f32(0, -0.0, -2, 3, np.inf, -np.inf), _f32(0, 0, 0, 0, 0, 0)],
    [True, True],
    None,
    [Instr("b", "pow", (0, 1))],
    [2],
    [_f32(*[1] * 6)],
)
REGRESSIONS["mean_over_a_zero_size_axis"] = Case(
    [np.zeros((3, 0), np.float32), _f32(1, 2, 3).reshape(3, 1)],
    [True, True],
    None,
    [Instr("sum", "mean", (0,), (-1,)), Instr("b", "add", (2, 1)), Instr("sum", "sum", (0,), (None,))],
    [3, 4],
    [np.ones((3, 1), np.float32), np.ones((1, 1), np.float32)],
)

# Found with column sums on: max over the last axis whose upstream gradient is NaN (sqrt of a negative
# max) gave NaN to every element of the row, not just to the maximum (mask * share: 0 * NaN), eager and
# in the row kernel. (min had the same formula; the fuzzer draws min too.)
_ROWS = np.zeros((2, 3, 4), np.float32)
_ROWS[1, 2, 3] = 1.0
REGRESSIONS["max_with_a_nan_upstream_gradient"] = Case(
    [_ROWS],
    [True],
    None,
    [Instr("sum", "max", (0,), (-1,)), Instr("u", "neg", (1,)), Instr("u", "sqrt", (2,))],
    [3],
    [-np.ones((2, 3, 1), np.float32)],
)


# Found when the fuzzer drew min and masked reductions: sum(x + b, -1) with b per row ((N, 1), or (1,) for a
# 1-d x) gave b the row's upstream gradient once, not summed over the row: the gradient of an elem value
# that read only row values (gout broadcast back) was taken as a row value, so nothing reduced it.
REGRESSIONS["row_input_gradient_summed_over_the_row"] = Case(
    [np.full((3, 4), -2, np.float32), _f32(1, 2, 3).reshape(3, 1)],
    [True, True],
    None,
    [Instr("b", "add", (0, 1)), Instr("sum", "sum", (2,), (-1,))],
    [3],
    [_f32(-1, 0.5, 2).reshape(3, 1)],
)
# Found by the masked reductions: where(mask, x, fill) with a bool mask fused into an elementwise kernel
# (not a row group) on OpenCL read the mask's bytes as floats, so every element took x.
REGRESSIONS["bool_mask_in_an_elementwise_kernel"] = Case(
    [np.full((2, 1, 3), -2, np.float32)],
    [True],
    None,
    [Instr("u", "neg", (0,)), Instr("mwhere", "where", (1,), (-np.inf,)), Instr("u", "neg", (2,))],
    [3],
    [_f32(1, 2, 3, -1, 0.5, 4).reshape(2, 1, 3)],
    mask=np.array([False, True, False]),
)
REGRESSIONS["masked_min_of_a_row"] = Case(
    [_f32(3, -1, 2, 5, 0, -4, 1, 1).reshape(2, 4), _f32(0.5, -2).reshape(2, 1)],
    [True, True],
    None,
    [Instr("b", "mul", (0, 1)), Instr("mwhere", "where", (2,), (-np.inf,)), Instr("sum", "min", (3,), (-1,))],
    [4],
    [_f32(1.5, -2).reshape(2, 1)],
    mask=np.array([True, False, True, True]),
)


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_fuzz_regressions(device, name):
    run_case(REGRESSIONS[name], device)


#: The special exponents and bases of pow (issue 11), every pair, through the fuzzer's oracle.
POW_EXPONENTS = [0.0, 1.0, 2.0, -1.0, 0.5]
POW_BASES = _f32(0, -0.0, -1, -2.5, 0.5, 3, np.inf, -np.inf)


@pytest.mark.parametrize("exponent", POW_EXPONENTS)
@pytest.mark.parametrize("form", ["scalar", "tensor"])
def test_pow_special_exponents_and_bases(device, exponent, form):
    n = POW_BASES.size
    upstream = [np.linspace(0.5, 2.0, n, dtype=np.float32)]
    if form == "scalar":
        case = Case([POW_BASES], [True], None, [Instr("sr", "pow", (0,), (exponent,))], [1], upstream)
    else:
        exponents = np.full(n, exponent, np.float32)
        case = Case([POW_BASES, exponents], [True, True], None, [Instr("b", "pow", (0, 1))], [2], upstream)
    run_case(case, device)
