"""CI runs ``hatch run distributed-check`` through this test: 2 ranks vs 1 process, SGD and Adam."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "distributed_check.py"


def test_distributed_check_passes(mpiexec):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), *sys.path) if p)
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    last = proc.stdout.strip().splitlines()[-1]
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(
        r"max relative difference (\S+) \(limit 1e-06\), equal to the shard mean: True, "
        r"all ranks bit-identical: True -> PASS$",
        last,
    )
    assert match is not None, last
    assert float(match.group(1)) <= 1e-6
