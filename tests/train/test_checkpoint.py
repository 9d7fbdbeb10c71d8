"""Trainer.save / Trainer.resume: bit-identical continuation, mismatches named with nothing changed,
torn and corrupt files refused, atomic writes."""

from __future__ import annotations

import os

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn as nn
import netcl.train.checkpoint as ckpt
from netcl.optim import SGD, Adam
from netcl.runtime.ops.random import get_rng_state
from netcl.train import Callback, CheckpointError, Trainer
from tests.train.helpers import make_dataset, make_parts

pytestmark = pytest.mark.filterwarnings("ignore:autocast")  # devices without float16: autocast does nothing

EPOCHS = 4  # 5 batches each: 20 steps


class Crash(Exception):
    pass


class SaveThenCrash(Callback):
    """Save after optimizer step ``at``, then raise (an interrupted run)."""

    def __init__(self, path, at: int) -> None:
        self.path, self.at = path, at

    def on_step_end(self, trainer, step):
        if trainer.global_step == self.at:
            trainer.save(self.path)
            raise Crash


def _run(device, replay, callbacks=(), seed=3):
    model, opt, sched, loader = make_parts(device, make_dataset(), seed=seed)
    ag.manual_seed(7)
    trainer = Trainer(model, opt, ag.cross_entropy, scheduler=sched, replay=replay)
    return trainer, trainer.fit(loader, EPOCHS, callbacks=callbacks)["loss"]


@pytest.mark.parametrize("replay", ["off", "auto"])
@pytest.mark.parametrize("at", [1, 7, 10])  # right after the capture, mid-epoch, at an epoch's end
def test_interrupted_and_resumed_run_is_bit_identical(device, replay, at, tmp_path):
    """Shuffle order (the checkpoint's loader seed wins over the new loader's), dropout masks (the
    Philox generator; under replay also the captured step's seeds and device counters), momentum,
    scheduler and position all continue: the losses are the same floats, the final weights the same bits."""
    uninterrupted, full = _run(device, replay)
    path = tmp_path / "run.ckpt"
    with pytest.raises(Crash):
        _run(device, replay, callbacks=[SaveThenCrash(path, at)])
    ag.manual_seed(12345)  # the resumed process's own seeding is overridden by the checkpoint
    model, opt, sched, loader = make_parts(device, make_dataset(), seed=99)
    resumed = Trainer.resume(path, model, opt, ag.cross_entropy, scheduler=sched, replay=replay)
    assert resumed.global_step == at
    rest = resumed.fit(loader, EPOCHS)["loss"]
    assert rest == full[at:]
    for a, b in zip(uninterrupted.model.parameters(), model.parameters(), strict=True):
        np.testing.assert_array_equal(a.value.to_host(), b.value.to_host())
    assert opt.param_groups[0]["lr"] == uninterrupted.optimizer.param_groups[0]["lr"]


def test_adam_amp_clipping_resume_is_bit_identical(device, tmp_path):
    """Adam's moments, the GradScaler's scale and clean-step count, clipping: all in the checkpoint."""

    def run(callbacks=(), resume_from=None):
        model, _, _, loader = make_parts(device, make_dataset())
        opt = Adam(model.parameters(), lr=0.01)
        options = {"amp": True, "clip_grad_norm": 0.5, "replay": "auto"}
        ag.manual_seed(7)
        if resume_from is not None:
            trainer = Trainer.resume(resume_from, model, opt, ag.cross_entropy, **options)
        else:
            trainer = Trainer(model, opt, ag.cross_entropy, **options)
        return trainer.fit(loader, 3, callbacks=callbacks)["loss"]

    full = run()
    path = tmp_path / "adam.ckpt"
    with pytest.raises(Crash):
        run(callbacks=[SaveThenCrash(path, 8)])
    assert run(resume_from=path) == full[8:]


def _snapshot(model, opt):
    return (
        [p.value.to_host().copy() for p in model.parameters()],
        opt.steps.to_host().copy(),
        [{k: v.to_host().copy() for k, v in s.items()} for s in opt.state.values()],
        dict(opt.param_groups[0]),
        get_rng_state(),
    )


def _assert_same(a, b):
    for x, y in zip(a[0], b[0], strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a[1], b[1])
    assert len(a[2]) == len(b[2])
    for s, t in zip(a[2], b[2], strict=True):
        for k in s:
            np.testing.assert_array_equal(s[k], t[k])
    assert {k: v for k, v in a[3].items() if k != "params"} == {k: v for k, v in b[3].items() if k != "params"}
    assert a[4] == b[4]


def _trained_checkpoint(device, path):
    model, opt, sched, loader = make_parts(device, make_dataset(), dropout=0.0)
    trainer = Trainer(model, opt, ag.cross_entropy, scheduler=sched)
    trainer.fit(loader, 1)
    trainer.save(path)
    return trainer


def test_resume_with_another_model_names_the_keys_and_changes_nothing(device, tmp_path):
    path = tmp_path / "a.ckpt"
    _trained_checkpoint(device, path)
    other, opt, sched, _ = make_parts(device, make_dataset(), hidden=8, dropout=0.0)
    extra = nn.Sequential(nn.Linear(6, 16, device=device), nn.ReLU(), nn.Linear(16, 3, device=device),
                          nn.Linear(3, 2, device=device))  # fmt: skip
    before = _snapshot(other, opt)
    with pytest.raises(KeyError, match=r"keys of another shape \['0.bias', '0.weight', '2.weight'\]"):
        Trainer.resume(path, other, opt, ag.cross_entropy, scheduler=sched)
    _assert_same(before, _snapshot(other, opt))
    opt2 = SGD(extra.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(KeyError, match=r"keys missing from the checkpoint \['3.bias', '3.weight'\]"):
        Trainer.resume(path, extra, opt2, ag.cross_entropy)


def test_resume_with_another_optimizer_names_it_and_changes_nothing(device, tmp_path):
    path = tmp_path / "a.ckpt"
    trainer = _trained_checkpoint(device, path)
    model, _, _, _ = make_parts(device, make_dataset(), dropout=0.0)
    model.load_state_dict({k: v.to_host() for k, v in trainer.model.state_dict().items()})
    adam = Adam(model.parameters(), lr=0.01)
    from netcl.optim import StepLR

    sched = StepLR(adam, 1)
    before = _snapshot(model, adam)
    with pytest.raises(KeyError, match=r"class SGD in the checkpoint, Adam here.*hyperparameter keys differ"):
        Trainer.resume(path, model, adam, ag.cross_entropy, scheduler=sched)
    _assert_same(before, _snapshot(model, adam))
    groups = SGD([{"params": list(model.parameters())[:2]}, {"params": list(model.parameters())[2:]}], lr=0.1,
                 momentum=0.9)  # fmt: skip
    with pytest.raises(KeyError, match="2 here"):
        Trainer.resume(path, model, groups, ag.cross_entropy, scheduler=StepLR(groups, 1))


def _corrupt_at(path, offset_from_end: int) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - offset_from_end] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "torn"),
        (lambda p: p.write_bytes(p.read_bytes()[:5]), "torn"),
        (lambda p: _corrupt_at(p, 3), "does not match its digest"),  # a byte of the last tensor
        (lambda p: p.write_bytes(b""), "torn"),
    ],
    ids=["half", "header-cut", "bit-flip", "empty"],
)
def test_torn_or_corrupt_checkpoint_raises(device, tmp_path, damage, message):
    path = tmp_path / "a.ckpt"
    _trained_checkpoint(device, path)
    damage(path)
    model, opt, sched, _ = make_parts(device, make_dataset(), dropout=0.0)
    before = _snapshot(model, opt)
    with pytest.raises(CheckpointError, match=message):
        Trainer.resume(path, model, opt, ag.cross_entropy, scheduler=sched)
    _assert_same(before, _snapshot(model, opt))


def test_flipped_byte_in_the_state_document_is_caught(tmp_path):
    path = tmp_path / "a.ckpt"
    ckpt.write_checkpoint(path, {"w": np.arange(4, dtype=np.float32)}, {"position": {"epoch": 3}})
    data = path.read_bytes()
    path.write_bytes(data.replace(b'\\"epoch\\": 3', b'\\"epoch\\": 4'))
    assert path.read_bytes() != data
    with pytest.raises(CheckpointError, match="state document does not match its digest"):
        ckpt.read_checkpoint(path)


def test_a_plain_state_dict_or_a_missing_file_is_not_a_checkpoint(tmp_path):
    nn.save({"w": np.zeros(3, np.float32)}, tmp_path / "plain.safetensors")
    with pytest.raises(CheckpointError, match="not a Trainer checkpoint"):
        ckpt.read_checkpoint(tmp_path / "plain.safetensors")
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        ckpt.read_checkpoint(tmp_path / "absent.ckpt")


def test_save_is_atomic_a_crash_midway_leaves_the_previous_checkpoint(device, tmp_path, monkeypatch):
    path = tmp_path / "a.ckpt"
    trainer = _trained_checkpoint(device, path)
    good = path.read_bytes()
    trainer.fit(make_parts(device, make_dataset(), dropout=0.0)[3], 2)
    assert trainer.epoch == 2

    def half_then_die(save_file, arrays, tmp, metadata):
        save_file(arrays, tmp, metadata=metadata)
        with open(tmp, "r+b") as f:  # the process dies with half the bytes written
            f.truncate(os.path.getsize(tmp) // 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "_save_file", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        trainer.save(path)
    assert path.read_bytes() == good
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt"]  # no temporary file left behind
    model, opt, sched, _ = make_parts(device, make_dataset(), dropout=0.0)
    resumed = Trainer.resume(path, model, opt, ag.cross_entropy, scheduler=sched)
    assert resumed.epoch == 1
