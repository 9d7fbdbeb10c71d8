"""The Trainer under mpiexec: DistributedDataParallel, a sharded loader, replicas in step with one process."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core import get_device
from netcl.optim import SGD
from tests.distributed.conftest import find_mpiexec
from tests.train.helpers import make_dataset, make_model

WORKER = Path(__file__).resolve().parent / "distributed_worker.py"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", ["cpu", "opencl"])
def test_two_ranks_train_like_one_process_on_the_union_batches(spec, tmp_path):
    """Each rank sees its own half of every epoch's shuffle (disjoint, covering); the gradients are
    averaged, so both ranks end bit-identical and equal to one process stepping on the two halves
    together (rtol 1e-5: the mean of two float32 means vs one mean over both halves)."""
    pytest.importorskip("mpi4py", reason="the netcl-runtime 'mpi' extra is not installed")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec (install the mpich wheel)")
    env = dict(os.environ, NETCL_DIST_TIMEOUT="30")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", ""), *sys.path) if p)
    command = [mpiexec, "-n", "2", sys.executable, str(WORKER), spec, str(tmp_path)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(2)]
    assert [r["wrapped"] for r in ranks] == ["DistributedDataParallel"] * 2
    for epoch in range(2):
        a, b = ranks[0]["orders"][epoch], ranks[1]["orders"][epoch]
        assert len(a) == len(b) == 35 and sorted(a + b) == list(range(70))
    assert ranks[0]["orders"][0] != ranks[0]["orders"][1]
    for w0, w1 in zip(ranks[0]["weights"], ranks[1]["weights"], strict=True):
        np.testing.assert_array_equal(w0, w1)

    # one process: the same model, each step on both ranks' batches at once
    device = get_device(spec)
    x_all, y_all = make_dataset().tensors
    model = make_model(device, dropout=0.0)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    expected_losses: list[list[float]] = [[], []]
    for epoch in range(2):
        orders = [ranks[r]["orders"][epoch] for r in range(2)]
        for start in range(0, 35, 8):
            chunks = [order[start : start + 8] for order in orders]
            for r in range(2):
                with ag.no_grad():
                    loss = ag.cross_entropy(model(ag.tensor(x_all[chunks[r]], device=device)), y_all[chunks[r]])
                expected_losses[r].append(loss.item())
            both = chunks[0] + chunks[1]
            with ag.Tape() as tape:
                loss = ag.cross_entropy(model(ag.tensor(x_all[both], device=device)), y_all[both])
            tape.backward(loss)
            opt.step()
            opt.zero_grad()
    for r in range(2):
        np.testing.assert_allclose(ranks[r]["loss"], expected_losses[r], rtol=1e-5)
    for got, p in zip(ranks[0]["weights"], model.parameters(), strict=True):
        np.testing.assert_allclose(got, p.value.to_host(), rtol=1e-5, atol=1e-6)
