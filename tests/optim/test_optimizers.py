"""SGD / Adam / AdamW / RMSprop / Adagrad against float64 NumPy transcriptions of torch.optim's algorithms, a few
steps.

Tolerances: the kernels compute in float32; three steps of these updates on values of order 1
stay within ~1e-6 absolute of the float64 reference (Adam's step is ~lr per element).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl.optim import SGD, Adagrad, Adam, AdamW, RMSprop
from netcl.runtime.ops import optim_kernels
from netcl.runtime.ops.optim_kernels import GPU_VECTOR, ItemSplit

STEPS = 3
SHAPES = [(3, 4), (5,)]  # (5,): one GPU vector and an element past it


@pytest.fixture(params=["as-the-device-splits", "gpu-vectors"])
def split(request, device, monkeypatch):
    """The updates' work-items as the device splits them, then (OpenCL devices) as a GPU's vectors of
    ``GPU_VECTOR`` elements, on whichever device runs the suite."""
    if request.param == "gpu-vectors":
        if device.kind != "opencl":
            pytest.skip("the NumPy backend's updates have no work-items")
        monkeypatch.setattr(optim_kernels, "update_split", lambda device: ItemSplit(GPU_VECTOR, vector=True))


def _setup(device, seed=0):
    rng = np.random.default_rng(seed)
    values = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
    grads = [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    params = [nn.Parameter(v, device=device) for v in values]
    return params, values, grads


def _run(opt_cls, kwargs, device):
    params, values, grads = _setup(device)
    opt = opt_cls(params, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = nc.tensor(g, device=device)
        opt.step()
        opt.zero_grad()
    return [p.to_host() for p in params], values, grads, opt


def sgd_reference(values, grads, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
    params = [v.astype(np.float64) for v in values]
    bufs = [None] * len(params)
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            d = g.astype(np.float64) + weight_decay * params[i]
            if momentum:
                bufs[i] = d.copy() if bufs[i] is None else momentum * bufs[i] + (1 - dampening) * d
                d = d + momentum * bufs[i] if nesterov else bufs[i]
            params[i] = params[i] - lr * d
    return params


def adam_reference(values, grads, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False, amsgrad=False):
    params = [v.astype(np.float64) for v in values]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    vmax = [np.zeros_like(p) for p in params]
    b1, b2 = betas
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = g.astype(np.float64)
            if decoupled:
                params[i] = params[i] * (1 - lr * weight_decay)
            else:
                g = g + weight_decay * params[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            vmax[i] = np.maximum(vmax[i], v[i])
            denom = np.sqrt(vmax[i] if amsgrad else v[i]) / math.sqrt(1 - b2**t) + eps
            params[i] = params[i] - lr / (1 - b1**t) * m[i] / denom
    return params


def rmsprop_reference(values, grads, lr, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False):
    params = [v.astype(np.float64) for v in values]
    square, mean, buf = ([np.zeros_like(p) for p in params] for _ in range(3))
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            g = g.astype(np.float64) + weight_decay * params[i]
            square[i] = alpha * square[i] + (1 - alpha) * g * g
            mean[i] = alpha * mean[i] + (1 - alpha) * g
            avg = np.sqrt(square[i] - mean[i] ** 2 if centered else square[i]) + eps
            buf[i] = momentum * buf[i] + g / avg
            params[i] = params[i] - lr * (buf[i] if momentum else g / avg)
    return params


def adagrad_reference(values, grads, lr, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10):
    params = [v.astype(np.float64) for v in values]
    sums = [np.full_like(p, initial_accumulator_value) for p in params]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = g.astype(np.float64) + weight_decay * params[i]
            sums[i] = sums[i] + g * g
            params[i] = params[i] - lr / (1 + (t - 1) * lr_decay) * g / (np.sqrt(sums[i]) + eps)
    return params


OTHER_CASES = [
    (RMSprop, rmsprop_reference, {"lr": 0.01}),
    (RMSprop, rmsprop_reference, {"lr": 0.02, "alpha": 0.9, "momentum": 0.5, "weight_decay": 0.1}),
    (RMSprop, rmsprop_reference, {"lr": 0.01, "centered": True, "momentum": 0.9, "eps": 1e-6}),
    (Adagrad, adagrad_reference, {"lr": 0.1}),
    (Adagrad, adagrad_reference, {"lr": 0.1, "lr_decay": 0.3, "weight_decay": 0.05, "initial_accumulator_value": 0.2}),
]


@pytest.mark.parametrize(
    ("opt_cls", "reference", "kwargs"),
    OTHER_CASES,
    ids=["rmsprop", "rmsprop-momentum-wd", "rmsprop-centered", "adagrad", "adagrad-decay-init"],
)
def test_rmsprop_and_adagrad_match_torch_algorithms(device, split, opt_cls, reference, kwargs):
    got, values, grads, opt = _run(opt_cls, kwargs, device)
    for a, b in zip(got, reference(values, grads, **kwargs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert set(opt.state_dict()["state"][0]) == {
        "step",
        *(k for k in opt.state_names if k in opt.state[opt.param_groups[0]["params"][0]]),
    }


SGD_CASES = [
    {"lr": 0.1},
    {"lr": 0.05, "momentum": 0.9},
    {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.01},
    {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1},
]


@pytest.mark.parametrize("kwargs", SGD_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_sgd_matches_torch_algorithm(device, split, kwargs):
    got, values, grads, _ = _run(SGD, kwargs, device)
    for a, b in zip(got, sgd_reference(values, grads, **kwargs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


ADAM_CASES = [
    (Adam, {"lr": 0.01}, False),
    (Adam, {"lr": 0.02, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}, False),
    (AdamW, {"lr": 0.01}, True),  # default weight_decay 0.01
    (AdamW, {"lr": 0.03, "weight_decay": 0.5}, True),
    # beta2 0.5: the second moment falls between steps, so its running maximum differs from it
    (Adam, {"lr": 0.02, "betas": (0.8, 0.5), "amsgrad": True}, False),
    (AdamW, {"lr": 0.02, "betas": (0.9, 0.5), "weight_decay": 0.1, "amsgrad": True}, True),
]


@pytest.mark.parametrize(
    "opt_cls,kwargs,decoupled", ADAM_CASES, ids=["adam", "adam-l2", "adamw", "adamw-wd", "amsgrad", "adamw-amsgrad"]
)
def test_adam_matches_torch_algorithm(device, split, opt_cls, kwargs, decoupled):
    got, values, grads, _ = _run(opt_cls, kwargs, device)
    ref_kwargs = dict(kwargs)
    if opt_cls is AdamW:
        ref_kwargs.setdefault("weight_decay", 0.01)
    for a, b in zip(got, adam_reference(values, grads, decoupled=decoupled, **ref_kwargs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    if kwargs.get("amsgrad"):  # the case tells amsgrad from Adam: its reference without it is far off
        plain = adam_reference(values, grads, decoupled=decoupled, **{**ref_kwargs, "amsgrad": False})
        assert max(np.abs(a - b).max() for a, b in zip(got, plain, strict=True)) > 1e-4


def test_param_groups_use_their_own_hyperparameters(device):
    params, values, grads = _setup(device)
    opt = SGD([{"params": [params[0]]}, {"params": [params[1]], "lr": 0.5}], lr=0.1, momentum=0.5)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = nc.tensor(g, device=device)
        opt.step()
    ref0 = sgd_reference(values[:1], [g[:1] for g in grads], lr=0.1, momentum=0.5)[0]
    ref1 = sgd_reference(values[1:], [g[1:] for g in grads], lr=0.5, momentum=0.5)[0]
    np.testing.assert_allclose(params[0].to_host(), ref0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(params[1].to_host(), ref1, rtol=1e-5, atol=1e-6)


def test_parameter_without_grad_is_skipped_and_keeps_its_step(device):
    params, values, grads = _setup(device)
    opt = Adam(params, lr=0.1)
    params[0].grad = nc.tensor(grads[0][0], device=device)
    opt.step()
    np.testing.assert_array_equal(params[1].to_host(), values[1])
    assert opt.steps.to_host().tolist() == [1, 0]
    assert params[1] not in opt.state


def test_changing_lr_between_steps_takes_effect(device):
    params, values, grads = _setup(device)
    opt = SGD(params, lr=0.1)
    for step_grads, lr in zip(grads, (0.1, 0.01, 0.3), strict=True):
        opt.param_groups[0]["lr"] = lr
        for p, g in zip(params, step_grads, strict=True):
            p.grad = nc.tensor(g, device=device)
        opt.step()
    expected = [
        v.astype(np.float64) - sum(lr * g[i] for g, lr in zip(grads, (0.1, 0.01, 0.3), strict=True))
        for i, v in enumerate(values)
    ]
    for a, b in zip(params, expected, strict=True):
        np.testing.assert_allclose(a.to_host(), b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "opt_cls,kwargs",
    [
        (SGD, {"lr": 0.1, "momentum": 0.9}),
        (Adam, {"lr": 0.01}),
        (Adam, {"lr": 0.01, "betas": (0.9, 0.5), "amsgrad": True}),
        (RMSprop, {"lr": 0.01, "momentum": 0.9, "centered": True}),
        (Adagrad, {"lr": 0.1, "initial_accumulator_value": 0.1}),
    ],
)
def test_state_dict_round_trip_continues_identically(device, opt_cls, kwargs):
    params_a, values, grads = _setup(device)
    params_b = [nn.Parameter(v, device=device) for v in values]
    opt_a = opt_cls(params_a, **kwargs)
    for step_grads in grads[:2]:
        for p, g in zip(params_a, step_grads, strict=True):
            p.grad = nc.tensor(g, device=device)
        opt_a.step()
    saved = opt_a.state_dict()
    assert sorted(saved["state"]) == [0, 1] and saved["state"][0]["step"] == 2.0
    assert saved["param_groups"][0]["params"] == [0, 1]
    for p, q in zip(params_b, params_a, strict=True):
        p.value = nc.tensor(q.to_host(), device=device)
    if kwargs.get("amsgrad"):
        assert set(saved["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}  # torch's keys
    flags = {k: v for k, v in kwargs.items() if k in ("amsgrad", "centered", "momentum")}  # the buffers' settings
    opt_b = opt_cls(params_b, lr=123.0, **flags)  # the loaded groups bring back the saved lr
    opt_b.load_state_dict(saved)
    assert opt_b.param_groups[0]["lr"] == kwargs["lr"]
    for opt, params in ((opt_a, params_a), (opt_b, params_b)):
        for p, g in zip(params, grads[2], strict=True):
            p.grad = nc.tensor(g, device=device)
        opt.step()
    for a, b in zip(params_a, params_b, strict=True):
        np.testing.assert_array_equal(a.to_host(), b.to_host())


def test_load_state_dict_errors(device):
    params, _, _ = _setup(device)
    opt = Adam(params)
    two_groups = Adam([{"params": [params[0]]}, {"params": [params[1]]}])
    with pytest.raises(ValueError, match="1 parameter groups, this optimizer 2"):
        two_groups.load_state_dict(opt.state_dict())
    bad = {
        "state": {0: {"step": 1.0, "exp_avg": np.zeros((2, 2)), "exp_avg_sq": np.zeros((3, 4))}},
        "param_groups": opt.state_dict()["param_groups"],
    }
    with pytest.raises(ValueError, match=r"state 'exp_avg' of parameter 0 has shape \(2, 2\), expected \(3, 4\)"):
        opt.load_state_dict(bad)
    assert opt.state == {}


def test_zero_grad_modes(device):
    params, _, grads = _setup(device)
    opt = SGD(params, lr=0.1)
    for p, g in zip(params, grads[0], strict=True):
        p.grad = nc.tensor(g, device=device)
    opt.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.to_host() == 0) and p.grad.shape == p.shape for p in params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_bad_hyperparameters_and_params(device):
    params, _, _ = _setup(device)
    with pytest.raises(ValueError, match="SGD: lr must be a number >= 0, got -1"):
        SGD(params, lr=-1)
    with pytest.raises(ValueError, match="nesterov needs momentum > 0 and dampening = 0"):
        SGD(params, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"Adam: betas must be two numbers in \[0, 1\)"):
        Adam(params, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="empty parameter list"):
        Adam([])
    with pytest.raises(ValueError, match="more than one parameter group"):
        SGD([{"params": params}, {"params": params[:1]}], lr=0.1)
    with pytest.raises(TypeError, match=r"unknown hyperparameter\(s\) \['momentum'\] for Adam"):
        Adam([{"params": params, "momentum": 0.9}])
    x = ag.tensor(np.ones(3, np.float32), requires_grad=True, device=device)
    with pytest.raises(ValueError, match=r"must be a leaf \(a Parameter\), not an op's result"):
        SGD([x * 2.0], lr=0.1)
    opt = SGD(params, lr=0.1)
    opt.param_groups[0]["lr"] = -0.5
    with pytest.raises(ValueError, match=r"lr must be a number >= 0, got -0\.5"):
        opt.step()


def test_the_parameters_update_is_one_multi_tensor_kernel(cl_device):
    from netcl.runtime.graph import Graph

    params, _, grads = _setup(cl_device)
    for opt in (SGD(params, lr=0.1, momentum=0.9), Adam(params), AdamW(params)):
        for p, g in zip(params, grads[0], strict=True):
            p.grad = nc.tensor(g, device=cl_device)
        opt.step()  # builds the programs and the state buffers outside the capture
        graph = Graph()
        with graph.capture(cl_device.queue):
            opt.step()
        names = [launch.name for launch in graph.launches]
        kernel = "netcl_sgd_multi" if isinstance(opt, SGD) else "netcl_adam_multi"
        assert names == [kernel, "netcl_count_steps"]


def _snapshot(opt, params) -> dict:
    return {
        "params": [p.to_host().copy() for p in params],
        "state": [t.to_host().copy() for p in params for t in opt.state.get(p, {}).values()],
        "steps": opt.steps.to_host().copy(),
    }


def _no_host_read(self):
    pytest.fail("a host read in a step the device skips")


@pytest.mark.parametrize(
    ("opt_cls", "kwargs"),
    [
        (SGD, {"lr": 0.1, "momentum": 0.9}),
        (Adam, {"lr": 0.1}),
        (AdamW, {"lr": 0.1}),
        (RMSprop, {"lr": 0.1, "momentum": 0.5, "centered": True}),
    ],
)
def test_a_raised_skip_flag_changes_nothing(device, opt_cls, kwargs, monkeypatch):
    """``step(skip_if=flag)``, the flag read by the kernels alone (no host read): up, parameters, state
    and step counts keep their bits (the first step's state is made, as zeros); down, the step is a
    plain step's, bit for bit."""
    up, down = (nc.tensor(np.array([v], np.int32), dtype=np.int32, device=device) for v in (1, 0))
    params, _, grads = _setup(device)
    twins, _, _ = _setup(device)
    opt, plain = opt_cls(params, **kwargs), opt_cls(twins, **kwargs)
    for step, step_grads in enumerate(grads):
        for p, q, g in zip(params, twins, step_grads, strict=True):
            p.grad, q.grad = nc.tensor(g, device=device), nc.tensor(g, device=device)
        if step != 1:
            before = _snapshot(opt, params)
            with monkeypatch.context() as patch:
                patch.setattr(nc.Tensor, "to_host", _no_host_read)
                opt.step(skip_if=up)
            after = _snapshot(opt, params)
            if step == 0:
                assert before["state"] == [] and all(np.all(t == 0) for t in after["state"])
                after["state"] = []
            for key in before:
                for a, b in zip(after[key], before[key], strict=True):
                    np.testing.assert_array_equal(a, b)
        opt.step(skip_if=down)
        plain.step()
        ours, theirs = _snapshot(opt, params), _snapshot(plain, twins)
        for key in ours:
            for a, b in zip(ours[key], theirs[key], strict=True):
                np.testing.assert_array_equal(a, b)


def test_skip_flag_needs_an_optimizer_that_reads_it(device):
    class PythonSGD(SGD):
        skips_on_device = False

    params, _, _ = _setup(device)
    for p in params:
        p.grad = nc.tensor(np.ones(p.shape, np.float32), device=device)
    flag = nc.tensor(np.zeros(1, np.int32), dtype=np.int32, device=device)
    with pytest.raises(TypeError, match="skip_if needs an optimizer whose kernels read it"):
        PythonSGD(params, lr=0.1).step(skip_if=flag)
    with pytest.raises(nc.DTypeError, match="skip must be one int32 on the device"):
        SGD(params, lr=0.1).step(skip_if=nc.tensor(np.zeros(2, np.float32), device=device))


def test_rmsprop_and_adagrad_refuse_bad_hyperparameters(device):
    params, _, _ = _setup(device)
    with pytest.raises(ValueError, match=r"RMSprop: alpha must be a number >= 0, got -0\.5"):
        RMSprop(params, alpha=-0.5)
    with pytest.raises(TypeError, match="RMSprop: centered must be a bool, got 1"):
        RMSprop(params, centered=1)
    with pytest.raises(ValueError, match="Adagrad: lr_decay must be a number >= 0, got -1"):
        Adagrad(params, lr_decay=-1)
    with pytest.raises(TypeError, match=r"unknown hyperparameter\(s\) \['betas'\] for Adagrad"):
        Adagrad([{"params": params, "betas": (0.9, 0.99)}])


def test_frozen_parameters_are_accepted_and_left_alone(device):
    """torch's fine-tuning pattern: ``requires_grad_(False)`` on some parameters, all of them given to the optimizer;
    the frozen ones get no gradient and keep their values."""
    model = nn.Sequential(nn.Linear(3, 4, device=device), nn.Linear(4, 2, device=device))
    model[0].requires_grad_(False)
    frozen = model[0].weight.to_host().copy()
    opt = SGD(model.parameters(), lr=0.1)
    x = ag.tensor(np.ones((5, 3), np.float32), device=device)
    ag.sum(model(x)).backward()
    opt.step()
    assert model[0].weight.grad is None
    np.testing.assert_array_equal(model[0].weight.to_host(), frozen)
    assert not np.array_equal(model[1].bias.to_host(), np.zeros(2))
