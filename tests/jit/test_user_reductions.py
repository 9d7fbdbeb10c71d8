"""Reductions a user writes (issue 36): programs of elementwise ops around sums, means, maxima and variances
along the last axis become one row kernel forward and at most three launches forward+backward, generated from
the trace. Values and gradients against float64 NumPy (gradients by central differences of the float64
function); launch counts on OpenCL."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.jit import jit_compile

ROWS, C = 12, 40
# float32 over rows of 40: a reduction of 40 terms and a handful of ops per element
RTOL, ATOL = 2e-5, 2e-6
# float32 gradients against central differences (h = 1e-6 on float64: truncation ~1e-9)
GRAD_RTOL, GRAD_ATOL = 2e-4, 2e-5


def masked_softmax(x, mask):
    s = ag.where(mask, x, -1e9)
    e = ag.exp(s - ag.max(s, axis=-1, keepdims=True))
    return e / ag.sum(e, axis=-1, keepdims=True)


def masked_softmax_64(x, mask):
    s = np.where(mask, x, -1e9)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def temperature_logsumexp(x):
    t = x / 0.7
    m = ag.max(t, axis=-1, keepdims=True)
    return m + ag.log(ag.sum(ag.exp(t - m), axis=-1, keepdims=True))


def temperature_logsumexp_64(x):
    t = x / 0.7
    m = t.max(-1, keepdims=True)
    return m + np.log(np.exp(t - m).sum(-1, keepdims=True))


def rms_norm(x, w):
    return x * ag.rsqrt(ag.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def rms_norm_64(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


def layer_norm_variant(x, w):  # a LayerNorm written with var, unbiased, and a scaled residual
    mu = ag.mean(x, axis=-1, keepdims=True)
    return (x - mu) / ag.sqrt(ag.var(x, axis=-1, keepdims=True, unbiased=True) + 1e-5) * w + 0.5 * x


def layer_norm_variant_64(x, w):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, ddof=1, keepdims=True) + 1e-5) * w + 0.5 * x


def weighted_soft_cross_entropy(x, q, w):  # soft targets q, per-class weights w
    shifted = x - ag.max(x, axis=-1, keepdims=True)
    logp = shifted - ag.log(ag.sum(ag.exp(shifted), axis=-1, keepdims=True))
    return -ag.sum(q * w * logp, axis=-1)


def weighted_soft_cross_entropy_64(x, q, w):
    shifted = x - x.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -(q * w * logp).sum(-1)


def row_std(x):
    return ag.std(x, axis=-1) * 2.0


def row_std_64(x):
    return x.std(-1) * 2.0


def _inputs(name: str, rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.uniform(-3, 3, (ROWS, C))
    if name == "masked_softmax":
        mask = rng.random((ROWS, C)) > 0.3
        mask[:, 0] = True  # every row keeps one entry
        return [x, mask]
    if name in ("rms_norm", "layer_norm_variant"):
        return [x, rng.uniform(0.5, 1.5, C)]
    if name == "weighted_soft_cross_entropy":
        q = rng.random((ROWS, C))
        return [x, q / q.sum(-1, keepdims=True), rng.uniform(0.5, 2.0, C)]
    return [x]


CASES: list[tuple[str, Callable, Callable, int]] = [
    # name, program, float64 reference, launches forward+backward on OpenCL
    ("masked_softmax", masked_softmax, masked_softmax_64, 2),
    ("temperature_logsumexp", temperature_logsumexp, temperature_logsumexp_64, 2),
    ("rms_norm", rms_norm, rms_norm_64, 3),  # + the sum of the weight's per-group partials
    ("layer_norm_variant", layer_norm_variant, layer_norm_variant_64, 3),
    ("weighted_soft_cross_entropy", weighted_soft_cross_entropy, weighted_soft_cross_entropy_64, 3),
    ("row_std", row_std, row_std_64, 2),
]


def _numeric_grad(ref: Callable, arrays: list[np.ndarray], upstream: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d sum(upstream * ref(x, ...)) / d x by central differences in float64."""
    x = arrays[0].copy()
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        saved = x[idx]
        x[idx] = saved + h
        up = np.sum(upstream * ref(x, *arrays[1:]))
        x[idx] = saved - h
        down = np.sum(upstream * ref(x, *arrays[1:]))
        x[idx] = saved
        grad[idx] = (up - down) / (2 * h)
    return grad


@pytest.mark.parametrize(("name", "fn", "ref", "launches"), CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_float64(device, name, fn, ref, launches) -> None:
    rng = np.random.default_rng(len(name))
    arrays = _inputs(name, rng)
    nodes = [
        ag.tensor(a if a.dtype == bool else a.astype(np.float32), requires_grad=k == 0, device=device)
        for k, a in enumerate(arrays)
    ]
    jitted = jit_compile(fn)
    with ag.Tape() as tape:
        out = jitted(*nodes)
    upstream = rng.uniform(-1, 1, out.shape)
    tape.backward(out, grad=ag.tensor(upstream.astype(np.float32), device=device).value)
    exact = ref(*[a.astype(np.float64) if a.dtype != bool else a for a in arrays])
    np.testing.assert_allclose(out.value.to_host(), exact, rtol=RTOL, atol=ATOL)
    expected = _numeric_grad(ref, [a.astype(np.float64) if a.dtype != bool else a for a in arrays], upstream)
    np.testing.assert_allclose(nodes[0].grad.to_host(), expected, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    assert jitted.cache_info()["fallbacks"] == 0


@pytest.mark.parametrize(("name", "fn", "ref", "launches"), CASES, ids=[c[0] for c in CASES])
def test_one_row_kernel_forward_and_few_launches_each_way(cl_device, launch_counter, name, fn, ref, launches):
    rng = np.random.default_rng(3)
    arrays = _inputs(name, rng)
    nodes = [
        ag.tensor(a if a.dtype == bool else a.astype(np.float32), requires_grad=k != 1 or name != "masked_softmax")
        for k, a in enumerate(arrays)
    ]
    nodes = [ag.tensor(n.value.to_host(), requires_grad=n.requires_grad, device=cl_device) for n in nodes]
    jitted = jit_compile(fn)
    for _ in range(2):  # the first call builds the kernels
        for n in nodes:
            n.grad = None
        with launch_counter(cl_device.queue) as counter:
            with ag.Tape() as tape:
                out = jitted(*nodes)
            forward = list(counter.names)
            tape.backward(out, grad=ag.tensor(np.ones(out.shape, np.float32), device=cl_device).value)
    assert forward == ["row_forward"], forward
    assert len(counter.names) == launches, counter.names


def test_where_with_a_scalar_branch_is_one_fused_op(device) -> None:
    """ag.where with a constant branch (either side) against NumPy; no gradient for the condition."""
    rng = np.random.default_rng(5)
    x, c = rng.uniform(-2, 2, (3, 7)).astype(np.float32), rng.random((3, 7)) > 0.5
    xn = ag.tensor(x, requires_grad=True, device=device)
    cn = ag.tensor(c, device=device)
    with ag.Tape() as tape:
        right, left = ag.where(cn, xn, -4.0), ag.where(cn, 2.5, xn)
        total = ag.sum(right * 3.0 + left)
    tape.backward(total)
    assert (right.op_name, left.op_name) == ("where_scalar_right", "where_scalar_left")
    np.testing.assert_array_equal(right.value.to_host(), np.where(c, x, np.float32(-4.0)))
    np.testing.assert_array_equal(left.value.to_host(), np.where(c, np.float32(2.5), x))
    np.testing.assert_array_equal(xn.grad.to_host(), np.where(c, 3.0, 1.0).astype(np.float32))
