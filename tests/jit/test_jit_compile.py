"""jit_compile: fused results equal the un-fused autograd path and float64 NumPy references."""

from __future__ import annotations

import re

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.jit import JitError, jit_compile, register_primitive, workloads
from netcl.jit.column_source import column_input, column_layout
from netcl.jit.gemm_epilogue import one_kernel
from netcl.jit.tuning import column_groups, launch_config
from netcl.runtime import ops as rops
from netcl.runtime.cache import program_cache
from netcl.runtime.ops import host_blas

# float32 chains of ~8 transcendental ops: each op is within a few ulps; errors compound
# through at most 8 ops, so 2e-5 relative plus 1e-6 absolute (values are O(1)) is ample
# and still catches any wrong formula (those are off by >1e-3).
RTOL, ATOL = 2e-5, 1e-6


def _rand(shape, seed, low=-2.0, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def _grads(fn, arrays, device, upstream):
    """Forward value and gradients of every input, through the tape."""
    nodes = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
    with ag.Tape() as tape:
        out = fn(*nodes)
    tape.backward(out, grad=ag.tensor(upstream, device=device).value)
    return out.to_host(), [n.grad.to_host() for n in nodes]


def _fd_elementwise_grads(reference, arrays, upstream, eps=1e-6):
    """float64 central differences of sum(upstream * reference(...)) for elementwise references."""
    arrays64 = [a.astype(np.float64) for a in arrays]
    out_shape = np.broadcast_shapes(*(a.shape for a in arrays))
    grads = []
    for k, a in enumerate(arrays64):
        plus = [x.copy() for x in arrays64]
        minus = [x.copy() for x in arrays64]
        plus[k] = a + eps
        minus[k] = a - eps
        local = (reference(*plus) - reference(*minus)) / (2 * eps) * upstream
        # reduce the broadcast dims back to the input's shape
        axes = tuple(range(len(out_shape) - a.ndim))
        local = local.sum(axis=axes)
        keep = tuple(i for i, d in enumerate(a.shape) if d == 1 and local.shape[i] != 1)
        grads.append(local.sum(axis=keep, keepdims=True) if keep else local)
    return grads


@pytest.fixture(
    params=[("1", "1", "0"), ("4", "1", "0"), ("4", "2", "0"), ("4", "1", "1"), ("8", "2", "1")],
    ids=["scalar", "float4", "float4x2", "float4-body", "float8x2-body"],
)
def launch_shape(request, monkeypatch):
    """Every kernel form on every device: the defaults differ per device (netcl.jit.tuning).

    "-body": the body evaluated on float vectors (vector_primitives), as on CPU devices.
    """
    width, items, body = request.param
    monkeypatch.setenv("NETCL_JIT_VECTOR", width)
    monkeypatch.setenv("NETCL_JIT_ITEMS", items)
    monkeypatch.setenv("NETCL_JIT_VECTOR_BODY", body)
    return request.param


@pytest.mark.parametrize(
    ("name", "shapes"),
    [
        ("chain8", [(1000,), (1000,), (1000,)]),
        ("bias_gelu", [(33, 65), (1, 65)]),  # odd last dim: scalar broadcast path
        ("bias_gelu", [(16, 64), (1, 64)]),  # last dim divisible by the width: vector path
        ("chain8", [(16, 64), (16, 1), (64,)]),  # splat, same and lanes inputs together
    ],
)
def test_fused_matches_unfused_and_float64(device, name, shapes, launch_shape):
    fn = getattr(workloads, name)
    reference = getattr(workloads, f"{name}_reference")
    arrays = [_rand(s, seed) for seed, s in enumerate(shapes)]
    upstream = _rand(np.broadcast_shapes(*shapes), 99)
    fused = jit_compile(fn)
    out_f, grads_f = _grads(fused, arrays, device, upstream)
    out_u, grads_u = _grads(fn, arrays, device, upstream)
    expected = reference(*[a.astype(np.float64) for a in arrays])
    np.testing.assert_allclose(out_f, expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out_f, out_u, rtol=RTOL, atol=ATOL)
    for gf, gu, gr in zip(grads_f, grads_u, _fd_elementwise_grads(reference, arrays, upstream), strict=True):
        # finite differences in float64 with eps=1e-6 are accurate to ~1e-9; the float32
        # gradient of a sum over up to 33 rows carries ~33 ulps of rounding.
        np.testing.assert_allclose(gf, gr, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gf, gu, rtol=1e-4, atol=1e-5)
    assert fused.cache_info()["fallbacks"] == 0


def test_mlp_block_fuses_epilogue(device):
    x, w, b = _rand((17, 9), 1), _rand((9, 13), 2), _rand((1, 13), 3)
    upstream = _rand((17, 13), 4)
    fused = jit_compile(workloads.mlp_block)
    out, (gx, gw, gb) = _grads(fused, [x, w, b], device, upstream)
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    pre = x64 @ w64 + b64
    np.testing.assert_allclose(out, workloads.mlp_block_reference(x64, w64, b64), rtol=1e-5, atol=1e-5)
    gpre = upstream * (pre > 0)
    np.testing.assert_allclose(gx, gpre @ w64.T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gw, x64.T @ gpre, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb, gpre.sum(axis=0, keepdims=True), rtol=1e-4, atol=1e-5)
    plan = fused.plan_for(*[ag.tensor(a, device=device) for a in (x, w, b)])
    assert len(plan.fused_steps) == 1 and len(plan.steps) == 1  # the epilogue runs in the GEMM's store


def test_launch_counts(cl_device, launch_counter):
    arrays = [_rand((4096,), s) for s in range(3)]
    nodes = [ag.tensor(a, requires_grad=True, device=cl_device) for a in arrays]
    chain8 = jit_compile(workloads.chain8)
    chain8(*nodes)  # compile outside the count
    with launch_counter(cl_device.queue) as forward, ag.no_grad():
        chain8(*nodes)
    assert forward.names == ["fused_forward"]
    upstream = ag.tensor(_rand((4096,), 7), device=cl_device).value
    _ = _grads(chain8, arrays, cl_device, upstream.to_host())  # builds the backward kernel
    with launch_counter(cl_device.queue) as both:
        with ag.Tape() as tape:
            out = chain8(*nodes)
        tape.backward(out, grad=upstream)
    assert both.names.count("fused_forward") == 1 and both.names.count("fused_backward") == 1
    assert len([n for n in both.names if n.startswith("fused")]) == 2

    mlp = jit_compile(workloads.mlp_block)
    xs = [ag.tensor(_rand(s, i), device=cl_device) for i, s in enumerate([(8, 4), (4, 6), (1, 6)])]
    mlp(*xs)
    with launch_counter(cl_device.queue) as counter:
        mlp(*xs)
    steps = [step.name for step in counter.graph.steps]
    if one_kernel(cl_device):  # the epilogue runs in the GEMM's store
        assert steps == ["netcl_gemm"], steps
    else:  # a CPU OpenCL device: the product is a host BLAS command, then the fused kernel
        assert len(steps) == 2 and steps[-1] == "fused_forward", steps


def test_a_sums_backward_is_the_upstream_gradient(device, launch_counter):
    """The gradient of a sum is the upstream one: no backward kernel; broadcast inputs (a block, a column) get
    it summed (a reduction each). Against float64 sums of the upstream."""
    arrays = [_rand((4, 8, 16), 1), _rand((8, 16), 2), _rand((16,), 3)]
    upstream = _rand((4, 8, 16), 4)
    fused = jit_compile(lambda a, b, c: a + b + c)
    out, (ga, gb, gc) = _grads(fused, arrays, device, upstream)
    np.testing.assert_allclose(out, arrays[0] + arrays[1] + arrays[2], rtol=1e-6, atol=1e-6)
    up64 = upstream.astype(np.float64)
    np.testing.assert_array_equal(ga, upstream)
    np.testing.assert_allclose(gb, up64.sum(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gc, up64.sum((0, 1)), rtol=1e-6, atol=1e-5)
    if device.kind == "opencl":
        nodes = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
        with ag.Tape() as tape:
            out = fused(*nodes)
        with launch_counter(device.queue) as counter:
            tape.backward(out, grad=ag.tensor(upstream, device=device).value)
        assert "fused_backward" not in counter.names and counter.names.count("netcl_reduce") >= 2


def test_spec_examples(device):
    @jit_compile
    def fused(x):
        y = ag.relu(x)
        z = ag.gelu(y) + 0.5
        return ag.sigmoid(z)

    @jit_compile
    def fused_mlp_block(x, w, b):
        h = ag.add(ag.matmul(x, w), b)
        h = ag.relu(h)
        return ag.add(h, 1.0)

    @jit_compile
    def small(x):
        return ag.relu(x * 0.5) + 1.0

    x = _rand((64,), 5)
    xn = ag.tensor(x, device=device)
    x64 = x.astype(np.float64)
    gelu = workloads._gelu(np.maximum(x64, 0)) + 0.5
    np.testing.assert_allclose(fused(xn).to_host(), 1 / (1 + np.exp(-gelu)), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(small(xn).to_host(), np.maximum(x64 * 0.5, 0) + 1.0, rtol=RTOL, atol=ATOL)
    m = [_rand(s, i) for i, s in enumerate([(5, 3), (3, 4), (1, 4)])]
    got = fused_mlp_block(*[ag.tensor(a, device=device) for a in m]).to_host()
    np.testing.assert_allclose(got, workloads.mlp_block_reference(*m), rtol=1e-5, atol=1e-5)
    if device.kind == "opencl":
        forward, backward = small.source(xn)
        assert forward.count("__kernel") == 1 and "RELU" in forward and "MUL(x0, 0.5f)" in forward
        assert "fused_backward" in backward
    else:
        forward, _ = small.source(xn)
        assert "def fused_forward" in forward


def test_custom_primitive_and_reregistration(device):
    register_primitive(
        "my_op",
        forward=lambda args, attrs: f"MUL({args[0]}, {args[1]})",
        backward=lambda args, g, attrs, out: [f"MUL({g}, {args[1]})", f"MUL({g}, {args[0]})"],
        arity=2,
    )

    def my_op(a, b):
        return ag.engine.apply_op(
            rops.mul,
            lambda g, inputs, out: [rops.mul(g, inputs[1]), rops.mul(g, inputs[0])],
            a,
            b,
            op_name="my_op",
        )

    @jit_compile
    def f(a, b):
        return my_op(a, b) + 1.0

    a, b = _rand((32,), 1), _rand((32,), 2)
    na, nb = ag.tensor(a, requires_grad=True, device=device), ag.tensor(b, device=device)
    np.testing.assert_allclose(f(na, nb).to_host(), a * b + 1.0, rtol=RTOL, atol=ATOL)
    with ag.Tape() as tape:
        out = f(na, nb)
    tape.backward(out, grad=ag.tensor(np.ones(32, np.float32), device=device).value)
    np.testing.assert_allclose(na.grad.to_host(), b, rtol=RTOL)
    register_primitive(
        "my_op",
        forward=lambda args, attrs: f"ADD({args[0]}, {args[1]})",
        backward=lambda args, g, attrs, out: [g, g],
        arity=2,
    )
    np.testing.assert_allclose(f(na, nb).to_host(), a + b + 1.0, rtol=RTOL, atol=ATOL)


def test_untraceable_and_unknown_ops_fall_back(device):
    @jit_compile(strict=False)
    def data_dependent(x):
        if x.to_host().sum() > 0:  # needs a concrete value: cannot be traced
            return x * 2.0
        return x * 3.0

    def custom(x):  # an op with no registered primitive: runs eagerly, rest still fuses
        return ag.engine.apply_op(
            rops.exp,
            lambda g, inputs, out: [None],
            x,
            op_name="unregistered_exp",
        )

    @jit_compile
    def mixed(x):
        return ag.relu(custom(x) * 2.0) + 1.0

    x = np.abs(_rand((16,), 3)) + 0.1
    xn = ag.tensor(x, device=device)
    np.testing.assert_allclose(data_dependent(xn).to_host(), x * 2.0, rtol=RTOL)
    assert data_dependent.cache_info()["fallbacks"] == 1
    np.testing.assert_allclose(mixed(xn).to_host(), np.exp(x) * 2.0 + 1.0, rtol=RTOL)
    assert mixed.cache_info()["fallbacks"] == 0
    assert len(mixed.plan_for(xn).fused_steps) == 1


def test_scalars_are_kernel_arguments_and_cache_hits(device):
    @jit_compile
    def scaled(x, s):
        return ag.tanh(x * s) + s

    x = _rand((128,), 8)
    xn = ag.tensor(x, device=device)
    scaled(xn, 0.5)
    builds = program_cache.stats().builds
    for s in (0.25, 1.5, -3.0):
        np.testing.assert_allclose(scaled(xn, s).to_host(), np.tanh(x * s) + s, rtol=RTOL, atol=ATOL)
    assert program_cache.stats().builds == builds
    info = scaled.cache_info()
    assert info["misses"] == 1 and info["hits"] == 3


def test_several_outputs_come_from_one_kernel(device):
    @jit_compile
    def two(x, y):
        h = x * y
        return ag.sigmoid(h), h + y

    x, y = _rand((50,), 1), _rand((50,), 2)
    p, q = two(ag.tensor(x, device=device), ag.tensor(y, device=device))
    np.testing.assert_allclose(p.to_host(), 1 / (1 + np.exp(-(x * y))), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(q.to_host(), x * y + y, rtol=RTOL, atol=ATOL)
    plan = two.plan_for(ag.tensor(x, device=device), ag.tensor(y, device=device))
    assert len(plan.fused_steps) == 1 and len(plan.fused_steps[0].group.outputs) == 2


def test_bad_primitive_registration():
    with pytest.raises(JitError, match="arity"):
        register_primitive("bad_arity", lambda a, t: "0", lambda a, g, t, o: ["0"], arity=5)
    with pytest.raises(JitError, match="identifier"):
        register_primitive("not a name", lambda a, t: "0", lambda a, g, t, o: ["0"])


def test_debug_log_names_each_miss_and_its_reason(device, caplog):
    @jit_compile
    def f(x):
        return ag.relu(x) * 2.0

    small, large = ag.tensor(_rand((8,), 1), device=device), ag.tensor(_rand((16,), 2), device=device)
    with caplog.at_level("DEBUG", logger="netcl.jit"):
        f(small)
        f(small)
        f(large)
        register_primitive("unused_marker", lambda a, t: "0.0f", lambda a, g, t, o: ["0.0f"], arity=1)
        f(small)
    misses = [r.getMessage() for r in caplog.records if "cache miss" in r.getMessage()]
    assert len(misses) == 3
    assert "first call" in misses[0] and "new input signature" in misses[1] and "registry changed" in misses[2]
    assert f.cache_info()["hits"] == 1


def test_gradients_after_a_first_call_without_grad(device):
    """A plan traced under no_grad must not serve a later call that needs gradients: the eager
    matmul decides at trace time which inputs get one (regression: x and w got None)."""
    arrays = [_rand(s, i) for i, s in enumerate([(8, 4), (4, 6), (1, 6)])]
    upstream = _rand((8, 6), 9)
    fused = jit_compile(workloads.mlp_block)
    with ag.no_grad():
        fused(*[ag.tensor(a, device=device) for a in arrays])
    _, grads = _grads(fused, arrays, device, upstream)
    _, expected = _grads(workloads.mlp_block, arrays, device, upstream)
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    only_w = [ag.tensor(arrays[0], device=device), ag.tensor(arrays[1], requires_grad=True, device=device)]
    only_w.append(ag.tensor(arrays[2], device=device))
    with ag.Tape() as tape:
        out = fused(*only_w)
    tape.backward(out, grad=ag.tensor(upstream, device=device).value)
    np.testing.assert_allclose(only_w[1].grad.to_host(), expected[1], rtol=1e-5, atol=1e-6)
    assert only_w[0].grad is None and only_w[2].grad is None


def _new_activations(x, b):
    h = ag.silu(x + b)
    h = ag.leaky_relu(h, 0.1) + ag.elu(x, 0.5)
    h = ag.softplus(h, 2.0, 1.0) * ag.sin(x) + ag.cos(x + b)
    return h * ag.rsqrt(ag.log1p(x * x) + 1.0) + ag.ne(x, b)


def _new_activations_reference(x, b):
    s = (x + b) / (1 + np.exp(-(x + b)))
    h = np.where(s > 0, s, 0.1 * s) + np.where(x > 0, x, 0.5 * np.expm1(x))
    h = np.where(2 * h > 1, h, np.log1p(np.exp(2 * h)) / 2) * np.sin(x) + np.cos(x + b)
    return h / np.sqrt(np.log1p(x * x) + 1.0) + (x != b)


def test_new_activations_fuse_into_one_kernel(device):
    """silu, leaky_relu, elu, softplus, sin, cos, rsqrt, log1p and ne trace as primitives: one fused
    forward and one fused backward, equal to the un-fused path and float64 finite differences."""
    arrays = [_rand((8, 16), 11), _rand((1, 16), 12)]
    upstream = _rand((8, 16), 13)
    fused = jit_compile(_new_activations)
    out_f, grads_f = _grads(fused, arrays, device, upstream)
    out_u, grads_u = _grads(_new_activations, arrays, device, upstream)
    np.testing.assert_allclose(out_f, _new_activations_reference(*[a.astype(np.float64) for a in arrays]), 2e-5, 1e-5)
    np.testing.assert_allclose(out_f, out_u, rtol=RTOL, atol=ATOL)
    fd = _fd_elementwise_grads(_new_activations_reference, arrays, upstream)
    for gf, gu, gr in zip(grads_f, grads_u, fd, strict=True):
        # kinks (leaky_relu/elu at 0, softplus's switch) are measure-zero for these random inputs
        np.testing.assert_allclose(gf, gr, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(gf, gu, rtol=1e-4, atol=1e-5)
    assert fused.cache_info()["fallbacks"] == 0
    plan = fused.plan_for(*[ag.tensor(a, device=device) for a in arrays])
    assert len(plan.fused_steps) == 1 and len(plan.steps) == 1


# ---- a bias's gradient summed down the rows inside the backward kernel (``column_source``) --------
# A bias gradient is a float32 sum over up to 131 rows of O(1) terms: ~131 ulps of rounding at worst,
# so 1e-4 relative and 1e-5 absolute against float64; a wrong row, column or partial-sum index is off
# by O(0.1).
GROUPS = {"one partial row": "1", "three partial rows": "3", "device default": None}


@pytest.fixture
def column_sums(monkeypatch):
    """Column sums on every OpenCL device (GPUs use them by default, CPU devices not): the kernels are
    checked on PoCL too."""
    monkeypatch.setenv("NETCL_JIT_COLUMN_SUMS", "1")


def _bias_tanh(x, b):
    return ag.tanh(x * b + b) * x


def _bias_tanh_reference(x, b):
    return np.tanh(x * b + b) * x


CASES = {
    # name: (function, float64 reference, input shapes)
    "bias_gelu": (workloads.bias_gelu, workloads.bias_gelu_reference, [(131, 64), (1, 64)]),
    "bias_gelu_3d_flat_bias": (workloads.bias_gelu, workloads.bias_gelu_reference, [(5, 7, 32), (32,)]),
    "two_uses_of_the_bias": (_bias_tanh, _bias_tanh_reference, [(40, 6), (1, 6)]),  # a row of 6: 2 lanes
    "same_row_and_bias_inputs": (workloads.chain8, workloads.chain8_reference, [(16, 64), (16, 1), (64,)]),
    "odd_row_length": (workloads.bias_gelu, workloads.bias_gelu_reference, [(9, 65), (1, 65)]),  # flat kernel
}


@pytest.mark.parametrize("groups", list(GROUPS.values()), ids=list(GROUPS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.usefixtures("column_sums")
def test_gradients_vs_float64(device, monkeypatch, case, groups):
    if groups is not None:
        monkeypatch.setenv("NETCL_JIT_COLUMN_GROUPS", groups)
    fn, reference, shapes = CASES[case]
    arrays = [_rand(s, seed) for seed, s in enumerate(shapes)]
    upstream = _rand(np.broadcast_shapes(*shapes), 99)
    fused = jit_compile(fn)
    out, grads = _grads(fused, arrays, device, upstream)
    np.testing.assert_allclose(out, reference(*[a.astype(np.float64) for a in arrays]), rtol=2e-5, atol=1e-6)
    for got, ref in zip(grads, _fd_elementwise_grads(reference, arrays, upstream), strict=True):
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    source = fused.source(*[ag.tensor(a, device=device) for a in arrays])[1]
    summed_in_kernel = device.kind == "opencl" and case != "odd_row_length"
    assert bool(re.search(r"acc\d+ \+= ", source)) == summed_in_kernel, source[-1500:]


@pytest.mark.parametrize("groups", ["1", "4"])
@pytest.mark.usefixtures("column_sums")
def test_mlp_block_bias_is_summed_in_the_relu_backward_kernel(device, monkeypatch, groups):
    monkeypatch.setenv(host_blas.ENV_VAR, "0")
    monkeypatch.setenv("NETCL_JIT_COLUMN_GROUPS", groups)
    x, w, b = _rand((45, 9), 1, -1, 1), _rand((9, 16), 2, -1, 1), _rand((1, 16), 3, -1, 1)
    upstream = _rand((45, 16), 4)
    fused = jit_compile(workloads.mlp_block)
    _, (gx, gw, gb) = _grads(fused, [x, w, b], device, upstream)
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    gpre = upstream * (x64 @ w64 + b64 > 0)
    np.testing.assert_allclose(gx, gpre @ w64.T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gw, x64.T @ gpre, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb, gpre.sum(axis=0, keepdims=True), rtol=1e-4, atol=1e-5)
    step = fused.plan_for(*[ag.tensor(a, device=device) for a in (x, w, b)]).steps[0]
    if device.kind == "opencl":  # the bias is a result of the kernel, not a sum of d(product)
        assert step.inner.sums_columns(1)  # the group's inputs: the product, b
        assert re.search(r"acc1 \+= (gin|r)1;", step.backward_source(0, (True, True, True)))


@pytest.mark.usefixtures("column_sums")
def test_bias_gradient_is_bitwise_repeatable(cl_device, monkeypatch):
    monkeypatch.setenv("NETCL_JIT_COLUMN_GROUPS", "5")
    arrays = [_rand((300, 32), 0), _rand((1, 32), 1)]
    upstream = _rand((300, 32), 2)
    fused = jit_compile(workloads.bias_gelu)
    first = _grads(fused, arrays, cl_device, upstream)[1][1]
    for _ in range(3):
        assert np.array_equal(_grads(fused, arrays, cl_device, upstream)[1][1], first)


@pytest.mark.usefixtures("column_sums")
def test_launches(cl_device, monkeypatch, launch_counter):
    """One backward kernel; the partial rows then take one small reduction, none when there is one row."""
    arrays = [_rand((64, 32), 0), _rand((1, 32), 1)]
    upstream = ag.tensor(_rand((64, 32), 2), device=cl_device).value
    for groups, extra in (("1", 0), ("4", 1)):
        monkeypatch.setenv("NETCL_JIT_COLUMN_GROUPS", groups)
        fused = jit_compile(workloads.bias_gelu)
        nodes = [ag.tensor(a, requires_grad=True, device=cl_device) for a in arrays]
        _grads(fused, arrays, cl_device, upstream.to_host())  # builds both kernels
        with launch_counter(cl_device.queue) as launches:
            with ag.Tape() as tape:
                out = fused(*nodes)
            tape.backward(out, grad=upstream)
        names = launches.names
        assert names[:2] == ["fused_forward", "fused_backward"] and len(names) == 2 + extra, names


def test_layout():
    """Which inputs count as a bias, how each input is read, lanes and the clamp of groups to rows."""
    assert column_input((1, 8), (4, 8)) and column_input((8,), (3, 4, 8))
    assert not column_input((4, 1), (4, 8)) and not column_input((1, 8), (1, 8)) and not column_input(None, (4, 8))
    layout = column_layout([(4, 8), (1, 8), (4, 1), (1, 1), None], (4, 8), 16, 100)
    assert layout.modes == ("same", "col", "row", "one", "param")
    assert (layout.rows, layout.width, layout.lanes, layout.groups, layout.vectors) == (4, 8, 8, 4, 1)
    assert column_layout([(2, 4, 8), (4, 8)], (2, 4, 8), 4, 1) is None  # a broadcast it cannot read
    assert column_layout([(4, 6), (1, 6)], (4, 6), 8, 1).lanes == 2
    assert column_layout([(4, 7), (1, 7)], (4, 7), 8, 1) is None


def test_column_sums_default_on_gpus_only(cl_device, monkeypatch):
    """The switch and its default: on where the device is a GPU (measured faster there, slower on PoCL)."""
    assert launch_config(cl_device, "backward").column_sums == cl_device.is_gpu
    monkeypatch.setenv("NETCL_JIT_COLUMN_SUMS", "0")
    assert not launch_config(cl_device, "backward").column_sums
    arrays = [_rand((8, 4), 0), _rand((1, 4), 1)]
    source = jit_compile(workloads.bias_gelu).source(*[ag.tensor(a, device=cl_device) for a in arrays])[1]
    assert "acc1" not in source


def test_bad_group_override(cl_device, monkeypatch):
    monkeypatch.setenv("NETCL_JIT_COLUMN_GROUPS", "0")
    with pytest.raises(ValueError, match="NETCL_JIT_COLUMN_GROUPS must be a whole number >= 1, got '0'"):
        column_groups(cl_device, 8)


def test_strict_mode_raises_where_it_would_fall_back(device, monkeypatch):
    """strict=True, or NETCL_JIT_STRICT=1 when strict is None, names the reason instead of running un-fused."""

    def data_dependent(x):
        return x * 2.0 if x.to_host().sum() > 0 else x * 3.0

    xn = ag.tensor(np.ones(4, np.float32), device=device)
    with pytest.raises(JitError, match=r"strict mode.*TracerConversionError.*to_host"):
        jit_compile(data_dependent, strict=True)(xn)
    monkeypatch.setenv("NETCL_JIT_STRICT", "1")
    with pytest.raises(JitError, match="strict mode"):
        jit_compile(data_dependent)(xn)
    with pytest.raises(JitError, match="no Tensor or Node positional argument"):
        jit_compile(lambda a: a * 2.0)(3.0)
    monkeypatch.setenv("NETCL_JIT_STRICT", "0")
    lenient = jit_compile(data_dependent)
    np.testing.assert_allclose(lenient(xn).to_host(), 2.0)
    assert lenient.cache_info()["fallbacks"] == 1
