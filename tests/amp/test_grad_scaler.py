"""GradScaler: scaling, unscaling, skipping steps with inf/NaN gradients, and the scale's schedule."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl.amp import GradScaler
from netcl.optim import SGD


def _param(device, values=(1.0, 2.0, 3.0)):
    return nn.Parameter(np.asarray(values, np.float32), device=device)


def test_scale_loss_multiplies_and_its_gradient_is_scaled(device):
    scaler = GradScaler(init_scale=1024.0)
    p = _param(device)
    with ag.Tape() as tape:
        loss = scaler.scale_loss(ag.sum(p * p))
    np.testing.assert_allclose(loss.item(), 1024.0 * 14.0)
    tape.backward(loss)
    np.testing.assert_allclose(p.grad.to_host(), 1024.0 * 2 * np.array([1, 2, 3]))


def test_clean_step_unscales_and_updates(device):
    scaler = GradScaler(init_scale=8.0, growth_interval=2)
    p = _param(device)
    opt = SGD([p], lr=0.5)
    g = np.array([1.0, -2.0, 4.0], np.float32)
    for step in range(3):
        p.grad = nc.tensor(scaler.get_scale() * g, device=device)  # what backward of a scaled loss gives
        scaler.step(opt, [p])
        np.testing.assert_allclose(p.grad.to_host(), g)  # unscaled in place
        scaler.update()
        # growth after growth_interval (2) clean steps in a row: 8 -> 16 after the second step
        assert scaler.get_scale() == (8.0 if step == 0 else 16.0)
    np.testing.assert_allclose(p.to_host(), np.array([1.0, 2.0, 3.0]) - 3 * 0.5 * g, rtol=1e-6)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_step_is_skipped_when_a_gradient_is_not_finite(device, bad):
    scaler = GradScaler(init_scale=4.0, backoff_factor=0.25)
    p, q = _param(device), _param(device, (5.0, 6.0))
    opt = SGD([p, q], lr=0.1)
    p.grad = nc.tensor(np.array([1.0, 1.0, 1.0], np.float32), device=device)
    q.grad = nc.tensor(np.array([1.0, bad], np.float32), device=device)
    assert scaler.step(opt, [p, q]) is None
    np.testing.assert_array_equal(p.to_host(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(q.to_host(), [5.0, 6.0])
    assert opt.steps.to_host().tolist() == [0, 0]
    scaler.update()
    assert scaler.get_scale() == 1.0
    # the next clean iteration steps again
    p.grad = nc.tensor(np.array([1.0, 1.0, 1.0], np.float32), device=device)
    q.grad = nc.tensor(np.array([1.0, 1.0], np.float32), device=device)
    scaler.step(opt, [p, q])
    scaler.update()
    np.testing.assert_allclose(p.to_host(), [0.9, 1.9, 2.9], rtol=1e-6)


def test_gradient_buffer_shared_by_two_parameters_is_unscaled_once(device):
    scaler = GradScaler(init_scale=2.0)
    p, q = _param(device), _param(device)
    with ag.Tape() as tape:
        loss = scaler.scale_loss(ag.sum(p + q))  # add gives both parents the same gradient buffer
    tape.backward(loss)
    scaler.unscale_(SGD([p, q], lr=1.0))
    np.testing.assert_array_equal(p.grad.to_host(), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(q.grad.to_host(), [1.0, 1.0, 1.0])


def test_disabled_scaler_is_transparent(device):
    scaler = GradScaler(enabled=False)
    p = _param(device)
    loss = ag.sum(p)
    assert scaler.scale_loss(loss) is loss and scaler.get_scale() == 1.0
    p.grad = nc.tensor(np.ones(3, np.float32), device=device)
    scaler.step(SGD([p], lr=1.0))
    np.testing.assert_array_equal(p.to_host(), [0.0, 1.0, 2.0])


def test_state_dict_and_bad_arguments():
    scaler = GradScaler(init_scale=16.0, growth_interval=3)
    other = GradScaler()
    other.load_state_dict(scaler.state_dict())
    assert other.get_scale() == 16.0 and other.growth_interval == 3
    with pytest.raises(ValueError, match="backoff_factor must be in"):
        GradScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_interval must be a positive int"):
        GradScaler(growth_interval=0)
    with pytest.raises(TypeError, match="scale_loss: expected a Node"):
        scaler.scale_loss(3.0)


def test_steps_with_netcl_optimizers_read_nothing_back(device, monkeypatch):
    """scale_loss, backward, step and update over a clean, an inf and a clean iteration with no host read
    (the flag goes to the SGD kernels); afterwards the skip and the schedule are what they should be."""
    scaler = GradScaler(init_scale=8.0, growth_interval=1)
    p = _param(device)
    opt = SGD([p], lr=0.5)
    factors = [1.0, np.inf, 1.0]
    with monkeypatch.context() as patch:
        patch.setattr(nc.Tensor, "to_host", lambda self: pytest.fail("a host read in an amp step"))
        for factor in factors:
            with ag.Tape() as tape:
                loss = scaler.scale_loss(ag.sum(p * factor))
            tape.backward(loss)
            scaler.step(opt)
            scaler.update()
            p.grad = None
    assert scaler.get_scale() == 16.0  # 8 grew to 16, the inf step halved it, the last step grew it again
    np.testing.assert_allclose(p.to_host(), np.array([1.0, 2.0, 3.0]) - 2 * 0.5)
    assert opt.steps.to_host().tolist() == [2]
