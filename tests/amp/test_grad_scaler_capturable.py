"""GradScaler(capturable=True): the scale, its schedule and the skip of an inf/NaN step on the device.

Eager, a capturable scaler must give what the default scaler gives (parameters, optimizer state, step
counts, scale) over clean and inf/NaN steps; captured with ``fuse_graph``, the replayed step must
follow the same schedule with no host read in it (the replays skip, back off and grow by themselves).
netcl's optimizers skip in their kernels (``skips_on_device``); the ``Snapshot*`` twins below do not,
so they take the other paths: the default scaler's host read, the capturable one's snapshots.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl.amp import GradScaler
from netcl.jit import fuse_graph
from netcl.optim import SGD, Adam


class SnapshotAdam(Adam):
    skips_on_device = False


class SnapshotSGD(SGD):
    skips_on_device = False


GRADS = [(1.0, -2.0, 4.0), (1.0, np.inf, 0.0), (0.5, 0.5, 0.5), (np.nan, 1.0, 1.0), (2.0, -1.0, 1.0), (1.0, 1.0, 3.0)]


def _params(device):
    return [nn.Parameter(np.asarray(v, np.float32), device=device) for v in ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))]


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: Adam(p, lr=0.1),
        lambda p: SGD(p, lr=0.1, momentum=0.9),
        lambda p: SnapshotAdam(p, lr=0.1),
        lambda p: SnapshotSGD(p, lr=0.1, momentum=0.9),
    ],
    ids=["adam", "sgd", "adam-snapshots", "sgd-snapshots"],
)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # overflowed gradients compute silently, as in the kernels
def test_capturable_matches_the_host_scaler(device, make_opt):
    runs = []
    for capturable in (False, True):
        params = _params(device)
        opt = make_opt(params)
        scaler = GradScaler(init_scale=8.0, growth_interval=2, capturable=capturable)
        scales = []
        for g in GRADS:
            for k, p in enumerate(params):
                p.grad = nc.tensor(scaler.get_scale() * np.asarray(g, np.float32) * (k + 1), device=device)
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        state = [opt.state[p][name].to_host() for p in params for name in sorted(opt.state[p])]
        runs.append(([p.to_host() for p in params], state, opt.steps.to_host().tolist(), scales))
    (p_host, s_host, steps_host, scales_host), (p_dev, s_dev, steps_dev, scales_dev) = runs
    assert scales_dev == scales_host == [8.0, 4.0, 4.0, 2.0, 2.0, 4.0]
    assert steps_dev == steps_host == [4, 4]
    for a, b in zip(p_dev + s_dev, p_host + s_host, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("opt_cls", [Adam, SnapshotAdam])
def test_first_step_skipped_leaves_fresh_state(device, opt_cls):
    params = _params(device)
    opt = opt_cls(params, lr=0.1)
    scaler = GradScaler(init_scale=4.0, capturable=True)
    for p in params:
        p.grad = nc.tensor(np.array([1.0, np.nan, 1.0], np.float32), device=device)
    scaler.step(opt)
    scaler.update()
    np.testing.assert_array_equal(params[0].to_host(), [1.0, 2.0, 3.0])
    assert opt.steps.to_host().tolist() == [0, 0]
    assert all(np.all(t.to_host() == 0) for p in params for t in opt.state[p].values())
    assert scaler.get_scale() == 2.0
    assert scaler.state_dict()["scale"] == 2.0


def _model(device):
    return nn.Sequential(nn.Linear(4, 8, device=device), nn.ReLU(), nn.Linear(8, 2, device=device))


@pytest.mark.parametrize("opt_cls", [Adam, SnapshotAdam])
def test_captured_amp_step_replays_skip_and_schedule(cl_device, opt_cls):
    device = cl_device
    ag.manual_seed(1)
    captured, eager = _model(device), _model(device)
    eager.load_state_dict({k: v.to_host() for k, v in captured.state_dict().items()})
    opt_c, opt_e = opt_cls(captured.parameters(), lr=0.05), opt_cls(eager.parameters(), lr=0.05)
    sc_c = GradScaler(init_scale=1024.0, growth_interval=2, capturable=True)
    sc_e = GradScaler(init_scale=1024.0, growth_interval=2)
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(6, 4)), rng.normal(size=(6, 2))) for _ in range(6)]
    batches[2][1][0, 0] = np.inf  # a target of inf: inf loss, inf/NaN gradients, a skipped step
    batches[4][1][1, 1] = np.nan
    batches = [(x.astype(np.float32), t.astype(np.float32)) for x, t in batches]

    def step_c() -> None:
        sc_c.step(opt_c)
        sc_c.update()

    def eager_step(x, t) -> None:
        opt_e.zero_grad()
        with ag.Tape() as tape:
            loss = sc_e.scale(ag.mse_loss(eager(ag.tensor(x, device=device)), ag.tensor(t, device=device)))
        tape.backward(loss)
        sc_e.step(opt_e)
        sc_e.update()

    x0, t0 = (ag.tensor(a, device=device) for a in batches[0])
    graph = fuse_graph(captured, x0, t0, lambda o, t: sc_c.scale(ag.mse_loss(o, t)), optimizer_step=step_c)
    eager_step(*batches[0])
    for x, t in batches[1:]:
        graph.execute(ag.tensor(x, device=device), ag.tensor(t, device=device))
        eager_step(x, t)
        assert sc_c.get_scale() == sc_e.get_scale()
        for (name, a), b in zip(captured.state_dict().items(), eager.state_dict().values(), strict=True):
            np.testing.assert_allclose(a.to_host(), b.to_host(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert sc_e.get_scale() == 512.0  # 1024: grew after steps 0-1, backed off at steps 2 and 4
    assert opt_c.steps.to_host().tolist() == opt_e.steps.to_host().tolist() == [4] * 4


def test_bad_inputs(device):
    from netcl.runtime.ops.amp_kernels import copy_if_, unscale_by_, update_scale_

    g = nc.tensor(np.ones(3, np.float32), device=device)
    flag = nc.tensor(np.zeros(1, np.int32), dtype=np.int32, device=device)
    with pytest.raises(TypeError, match="scale must be a one-element float32 Tensor"):
        unscale_by_(g, 2.0, flag)
    with pytest.raises(ValueError, match="mode must be ALWAYS"):
        copy_if_(g, g, flag, 5)
    with pytest.raises(ValueError, match="interval must be a positive int"):
        update_scale_(nc.tensor(np.ones(1, np.float32), device=device), flag, flag, 2.0, 0.5, 0)


@pytest.mark.parametrize("bad", [None, 17])
def test_unscale_many_is_the_per_gradient_unscale(device, bad):
    """``unscale_many_`` over 20 gradients (two launches of float32, one of float64) gives the bits of
    ``unscale_by_`` on each, and raises the flag exactly when one holds inf/NaN."""
    from netcl.runtime.ops.amp_kernels import unscale_by_, unscale_many_

    rng = np.random.default_rng(5)
    hosts = [rng.normal(size=(k % 5 + 1, 7)).astype(np.float64 if k % 7 == 3 else np.float32) for k in range(20)]
    if bad is not None:
        hosts[bad][0, 3] = np.inf
    scale = nc.tensor(np.array([3.0], np.float32), device=device)
    results = []
    for unscale in (lambda gs, f: unscale_many_(gs, scale, f), lambda gs, f: [unscale_by_(g, scale, f) for g in gs]):
        grads = [nc.tensor(h, dtype=h.dtype, device=device) for h in hosts]
        flag = nc.tensor(np.zeros(1, np.int32), dtype=np.int32, device=device)
        unscale(grads, flag)
        results.append(([g.to_host() for g in grads], int(flag.to_host()[0])))
    (many, flag_many), (each, flag_each) = results
    assert flag_many == flag_each == (bad is not None)
    for a, b in zip(many, each, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_amp_step_unscales_in_one_launch(cl_device, launch_counter):
    scaler = GradScaler(init_scale=4.0)
    params = _params(cl_device)
    opt = SGD(params, lr=0.1)
    for p in params:
        p.grad = nc.tensor(np.ones(3, np.float32), device=cl_device)
    with launch_counter(cl_device.queue) as launches:
        scaler.step(opt)
    assert launches.names.count("netcl_amp_unscale_multi") == 1 and "netcl_amp_unscale" not in launches.names
