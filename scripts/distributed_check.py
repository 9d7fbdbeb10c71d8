"""Data-parallel equivalence check: 2 MPI ranks vs 1 process on the concatenated batch.

``python scripts/distributed_check.py`` (``hatch run distributed-check``) launches itself under
``mpiexec -n 2``. Each rank trains the same model with DistributedDataParallel for 20 steps on its
half of every batch, with SGD (momentum) and with Adam from netcl.optim; rank 0 also trains copies
alone, from the same initial parameters: (a) on the whole (concatenated) batches, (b) with the
gradient of each step taken as the rank-order mean of the two half-batch gradients. Models: an
MLP 64-48-10 and the digits CNN of examples/train_digits_cnn.py, on 8x8 one-channel images.

Printed last, one line: the largest relative difference (max over tensors of max|a - b| / max|b|)
between the 2-rank parameters and (a), which must be <= 1e-6, and whether all ranks are
bit-identical. Also required: DDP equals (b) bit for bit (the all-reduce is exactly that mean).
The CNN trained with Adam is reported against (a) but not held to 1e-6: there one process
alone differs from itself by ~1e-5 between (a) and (b) (float32 sums in another order, then Adam
divides every gradient element by its own magnitude, so an element whose gradient is rounding
noise takes a full learning-rate step whose sign depends on the order). Exit status 0 only
when everything holds. Devices: the NumPy backend, and the first OpenCL device too when there
is one (``--devices cpu,opencl`` to choose).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

STEPS = 20
BATCH_PER_RANK = 16
TOLERANCE = 1e-6
MODELS = ("mlp", "cnn")


# ---- the worker (one MPI rank) -------------------------------------------------------------------
def build_model(kind: str, device):
    """An MLP 64-48-10, or the digits CNN of examples/train_digits_cnn.py."""
    import netcl.nn as nn

    if kind == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(64, 48, device=device), nn.ReLU(), nn.Linear(48, 10, device=device)
        )
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from train_digits_cnn import digits_cnn

    return digits_cnn(device)


def make_optimizer(kind: str, params):
    from netcl.optim import SGD, Adam

    if kind == "sgd":
        return SGD(params, lr=0.05, momentum=0.9)
    return Adam(params, lr=1e-3)


def batches(device):
    """STEPS batches of 2 * BATCH_PER_RANK images and labels (the same on every rank)."""
    import netcl.autograd as ag

    rng = np.random.default_rng(1234)
    for _ in range(STEPS):
        x = rng.uniform(0.0, 1.0, size=(2 * BATCH_PER_RANK, 1, 8, 8)).astype(np.float32)
        y = rng.integers(0, 10, size=2 * BATCH_PER_RANK).astype(np.int32)
        yield ag.tensor(x, device=device), ag.tensor(y, device=device), x, y


def train(model, optimizer, device, shard: slice | None) -> None:
    import netcl.autograd as ag

    for x, y, x_host, y_host in batches(device):
        if shard is not None:
            x, y = ag.tensor(x_host[shard], device=device), ag.tensor(y_host[shard], device=device)
        optimizer.zero_grad()
        with ag.Tape():
            loss = ag.cross_entropy(model(x), y)
            loss.backward()
        optimizer.step()


def train_shard_mean(model, optimizer, device, ranks: int) -> None:
    """One process, gradient = rank-order mean of the ``ranks`` shard gradients (what the all-reduce computes)."""
    import netcl.autograd as ag
    from netcl.core import Tensor

    params = list(model.parameters())
    for _, _, x_host, y_host in batches(device):
        shard_grads = []
        for r in range(ranks):
            shard = slice(r * BATCH_PER_RANK, (r + 1) * BATCH_PER_RANK)
            optimizer.zero_grad()
            with ag.Tape():
                loss = ag.cross_entropy(
                    model(ag.tensor(x_host[shard], device=device)), ag.tensor(y_host[shard], device=device)
                )
                loss.backward()
            shard_grads.append([p.grad.to_host() for p in params])
        for i, p in enumerate(params):
            total = shard_grads[0][i].copy()
            for r in range(1, ranks):
                total += shard_grads[r][i]
            grad = Tensor.from_host(device, total / np.float32(ranks))
            p.grad, p._grad_owned, p.value.grad = grad, True, grad
        optimizer.step()


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max|a - b| / max|b| over one tensor."""
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def worker(devices: list[str]) -> None:
    import netcl.autograd as ag
    from netcl.core import get_device
    from netcl.nn.parallel import DistributedDataParallel
    from netcl.runtime import distributed as dist
    from netcl.runtime import tune

    info = dist.init(device=devices[0])
    report = []
    for spec in devices:
        device = get_device(spec)
        for model_kind in MODELS:
            for kind in ("sgd", "adam"):
                ag.manual_seed(100 + info.rank)  # ranks start apart: DDP must broadcast rank 0's parameters
                model = build_model(model_kind, device)
                ddp = DistributedDataParallel(model)
                start = {k: v.to_host() for k, v in model.state_dict().items()}
                shard = slice(info.rank * BATCH_PER_RANK, (info.rank + 1) * BATCH_PER_RANK)
                train(ddp, make_optimizer(kind, list(model.parameters())), device, shard)
                ddp.remove_hooks()
                mine = [p.to_host() for p in model.parameters()]
                everyone = dist.all_gather_object(mine)
                if info.rank == 0:
                    ref = []
                    # rank 0 alone: new tuned choices (the whole batch's shapes) are its own; the shards'
                    # shapes keep the configs the ranks agreed on, so (b) rounds as DDP did
                    with tune.local_choices():
                        for run in (train, train_shard_mean):
                            reference = build_model(model_kind, device)
                            reference.load_state_dict(start)
                            optimizer = make_optimizer(kind, list(reference.parameters()))
                            run(reference, optimizer, device, None if run is train else info.world_size)
                            ref.append([p.to_host() for p in reference.parameters()])
                    identical = all(
                        all(a.tobytes() == b.tobytes() for a, b in zip(everyone[0], other, strict=True))
                        for other in everyone[1:]
                    )
                    report.append(
                        {
                            "device": spec,
                            "model": model_kind,
                            "optimizer": kind,
                            "max_rel_diff": max(relative_difference(a, b) for a, b in zip(mine, ref[0], strict=True)),
                            "gated": not (model_kind == "cnn" and kind == "adam"),
                            "equals_shard_mean": all(
                                a.tobytes() == b.tobytes() for a, b in zip(mine, ref[1], strict=True)
                            ),
                            "bit_identical": identical,
                        }
                    )
                dist.barrier()
    if info.rank == 0:
        print("RESULT " + json.dumps(report), flush=True)


# ---- the launcher ----------------------------------------------------------------------------------
def find_mpiexec() -> str:
    """The mpiexec next to this Python (the mpich wheel installs it there), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise SystemExit("distributed-check: no mpiexec found; install netcl-runtime[mpi] (mpi4py and mpich)")
    return found


def default_devices() -> list[str]:
    import netcl.core as nc

    return ["cpu", "opencl"] if nc.usable_opencl_devices() else ["cpu"]


def launch(devices: list[str], ranks: int = 2, timeout: float = 300.0) -> int:
    env = dict(os.environ)
    env.setdefault("NETCL_DIST_TIMEOUT", "60")
    command = [find_mpiexec(), "-n", str(ranks), sys.executable, __file__, "--worker", "--devices", ",".join(devices)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(proc.stdout)
        print(f"distributed-check: FAILED (mpiexec exit status {proc.returncode}, no result)")
        return 1
    report = json.loads(lines[-1][len("RESULT ") :])
    for row in report:
        note = "" if row["gated"] else " (not held to the limit: see the docstring)"
        print(
            f"  {row['device']:>7} {row['model']:>4} {row['optimizer']:>5}: vs concatenated batch "
            f"{row['max_rel_diff']:.3g}{note}; equals the 1-process shard mean bit for bit: "
            f"{row['equals_shard_mean']}; ranks bit-identical: {row['bit_identical']}"
        )
    worst = max(row["max_rel_diff"] for row in report if row["gated"])
    identical = all(row["bit_identical"] for row in report)
    exact = all(row["equals_shard_mean"] for row in report)
    ok = worst <= TOLERANCE and identical and exact
    print(
        f"distributed-check: {ranks} ranks vs 1 process on the concatenated batch, {STEPS} steps, SGD and Adam "
        f"(MLP; CNN with SGD) on {'+'.join(devices)}: max relative difference {worst:.3g} (limit {TOLERANCE:g}), "
        f"equal to the shard mean: {exact}, all ranks bit-identical: {identical} -> {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="run as one MPI rank (used by the launcher)")
    parser.add_argument("--devices", default=None, help="comma-separated device specs (default: cpu[,opencl])")
    args = parser.parse_args()
    devices = args.devices.split(",") if args.devices else default_devices()
    if args.worker:
        worker(devices)
        return 0
    return launch(devices)


if __name__ == "__main__":
    sys.exit(main())
