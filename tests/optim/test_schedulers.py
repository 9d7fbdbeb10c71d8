"""LR schedulers against their closed forms (torch's documented formulas), and their device effect."""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.core as nc
import netcl.nn as nn
from netcl.optim import SGD, CosineAnnealingLR, LinearLR, StepLR


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
