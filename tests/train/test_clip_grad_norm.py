"""nn.utils.clip_grad_norm_ against a float64 NumPy norm, many tensors, every norm type, and inside a replay."""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn as nn
from netcl.core import Tensor
from netcl.jit import fuse_graph, jit_compile

#: 21 gradients (two multi-tensor launches of 16 and 8 slots), an empty one among them
SHAPES = [(3, 4), (5,), (0,), (7, 2, 3), (300,)] + [(2, 3)] * 16


def _params(device, scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    params, grads = [], []
    for shape in SHAPES:
        p = nn.Parameter(np.zeros(shape, np.float32), device=device)
        g = (rng.standard_normal(shape) * scale).astype(np.float32)
        p.grad = Tensor.from_host(device, g)
        params.append(p)
        grads.append(g.astype(np.float64))
    return params, grads


def _reference(grads, norm_type):
    flat = np.concatenate([g.ravel() for g in grads])
    return np.abs(flat).max() if math.isinf(norm_type) else float(np.sum(np.abs(flat) ** norm_type) ** (1 / norm_type))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_float64_numpy(device, norm_type, max_norm):
    """Tolerance: float32 elements summed in float32 (p-th powers of ~350 values, tree order): a few
    float32 ulps of relative error, 1e-5 with room."""
    params, grads = _params(device)
    total = nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    expected = _reference(grads, norm_type)
    assert isinstance(total, Tensor) and total.shape == () and total.dtype == np.float32
    assert float(total.to_host()) == pytest.approx(expected, rel=1e-5)
    coef = min(max_norm / (expected + 1e-6), 1.0)
    for p, g in zip(params, grads, strict=True):
        np.testing.assert_allclose(p.grad.to_host(), g * coef, rtol=1e-5, atol=1e-7)
    if max_norm > expected:  # a factor of exactly 1: the gradients are untouched
        for p, g in zip(params, grads, strict=True):
            np.testing.assert_array_equal(p.grad.to_host(), g.astype(np.float32))


def test_parameters_without_gradients_are_skipped_and_a_single_one_is_taken(device):
    a = nn.Parameter(np.zeros(3, np.float32), device=device)
    b = nn.Parameter(np.zeros(2, np.float32), device=device)
    b.grad = Tensor.from_host(device, np.array([3.0, 4.0], np.float32))
    assert float(nn.utils.clip_grad_norm_([a, b], 1.0).to_host()) == pytest.approx(5.0)
    np.testing.assert_allclose(b.grad.to_host(), [0.6, 0.8], rtol=1e-6)
    assert a.grad is None
    assert float(nn.utils.clip_grad_norm_(b, 10.0).to_host()) == pytest.approx(1.0, rel=1e-6)


def test_nonfinite_norm_raises_when_asked_and_changes_nothing(device):
    params, grads = _params(device)
    bad = grads[0].copy()
    bad[0, 0] = np.inf
    params[0].grad = Tensor.from_host(device, bad.astype(np.float32))
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    for p, g in zip(params[1:], grads[1:], strict=True):
        np.testing.assert_array_equal(p.grad.to_host(), g.astype(np.float32))


def test_bad_arguments(device):
    params, _ = _params(device)
    with pytest.raises(ValueError, match="norm_type must be"):
        nn.utils.clip_grad_norm_(params, 1.0, norm_type=0)
    with pytest.raises(ValueError, match="max_norm must be"):
        nn.utils.clip_grad_norm_(params, -1.0)
    with pytest.raises(TypeError, match="expected a Parameter"):
        nn.utils.clip_grad_norm_([np.zeros(3)], 1.0)


def test_clip_replays_with_the_factor_computed_on_the_device(device):
    """A captured step that clips: each replay clips that batch's gradients by that batch's norm."""
    ag.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8, device=device), nn.Tanh(), nn.Linear(8, 3, device=device))
    params = list(model.parameters())
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((6, 5)).astype(np.float32) * s, rng.integers(0, 3, 6).astype(np.int32))
               for s in (1.0, 30.0, 0.01)]  # fmt: skip
    norms = []
    x0, y0 = batches[0]
    graph = fuse_graph(model, ag.tensor(x0, device=device), ag.tensor(y0, device=device), ag.cross_entropy,
                       optimizer_step=lambda: norms.append(nn.utils.clip_grad_norm_(params, 0.3)))  # fmt: skip
    captured_norm = norms[0]
    for x, y in batches[1:]:
        graph.execute(ag.tensor(x, device=device), ag.tensor(y, device=device))
        clipped = [p.grad.to_host().astype(np.float64) for p in params]
        for p in params:  # the unclipped gradient of this batch, eagerly
            p.grad = None
        with ag.Tape() as tape:
            loss = ag.cross_entropy(model(ag.tensor(x, device=device)), y)
        tape.backward(loss)
        raw = [p.grad.to_host().astype(np.float64) for p in params]
        norm = _reference(raw, 2.0)
        if device.kind == "opencl":  # the captured norm tensor is rewritten by each replay
            assert float(captured_norm.to_host()) == pytest.approx(norm, rel=1e-5)
        coef = min(0.3 / (norm + 1e-6), 1.0)
        for c, r in zip(clipped, raw, strict=True):
            np.testing.assert_allclose(c, r * coef, rtol=1e-4, atol=1e-7)  # jit-fused vs eager backward


def test_clip_grad_value_clamps_every_gradient_in_place(device):
    """torch's ``clip_grad_value_``: each gradient clamped to [-c, c] in its own buffer; no gradient, no change."""
    params, grads = _params(device, scale=3.0)
    buffers = [p.grad for p in params]
    bare = nn.Parameter(np.zeros(2, np.float32), device=device)
    nn.utils.clip_grad_value_([*params, bare], 1.5)
    for p, buffer, g in zip(params, buffers, grads, strict=True):
        assert p.grad is buffer
        np.testing.assert_array_equal(p.grad.to_host(), np.clip(g, -1.5, 1.5).astype(np.float32))
    assert bare.grad is None
    with pytest.raises(ValueError, match="clip_value must be a number >= 0, got -1"):
        nn.utils.clip_grad_value_(params, -1)


@pytest.mark.parametrize("fused", [False, True], ids=["eager", "jit"])
def test_leaves_of_one_sum_get_buffers_of_their_own(device, fused):
    """``a + b``'s backward hands both leaves the upstream gradient; each stores a buffer of its own, so clipping
    (in place, per gradient) scales each once: the float64 result, not the square of the factor."""
    a, b = (nn.Parameter(np.zeros(6, np.float32), device=device) for _ in range(2))
    add = jit_compile(lambda x, y: x + y) if fused else (lambda x, y: x + y)
    upstream = np.arange(1, 7, dtype=np.float32)
    with ag.Tape() as tape:
        out = add(a, b)
    tape.backward(out, grad=Tensor.from_host(device, upstream))
    assert a.grad is not b.grad
    norm = float(np.asarray(nn.utils.clip_grad_norm_([a, b], 1.0).to_host()))
    total = math.sqrt(2 * float(np.sum(upstream.astype(np.float64) ** 2)))
    assert norm == pytest.approx(total, rel=1e-6)
    for p in (a, b):
        np.testing.assert_allclose(p.grad.to_host(), upstream / (total + 1e-6), rtol=1e-6)


def test_a_leaf_never_takes_the_callers_gradient_buffer(device):
    """``backward(out, grad=g)`` where a leaf's gradient is ``g`` itself: the leaf stores a copy, so zeroing or
    scaling its gradient in place leaves the caller's ``g`` alone (as torch's)."""
    a = nn.Parameter(np.zeros(5, np.float32), device=device)
    upstream = Tensor.from_host(device, np.arange(5, dtype=np.float32))
    with ag.Tape() as tape:
        out = a + ag.tensor(np.ones(5, np.float32), device=device)  # a's gradient: the upstream itself
    tape.backward(out, grad=upstream)
    nn.utils.clip_grad_norm_([a], 1e-3)
    np.testing.assert_array_equal(upstream.to_host(), np.arange(5, dtype=np.float32))
    np.testing.assert_allclose(np.linalg.norm(a.grad.to_host()), 1e-3, rtol=1e-4)
