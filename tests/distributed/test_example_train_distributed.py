"""examples/train_distributed.py runs under ``mpiexec -n 2`` as the README shows (a short run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_distributed.py"


def test_example_trains_two_ranks(mpiexec, tmp_path):
    pytest.importorskip("sklearn", reason="the example's data come from scikit-learn (the examples extra)")
    env = dict(os.environ, NETCL_DIST_TIMEOUT="60")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), *sys.path) if p)
    checkpoint = tmp_path / "digits.safetensors"
    command = [mpiexec, "-n", "2", sys.executable, str(EXAMPLE), "--device", "cpu", "--epochs", "1"]
    command += ["--max-steps", "20", "--checkpoint", str(checkpoint)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count("2 ranks, 21386 parameters") == 1  # only rank 0 prints
    accuracy = float(re.search(r"test accuracy ([0-9.]+)% after 20 steps", out).group(1))
    # 20 Adam steps of 32 images reach ~70% on the 360 test digits; chance is 10%
    assert accuracy > 40.0, out
    assert "2 replicas bit-identical" in out and checkpoint.exists()
