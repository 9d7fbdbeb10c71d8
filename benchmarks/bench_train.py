"""The ``train`` workload: milliseconds per training step, eager and replayed, with torch as the peer.

Two steps at batch 128: an MLP 784-512-512-10 (ReLU) with SGD (momentum 0.9), and the digits CNN
of ``examples/train_digits_cnn.py`` (8x8 inputs, conv-relu-pool x2, linear) with Adam. Each step is
forward, cross-entropy, backward and the optimizer update, on random data. Variants:

- ``netcl eager``: ``Tape`` + ``backward`` + ``opt.step()`` + ``opt.zero_grad()`` every step;
- ``netcl replayed``: the step captured once by ``fuse_graph(..., optimizer_step=opt.step)`` and
  replayed per step (on the NumPy backend there is nothing to capture: it runs the jitted step);
- ``torch eager`` and, on CUDA, ``torch CUDA graph`` (the whole step captured with
  ``torch.cuda.graph``), when torch is importable.

Times are wall-clock per step (median of repeats of ``STEPS`` back-to-back steps, the device
drained at the end of each repeat), so host overhead counts, as it does in training. Run alone
(``python benchmarks/bench_train.py [--quick] [--device SPEC]``) or as
``hatch run bench --workload train``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl.optim import SGD, Adam

BATCH = 128
STEPS = 10


def mlp(device) -> nn.Module:
    return nn.Sequential(
        nn.Linear(784, 512, device=device),
        nn.ReLU(),
        nn.Linear(512, 512, device=device),
        nn.ReLU(),
        nn.Linear(512, 10, device=device),
    )


def workloads(device) -> list[tuple[str, nn.Module, Callable, tuple[int, ...]]]:
    """(name, model, optimizer factory, input shape) of each training step."""
    from train_digits_cnn import digits_cnn

    return [
        ("mlp 784-512-512-10, SGD", mlp(device), lambda p: SGD(p, lr=0.01, momentum=0.9), (BATCH, 784)),
        ("digits CNN, Adam", digits_cnn(device), lambda p: Adam(p, lr=1e-3), (BATCH, 1, 8, 8)),
    ]


def _per_step_ms(step: Callable[[], object], sync: Callable[[], None], repeats: int) -> float:
    for _ in range(3):  # warm-up: programs built, buffers pooled
        step()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        sync()
        samples.append((time.perf_counter() - start) * 1e3 / STEPS)
    return statistics.median(samples)


def netcl_variants(device, model, make_opt, x_host, y_host, repeats) -> dict[str, float]:
    sync = device.queue.finish if device.kind == "opencl" else (lambda: None)
    x, y = ag.tensor(x_host, device=device), ag.tensor(y_host, device=device)
    opt = make_opt(model.parameters())

    def eager() -> None:
        opt.zero_grad()
        with ag.Tape() as tape:
            loss = ag.cross_entropy(model(x), y)
        tape.backward(loss)
        opt.step()

    results = {"netcl eager": _per_step_ms(eager, sync, repeats)}
    from netcl.jit import fuse_graph

    graph = fuse_graph(model, x, y, ag.cross_entropy, optimizer_step=opt.step)
    results["netcl replayed"] = _per_step_ms(lambda: graph.execute(x, y), sync, repeats)
    return results


def _torch():
    try:
        import torch
    except Exception:
        return None
    return torch


def torch_variants(torch, name, x_host, y_host, repeats) -> dict[str, float]:
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    tnn = torch.nn
    if name.startswith("mlp"):
        model = tnn.Sequential(tnn.Linear(784, 512), tnn.ReLU(), tnn.Linear(512, 512), tnn.ReLU(), tnn.Linear(512, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        model = tnn.Sequential(
            tnn.Conv2d(1, 32, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
            tnn.Conv2d(32, 64, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
            tnn.Flatten(), tnn.Linear(256, 10),
        )  # fmt: skip
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=cuda)
    model = model.to(dev)
    x = torch.from_numpy(x_host).to(dev)
    y = torch.from_numpy(y_host.astype(np.int64)).to(dev)
    loss_fn = tnn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    results = {"torch eager": _per_step_ms(step, sync, repeats)}
    if cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            loss_fn(model(x), y).backward()
            opt.step()
        results["torch CUDA graph"] = _per_step_ms(graph.replay, sync, repeats)
    return results


def run(device_spec: str | None = None, quick: bool = False, repeats: int | None = None, peers: bool = True) -> dict:
    device = nc.get_device(device_spec)
    repeats = repeats or (3 if quick else 10)
    torch = _torch() if peers else None
    peer = "none" if torch is None else f"torch {torch.__version__} on {'CUDA' if torch.cuda.is_available() else 'CPU'}"
    print(f"train: ms per training step at batch {BATCH} on {device!r} (peer: {peer})")
    rng = np.random.default_rng(0)
    results: dict = {"device": repr(device), "batch": BATCH, "rows": []}
    header = f"{'workload':<28}{'variant':<20}{'ms/step':>10}"
    print(header)
    print("-" * len(header))
    for name, model, make_opt, shape in workloads(device):
        x_host = rng.normal(size=shape).astype(np.float32)
        y_host = rng.integers(0, 10, BATCH).astype(np.int32)
        times = netcl_variants(device, model, make_opt, x_host, y_host, repeats)
        if torch is not None:
            times.update(torch_variants(torch, name, x_host, y_host, repeats))
        for variant, ms in times.items():
            print(f"{name:<28}{variant:<20}{ms:>10.3f}", flush=True)
        ratio = times["netcl eager"] / times["netcl replayed"]
        print(f"{'':<28}replay speed-up {ratio:.2f}x over netcl eager")
        results["rows"].append({"workload": name, "ms_per_step": times})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    results = run(args.device, args.quick, args.repeats, not args.no_peers)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
