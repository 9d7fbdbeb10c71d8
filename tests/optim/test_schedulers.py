"""LR schedulers against their closed forms (torch's documented formulas), and their device effect."""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.core as nc
import netcl.nn as nn
from netcl.optim import (
    SGD,
    Adam,
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    MultiplicativeLR,
    MultiStepLR,
    OneCycleLR,
    PolynomialLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)


def _optimizer(device, lr=0.5):
    return SGD([nn.Parameter(np.zeros(3, np.float32), device=device)], lr=lr)


def _trace(scheduler, steps=12):
    lrs = [scheduler.get_last_lr()[0]]
    for _ in range(steps):
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    return lrs


def test_step_lr(device):
    lrs = _trace(StepLR(_optimizer(device), step_size=3, gamma=0.5))
    np.testing.assert_allclose(lrs, [0.5 * 0.5 ** (t // 3) for t in range(13)], rtol=1e-12)


def test_cosine_annealing_lr(device):
    eta_min, period = 0.05, 10
    lrs = _trace(CosineAnnealingLR(_optimizer(device), T_max=period, eta_min=eta_min), steps=10)
    closed = [eta_min + (0.5 - eta_min) * (1 + math.cos(math.pi * t / period)) / 2 for t in range(11)]
    np.testing.assert_allclose(lrs, closed, rtol=1e-9, atol=1e-12)


def test_linear_lr(device):
    lrs = _trace(LinearLR(_optimizer(device), start_factor=0.25, end_factor=1.0, total_iters=4), steps=8)
    closed = [0.5 * (0.25 + 0.75 * min(t, 4) / 4) for t in range(9)]
    np.testing.assert_allclose(lrs, closed, rtol=1e-9)


def test_scheduler_lr_reaches_the_update(device):
    param = nn.Parameter(np.zeros(2, np.float32), device=device)
    opt = SGD([param], lr=1.0)
    scheduler = StepLR(opt, step_size=1, gamma=0.1)
    for _ in range(3):
        param.grad = nc.tensor(np.ones(2, np.float32), device=device)
        opt.step()
        scheduler.step()
    np.testing.assert_allclose(param.to_host(), -(1.0 + 0.1 + 0.01) * np.ones(2), rtol=1e-6)
    assert scheduler.state_dict()["last_epoch"] == 3


def test_bad_arguments(device):
    with pytest.raises(ValueError, match="step_size must be a positive int, got 0"):
        StepLR(_optimizer(device), step_size=0)
    with pytest.raises(ValueError, match="T_max must be a positive int"):
        CosineAnnealingLR(_optimizer(device), T_max=-1)
    with pytest.raises(ValueError, match="start_factor must be in"):
        LinearLR(_optimizer(device), start_factor=0.0)
    with pytest.raises(TypeError, match="expected a netcl Optimizer"):
        StepLR(object(), step_size=1)


@pytest.mark.parametrize(
    ("make", "closed"),
    [
        (lambda o: MultiStepLR(o, [3, 7, 7]), lambda t: 0.5 * 0.1 ** ((t >= 3) + 2 * (t >= 7))),
        (lambda o: ExponentialLR(o, 0.9), lambda t: 0.5 * 0.9**t),
        (lambda o: ConstantLR(o, 0.25, 4), lambda t: 0.5 * (0.25 if t < 4 else 1.0)),
        (lambda o: PolynomialLR(o, 8, 2.0), lambda t: 0.5 * (1 - min(t, 8) / 8) ** 2),
        (lambda o: LambdaLR(o, lambda e: 1 / (1 + e)), lambda t: 0.5 / (1 + t)),
        (lambda o: MultiplicativeLR(o, lambda e: 0.8), lambda t: 0.5 * 0.8**t),
    ],
    ids=["multistep", "exponential", "constant", "polynomial", "lambda", "multiplicative"],
)
def test_more_schedulers_follow_their_closed_forms(device, make, closed):
    """torch's documented closed forms (the schedulers compute torch's recursive forms)."""
    np.testing.assert_allclose(_trace(make(_optimizer(device))), [closed(t) for t in range(13)], rtol=1e-9)


def test_one_cycle_lr_and_its_momentum(device):
    """1cycle, two phases, cosine: max_lr / 25 up to max_lr over 30% of the steps, then down to initial / 1e4;
    SGD's momentum (and Adam's beta1) moves the opposite way between 0.95 and 0.85; the device gets both."""
    total, top = 20, 1.0
    opt = _optimizer(device)
    schedule = OneCycleLR(opt, max_lr=top, total_steps=total)
    lrs, momenta = [], []
    for _ in range(total):
        lrs.append(opt.param_groups[0]["lr"])
        momenta.append(opt.param_groups[0]["momentum"])
        schedule.step()
    initial, up = top / 25, 0.3 * total - 1

    def cos(start, end, pct):
        return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)

    want = [
        cos(initial, top, t / up) if t <= up else cos(top, initial / 1e4, (t - up) / (total - 1 - up))
        for t in range(total)
    ]
    want_m = [
        cos(0.95, 0.85, t / up) if t <= up else cos(0.85, 0.95, (t - up) / (total - 1 - up)) for t in range(total)
    ]
    np.testing.assert_allclose(lrs, want, rtol=1e-12)
    np.testing.assert_allclose(momenta, want_m, rtol=1e-12)
    hyper = opt.group_hyper(0).to_host()  # lr, momentum, ...: what the update kernels read
    np.testing.assert_allclose(hyper[:2], [opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"]], rtol=1e-6)
    adam = Adam([nn.Parameter(np.zeros(2, np.float32), device=device)], lr=0.1)
    OneCycleLR(adam, max_lr=0.3, total_steps=10).step()
    assert adam.param_groups[0]["betas"][1] == 0.999 and adam.param_groups[0]["betas"][0] < 0.95


def test_sequential_lr_warms_up_then_restarts_the_next_at_its_milestone(device):
    opt = _optimizer(device)
    warmup = LinearLR(opt, start_factor=0.1, total_iters=4)
    cosine = CosineAnnealingLR(opt, T_max=6, eta_min=0.05)
    lrs = _trace(SequentialLR(opt, [warmup, cosine], milestones=[4]), steps=9)
    ramp = [0.5 * (0.1 + 0.9 * t / 4) for t in range(4)]
    anneal = [0.05 + 0.45 * (1 + math.cos(math.pi * t / 6)) / 2 for t in range(6)]
    np.testing.assert_allclose(lrs, ramp + anneal, rtol=1e-9)
    with pytest.raises(ValueError, match="one milestone fewer than schedulers"):
        SequentialLR(opt, [warmup, cosine], milestones=[])


def test_reduce_lr_on_plateau(device):
    """patience 2: the third epoch without a relative improvement of 1e-4 halves the lr (not below min_lr), then
    one cooldown epoch passes before counting again (the epochs counted by hand from torch's rules)."""
    opt = _optimizer(device)
    schedule = ReduceLROnPlateau(opt, factor=0.5, patience=2, cooldown=1, min_lr=0.1)
    lrs = []
    for metric in [5, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3] + [3] * 7:
        schedule.step(metric)
        lrs.append(schedule.get_last_lr()[0])
    halves = [0.5] * 4 + [0.25] * 4 + [0.125] * 5
    assert lrs == halves + [0.1] * 5  # the fourth cut would go below min_lr: it stops there
    np.testing.assert_allclose(opt.group_hyper(0).to_host()[0], lrs[-1], rtol=1e-6)
    with pytest.raises(ValueError, match=r"factor must be < 1\.0"):
        ReduceLROnPlateau(opt, factor=1.0)


def test_a_step_that_would_set_a_bad_lr_raises_and_changes_nothing(device):
    """A schedule that leaves its range (a linear 1cycle stepped past its end goes negative) raises the optimizer's
    check, and the groups, the scheduler's count and the device's hyperparameters stay as they were."""
    opt = _optimizer(device)
    schedule = OneCycleLR(opt, max_lr=1.0, total_steps=4, anneal_strategy="linear", cycle_momentum=False)
    for _ in range(3):
        schedule.step()
    with pytest.raises(ValueError, match="lr must be a number >= 0"):
        schedule.step()  # step 4 of a 4-step schedule extrapolates below 0, as torch's would
    assert schedule.last_epoch == 3 and opt.param_groups[0]["lr"] == pytest.approx(1.0 / 25 / 1e4)
    np.testing.assert_allclose(opt.group_hyper(0).to_host()[0], opt.param_groups[0]["lr"], rtol=1e-6)


def _sgdr(epoch, t_0, t_mult, eta_min, base=0.5):
    """torch's documented SGDR: the position within the current period, then the cosine."""
    period, start = t_0, 0.0
    while epoch >= start + period:
        start, period = start + period, period * t_mult
    return eta_min + (base - eta_min) * (1 + math.cos(math.pi * (epoch - start) / period)) / 2


@pytest.mark.parametrize(("t_0", "t_mult", "eta_min"), [(5, 1, 0.01), (3, 2, 0.0)])
def test_cosine_annealing_warm_restarts(device, t_0, t_mult, eta_min):
    """Stepped, the periods T_0, T_0 * T_mult, ...; stepped with fractional epochs (torch's usage), the same curve at
    those points; a bad argument and a negative epoch refused, the latter with nothing changed."""
    schedule = CosineAnnealingWarmRestarts(_optimizer(device), t_0, t_mult, eta_min)
    np.testing.assert_allclose(_trace(schedule, 20), [_sgdr(e, t_0, t_mult, eta_min) for e in range(21)], rtol=1e-12)
    fractional = CosineAnnealingWarmRestarts(_optimizer(device), t_0, t_mult, eta_min)
    for epoch in np.arange(0, 12, 0.7):
        fractional.step(float(epoch))
        assert fractional.get_last_lr()[0] == pytest.approx(_sgdr(epoch, t_0, t_mult, eta_min), rel=1e-9)
    before = fractional.get_last_lr()
    with pytest.raises(ValueError, match="CosineAnnealingWarmRestarts: epoch must be >= 0, got -1"):
        fractional.step(-1)
    assert fractional.get_last_lr() == before
    with pytest.raises(ValueError, match="CosineAnnealingWarmRestarts: T_mult must be a positive int, got 0"):
        CosineAnnealingWarmRestarts(_optimizer(device), 3, 0)
