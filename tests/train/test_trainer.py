"""Trainer.fit against a hand-written loop (bit for bit), history, metrics JSONL, callbacks, accumulation, amp."""

from __future__ import annotations

import json

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core import get_device
from netcl.data import DataLoader
from netcl.optim import SGD, Adam
from netcl.train import Callback, Trainer, accuracy
from tests.train.helpers import hand_written_loop, make_dataset, make_model, make_parts


@pytest.mark.parametrize("replay", ["off", "auto"])
def test_fit_equals_the_hand_written_loop_bit_for_bit(device, replay):
    """Same model, optimizer, scheduler, shuffle and dropout draws: every step's loss is the same float
    (5 batches of 16, 14, 16 ... : the short last batch runs eagerly under replay="auto" too)."""
    data = make_dataset()
    model, opt, sched, loader = make_parts(device, data)
    ag.manual_seed(7)
    expected = hand_written_loop(model, opt, sched, loader, 3, replay=replay == "auto")
    model, opt, sched, loader = make_parts(device, data)
    ag.manual_seed(7)
    trainer = Trainer(model, opt, ag.cross_entropy, scheduler=sched, replay=replay)
    history = trainer.fit(loader, 3)
    assert history["loss"] == expected
    assert len(expected) == 15 and len(set(expected)) == 15
    if replay == "auto":
        assert trainer._graph is not None and trainer._graph_runs == 11  # captured at step 2, then replayed
    assert trainer.epoch == 3 and trainer.global_step == 15
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


def test_history_metrics_jsonl_and_validation(device, tmp_path):
    data = make_dataset()
    model, opt, sched, loader = make_parts(device, data, dropout=0.0)
    val = DataLoader(data, batch_size=32, device=device, seed=0)
    log = tmp_path / "metrics.jsonl"
    trainer = Trainer(model, opt, ag.cross_entropy, scheduler=sched, log_path=log)
    history = trainer.fit(loader, 2, val_loader=val, metrics={"acc": accuracy})
    assert set(history) == {"loss", "val_loss", "acc"}
    assert len(history["loss"]) == 2 * len(loader) and len(history["val_loss"]) == len(history["acc"]) == 2
    assert all(isinstance(v, float) for values in history.values() for v in values)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [0, 1]
    for e, line in enumerate(lines):
        assert line["loss"] == float(np.mean(history["loss"][e * 5 : (e + 1) * 5]))
        assert line["val_loss"] == history["val_loss"][e] and line["acc"] == history["acc"][e]
        assert line["step"] == 5 * (e + 1)
    # the validation numbers against a float64 NumPy evaluation of the trained model
    x, y = data.tensors
    w1, b1, w2, b2 = (p.value.to_host().astype(np.float64) for p in model.parameters())
    logits = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    nll = -(shifted[np.arange(len(y)), y] - np.log(np.exp(shifted).sum(axis=1)))
    assert history["val_loss"][-1] == pytest.approx(nll.mean(), rel=1e-5)  # float32 forward and batch sums
    assert history["acc"][-1] == pytest.approx(np.mean(logits.argmax(axis=1) == y), abs=1e-6)
    # a second fit call appends to the same file; a finished run trains no more
    assert trainer.fit(loader, 2) == {"loss": []}
    assert len(log.read_text().splitlines()) == 2


class Counting(Callback):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_fit_start(self, trainer):
        self.calls.append(("start",))

    def on_step_end(self, trainer, step):
        self.calls.append(("step", step["epoch"], step["batch"], step["step"]))

    def on_epoch_end(self, trainer, logs):
        self.calls.append(("epoch", logs["epoch"], trainer.epoch))

    def on_fit_end(self, trainer, history):
        self.calls.append(("end", len(history["loss"])))


def test_callbacks_are_called_per_step_and_epoch(device):
    model, opt, _, loader = make_parts(device, make_dataset())
    cb = Counting()
    Trainer(model, opt, ag.cross_entropy).fit(loader, 2, callbacks=[cb])
    steps = [("step", e, b, e * 5 + b + 1) for e in range(2) for b in range(5)]
    assert cb.calls == [("start",), *steps[:5], ("epoch", 0, 1), *steps[5:], ("epoch", 1, 2), ("end", 10)]


def test_grad_accumulation_equals_the_large_batch_step(device):
    """2 micro-batches of 8 (each loss halved) then one step == one batch of 16: the same shuffle makes
    the same 16 items. Tolerance: float32 gradient sums taken in another order (a few ulps per step)."""
    data = make_dataset()
    results = []
    for batch_size, accum in ((16, 1), (8, 2)):
        model, _, _, loader = make_parts(device, data, batch_size=batch_size, dropout=0.0)
        loader = DataLoader(data, batch_size=batch_size, shuffle=True, seed=3, device=device, drop_last=True)
        opt = SGD(model.parameters(), lr=0.2)
        history = Trainer(model, opt, ag.cross_entropy, grad_accum_steps=accum).fit(loader, 2)
        results.append((history["loss"], [p.value.to_host() for p in model.parameters()]))
    (big_loss, big_params), (acc_loss, acc_params) = results
    assert len(big_loss) == len(acc_loss) == 8
    np.testing.assert_allclose(acc_loss, big_loss, rtol=1e-5)
    for a, b in zip(acc_params, big_params, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_clipping_replayed_equals_eager_and_bounds_the_update(device):
    data = make_dataset()
    runs = {}
    for replay in ("off", "auto"):
        model, opt, _, loader = make_parts(device, data, dropout=0.0)
        opt = SGD(model.parameters(), lr=1.0)
        runs[replay] = Trainer(model, opt, ag.cross_entropy, clip_grad_norm=0.05, replay=replay).fit(loader, 2)["loss"]
        params = [p.value.to_host() for p in model.parameters()]
    np.testing.assert_allclose(runs["auto"], runs["off"], rtol=1e-5)  # fused (jit) vs eager kernels
    model = make_model(device, dropout=0.0)
    start = [p.value.to_host() for p in model.parameters()]
    moved = np.sqrt(sum(float(np.sum((a.astype(np.float64) - b) ** 2)) for a, b in zip(params, start, strict=True)))
    assert moved <= 10 * 0.05 * 1.0 + 1e-5  # 10 SGD steps of lr 1 on gradients clipped to norm 0.05


@pytest.mark.filterwarnings("ignore:autocast")  # devices without float16: autocast does nothing
@pytest.mark.filterwarnings("error::netcl.jit.errors.UnwatchedCaptureWarning")  # the scaler's scale is watched
def test_amp_trains_and_logs_unscaled_losses(device):
    data = make_dataset()
    losses = {}
    for amp in (False, True):
        model, opt, _, loader = make_parts(device, data, dropout=0.0)
        losses[amp] = Trainer(model, opt, ag.cross_entropy, amp=amp, replay="auto").fit(loader, 1)["loss"]
    # logged unscaled (not times the 65536 loss scale); float16 matmuls where the device has them (~1e-3)
    np.testing.assert_allclose(losses[True], losses[False], rtol=5e-2)


@pytest.mark.parametrize("make_opt", [lambda p: SGD(p, lr=0.1, momentum=0.9), lambda p: Adam(p, lr=0.01)],
                         ids=["sgd-momentum", "adam"])  # fmt: skip
def test_optimizer_built_before_model_to_keeps_working(make_opt):
    """torch habit: the optimizer is built, then the model moves; its state (momentum, step counts,
    hyperparameters) follows the parameters, which moved in place."""
    cpu, cl = get_device("cpu"), get_device("opencl")
    data = make_dataset()
    x = ag.tensor(data.tensors[0][:16])
    y = data.tensors[1][:16]
    finals = []
    for move in (False, True):
        model = make_model(cpu, dropout=0.0)
        opt = make_opt(model.parameters())
        for step in range(3):
            if move and step == 1:
                model.to(cl)
            device = model.device
            with ag.Tape() as tape:
                loss = ag.cross_entropy(model(ag.tensor(x.value.to_host(), device=device)), y)
            tape.backward(loss)
            opt.step()
            opt.zero_grad()
        assert all(p.device is (cl if move else cpu) for p in model.parameters())
        assert all(b.device is model.device for s in opt.state.values() for b in s.values())
        finals.append([p.value.to_host() for p in model.parameters()])
    for a, b in zip(*finals, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # PoCL vs NumPy float32 matmuls


def test_bad_arguments_raise_before_training(device):
    model, opt, _, loader = make_parts(device, make_dataset())
    with pytest.raises(ValueError, match="replay must be one of"):
        Trainer(model, opt, ag.cross_entropy, replay="always")
    with pytest.raises(ValueError, match="grad_accum_steps"):
        Trainer(model, opt, ag.cross_entropy, grad_accum_steps=0)
    with pytest.raises(ValueError, match="clip_grad_norm"):
        Trainer(model, opt, ag.cross_entropy, clip_grad_norm=-1.0)
    trainer = Trainer(model, opt, ag.cross_entropy)
    with pytest.raises(ValueError, match="metrics are computed on val_loader"):
        trainer.fit(loader, 1, metrics={"acc": accuracy})
    with pytest.raises(TypeError, match=r"must be a netcl\.data\.DataLoader"):
        trainer.fit([(1, 2)], 1)
    assert trainer.global_step == 0
