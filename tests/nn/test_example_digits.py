"""examples/train_digits_cnn.py runs briefly on each device, saves and reloads its checkpoint."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_digits_cnn.py"


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_example_trains_a_few_steps_and_reloads_its_checkpoint(device, optimizer, tmp_path, monkeypatch, capsys):
    checkpoint = tmp_path / "digits.safetensors"
    argv = [
        str(EXAMPLE),
        "--device",
        device.spec,
        "--optimizer",
        optimizer,
        "--epochs",
        "1",
        "--max-steps",
        "12",
        "--checkpoint",
        str(checkpoint),
        "--quiet",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert f"with {'Adam' if optimizer == 'adam' else 'SGD'} on" in out
    epoch = re.search(r"epoch 1: loss ([0-9.]+)\s+test accuracy ([0-9.]+)%", out)
    assert epoch is not None, out
    # 12 steps from random weights: above chance (10%, i.e. 36 of the 360 test digits) by far
    assert float(epoch.group(2)) > 20.0
    final = re.search(r"test accuracy ([0-9.]+)% after 12 steps", out)
    reloaded = re.search(r"reloaded: test accuracy ([0-9.]+)% \(identical\)", out)
    assert final and reloaded and final.group(1) == reloaded.group(1) == epoch.group(2)
    assert checkpoint.is_file()


def _run_example(monkeypatch, capsys, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), *args, "--quiet"])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    return capsys.readouterr().out


def test_example_resumes_from_its_trainer_checkpoint_bit_identically(device, tmp_path, monkeypatch, capsys):
    """One epoch, the process ends, a second run resumes from the Trainer checkpoint: its epoch-2 line
    (loss and accuracy) is the uninterrupted two-epoch run's, character for character."""
    common = ["--device", device.spec, "--optimizer", "sgd", "--batch-size", "64"]
    full = _run_example(monkeypatch, capsys, *common, "--epochs", "2")
    ckpt = str(tmp_path / "trainer.ckpt")
    # the first run stops after epoch 1's 23 steps (the cosine schedule planned for 2 epochs, as the full run's)
    _run_example(monkeypatch, capsys, *common, "--epochs", "2", "--max-steps", "23", "--trainer-checkpoint", ckpt)
    resumed = _run_example(monkeypatch, capsys, *common, "--epochs", "2", "--trainer-checkpoint", ckpt)
    assert "resumed from" in resumed and "at epoch 1, step 23" in resumed
    line = re.compile(r"epoch 2: loss [0-9.]+\s+test accuracy [0-9.]+%")
    assert line.search(full) and line.search(full).group(0) == line.search(resumed).group(0)
    assert "epoch 1:" not in resumed
