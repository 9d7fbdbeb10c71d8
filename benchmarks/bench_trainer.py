"""The ``trainer`` workload: the Trainer's replayed step against a hand-captured ``fuse_graph`` step.

The model is the digits CNN (conv 32 -> relu -> pool -> conv 64 -> relu -> pool -> linear 10) on
batches of 8x8 images (256 on a GPU, 32 with ``--quick`` or off a GPU), Adam. Both sides replay the
same kind of captured step on batches already on the device:

- **hand**: ``graph = fuse_graph(model, x, y, cross_entropy, optimizer_step=opt.step)``, then
  ``graph.execute(x, y)`` per step (the loss Node dropped);
- **Trainer**: ``Trainer(model, opt, cross_entropy)`` driven through its per-batch path (signature
  check, replay, the loss appended to the device-side log), the capture done in the warm-up.

Wall-clock ms per step (queue finished at the end), median over repeats of ``steps`` steps each.
Target: Trainer / hand <= 1.05. Run alone (``python benchmarks/bench_trainer.py [--quick] [--device
SPEC]``) or as ``hatch run bench --workload trainer``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import standalone_parser, write_results

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl.jit import fuse_graph
from netcl.optim import Adam
from netcl.train import Trainer

TARGET = 1.05


def digits_cnn(device: nc.Device) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, device=device),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, device=device),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(256, 10, device=device),
    )


def _is_gpu(device: nc.Device) -> bool:
    import pyopencl as cl

    return device.kind == "opencl" and bool(device.cl_device.type & cl.device_type.GPU)


def _finish(device: nc.Device) -> None:
    if device.kind == "opencl":
        device.queue.finish()


def _batches(device: nc.Device, batch: int, count: int) -> list[tuple[nc.Tensor, nc.Tensor]]:
    rng = np.random.default_rng(0)
    return [
        (
            nc.Tensor.from_host(device, rng.random((batch, 1, 8, 8), dtype=np.float32)),
            nc.Tensor.from_host(device, rng.integers(0, 10, batch).astype(np.int32)),
        )
        for _ in range(count)
    ]


def run(device_spec: str | None = None, quick: bool = False, repeats: int | None = None) -> dict:
    device = nc.get_device(device_spec)
    batch = 256 if _is_gpu(device) and not quick else 32
    steps, repeats = (20, repeats or 3) if quick else (100, repeats or 7)
    batches = _batches(device, batch, 8)
    print(f"trainer: the digits CNN step (batch {batch}, Adam) replayed on {device!r}, {steps} steps x {repeats}")

    ag.manual_seed(0)
    model = digits_cnn(device)
    opt = Adam(model.parameters(), lr=1e-3)
    graph = fuse_graph(model, batches[0][0], batches[0][1], ag.cross_entropy, optimizer_step=opt.step)

    def hand() -> None:
        for i in range(steps):
            x, y = batches[i % len(batches)]
            graph.execute(x, y)

    ag.manual_seed(0)
    t_model = digits_cnn(device)
    trainer = Trainer(t_model, Adam(t_model.parameters(), lr=1e-3), ag.cross_entropy, progress=False)
    trainer._start_log(steps)
    for x, y in batches[:2]:  # the second sight of the signature captures the step
        trainer._train_batch(x, y, 0, steps)
    assert trainer._graph is not None

    def with_trainer() -> None:
        trainer._start_log(steps)
        for i in range(steps):
            x, y = batches[i % len(batches)]
            trainer._train_batch(x, y, i, steps)

    times: dict[str, list[float]] = {"hand fuse_graph": [], "Trainer": []}
    for fn in (hand, with_trainer):  # warm-up
        fn()
        _finish(device)
    for _ in range(repeats):  # interleaved, so drift hits both sides alike
        for label, fn in (("hand fuse_graph", hand), ("Trainer", with_trainer)):
            _finish(device)
            start = time.perf_counter()
            fn()
            _finish(device)
            times[label].append((time.perf_counter() - start) / steps * 1e3)
    medians = {label: statistics.median(values) for label, values in times.items()}
    for label, ms in medians.items():
        print(f"  {label:<20}{ms:>10.3f} ms/step")
    ratio = medians["Trainer"] / medians["hand fuse_graph"]
    print(f"  Trainer / hand = {ratio:.3f} (target <= {TARGET}: {'met' if ratio <= TARGET else 'not met'})")
    return {"device": repr(device), "batch": batch, "ms_per_step": medians, "ratio": ratio}


def main() -> None:
    args = standalone_parser(__doc__).parse_args()
    write_results(run(args.device, args.quick, args.repeats), args.json_path)


if __name__ == "__main__":
    main()
