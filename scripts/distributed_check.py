"""Data-parallel equivalence check: 2 MPI ranks vs 1 process on the concatenated batch.

``python scripts/distributed_check.py`` (``hatch run distributed-check``) launches itself under
``mpiexec -n 2``. Each rank trains the same MLP with DistributedDataParallel for 20 steps on its
half of every batch, with SGD (momentum) and with Adam; rank 0 also trains a copy alone on the
whole batches. Printed last, one line: the largest relative difference between the 2-rank
parameters and the 1-process ones (max over tensors of max|a - b| / max|b|; must be <= 1e-6) and
whether both ranks hold bit-identical parameters. Exit status 0 only when both hold.
Devices: the NumPy backend, and the first OpenCL device too when there is one (``--devices``).
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
SIZES = (64, 48, 10)
TOLERANCE = 1e-6


# ---- the worker (one MPI rank) -------------------------------------------------------------------
class MLP:
    """64-48-10 ReLU MLP on netcl.autograd ops (the check does not depend on netcl.nn)."""

    def __init__(self, device, seed: int) -> None:
        import netcl.autograd as ag

        rng = np.random.default_rng(seed)
        shapes = [(SIZES[0], SIZES[1]), (1, SIZES[1]), (SIZES[1], SIZES[2]), (1, SIZES[2])]
        names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
        self._named = []
        for name, shape in zip(names, shapes, strict=True):
            values = rng.normal(0.0, 1.0 / np.sqrt(shape[0] if shape[0] > 1 else SIZES[1]), shape)
            self._named.append((name, ag.tensor(values.astype(np.float32), requires_grad=True, device=device)))

    def named_parameters(self):
        return iter(self._named)

    def parameters(self):
        return (p for _, p in self._named)

    def __call__(self, x):
        import netcl.autograd as ag

        w1, b1, w2, b2 = (p for _, p in self._named)
        return ag.relu(x @ w1 + b1) @ w2 + b2


class _SGD:
    """SGD with momentum on runtime ops (netcl.optim is not a dependency of this check yet)."""

    def __init__(self, params, lr: float, momentum: float) -> None:
        self.params, self.lr, self.momentum, self.buffers = params, lr, momentum, {}

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad, p.value.grad = None, None

    def step(self) -> None:
        from netcl.runtime import ops as R  # noqa: N812

        for p in self.params:
            buf = self.buffers.get(id(p))
            buf = p.grad if buf is None else R.add(R.mul(buf, self.momentum), p.grad)
            self.buffers[id(p)] = buf
            R.add_(p.value, R.mul(buf, -self.lr))


class _Adam(_SGD):
    """Adam on runtime ops."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr, 0.0)
        self.betas, self.eps, self.t, self.m, self.v = betas, eps, 0, {}, {}

    def step(self) -> None:
        from netcl.runtime import ops as R  # noqa: N812

        self.t += 1
        b1, b2 = self.betas
        for p in self.params:
            g = p.grad
            m = R.mul(g, 1 - b1) if id(p) not in self.m else R.add(R.mul(self.m[id(p)], b1), R.mul(g, 1 - b1))
            v = R.mul(R.mul(g, g), 1 - b2)
            if id(p) in self.v:
                v = R.add(R.mul(self.v[id(p)], b2), v)
            self.m[id(p)], self.v[id(p)] = m, v
            denom = R.add(R.sqrt(R.mul(v, 1.0 / (1 - b2**self.t))), self.eps)
            R.add_(p.value, R.mul(R.div(m, denom), -self.lr / (1 - b1**self.t)))


def _optimizer(kind: str, params):
    if kind == "sgd":
        return _SGD(params, lr=0.05, momentum=0.9)
    return _Adam(params, lr=1e-3)


def _batches(device):
    import netcl.autograd as ag

    rng = np.random.default_rng(1234)
    for _ in range(STEPS):
        x = rng.normal(size=(2 * BATCH_PER_RANK, SIZES[0])).astype(np.float32)
        y = rng.integers(0, SIZES[2], size=2 * BATCH_PER_RANK).astype(np.int32)
        yield ag.tensor(x, device=device), ag.tensor(y, device=device), x, y


def _train(model, optimizer, device, shard: slice | None) -> None:
    import netcl.autograd as ag

    for x, y, x_host, y_host in _batches(device):
        if shard is not None:
            x, y = ag.tensor(x_host[shard], device=device), ag.tensor(y_host[shard], device=device)
        optimizer.zero_grad()
        with ag.Tape():
            loss = ag.cross_entropy(model(x), y)
            loss.backward()
        optimizer.step()


def _relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max|a - b| / max|b| over one tensor."""
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def worker(devices: list[str]) -> None:
    from netcl.nn.parallel import DistributedDataParallel
    from netcl.runtime import distributed as dist

    info = dist.init(device="cpu")
    report = []
    for spec in devices:
        from netcl.core import get_device

        device = get_device(spec)
        for kind in ("sgd", "adam"):
            # different seeds per rank: DDP must broadcast rank 0's initial parameters
            model = MLP(device, seed=100 + info.rank)
            ddp = DistributedDataParallel(model)
            shard = slice(info.rank * BATCH_PER_RANK, (info.rank + 1) * BATCH_PER_RANK)
            _train(ddp, _optimizer(kind, list(model.parameters())), device, shard)
            mine = [p.to_host() for p in model.parameters()]
            everyone = dist.all_gather_object(mine)
            if info.rank == 0:
                reference = MLP(device, seed=100)
                _train(reference, _optimizer(kind, list(reference.parameters())), device, None)
                ref = [p.to_host() for p in reference.parameters()]
                rel = max(_relative_difference(a, b) for a, b in zip(mine, ref, strict=True))
                identical = all(
                    all(
                        np.array_equal(a.view(np.uint32), b.view(np.uint32))
                        for a, b in zip(everyone[0], other, strict=True)
                    )
                    for other in everyone[1:]
                )
                report.append({"device": spec, "optimizer": kind, "max_rel_diff": rel, "bit_identical": identical})
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

    return ["cpu", "opencl"] if any(d.kind == "opencl" for d in nc.devices()) else ["cpu"]


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
        print(
            f"  {row['device']:>7} {row['optimizer']:>5}: max relative difference {row['max_rel_diff']:.3g}, "
            f"ranks bit-identical: {row['bit_identical']}"
        )
    worst = max(row["max_rel_diff"] for row in report)
    identical = all(row["bit_identical"] for row in report)
    ok = worst <= TOLERANCE and identical
    print(
        f"distributed-check: {ranks} ranks vs 1 process, {STEPS} steps, SGD and Adam on {'+'.join(devices)}: "
        f"max relative difference {worst:.3g} (limit {TOLERANCE:g}), all ranks bit-identical: {identical} -> "
        f"{'PASS' if ok else 'FAIL'}"
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
