"""fuse_graph: a captured, jit-fused step replays to the same loss, gradients and updates as the eager step.

Both sides run the same float32 kernels on the same inputs except that the fused step runs the
elementwise parts as jit kernels; those agree with the eager ops to a few ulps (a GPU compiler
may contract differently), and the matmul gradients sum such values over the batch with
cancellation. So: 1e-5 relative, plus 1e-5 of the largest magnitude of that tensor as absolute
slack for entries that cancel to near zero. A wrong rule is off by O(1) relative.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.jit import FusedGraph, fuse_graph, fused_weighted_bce_smooth_l1_loss
from netcl.jit.gemm_epilogue import one_kernel
from netcl.runtime import ops as rops
from netcl.runtime.errors import ReplayError

RTOL, ATOL = 1e-5, 1e-6


def assert_close(got, ref):
    ref = np.asarray(ref)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=1e-5 * float(np.max(np.abs(ref), initial=0.0)) + ATOL)


B, F, H, K = 8, 6, 16, 5


class Head:
    """A two-layer detection-style head: ``tanh(x @ w1 + b1) @ w2 + b2`` -> K logits."""

    def __init__(self, device, seed=0):
        rng = np.random.default_rng(seed)
        self.w1 = ag.tensor(rng.normal(0, 0.4, (F, H)).astype(np.float32), requires_grad=True, device=device)
        self.b1 = ag.tensor(rng.normal(0, 0.1, (1, H)).astype(np.float32), requires_grad=True, device=device)
        self.w2 = ag.tensor(rng.normal(0, 0.4, (H, K)).astype(np.float32), requires_grad=True, device=device)
        self.b2 = ag.tensor(np.zeros((1, K), np.float32), requires_grad=True, device=device)

    def parameters(self):
        return [self.w1, self.b1, self.w2, self.b2]

    def __call__(self, x):
        h = ag.tanh(ag.matmul(x, self.w1) + self.b1) * 1.5 + 0.1
        return ag.matmul(h, self.w2) + self.b2


def batch(seed, device):
    rng = np.random.default_rng(100 + seed)
    x = ag.tensor(rng.normal(0, 1, (B, F)).astype(np.float32), device=device)
    y = ag.tensor(rng.uniform(0, 1, (B, K)).astype(np.float32), device=device)
    return x, y


def weights(device):
    rng = np.random.default_rng(7)
    hw = ag.tensor(rng.uniform(0.5, 1.5, (B, K)).astype(np.float32), device=device)
    rw = ag.tensor(rng.uniform(0.5, 1.5, (B, K)).astype(np.float32), device=device)
    return hw, rw


def make_loss(device):
    hw, rw = weights(device)
    return functools.partial(_loss, hw=hw, rw=rw)


def _loss(pred, target, hw, rw):
    return fused_weighted_bce_smooth_l1_loss(pred, target, hw, rw, heat_scale=0.5, reg_scale=2.0, beta=0.1)


def eager_step(model, loss_fn, x, y):
    for p in model.parameters():
        p.grad = None
    with ag.Tape() as tape:
        loss = loss_fn(model(x), y)
    tape.backward(loss)
    return loss.item(), [p.grad.to_host() for p in model.parameters()]


def test_training_step_replays_like_eager(device):
    model, loss_fn = Head(device), make_loss(device)
    x0, y0 = batch(0, device)
    fused = fuse_graph(model, x0, target=y0, loss_fn=loss_fn)
    assert isinstance(fused, FusedGraph)
    for seed, run in ((1, fused.execute), (2, fused.replay), (0, fused.execute)):
        x, y = batch(seed, device)
        loss = run(x, y).item()
        grads = [p.grad.to_host() for p in model.parameters()]
        ref_loss, ref_grads = eager_step(model, loss_fn, x, y)
        np.testing.assert_allclose(loss, ref_loss, rtol=RTOL)
        for got, ref in zip(grads, ref_grads, strict=True):
            assert_close(got, ref)


def test_captured_step_is_fused(cl_device):
    """The capture holds the fused loss kernels. Where products run in GEMM kernels (not the host BLAS
    of a CPU device), both layers' elementwise epilogues run in their GEMM's store (no separate forward
    kernel); the first layer's backward is one fused kernel, the second's (``+ b2``) needs none: its
    product's gradient is the upstream gradient. On a host-BLAS device each epilogue is a fused kernel."""
    model, loss_fn = Head(cl_device), make_loss(cl_device)
    fused = fuse_graph(model, *batch(0, cl_device), loss_fn=loss_fn)
    names = [launch.name for launch in fused.launches]
    assert names.count("detection_loss_partial") == 1 and names.count("detection_loss_reduce") == 1
    assert names.count("detection_loss_backward") == 1
    if one_kernel(cl_device):
        assert "fused_forward" not in names and names.count("fused_backward") == 1
    else:
        assert "fused_forward" in names and "fused_backward" in names
    unfused = fuse_graph(model, *batch(0, cl_device), loss_fn=loss_fn, jit=False)
    assert len(fused.launches) < len(unfused.launches)


def test_classifier_step_uses_the_class_loss_kernels(device):
    """``cross_entropy`` (mean, integer targets) inside a jit-fused step runs on the class-loss kernels
    (one row kernel and one reduction forward, one row kernel backward), as it does eagerly, not on
    ~20 launches of composed ops; replayed steps on new batches equal eager steps."""
    from netcl import nn

    model = nn.Sequential(nn.Linear(F, H, device=device), nn.ReLU(), nn.Linear(H, K, device=device))
    rng = np.random.default_rng(3)

    def classes(seed):
        x = ag.tensor(rng.normal(0, 1, (B, F)).astype(np.float32), device=device)
        y = ag.tensor(np.random.default_rng(seed).integers(0, K, B).astype(np.int32), device=device)
        return x, y

    fused = fuse_graph(model, *classes(0), loss_fn=ag.cross_entropy)
    for seed in (1, 2):
        x, y = classes(seed)
        loss = fused.execute(x, y).item()
        grads = [p.grad.to_host() for p in model.parameters()]
        ref_loss, ref_grads = eager_step(model, ag.cross_entropy, x, y)
        np.testing.assert_allclose(loss, ref_loss, rtol=RTOL)
        for got, ref in zip(grads, ref_grads, strict=True):
            assert_close(got, ref)
    if device.kind == "opencl":
        names = [launch.name for launch in fused.launches]
        for kernel in ("netcl_class_loss_rows", "netcl_class_loss_reduce", "netcl_class_loss_rows_backward"):
            assert names.count(kernel) == 1, names
        assert "netcl_softmax_rows" not in names, names


class TwoBranch(Head):
    """``Head`` whose hidden layer feeds two products, summed (a residual block's shape: the hidden layer's
    gradient is the sum of the two products' input gradients)."""

    def __init__(self, device, seed=0):
        super().__init__(device, seed)
        rng = np.random.default_rng(seed + 1)
        self.w3 = ag.tensor(rng.normal(0, 0.4, (H, K)).astype(np.float32), requires_grad=True, device=device)

    def parameters(self):
        return [*super().parameters(), self.w3]

    def __call__(self, x):
        h = ag.tanh(ag.matmul(x, self.w1) + self.b1)
        return ag.matmul(h, self.w2) + ag.matmul(h, self.w3) + self.b2


def test_a_gradient_summed_over_two_products_is_folded_into_the_second_in_a_fused_step(device, monkeypatch):
    """The op that reaches a tensor's pending gradient second takes it as its addend (summed in its store: no add
    kernel) inside a fused step's backward as in an eager one: the traced op keeps ``folds_addends``. The step's
    gradients are the eager step's."""
    from netcl.autograd import engine

    folded = []
    real = engine._BoundGrad.__call__

    def spy(self, grad_out, addends=None):
        if self.op_name == "matmul" and addends is not None:
            folded.append(any(a is not None for a in addends))
        return real(self, grad_out, addends)

    monkeypatch.setattr(engine._BoundGrad, "__call__", spy)
    model, loss_fn = TwoBranch(device), make_loss(device)
    x0, y0 = batch(0, device)
    fused = fuse_graph(model, x0, y0, loss_fn)
    assert folded.count(True) == 1, folded  # the capture's backward: h's gradient from the second product
    for seed in (1, 2):
        x, y = batch(seed, device)
        loss = fused.execute(x, y).item()
        grads = [p.grad.to_host() for p in model.parameters()]
        ref_loss, ref_grads = eager_step(model, loss_fn, x, y)
        np.testing.assert_allclose(loss, ref_loss, rtol=RTOL)
        for got, ref in zip(grads, ref_grads, strict=True):
            assert_close(got, ref)


def test_optimizer_step_is_captured(device):
    """An SGD update inside the step (in-place runtime ops) replays: parameters move like eager SGD."""
    lr = 0.05
    model, ref_model, loss_fn = Head(device), Head(device), make_loss(device)

    def sgd(m):
        for p in m.parameters():
            rops.add_(p.value, rops.mul(p.grad, -lr))

    x0, y0 = batch(0, device)
    fused = fuse_graph(model, x0, y0, loss_fn, optimizer_step=lambda: sgd(model))
    eager_step(ref_model, loss_fn, x0, y0)  # the capture ran one real step
    sgd(ref_model)
    for seed in (1, 2):
        x, y = batch(seed, device)
        loss = fused.execute(x, y).item()
        ref_loss, _ = eager_step(ref_model, loss_fn, x, y)
        sgd(ref_model)
        np.testing.assert_allclose(loss, ref_loss, rtol=RTOL)
        for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
            assert_close(p.to_host(), q.to_host())


def test_inference_step_and_plain_function_with_params(device):
    model = Head(device)
    x0, _ = batch(0, device)
    fused = fuse_graph(model, x0)
    x1, _ = batch(1, device)
    assert_close(fused.execute(x1).to_host(), model(x1).to_host())
    # a plain function plus params=, a one-argument loss_fn and a NumPy input
    w = ag.tensor(np.full((F, 1), 0.5, np.float32), requires_grad=True, device=device)
    step = fuse_graph(lambda x: ag.matmul(x, w), x0, loss_fn=lambda out: ag.sum(ag.relu(out) * out), params=[w])
    data = np.random.default_rng(3).normal(size=(B, F)).astype(np.float32)
    loss = step.execute(data).item()
    z = data.astype(np.float64) @ np.full((F, 1), 0.5)
    np.testing.assert_allclose(loss, np.sum(np.maximum(z, 0) * z), rtol=RTOL)
    np.testing.assert_allclose(
        w.grad.to_host(), data.T.astype(np.float64) @ (2 * np.maximum(z, 0)), rtol=RTOL, atol=1e-5
    )


def test_errors(device):
    model, loss_fn = Head(device), make_loss(device)
    x0, y0 = batch(0, device)
    with pytest.raises(ValueError, match="target but no loss_fn"):
        fuse_graph(model, x0, target=y0)
    with pytest.raises(ValueError, match="parameters that require grad"):
        fuse_graph(lambda x: x * 2.0, x0, y0, loss_fn)
    with pytest.raises(TypeError, match="callable"):
        fuse_graph(3, x0)
    fused = fuse_graph(model, x0, y0, loss_fn)
    with pytest.raises(ValueError, match="execute\\(x, target\\)"):
        fused.execute(x0)
    if device.kind == "opencl":
        bad = ag.tensor(np.zeros((B + 1, F), np.float32), device=device)
        with pytest.raises(ReplayError, match="captured"):
            fused.execute(bad, y0)


def test_model_without_parameters_method_needs_params():
    device = nc.get_device("cpu")
    x0, y0 = batch(0, device)
    with pytest.raises(ValueError, match="params="):
        fuse_graph(lambda x: x, x0, y0, make_loss(device))


def test_replaying_after_a_mode_switch_raises_until_switched_back(device):
    """A step captured in training mode baked in batch statistics and dropout: after model.eval() a replay
    would compute training numbers, so it raises, naming the modules; train() makes it replay again."""
    from netcl import nn
    from netcl.runtime import StaleCaptureError

    model = nn.Sequential(nn.Linear(F, H, device=device), nn.BatchNorm1d(H, device=device), nn.Dropout(0.25))
    x = batch(0, device)[0]
    graph = fuse_graph(model, x, ag.tensor(np.zeros((B, H), np.float32), device=device), ag.mse_loss)
    model.eval()
    message = r"BatchNorm1d \(captured in training mode, now in eval mode\), Dropout \(captured in training"
    with pytest.raises(StaleCaptureError, match=message):
        graph.execute(x, ag.tensor(np.zeros((B, H), np.float32), device=device))
    model.train()
    loss = graph.execute(x, ag.tensor(np.zeros((B, H), np.float32), device=device))
    assert np.isfinite(float(np.asarray(loss.to_host())))


def test_a_host_read_inside_the_captured_step_raises_and_leaves_nothing_recording(cl_device):
    """A replay would not read the value again (the clip's non-finite check, a loss printed with item()):
    the capture refuses the read, names the user's line, and the queue records nothing afterwards."""
    from netcl import nn
    from netcl.nn.utils import clip_grad_norm_
    from netcl.optim import SGD
    from netcl.runtime import HostReadInCaptureError
    from netcl.runtime.recording import RECORDING

    model = nn.Linear(F, K, device=cl_device)
    opt = SGD(model.parameters(), lr=0.1)
    x, y = batch(0, cl_device)

    def clipped_step():
        clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
        opt.step()

    with pytest.raises(HostReadInCaptureError, match=r"test_fuse_graph\.py:\d+\)"):
        fuse_graph(model, x, y, ag.mse_loss, optimizer_step=clipped_step)
    with pytest.raises(HostReadInCaptureError, match="Read it outside the captured step"):
        fuse_graph(model, x, y, lambda out, t: ag.mse_loss(out, t) * float(ag.sum(out).item()), jit=False)
    assert cl_device.queue.int_ptr not in RECORDING
    graph = fuse_graph(model, x, y, ag.mse_loss, optimizer_step=opt.step)  # the same step without the reads
    assert np.isfinite(float(np.asarray(graph.execute(x, y).to_host())))


def test_replaying_after_freezing_a_parameter_raises(device):
    """Freezing (or unfreezing) a parameter after the capture: the replay would still compute and apply its
    gradient (or never), so it raises naming the parameter; unfreezing it again replays."""
    from netcl import nn
    from netcl.optim import SGD
    from netcl.runtime import StaleCaptureError

    model = nn.Sequential(nn.Linear(F, H, device=device), nn.Tanh(), nn.Linear(H, K, device=device))
    opt = SGD(model.parameters(), lr=0.1)
    x, y = batch(0, device)
    graph = fuse_graph(model, x, y, ag.mse_loss, optimizer_step=opt.step)
    model[0].requires_grad_(False)
    frozen = rf"parameter 0 \(shape \({H}, {F}\)\) was captured with requires_grad=True"
    with pytest.raises(StaleCaptureError, match=frozen):
        graph.execute(x, y)
    model[0].requires_grad_(True)
    assert np.isfinite(float(np.asarray(graph.execute(x, y).to_host())))


def test_replaying_after_a_parameter_moved_raises(device):
    """``model.to(other)`` after the capture gives the parameters new tensors; the replay's kernels would keep
    training the old buffers, so it raises."""
    from netcl import nn
    from netcl.runtime import StaleCaptureError

    model = nn.Sequential(nn.Linear(F, K, device=device))
    x, y = batch(0, device)
    graph = fuse_graph(model, x, y, ag.mse_loss)
    other = nc.get_device("cpu") if device.kind == "opencl" else nc.get_device("opencl")
    model.to(other)
    with pytest.raises(StaleCaptureError, match="parameter 0 holds another tensor than at capture"):
        graph.execute(x, y)
