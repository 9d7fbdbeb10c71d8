"""The fused detection loss and the TrainingGraphCompiler registry.

References are float64 NumPy on the float32 inputs, written here independently of the
implementation (``logaddexp`` form of the BCE term). Tolerances: the fused kernels evaluate each
term in float32 (a few ulps) and accumulate with compensated sums, so the loss is within ~1e-6
relative; 1e-5 is the issue's bound. Gradients are per element float32 expressions of a handful of
ops: 1e-5 relative plus 1e-6 absolute (values are O(1) times the weights).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.core.errors import DeviceError, DTypeError, ShapeError
from netcl.jit import jit_compile
from netcl.jit.detection_loss import FusedDetectionLossPlan, compile_plan
from netcl.jit.training_compiler import (
    NoMatchingPatternError,
    TrainingGraphCompiler,
    TrainingPattern,
    fused_weighted_bce_smooth_l1_loss,
    get_training_compiler,
)
from netcl.runtime.cache import program_cache

fused = fused_weighted_bce_smooth_l1_loss
RTOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-6
SCALES = {"heat_scale": 0.7, "reg_scale": 1.3, "beta": 0.05}


# ---- references -----------------------------------------------------------------------------
def ref_terms(x, t, hw, rw, heat_scale=1.0, reg_scale=1.0, beta=0.05):
    x, t, hw, rw = (np.asarray(a, np.float64) for a in (x, t, hw, rw))
    bce = np.logaddexp(0.0, x) - x * t
    d = np.abs(x - t)
    sl1 = np.where(d < beta, 0.5 * d * d / (beta or 1.0), d - 0.5 * beta)
    return heat_scale * hw * bce + reg_scale * rw * sl1


def ref_loss(x, t, hw, rw, chunk=1 << 20, **scales):
    return sum(
        float(np.sum(ref_terms(x[i : i + chunk], t[i : i + chunk], hw[i : i + chunk], rw[i : i + chunk], **scales)))
        for i in range(0, x.size, chunk)
    )


def ref_grad(x, t, hw, rw, heat_scale=1.0, reg_scale=1.0, beta=0.05):
    x, t, hw, rw = (np.asarray(a, np.float64) for a in (x, t, hw, rw))
    d = x - t
    s = np.where(np.abs(d) < beta, d / (beta or 1.0), np.sign(d))
    return heat_scale * hw * (1.0 / (1.0 + np.exp(-x)) - t) + reg_scale * rw * s


def make_inputs(shape, seed=0, logit=6.0):
    """Logits, soft targets in [0, 1], non-negative weights; about a fifth of the |pred - target| in the beta band."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.0, 1.0, shape).astype(np.float32)
    x = rng.uniform(-logit, logit, shape).astype(np.float32)
    band = rng.random(shape) < 0.2
    x[band] = (t[band] + rng.uniform(-0.04, 0.04, int(band.sum()))).astype(np.float32)
    hw = rng.uniform(0.0, 2.0, shape).astype(np.float32)
    rw = rng.uniform(0.0, 2.0, shape).astype(np.float32)
    return [x, t, hw, rw]


def nodes(arrays, device, grad=True):
    return [ag.tensor(a, requires_grad=grad and i == 0, device=device) for i, a in enumerate(arrays)]


def loss_and_grad(arrays, device, upstream=None, **scales):
    ns = nodes(arrays, device)
    with ag.Tape() as tape:
        loss = fused(*ns, **scales)
        out = loss if upstream is None else loss * upstream
    tape.backward(out)
    return loss, ns[0].grad.to_host()


# ---- values and gradients ----------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(37, 53), (4096,), (3,), (1,)])
def test_forward_and_grad_match_float64_reference(device, shape):
    arrays = make_inputs(shape, seed=1)
    loss, grad = loss_and_grad(arrays, device, **SCALES)
    assert loss.shape == () and loss.dtype == np.float32 and loss.requires_grad
    np.testing.assert_allclose(loss.item(), ref_loss(*(a.ravel() for a in arrays), **SCALES), rtol=RTOL)
    np.testing.assert_allclose(grad, ref_grad(*arrays, **SCALES), rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_equals_unfused_autograd_composition(device):
    """Forward and gradient (upstream gradient 2.5, on the device) vs weighted_bce + weighted_smooth_l1 + sum."""
    arrays = make_inputs((61, 17), seed=2)
    hs, rs, beta = 0.3, 1.7, 0.1
    loss, grad = loss_and_grad(arrays, device, upstream=2.5, heat_scale=hs, reg_scale=rs, beta=beta)
    ns = nodes(arrays, device)
    with ag.Tape() as tape:
        p, t, hw, rw = ns
        ref = ag.sum(ag.weighted_bce(p, t, hw)) * hs + ag.sum(ag.weighted_smooth_l1(p, t, rw, beta)) * rs
        out = ref * 2.5
    tape.backward(out)
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=RTOL)
    np.testing.assert_allclose(grad, ns[0].grad.to_host(), rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_gradient_matches_finite_differences(device):
    """float64 central differences of the reference loss, and ag.gradcheck on the fused op itself."""
    arrays = make_inputs((5, 7), seed=3)
    _, grad = loss_and_grad(arrays, device, **SCALES)
    x = arrays[0].astype(np.float64)
    numeric = np.empty_like(x)
    eps = 1e-6
    for idx in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        numeric[idx] = (
            ref_terms(plus, *arrays[1:], **SCALES).sum() - ref_terms(minus, *arrays[1:], **SCALES).sum()
        ) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=GRAD_RTOL, atol=1e-5)
    ns = nodes(arrays, device)
    assert ag.gradcheck(lambda *a: fused(*a, **SCALES), *ns)


def test_beta_zero_is_plain_l1_and_scales_apply(device):
    arrays = make_inputs((33, 9), seed=4)
    for scales in (
        {"beta": 0.0},
        {"heat_scale": 0.0, "reg_scale": 1.0, "beta": 0.0},
        {"heat_scale": 2.0, "reg_scale": 0.0},
    ):
        loss, grad = loss_and_grad(arrays, device, **scales)
        np.testing.assert_allclose(loss.item(), ref_loss(*(a.ravel() for a in arrays), **scales), rtol=RTOL)
        np.testing.assert_allclose(grad, ref_grad(*arrays, **scales), rtol=GRAD_RTOL, atol=GRAD_ATOL)
    # reg term alone with beta 0 is sum(rw * |pred - target|)
    loss, _ = loss_and_grad(arrays, device, heat_scale=0.0, reg_scale=1.0, beta=0.0)
    x, t, _, rw = (a.astype(np.float64) for a in arrays)
    np.testing.assert_allclose(loss.item(), np.sum(rw * np.abs(x - t)), rtol=RTOL)


def test_large_logits_do_not_overflow(device):
    arrays = make_inputs((1000,), seed=5, logit=80.0)
    arrays[0][:4] = [80.0, -80.0, 88.0, -88.0]
    loss, grad = loss_and_grad(arrays, device, **SCALES)
    assert np.isfinite(loss.item()) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(loss.item(), ref_loss(*arrays, **SCALES), rtol=RTOL)
    np.testing.assert_allclose(grad, ref_grad(*arrays, **SCALES), rtol=GRAD_RTOL, atol=GRAD_ATOL)


@pytest.mark.parametrize("vec", [1, 4, 8, 16])
@pytest.mark.parametrize("n", [10007, 8, 3])
def test_both_vector_widths_strided_loops_and_tails(cl_device, vec, n):
    """scalar, float4 (GPU) and float8/16 vector-body (CPU) kernels; 3 blocks make each work-item loop,
    odd n leaves tails."""
    if not cl_device.is_gpu and vec > cl_device.vector_width:
        pytest.skip(f"float{vec} crashes this device's compiler (Device.vector_width is {cl_device.vector_width})")
    arrays = make_inputs((n,), seed=6)
    tensors = [nc.tensor(a, device=cl_device) for a in arrays]
    plan = dataclasses.replace(compile_plan(cl_device, "int", vec=vec), max_blocks=3)
    assert plan.vec == vec and plan.blocks(10007) == 3
    out = plan.forward(*tensors, 0.7, 1.3, 0.05)
    np.testing.assert_allclose(out.to_host(), ref_loss(*arrays, **SCALES), rtol=RTOL)
    upstream = nc.tensor(np.float32(-2.0), device=cl_device)
    grad = plan.backward(upstream, *tensors, 0.7, 1.3, 0.05)
    np.testing.assert_allclose(grad.to_host(), -2.0 * ref_grad(*arrays, **SCALES), rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_zero_elements(device):
    arrays = [np.zeros((0, 4), np.float32) for _ in range(4)]
    loss, grad = loss_and_grad(arrays, device)
    assert loss.item() == 0.0 and grad.shape == (0, 4)


def test_gradient_flows_to_pred_only_and_tensors_are_accepted(device):
    arrays = make_inputs((8, 8), seed=7)
    ns = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
    with ag.Tape() as tape:
        loss = fused(*ns)
    tape.backward(loss)
    assert ns[0].grad is not None and all(n.grad is None for n in ns[1:])
    plain = fused(*(nc.tensor(a, device=device) for a in arrays))
    assert not plain.requires_grad
    assert plain.to_host().tobytes() == loss.to_host().tobytes()


def test_deterministic_bit_identical(device):
    arrays = make_inputs((300_001,), seed=8)
    tensors = [nc.tensor(a, device=device) for a in arrays]
    first = fused(*tensors, **SCALES).to_host().tobytes()
    assert all(fused(*tensors, **SCALES).to_host().tobytes() == first for _ in range(3))


@pytest.fixture(scope="module")
def big_case():
    """16M elements, logits in [-80, 80], 30% positives, and the float64 reference loss."""
    n = 1 << 24
    rng = np.random.default_rng(9)
    x = rng.random(n, dtype=np.float32) * np.float32(160.0) - np.float32(80.0)
    t = (rng.random(n, dtype=np.float32) < 0.3).astype(np.float32)
    hw = rng.random(n, dtype=np.float32)
    rw = rng.random(n, dtype=np.float32)
    return (x, t, hw, rw), ref_loss(x, t, hw, rw, heat_scale=0.5, reg_scale=2.0, beta=0.05)


@pytest.mark.slow
def test_16M_elements_logits_80_within_1e5_relative(device, big_case):
    """One forward per device (every work-item of the scalar kernel sums 64 elements, of the float4 one 16 chunks)."""
    arrays, expected = big_case
    tensors = [nc.tensor(a, device=device) for a in arrays]
    got = fused(*tensors, heat_scale=0.5, reg_scale=2.0, beta=0.05).to_host()
    assert abs(float(got) - expected) <= RTOL * abs(expected)


# ---- launches, caching ---------------------------------------------------------------------------
def test_two_launches_forward_one_backward(cl_device, launch_counter):
    arrays = make_inputs((129, 31), seed=10)
    ns = nodes(arrays, cl_device)
    fused(*ns)  # compile outside the counted region
    with launch_counter(cl_device.queue) as fwd, ag.Tape() as tape:
        loss = fused(*ns, **SCALES)
    assert fwd.names == ["detection_loss_partial", "detection_loss_reduce"]
    upstream = nc.tensor(np.float32(1.5), device=cl_device)
    with launch_counter(cl_device.queue) as bwd:
        tape.backward(loss, grad=upstream)
    assert bwd.names == ["detection_loss_backward"]
    np.testing.assert_allclose(ns[0].grad.to_host(), 1.5 * ref_grad(*arrays, **SCALES), rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_compiles_once_scales_and_beta_are_arguments(cl_device):
    arrays = make_inputs((256,), seed=11)
    tensors = [nc.tensor(a, device=cl_device) for a in arrays]
    compiler = get_training_compiler()
    plan = compiler.plan_for("weighted_bce_smooth_l1_sum", *tensors)
    assert isinstance(plan, FusedDetectionLossPlan)
    assert plan.partial_kernel is not None and plan.reduce_kernel is not None and plan.backward_kernel is not None
    misses, plans = program_cache.stats().misses, compiler.cache_info()["plans"]
    for hs, rs, beta in [(1.0, 1.0, 0.05), (0.2, 3.0, 0.5), (1.0, 1.0, 0.0)]:
        got = fused(*tensors, heat_scale=hs, reg_scale=rs, beta=beta).item()
        np.testing.assert_allclose(got, ref_loss(*arrays, heat_scale=hs, reg_scale=rs, beta=beta), rtol=RTOL)
    bigger = [nc.tensor(np.resize(a, 1000), device=cl_device) for a in arrays]
    fused(*bigger)  # another size: same kernels
    assert program_cache.stats().misses == misses
    assert compiler.cache_info()["plans"] == plans
    assert compiler.plan_for("weighted_bce_smooth_l1_sum", *bigger) is plan


# ---- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["target", "heat_weight", "reg_weight"])
def test_shape_and_dtype_errors_name_the_argument(device, bad):
    arrays = make_inputs((4, 5), seed=12)
    compiler = get_training_compiler()
    compiler.clear_plans()
    index = ["pred", "target", "heat_weight", "reg_weight"].index(bad)
    wrong_shape = list(arrays)
    wrong_shape[index] = np.zeros((5, 4), np.float32)
    with pytest.raises(ShapeError, match=rf"{bad} has shape \(5, 4\) but pred has shape \(4, 5\)"):
        fused(*nodes(wrong_shape, device))
    wrong_dtype = list(arrays)
    wrong_dtype[index] = arrays[index].astype(np.int32)
    with pytest.raises(DTypeError, match=rf"{bad} has dtype int32"):
        fused(*nodes(wrong_dtype, device, grad=False))
    wrong_type = list(nodes(arrays, device))
    wrong_type[index] = arrays[index]
    with pytest.raises(TypeError, match=rf"{bad} must be a netcl Node or Tensor"):
        fused(*wrong_type)
    assert compiler.cache_info()["plans"] == 0


def test_pred_dtype_scalar_and_beta_errors(device):
    arrays = make_inputs((6,), seed=13)
    compiler = get_training_compiler()
    compiler.clear_plans()
    with pytest.raises(DTypeError, match="pred has dtype int32"):
        fused(ag.tensor(arrays[0].astype(np.int32), device=device), *nodes(arrays, device)[1:])
    ns = nodes(arrays, device)
    with pytest.raises(ValueError, match=r"beta must be finite and >= 0.*got -0.1"):
        fused(*ns, beta=-0.1)
    with pytest.raises(ValueError, match="beta"):
        fused(*ns, beta=float("nan"))
    with pytest.raises(TypeError, match="heat_scale must be a real number"):
        fused(*ns, heat_scale="1")
    assert compiler.cache_info()["plans"] == 0


def test_device_mismatch_names_both_devices(cl_device):
    arrays = make_inputs((6,), seed=14)
    ns = nodes(arrays, cl_device)
    ns[2] = ag.tensor(arrays[2], device="cpu")
    with pytest.raises(DeviceError, match="two devices"):
        fused(*ns)


# ---- the registry ------------------------------------------------------------------------------
def test_singleton_and_import_paths():
    import netcl.autograd.training_compiler as spec_path

    compiler = get_training_compiler()
    assert get_training_compiler() is compiler
    assert ag.get_training_compiler() is compiler and spec_path.get_training_compiler() is compiler
    assert ag.TrainingGraphCompiler is TrainingGraphCompiler is spec_path.TrainingGraphCompiler
    assert ag.TrainingPattern is TrainingPattern
    assert ag.fused_weighted_bce_smooth_l1_loss is fused is spec_path.fused_weighted_bce_smooth_l1_loss
    assert "weighted_bce_smooth_l1_sum" in compiler
    assert TrainingGraphCompiler(builtins=False).names == []
    # as the API reference: a bare call is the global singleton; an explicit one is private
    assert TrainingGraphCompiler() is compiler and ag.TrainingGraphCompiler() is compiler
    private = TrainingGraphCompiler(builtins=True)
    assert private is not compiler and "weighted_bce_smooth_l1_sum" in private


def test_user_pattern_register_match_plan_and_run(device):
    """A user pattern: fused mean of squared error for same-shape inputs; its plan is built once per key."""
    builds = []

    def matcher(pred, target):
        return tuple(pred.shape) == tuple(target.shape) and len(pred.shape) == 2

    def planner(pred, target):
        builds.append(tuple(pred.shape))
        count = pred.shape[0] * pred.shape[1]
        return lambda p, t: ag.sum((p - t) * (p - t)) * (1.0 / count)

    compiler = TrainingGraphCompiler(builtins=True)  # private: the global one stays as it was
    compiler.register(TrainingPattern("mse_2d", matcher, planner))
    with pytest.raises(ValueError, match="already registered"):
        compiler.register(TrainingPattern("mse_2d", matcher, planner))
    a = ag.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True, device=device)
    b = ag.tensor(np.ones((2, 3), np.float32), device=device)
    assert compiler.match("mse_2d", a, b).name == "mse_2d"
    assert compiler.match(None, a, b).name == "mse_2d"  # the latest registered is asked first
    assert compiler.match("mse_2d", a, ag.tensor(np.ones(6, np.float32), device=device)) is None
    with ag.Tape() as tape:
        loss = compiler.run("mse_2d", a, b)
    tape.backward(loss)
    expected = np.arange(6, dtype=np.float64) - 1.0
    np.testing.assert_allclose(loss.item(), np.mean(expected**2), rtol=1e-6)
    np.testing.assert_allclose(a.grad.to_host().ravel(), 2 * expected / 6, rtol=1e-6)
    compiler.run("mse_2d", a, b)
    assert builds == [(2, 3)] and compiler.cache_info()["plans"] == 1
    with pytest.raises(NoMatchingPatternError, match="mse_2d"):
        compiler.plan_for("mse_2d", a, ag.tensor(np.ones(6, np.float32), device=device))
    with pytest.raises(KeyError, match="no training pattern named 'nope'"):
        compiler.match("nope", a, b)
    replaced = compiler.register(TrainingPattern("mse_2d", matcher, lambda p, t: "new plan"), replace=True)
    assert compiler.plan_for("mse_2d", a, b) == "new plan" and compiler.get("mse_2d") is replaced
    compiler.unregister("mse_2d")
    assert compiler.names == ["weighted_bce_smooth_l1_sum"]


def test_global_registry_user_pattern_and_clear_caches(device):
    from netcl.runtime.cache import clear_caches

    compiler = get_training_compiler()
    pattern = TrainingPattern("double_sum", lambda x: True, lambda x: lambda y: ag.sum(y) * 2.0)
    compiler.register(pattern, replace=True)
    try:
        x = ag.tensor(np.array([1.0, 2.0, 3.5], np.float32), device=device)
        assert compiler.run("double_sum", x).item() == 13.0
        assert compiler.cached_plans("double_sum")
        clear_caches()
        assert compiler.cache_info()["plans"] == 0
    finally:
        compiler.unregister("double_sum")


def test_inside_jit_compile_elementwise_prologue_fuses_and_loss_runs(device):
    """A jit_compile function whose logits come from a fused elementwise chain, then the fused loss."""

    @jit_compile
    def head(x, t, hw, rw):
        return fused(ag.tanh(x) * 4.0 + 0.5, t, hw, rw, heat_scale=0.5, reg_scale=2.0, beta=0.1)

    arrays = make_inputs((40, 10), seed=15)
    for _ in range(2):  # trace + compile, then the cached plan
        ns = nodes(arrays, device)
        with ag.Tape() as tape:
            loss = head(*ns)
        tape.backward(loss)
        z = np.tanh(arrays[0].astype(np.float64)) * 4.0 + 0.5
        scales = {"heat_scale": 0.5, "reg_scale": 2.0, "beta": 0.1}
        np.testing.assert_allclose(loss.item(), ref_loss(z, *arrays[1:], **scales), rtol=RTOL)
        dz = ref_grad(z, *arrays[1:], **scales) * 4.0 * (1.0 - np.tanh(arrays[0].astype(np.float64)) ** 2)
        np.testing.assert_allclose(ns[0].grad.to_host(), dz, rtol=1e-4, atol=1e-5)
