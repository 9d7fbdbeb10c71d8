"""Train the digits CNN data-parallel over MPI ranks: ``mpiexec -n 2 python examples/train_distributed.py``.

The model and data are those of examples/train_digits_cnn.py (scikit-learn's bundled 8x8 digits,
conv-relu-pool twice then a linear layer). Every rank holds a full replica on its own device
(``netcl.runtime.distributed.init``: GPU ``local_rank % n_gpus`` on a multi-GPU host, else the
default device). ``netcl.train.Trainer`` sees the MPI world and does the rest: it wraps the model in
``DistributedDataParallel`` (rank 0's weights broadcast, gradients averaged during the backward),
gives the loader a ``DistributedSampler`` (each rank trains on its shard of each epoch), and
captures and replays the step. All replicas take the same optimizer steps and stay bit-identical
(checked at the end). Rank 0 prints and saves.

``--loop manual`` runs the same training as a hand-written loop, to show what the Trainer does under
MPI: the ``DistributedDataParallel`` wrapper, the sampler's ``set_epoch``, one eager step per batch.

Run: ``mpiexec -n 2 python examples/train_distributed.py [--optimizer sgd|adam] [--epochs 6]
[--batch-size 16 (per rank)] [--device cpu] [--loop trainer|manual]``; ``-n 1`` trains alone with
the same code.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from train_digits_cnn import (  # the same model, data and scoring as the one-process example
    StopAfter,
    accuracy,
    digits_cnn,
    load_data,
    profiled,
)

import netcl.autograd as ag
import netcl.nn as nn
from netcl.data import DataLoader, DistributedSampler, TensorDataset
from netcl.nn.parallel import DistributedDataParallel
from netcl.optim import SGD, Adam, CosineAnnealingLR
from netcl.profiler import record_function
from netcl.runtime import distributed as dist
from netcl.train import Callback, Trainer


class EpochReport(Callback):
    """Rank 0 prints each epoch's mean loss (its shard), the test accuracy and the images/s of all ranks."""

    def __init__(self, say, test_accuracy, images_per_step: int) -> None:
        self.say, self.test_accuracy, self.images_per_step = say, test_accuracy, images_per_step
        self.start, self.steps, self.last = time.perf_counter(), 0, 0.0

    def on_epoch_end(self, trainer: Trainer, logs: dict[str, float]) -> None:
        self.epoch_done(int(logs["epoch"]), logs["loss"], trainer.global_step)

    def epoch_done(self, epoch: int, loss: float, steps: int) -> None:
        self.last = self.test_accuracy()
        rate = (steps - self.steps) * self.images_per_step / (time.perf_counter() - self.start)
        self.say(f"epoch {epoch + 1}: loss {loss:.4f}  test accuracy {self.last:.2%}  ({rate:.0f} images/s, all ranks)")
        self.start, self.steps = time.perf_counter(), steps


def fit_with_trainer(args, model, opt, schedule, loader, report: EpochReport) -> int:
    """The Trainer: DistributedDataParallel and the loader's DistributedSampler come from the MPI world."""
    trainer = Trainer(model, opt, ag.cross_entropy, scheduler=schedule, replay=args.replay, progress=False)
    trainer.fit(loader, args.epochs, callbacks=[report, StopAfter(args.max_steps)])
    return trainer.global_step


def fit_by_hand(args, model, opt, schedule, loader, report: EpochReport) -> int:
    """The same training written out: what the Trainer does under MPI, one eager step per batch."""
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's weights; averages gradients in the backward
    sampler = DistributedSampler(len(loader.dataset), shuffle=True, seed=args.seed)  # this rank's shard
    shard = DataLoader(loader.dataset, batch_size=args.batch_size, sampler=sampler, device=loader.device)
    steps = 0
    for epoch in range(args.epochs):
        shard.set_epoch(epoch)  # reaches the sampler: every epoch is a new shuffle, the same on every rank
        for x, y in shard:
            with record_function(f"step {steps}"):  # a range in the trace of --profile (free without one)
                with ag.Tape() as tape:
                    loss = ag.cross_entropy(ddp(x), y)
                tape.backward(loss)  # gradients are averaged over the ranks during this backward
                opt.step()
                opt.zero_grad()
            steps += 1
            if args.max_steps is not None and steps >= args.max_steps:
                break
        schedule.step()
        report.epoch_done(epoch, loss.item(), steps)  # the last step's loss (the Trainer reports the mean)
        if args.max_steps is not None and steps >= args.max_steps:
            break
    return steps


def train(args: argparse.Namespace) -> dict[str, float]:
    info = dist.init(device=args.device)
    device, main = info.device, info.rank == 0
    say = print if main else (lambda *a, **k: None)
    if args.profile and not main:  # read by ``profiled`` when the run is over
        args.profile = f"{args.profile}.rank{info.rank}"
    ag.manual_seed(args.seed + info.rank)  # replicas start apart on purpose: DDP broadcasts rank 0's weights
    x_train, y_train, x_test, y_test = load_data(args.seed)
    model = digits_cnn(device)
    params = list(model.parameters())
    opt = SGD(params, lr=0.05, momentum=0.9) if args.optimizer == "sgd" else Adam(params, lr=3e-3)
    schedule = CosineAnnealingLR(opt, T_max=args.epochs)
    # the whole training set; each rank trains on its shard of every epoch (a DistributedSampler)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True, seed=args.seed,
                        device=device)  # fmt: skip
    say(
        f"{info.world_size} ranks, {sum(p.size for p in params)} parameters, {type(opt).__name__}, "
        f"{args.batch_size} images per rank per step; rank 0 on {device}"
    )
    report = EpochReport(say, lambda: accuracy(model, x_test, y_test, device), args.batch_size * info.world_size)
    start = time.perf_counter()
    fit = fit_with_trainer if args.loop == "trainer" else fit_by_hand
    steps = fit(args, model, opt, schedule, loader, report)
    elapsed = time.perf_counter() - start
    test_acc = report.last
    replicas = dist.all_gather_object([p.to_host() for p in params])
    identical = all(all(a.tobytes() == b.tobytes() for a, b in zip(replicas[0], r, strict=True)) for r in replicas)
    if not identical:
        raise RuntimeError("the replicas diverged: DistributedDataParallel should keep them bit-identical")
    if main:
        path = args.checkpoint or os.path.join(tempfile.mkdtemp(prefix="netcl-ddp-"), "digits_cnn.safetensors")
        nn.save(model.state_dict(), path)
        say(f"checkpoint saved to {path}")
    say(f"test accuracy {test_acc:.2%} after {steps} steps ({elapsed:.1f} s); {info.world_size} replicas bit-identical")
    dist.barrier()
    return {"test_accuracy": test_acc, "steps": steps}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--device", default=None, help="device spec for every rank (default: GPU per rank, else default)"
    )
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16, help="images per rank per step")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (quick runs)")
    parser.add_argument("--checkpoint", default=None, help="where rank 0 saves the weights (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--loop", choices=["trainer", "manual"], default="trainer", help="netcl.train.Trainer, or the loop by hand"
    )
    parser.add_argument("--replay", choices=["auto", "off"], default="auto", help="the Trainer captures the step")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PATH",
        help="write a Chrome trace of the run (netcl.profiler); rank r > 0 writes PATH.rank<r>",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    profiled(parse_args(), train)
