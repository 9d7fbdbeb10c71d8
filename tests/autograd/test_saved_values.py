"""A value a backward reads, overwritten in place after its forward, raises ``ModifiedInPlaceError`` (torch's
version-counter error) instead of giving the gradient of the new values; writes the backward does not read,
and the usual forward / backward / step order, do not."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import nn
from netcl.autograd import ModifiedInPlaceError
from netcl.optim import SGD
from netcl.runtime import ops as R

MODIFIED = r"the backward of op '{}' needs its {} \(shape \({}\), float32\), which was modified in place"


def _linear(device):
    rng = np.random.default_rng(0)
    layer = nn.Linear(3, 2, device=device)
    x = ag.tensor(rng.normal(size=(4, 3)).astype(np.float32), requires_grad=True, device=device)
    return layer, x


def test_an_optimizer_step_before_backward_raises_before_any_launch(device, raises_before_launch):
    """``opt.step()`` between the forward and ``backward`` (a GAN loop in the wrong order): the product's backward
    would read the updated weight. Raised before any backward kernel; no gradient is stored."""
    layer, x = _linear(device)
    opt = SGD(layer.parameters(), lr=0.5)
    loss = ag.sum(layer(x) * layer(x))
    for p in layer.parameters():
        p.grad = ag.tensor(np.ones(p.shape, np.float32), device=device).value
    opt.step()
    raises_before_launch(device, ModifiedInPlaceError, MODIFIED.format("linear", "input 1", "2, 3"), loss.backward)
    assert x.grad is None


@pytest.mark.parametrize(
    "write",
    [
        lambda w: nn.init.normal_(w),
        lambda w: R.add_(w.value.reshape(-1), 1.0),  # through a view: views share the buffer's stamp
        lambda w: R.fill_(w.value, 0.5),
    ],
    ids=["nn.init", "add_ into a view", "fill_"],
)
def test_writes_into_a_saved_weight_raise(device, write):
    layer, x = _linear(device)
    loss = ag.sum(layer(x))
    write(layer.weight)
    with pytest.raises(ModifiedInPlaceError, match=MODIFIED.format("linear", "input 1", "2, 3")):
        loss.backward()


def test_load_state_dict_between_forward_and_backward_raises(device):
    layer, x = _linear(device)
    loss = ag.sum(layer(x))
    layer.load_state_dict({k: np.zeros(v.shape, np.float32) for k, v in layer.state_dict().items()})
    with pytest.raises(ModifiedInPlaceError, match="load_state_dict"):
        loss.backward()


def test_an_overwritten_output_an_elementwise_derivative_reads_raises(device):
    """exp's derivative reads its output: writing into it raises; writing into its input does not (not read)."""
    x = ag.tensor(np.array([0.5, -1.0], np.float32), requires_grad=True, device=device)
    y = ag.exp(x)
    R.add_(x.value, 1.0)  # exp's derivative g * out never reads x
    ag.sum(y).backward()
    np.testing.assert_allclose(x.grad.to_host(), np.exp(np.array([0.5, -1.0])), rtol=1e-6)
    x.grad = None
    y = ag.exp(x)
    R.fill_(y.value, 0.0)
    with pytest.raises(ModifiedInPlaceError, match=MODIFIED.format("exp", "output", "2,")):
        ag.sum(y).backward()


def test_writes_the_backward_does_not_read_pass(device):
    """add's derivative reads neither input: a bias overwritten after ``h + b`` keeps the exact gradient."""
    h = ag.tensor(np.ones((2, 3), np.float32), requires_grad=True, device=device)
    b = ag.tensor(np.zeros(3, np.float32), requires_grad=True, device=device)
    out = ag.sum(h + b)
    R.fill_(b.value, 3.0)
    out.backward()
    np.testing.assert_array_equal(b.grad.to_host(), [2.0, 2.0, 2.0])


def test_the_usual_loop_and_two_forwards_through_batch_norm_pass(device):
    """forward, backward, step, repeated; and one loss over two forwards of a model whose BatchNorm updates its
    running statistics in place (not read by its training-mode backward): no error, finite gradients."""
    rng = np.random.default_rng(1)
    model = nn.Sequential(nn.Linear(3, 4, device=device), nn.BatchNorm1d(4, device=device), nn.ReLU())
    opt = SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        a = ag.tensor(rng.normal(size=(8, 3)).astype(np.float32), device=device)
        b = ag.tensor(rng.normal(size=(8, 3)).astype(np.float32), device=device)
        opt.zero_grad()
        loss = ag.sum(model(a) * model(b))
        loss.backward()
        opt.step()
    assert all(np.isfinite(p.grad.to_host()).all() for p in model.parameters())


def test_a_replayed_training_step_counts_as_a_write_of_the_parameters(cl_device):
    """A forward recorded eagerly, then a replay of a captured step with an optimizer update (which rewrites the
    weights on the device), then the eager backward: it would use the updated weights, so it raises."""
    from netcl.jit import fuse_graph

    layer, x = _linear(cl_device)
    opt = SGD(layer.parameters(), lr=0.5)
    y = ag.tensor(np.zeros((4, 2), np.float32), device=cl_device)
    graph = fuse_graph(layer, x, y, ag.mse_loss, optimizer_step=opt.step)
    loss = ag.sum(layer(x))
    graph.execute(x, y)
    with pytest.raises(ModifiedInPlaceError, match=MODIFIED.format("linear", "input 1", "2, 3")):
        loss.backward()
