"""The README's example (examples/detection_head.py) runs as a script and its loss falls."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "detection_head.py"


def test_example_trains_and_loss_falls(device, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--steps", "15", "--device", device.spec])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    losses = [float(v) for v in re.findall(r"step\s+\d+\s+loss ([0-9.]+)", out)]
    assert len(losses) == 3  # steps 0, 10 and 14
    assert losses[0] > losses[1] > losses[2]
    assert losses[2] < 0.9 * losses[0]
    first, last = (float(v) for v in re.search(r"loss ([0-9.]+) -> ([0-9.]+) on", out).groups())
    assert (first, last) == (losses[0], losses[2])


def test_example_prints_time_per_step(cl_device, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--steps", "3", "--device", cl_device.spec])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert re.search(r"step\s+0\s+loss [0-9.]+\s+\([0-9.]+ ms\)", out)
    assert re.search(r"time: first step [0-9.]+ ms \(builds or loads its programs\), then [0-9.]+ ms per step", out)


def test_example_with_zero_steps_runs_nothing_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--steps", "0", "--device", "cpu"])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert "no steps run (--steps 0) on" in capsys.readouterr().out
