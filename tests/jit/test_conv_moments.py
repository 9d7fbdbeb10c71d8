"""The JIT's convolution-moments pass: a convolution read by a training batch norm alone gathers its output's
per-channel moments in its store (a Winograd forward's output transform), and the batch norm merges them
instead of reading its input for its statistics.

The replayed ResNet-8 training step of examples/resnet.py at width 0.25 (so each block's second convolution,
3x3 stride 1 with 16-64 channels, runs by Winograd on every device: the tests' ``NETCL_TUNE=0`` searches no
algorithm) must pair those three sites and no other,
and its losses, parameters, gradients and running statistics after three steps must agree with the eager
step's within float32 rounding: the statistics are the same sums in another order (relative ~1e-6 each), which
three SGD steps carry to ~1e-5 of the parameters; 1e-4 relative is allowed (a statistic off by one element of
~10^3 in a channel moves it by ~1e-3). With the pass off (``NETCL_JIT_CONV_MOMENTS=0``) nothing is paired and
the replay is the eager step bit for bit. GPUs gather the moments; CPU devices do not by default
(``conv_winograd.gathers_moments``: the gathering costs the output transform more there than it saves), so the
tests force it there and check the default apart.
"""

from __future__ import annotations

from typing import Any

import file_modules
import numpy as np
import pytest

import netcl.autograd as ag
from netcl.jit import conv_moments, jit_compile
from netcl.runtime.ops import batchnorm, conv_winograd, moments
from netcl.runtime.ops.call_plans import clear_plans

WIDTH = 0.25
steps = file_modules.load("tests/jit/resnet8_steps.py", "netcl_test_resnet8_steps")


def _merging_norms(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per batch_norm_forward call from now on: whether it was handed its own input's moments."""
    calls: list[bool] = []
    real, moments_of = batchnorm.batch_norm_forward, moments.of

    def spied(x, *args, moments=None, **kwargs):
        calls.append(moments_of(moments, x) is not None)
        return real(x, *args, moments=moments, **kwargs)

    monkeypatch.setattr(batchnorm, "batch_norm_forward", spied)
    return calls


def _replayed(
    device: Any, state: dict, on: bool, monkeypatch: pytest.MonkeyPatch, gathering: bool = True
) -> tuple[list[bool], dict]:
    """The batch norms' merging flags of a replayed step's capture and its ``results``; ``gathering``: the output
    transforms gather moments on any device (else where ``gathers_moments`` says)."""
    monkeypatch.setenv(conv_moments.ENV, "1" if on else "0")
    if gathering:
        monkeypatch.setattr(conv_winograd, "gathers_moments", lambda device: True)
    clear_plans()  # conv2d's plans read the policy when made
    calls = _merging_norms(monkeypatch)
    _, _, results = steps.replayed_results(device, WIDTH, state)
    monkeypatch.undo()
    clear_plans()
    return calls, results


def test_resnet8_replay_merges_the_moments_of_each_winograd_convolution(device, monkeypatch):
    state = steps.initial_state(device, WIDTH)
    eager = steps.eager_results(device, WIDTH, state)
    on_calls, on = _replayed(device, state, True, monkeypatch)
    off_calls, off = _replayed(device, state, False, monkeypatch)
    norms = 7  # the stem's, two a block, one a shortcut
    # OpenCL: each block's second convolution (three) gathers its moments; the NumPy backend gathers none
    assert on_calls.count(True) == (3 if device.kind == "opencl" else 0) and len(on_calls) >= norms
    assert not any(off_calls)
    for key, want in eager.items():
        np.testing.assert_array_equal(off[key], want, err_msg=f"{key} (pass off vs eager)")
        np.testing.assert_allclose(on[key], want, rtol=1e-4, atol=1e-5, err_msg=f"{key} (pass on vs eager)")


def test_by_default_gpus_gather_and_cpu_devices_keep_the_batch_norms_pass(cl_device, monkeypatch):
    state = steps.initial_state(cl_device, WIDTH)
    calls, results = _replayed(cl_device, state, True, monkeypatch, gathering=False)
    assert conv_winograd.gathers_moments(cl_device) == cl_device.is_gpu
    assert calls.count(True) == (3 if cl_device.is_gpu else 0)
    if not cl_device.is_gpu:  # nothing merged: the eager step's bits
        for key, want in steps.eager_results(cl_device, WIDTH, state).items():
            np.testing.assert_array_equal(results[key], want, err_msg=key)


def test_no_pairing_where_the_convolution_has_another_use_or_the_norm_evaluates(cl_device, monkeypatch):
    rng = np.random.default_rng(1)
    x = ag.tensor(rng.normal(size=(2, 16, 8, 8)).astype(np.float32), device=cl_device)
    w = ag.tensor(rng.normal(size=(16, 16, 3, 3)).astype(np.float32), device=cl_device, requires_grad=True)
    rm = ag.tensor(np.zeros(16, np.float32), device=cl_device)
    rv = ag.tensor(np.ones(16, np.float32), device=cl_device)

    def read_twice(x, w):
        z = ag.conv2d(x, w, None, 1, 1)
        return ag.batch_norm(z, None, None, None, None, True) + z

    def evaluating(x, w):
        return ag.batch_norm(ag.conv2d(x, w, None, 1, 1), rm, rv, None, None, False)

    def alone(x, w):
        return ag.batch_norm(ag.conv2d(x, w, None, 1, 1), None, None, None, None, True)

    merged = []
    for f in (read_twice, evaluating, alone):
        monkeypatch.setattr(conv_winograd, "gathers_moments", lambda device: True)
        clear_plans()
        calls = _merging_norms(monkeypatch)
        jit_compile(f)(x, w)
        merged.append(any(calls))
        monkeypatch.undo()
    clear_plans()
    assert merged == [False, False, True]
