"""jit_compile of a matmul followed by elementwise ops: ONE GEMM kernel with the ops in its store.

References are float64 NumPy: the forward directly, gradients by central differences of
``sum(upstream * f)`` (eps 1e-6 in float64: ~1e-9 accurate, far below the float32 tolerances).
Operands are O(1) and K <= 9, so a float32 product is within ~1e-6 of float64; 1e-5 forward and
1e-4 relative / 1e-5 absolute on gradients (sums over up to 17 rows) leave room and still catch
any wrong formula or operand index (off by O(0.1)).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn.functional as F
from netcl import nn
from netcl.jit import jit_compile, workloads
from netcl.jit.gemm_epilogue import GemmEpilogueStep, one_kernel
from netcl.runtime.ops import host_blas
from netcl.runtime.ops.gemm_source import OPERAND_KINDS


@pytest.fixture(autouse=True)
def _gemm_kernel_on_cpu_opencl(monkeypatch):
    """On a CPU OpenCL device products run on the host BLAS, and so does this path; switched off here
    so that PoCL runs (and these tests check) the one-kernel path a GPU takes."""
    monkeypatch.setenv(host_blas.ENV_VAR, "0")


def _rand(shape, seed, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def _sigmoid(v):
    return 0.5 * (1.0 + np.tanh(0.5 * v))


def _gelu(v):
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v**3)))


# name: (netcl function, float64 reference, input shapes)
CASES = {
    "mlp_block": (workloads.mlp_block, workloads.mlp_block_reference, [(17, 9), (9, 13), (1, 13)]),
    "linear": (lambda x, w, b: ag.matmul(x, w) + b, lambda x, w, b: x @ w + b, [(9, 5), (5, 6), (6,)]),
    "scaled_linear": (
        lambda x, w, b: (ag.matmul(x, w) * 0.5 + b) * 3.0,
        lambda x, w, b: (x @ w * 0.5 + b) * 3.0,
        [(6, 3), (3, 5), (1, 5)],
    ),
    "residual_of_input": (
        lambda x, w: ag.tanh(ag.matmul(x, w) + x) * x,
        lambda x, w: np.tanh(x @ w + x) * x,
        [(5, 4), (4, 4)],
    ),
    "nn_linear": (
        lambda x, w, b: ag.relu(F.linear(x, w, b)) * 2.0,
        lambda x, w, b: np.maximum(x @ w.T + b, 0.0) * 2.0,
        [(7, 5), (4, 5), (4,)],
    ),
    "nn_linear_3d_no_bias": (
        lambda x, w: ag.tanh(F.linear(x, w)) + 0.5,
        lambda x, w: np.tanh(x @ w.T) + 0.5,
        [(2, 3, 5), (4, 5)],
    ),
    "no_bias": (lambda x, w: ag.sigmoid(ag.matmul(x, w)), lambda x, w: _sigmoid(x @ w), [(6, 5), (5, 7)]),
    "gelu_bias_1d": (
        lambda x, w, b: ag.gelu(ag.matmul(x, w) + b),
        lambda x, w, b: _gelu(x @ w + b),
        [(8, 4), (4, 12), (12,)],
    ),
    "residual": (
        lambda x, w, b, r: ag.relu(ag.matmul(x, w) + b) + r,
        lambda x, w, b, r: np.maximum(x @ w + b, 0.0) + r,
        [(7, 6), (6, 5), (1, 5), (7, 5)],
    ),
    "row_bias_scale": (
        lambda x, w, c: ag.tanh(ag.matmul(x, w) * c + c) * 0.5,
        lambda x, w, c: np.tanh((x @ w) * c + c) * 0.5,
        [(5, 3), (3, 4), (5, 1)],
    ),
    "batched": (
        lambda x, w, b: ag.relu(ag.matmul(x, w) - b) * 2.0,
        lambda x, w, b: np.maximum(x @ w - b, 0.0) * 2.0,
        [(3, 4, 6), (6, 5), (1, 5)],
    ),
}


def _fd_grads(reference, arrays, upstream, eps=1e-6):
    arrays64 = [a.astype(np.float64) for a in arrays]
    grads = []
    for k, a in enumerate(arrays64):
        grad = np.zeros_like(a)
        for index in np.ndindex(a.shape):
            plus, minus = list(arrays64), list(arrays64)
            plus[k], minus[k] = a.copy(), a.copy()
            plus[k][index] += eps
            minus[k][index] -= eps
            grad[index] = np.sum(upstream * (reference(*plus) - reference(*minus))) / (2 * eps)
        grads.append(grad)
    return grads


def _run(fn, arrays, device, upstream):
    nodes = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
    with ag.Tape() as tape:
        out = fn(*nodes)
    tape.backward(out, grad=ag.tensor(upstream, device=device).value)
    return out.to_host(), [n.grad.to_host() for n in nodes]


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_backward_vs_float64(device, case):
    fn, reference, shapes = CASES[case]
    arrays = [_rand(s, seed) for seed, s in enumerate(shapes)]
    arrays64 = [a.astype(np.float64) for a in arrays]
    expected = reference(*arrays64)
    upstream = _rand(expected.shape, 99)
    fused = jit_compile(fn)
    for _ in range(2):  # the second call replays the cached plan
        out, grads = _run(fused, arrays, device, upstream)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
        for got, ref in zip(grads, _fd_grads(reference, arrays, upstream), strict=True):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    with ag.no_grad():
        np.testing.assert_allclose(
            fused(*[ag.tensor(a, device=device) for a in arrays]).to_host(), expected, 1e-5, 1e-5
        )
    plan = fused.plan_for(*[ag.tensor(a, device=device) for a in arrays])
    assert len(plan.steps) == 1 and isinstance(plan.steps[0], GemmEpilogueStep)
    assert fused.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize("case", ["mlp_block", "row_bias_scale"])
def test_gradcheck(device, case):
    fn, _, shapes = CASES[case]
    nodes = [ag.tensor(_rand(s, seed + 10), requires_grad=True, device=device) for seed, s in enumerate(shapes)]
    assert ag.gradcheck(jit_compile(fn), *nodes)


def test_scalar_argument_and_two_outputs(device):
    """A Python scalar argument is a kernel argument; a group with two outputs stores both."""

    def fn(x, w, s):
        y = ag.relu(ag.matmul(x, w) * s)
        return y, y * y

    x, w = _rand((4, 3), 0), _rand((3, 6), 1)
    upstream = _rand((4, 6), 2)
    fused = jit_compile(fn)
    nodes = [ag.tensor(a, requires_grad=True, device=device) for a in (x, w)]
    with ag.Tape() as tape:
        y, y2 = fused(nodes[0], nodes[1], 1.5)
    tape.backward(y2, grad=ag.tensor(upstream, device=device).value)
    ref = np.maximum(x.astype(np.float64) @ w * 1.5, 0.0)
    np.testing.assert_allclose(y.to_host(), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y2.to_host(), ref * ref, rtol=1e-5, atol=1e-5)
    gx, gw = _fd_grads(lambda a, b: np.maximum(a @ b * 1.5, 0.0) ** 2, [x, w], upstream)
    np.testing.assert_allclose(nodes[0].grad.to_host(), gx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(nodes[1].grad.to_host(), gw, rtol=1e-4, atol=1e-5)
    step = fused.plan_for(nodes[0], nodes[1], 1.5).steps[0]
    assert isinstance(step, GemmEpilogueStep) and step.merged.kinds == ["scalar"]


def test_some_inputs_without_gradient(device):
    """Only w and b require a gradient (x is data): they get theirs, x gets none."""
    fn, reference, shapes = CASES["mlp_block"]
    arrays = [_rand(s, seed) for seed, s in enumerate(shapes)]
    expected = reference(*[a.astype(np.float64) for a in arrays])
    upstream = _rand(expected.shape, 3)
    nodes = [ag.tensor(a, requires_grad=k > 0, device=device) for k, a in enumerate(arrays)]
    fused = jit_compile(fn)
    with ag.Tape() as tape:
        out = fused(*nodes)
    tape.backward(out, grad=ag.tensor(upstream, device=device).value)
    np.testing.assert_allclose(out.to_host(), expected, rtol=1e-5, atol=1e-5)
    refs = _fd_grads(reference, arrays, upstream)
    assert nodes[0].grad is None
    for node, ref in zip(nodes[1:], refs[1:], strict=True):
        np.testing.assert_allclose(node.grad.to_host(), ref, rtol=1e-4, atol=1e-5)


def test_sequential_model(device):
    """``Linear -> ReLU -> Linear`` under jit_compile: the first layer and its ReLU are one GEMM; the
    output and every parameter gradient equal the eager model's."""
    model = nn.Sequential(nn.Linear(6, 16, device=device), nn.ReLU(), nn.Linear(16, 3, device=device))
    x = ag.tensor(_rand((9, 6), 0), device=device)
    upstream = ag.tensor(_rand((9, 3), 1), device=device).value
    results = []
    for fn in (model, jit_compile(model)):
        for p in model.parameters():
            p.grad = None
        with ag.Tape() as tape:
            out = fn(x)
        tape.backward(out, grad=upstream)
        results.append([out.to_host()] + [p.grad.to_host() for p in model.parameters()])
    for eager, fused in zip(*results, strict=True):
        np.testing.assert_allclose(fused, eager, rtol=1e-5, atol=1e-6)
    steps = jit_compile(model).plan_for(x).steps
    assert sum(isinstance(s, GemmEpilogueStep) for s in steps) == 1


def test_not_merged_when_product_is_read_elsewhere(device):
    """The product is also returned: the matmul stays a step of its own (its result must exist)."""

    def fn(x, w):
        h = ag.matmul(x, w)
        return ag.relu(h) + 1.0, h

    fused = jit_compile(fn)
    args = [ag.tensor(_rand(s, i), device=device) for i, s in enumerate([(3, 4), (4, 5)])]
    _out, h = fused(*args)
    np.testing.assert_allclose(h.to_host(), args[0].to_host() @ args[1].to_host(), rtol=1e-5, atol=1e-6)
    assert not any(isinstance(s, GemmEpilogueStep) for s in fused.plan_for(*args).steps)


def test_split_product_applies_the_group_in_its_sum(cl_device, launch_counter):
    """A small output with a large K is split along K (many work-groups); the group then runs in the
    split's sum kernel: still no separate elementwise kernel, forward vs float64."""
    arrays = [_rand((16, 1536), 0), _rand((1536, 24), 1), _rand((1, 24), 2)]
    nodes = [ag.tensor(a, device=cl_device) for a in arrays]
    mlp = jit_compile(workloads.mlp_block)
    mlp(*nodes)
    with launch_counter(cl_device.queue) as launches:
        out = mlp(*nodes)
    expected = workloads.mlp_block_reference(*[a.astype(np.float64) for a in arrays])
    np.testing.assert_allclose(out.to_host(), expected, rtol=1e-5, atol=1e-4)  # K = 1536: ~1536 ulps of sums
    assert launches.names == ["netcl_gemm", "netcl_split_sum"]


def test_host_blas_devices_keep_two_steps(cl_device, monkeypatch):
    """With the host BLAS on, a CPU OpenCL device runs the product there, then the group's kernel."""
    monkeypatch.setenv(host_blas.ENV_VAR, "1")
    fn, reference, shapes = CASES["residual"]
    arrays = [_rand(s, seed) for seed, s in enumerate(shapes)]
    fused = jit_compile(fn)
    expected = reference(*[a.astype(np.float64) for a in arrays])
    upstream = _rand(expected.shape, 7)
    out, grads = _run(fused, arrays, cl_device, upstream)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    for got, ref in zip(grads, _fd_grads(reference, arrays, upstream), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    step = fused.plan_for(*[ag.tensor(a, device=cl_device) for a in arrays]).steps[0]
    assert step.one_kernel == one_kernel(cl_device) == (not host_blas.host_memory_device(cl_device))


@pytest.mark.parametrize(("case", "saved"), [("mlp_block", True), ("linear", False), ("scaled_linear", False)])
def test_product_saved_only_when_read(device, case, saved):
    """Under autograd the forward also stores the product only where a backward kernel reads it."""
    fn, _, shapes = CASES[case]
    nodes = [ag.tensor(_rand(s, seed), requires_grad=True, device=device) for seed, s in enumerate(shapes)]
    step = jit_compile(fn).plan_for(*nodes).steps[0]
    assert step._needs_product((True,) * len(shapes)) is saved


def test_operand_kinds_known():
    assert set(OPERAND_KINDS) == {"full", "col", "row", "scalar", "out"}


def test_one_launch_forward(cl_device, launch_counter):
    """mlp_block forward is one GEMM launch, with and without autograd; the backward is one fused
    kernel for d(product), the bias's column sum and the two products of the matmul's gradient."""
    arrays = [_rand(s, i) for i, s in enumerate([(16, 8), (8, 12), (1, 12)])]
    nodes = [ag.tensor(a, requires_grad=True, device=cl_device) for a in arrays]
    mlp = jit_compile(workloads.mlp_block)
    upstream = ag.tensor(_rand((16, 12), 5), device=cl_device).value
    for _ in range(2):  # the first round builds every kernel
        with launch_counter(cl_device.queue) as plain, ag.no_grad():
            mlp(*nodes)
        with launch_counter(cl_device.queue) as forward, ag.Tape() as tape:
            out = mlp(*nodes)
        with launch_counter(cl_device.queue) as backward:
            tape.backward(out, grad=upstream)
    assert plain.names == ["netcl_gemm"] and forward.names == ["netcl_gemm"]
    assert backward.names.count("fused_backward") == 1 and backward.names.count("netcl_gemm") == 2
    assert "fused_forward" not in backward.names

    linear = jit_compile(CASES["linear"][0])
    for _ in range(2):
        with ag.Tape() as tape:
            out = linear(nodes[0], nodes[1], nodes[2])
        with launch_counter(cl_device.queue) as backward:
            tape.backward(out, grad=upstream)
    assert "fused_backward" not in backward.names  # d(product) is the upstream gradient itself
