"""examples/train_distributed.py under ``mpiexec -n 2`` as the README shows (a short run): Trainer and by hand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_distributed.py"


def _run(mpiexec, tmp_path, loop: str) -> tuple[str, float]:
    env = dict(os.environ, NETCL_DIST_TIMEOUT="60")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), *sys.path) if p)
    checkpoint = tmp_path / f"digits-{loop}.safetensors"
    command = [mpiexec, "-n", "2", sys.executable, str(EXAMPLE), "--device", "cpu", "--epochs", "1"]
    command += ["--max-steps", "20", "--checkpoint", str(checkpoint), "--loop", loop]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count("2 ranks, 21386 parameters") == 1  # only rank 0 prints
    accuracy = float(re.search(r"test accuracy ([0-9.]+)% after 20 steps", out).group(1))
    assert "2 replicas bit-identical" in out and checkpoint.exists()
    return out, accuracy


def test_example_trains_two_ranks(mpiexec, tmp_path):
    pytest.importorskip("sklearn", reason="the example's data come from scikit-learn (the examples extra)")
    out, accuracy = _run(mpiexec, tmp_path, "trainer")
    # 20 Adam steps of 32 images reach ~70% on the 360 test digits; chance is 10%
    assert accuracy > 40.0, out
    # the hand-written loop trains the same shards in the same order with the same steps: the same model
    manual_out, manual_accuracy = _run(mpiexec, tmp_path, "manual")
    assert manual_accuracy == accuracy, out + manual_out
