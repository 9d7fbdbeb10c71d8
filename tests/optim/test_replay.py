"""An optimizer step captured with fuse_graph replays like eager steps (N replays == N eager steps).

Adam's step count (bias correction) and SGD's first momentum step are read from the device, and a
scheduler's new learning rate reaches the next replay; the captured model and an eager twin with
the same initial weights must agree after every step (float32; the two runs execute the same
kernels in the same order, the tolerance only absorbs the jit's fused elementwise kernels).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn as nn
from netcl.jit import fuse_graph
from netcl.optim import SGD, Adagrad, Adam, RMSprop, StepLR

BATCH, STEPS = 8, 4


def _mlp(device):
    return nn.Sequential(nn.Linear(6, 16, device=device), nn.ReLU(), nn.Linear(16, 3, device=device))


def _cnn(device):
    """Conv, BatchNorm (running statistics and num_batches_tracked advance by launches), pool, linear.

    The conv has no bias, as usual before BatchNorm: its gradient would be rounding noise, which
    Adam turns into full-size steps of arbitrary sign.
    """
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False, device=device),
        nn.BatchNorm2d(4, device=device),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 3, device=device),
    )


def _batches(shape, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(BATCH, *shape)).astype(np.float32), rng.integers(0, 3, BATCH).astype(np.int32))
        for _ in range(STEPS + 1)
    ]


def _eager_step(model, opt, x, y, device):
    opt.zero_grad()
    with ag.Tape() as tape:
        loss = ag.cross_entropy(model(ag.tensor(x, device=device)), y)
    tape.backward(loss)
    opt.step()
    return loss.item()


def _twins(make_model, make_opt, batch, device):
    """A model captured with ``fuse_graph`` (the capture runs step 1 on ``batch``) and its eager twin (same
    initial weights, step 1 run eagerly): (captured, eager, their optimizers, the graph, the eager loss)."""
    captured, eager = make_model(device), make_model(device)
    eager.load_state_dict({k: v.to_host() for k, v in captured.state_dict().items()})
    opt_c, opt_e = make_opt(captured.parameters()), make_opt(eager.parameters())
    x0, y0 = batch
    graph = fuse_graph(
        captured,
        ag.tensor(x0, device=device),
        ag.tensor(y0, device=device),
        ag.cross_entropy,
        optimizer_step=opt_c.step,
    )
    return captured, eager, opt_c, opt_e, graph, _eager_step(eager, opt_e, x0, y0, device)


def _assert_same_state(captured, eager, when):
    for (name, a), b in zip(captured.state_dict().items(), eager.state_dict().values(), strict=True):
        np.testing.assert_allclose(a.to_host(), b.to_host(), rtol=1e-5, atol=1e-6, err_msg=f"{name} {when}")


@pytest.mark.parametrize(
    "make_model,shape,make_opt",
    [
        (_mlp, (6,), lambda p: Adam(p, lr=0.05)),
        (_mlp, (6,), lambda p: SGD(p, lr=0.1, momentum=0.9, nesterov=True)),
        (_cnn, (1, 4, 4), lambda p: Adam(p, lr=0.05)),
        (_mlp, (6,), lambda p: RMSprop(p, lr=0.01, momentum=0.5, centered=True)),
        (_mlp, (6,), lambda p: Adagrad(p, lr=0.1, lr_decay=0.2)),
    ],
    ids=["mlp-adam", "mlp-sgd", "cnn-batchnorm-adam", "mlp-rmsprop", "mlp-adagrad"],
)
def test_replayed_training_equals_eager(device, make_model, shape, make_opt):
    if make_model is _cnn and not hasattr(ag, "batch_norm"):
        pytest.skip("ag.batch_norm is not in this tree yet")
    ag.manual_seed(3)
    batches = _batches(shape)
    captured, eager, opt_c, opt_e, graph, first = _twins(make_model, make_opt, batches[0], device)
    sched_c, sched_e = StepLR(opt_c, step_size=2, gamma=0.5), StepLR(opt_e, step_size=2, gamma=0.5)
    np.testing.assert_allclose(graph.outputs.item(), first, rtol=1e-5)
    sched_c.step(), sched_e.step()
    for x, y in batches[1:]:
        loss = graph.execute(ag.tensor(x, device=device), ag.tensor(y, device=device)).item()
        expected = _eager_step(eager, opt_e, x, y, device)
        np.testing.assert_allclose(loss, expected, rtol=1e-5)
        sched_c.step(), sched_e.step()
        _assert_same_state(captured, eager, "after step")
    assert opt_c.steps.to_host().tolist() == [STEPS + 1] * len(opt_c.steps.to_host())
    assert opt_c.param_groups[0]["lr"] == opt_e.param_groups[0]["lr"] < 0.05


@pytest.mark.parametrize(
    "make_opt", [lambda p: Adam(p, lr=0.05), lambda p: SGD(p, lr=0.1, momentum=0.9)], ids=["adam", "sgd"]
)
def test_a_learning_rate_written_into_param_groups_reaches_the_next_replay(device, make_opt):
    """torch users set ``group["lr"]`` by hand (warm-up, a schedule of their own); a replay has no host
    ``step()`` to upload it, so the captured step uploads what changed before each replay. lr 0 at the
    last step: the replay must leave every weight as it was (it kept the captured lr before)."""
    ag.manual_seed(5)
    batches = _batches((6,), seed=1)
    captured, eager, opt_c, opt_e, graph, _ = _twins(_mlp, make_opt, batches[0], device)
    for step, (x, y) in enumerate(batches[1:]):
        lr = 0.0 if step == STEPS - 1 else 0.02 * (step + 1)
        for group in (*opt_c.param_groups, *opt_e.param_groups):
            group["lr"] = lr
        before = [p.to_host() for p in captured.parameters()]
        loss = graph.execute(ag.tensor(x, device=device), ag.tensor(y, device=device)).item()
        np.testing.assert_allclose(loss, _eager_step(eager, opt_e, x, y, device), rtol=1e-5)
        _assert_same_state(captured, eager, f"at lr {lr}")
    for old, new in zip(before, captured.parameters(), strict=True):
        np.testing.assert_array_equal(old, new.to_host())  # lr 0: nothing moved


@pytest.mark.parametrize(
    "make_opt", [lambda p: Adam(p, lr=0.05), lambda p: SGD(p, lr=0.1, momentum=0.9)], ids=["adam", "sgd"]
)
def test_a_state_dict_loaded_after_the_capture_is_what_the_replays_continue_from(device, make_opt):
    """``load_state_dict`` writes the loaded moments into the buffers the captured update reads (it made new ones
    before, and replays kept the old moments), and zeroes those the state_dict lacks (a fresh optimizer's)."""
    ag.manual_seed(7)
    batches = _batches((6,), seed=2)
    captured, eager, opt_c, opt_e, graph, _ = _twins(_mlp, make_opt, batches[0], device)
    for x, y in batches[1:3]:  # the eager twin runs ahead; the captured one replays from elsewhere
        _eager_step(eager, opt_e, x, y, device)
    for donor in (opt_e.state_dict(), make_opt(_mlp(device).parameters()).state_dict()):
        captured.load_state_dict({k: v.to_host() for k, v in eager.state_dict().items()})
        opt_c.load_state_dict(donor)
        if not donor["state"]:  # a fresh optimizer: the eager twin starts one too
            opt_e = make_opt(eager.parameters())
        for x, y in batches[3:]:
            loss = graph.execute(ag.tensor(x, device=device), ag.tensor(y, device=device)).item()
            np.testing.assert_allclose(loss, _eager_step(eager, opt_e, x, y, device), rtol=1e-5)
            _assert_same_state(captured, eager, "after loading")
