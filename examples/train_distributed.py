"""Train the digits CNN data-parallel over MPI ranks: ``mpiexec -n 2 python examples/train_distributed.py``.

The model and data are those of examples/train_digits_cnn.py (scikit-learn's bundled 8x8 digits,
conv-relu-pool twice then a linear layer). Every rank holds a full replica on its own device
(``netcl.runtime.distributed.init``: GPU ``local_rank % n_gpus`` on a multi-GPU host, else the
default device), trains on its shard of each epoch (``DistributedSampler``), and
``DistributedDataParallel`` averages the gradients during the backward, so all replicas take the
same optimizer steps and stay bit-identical (checked at the end). Rank 0 prints and saves.

Run: ``mpiexec -n 2 python examples/train_distributed.py [--optimizer sgd|adam] [--epochs 6]
[--batch-size 16 (per rank)] [--device cpu]``; ``-n 1`` trains alone with the same code.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from train_digits_cnn import (  # the same model, data and scoring as the one-process example
    accuracy,
    digits_cnn,
    load_data,
    profiled,
)

import netcl.autograd as ag
import netcl.nn as nn
from netcl.nn.parallel import DistributedDataParallel, DistributedSampler
from netcl.optim import SGD, Adam, CosineAnnealingLR
from netcl.profiler import record_function
from netcl.runtime import distributed as dist


def train(args: argparse.Namespace) -> dict[str, float]:
    info = dist.init(device=args.device)
    device, main = info.device, info.rank == 0
    say = print if main else (lambda *a, **k: None)
    if args.profile and not main:  # read by ``profiled`` when the run is over
        args.profile = f"{args.profile}.rank{info.rank}"
    ag.manual_seed(args.seed + info.rank)  # replicas start apart on purpose: DDP broadcasts rank 0's weights
    x_train, y_train, x_test, y_test = load_data(args.seed)
    model = digits_cnn(device)
    ddp = DistributedDataParallel(model)
    params = list(model.parameters())
    opt = SGD(params, lr=0.05, momentum=0.9) if args.optimizer == "sgd" else Adam(params, lr=3e-3)
    schedule = CosineAnnealingLR(opt, T_max=args.epochs)
    sampler = DistributedSampler(len(x_train), shuffle=True, seed=args.seed)
    say(
        f"{info.world_size} ranks, {sum(p.size for p in params)} parameters, {type(opt).__name__}, "
        f"{args.batch_size} images per rank per step; rank 0 on {device}"
    )
    steps, start, test_acc = 0, time.perf_counter(), 0.0
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        order = sampler.indices()
        epoch_start = time.perf_counter()
        for first in range(0, len(order), args.batch_size):
            with record_function(f"step {steps}"):  # a range in the trace of --profile (free without one)
                index = order[first : first + args.batch_size]
                with ag.Tape() as tape:
                    loss = ag.cross_entropy(ddp(ag.tensor(x_train[index], device=device)), y_train[index])
                tape.backward(loss)  # gradients are averaged over the ranks during this backward
                opt.step()
                opt.zero_grad()
            steps += 1
            if args.max_steps is not None and steps >= args.max_steps:
                break
        schedule.step()
        test_acc = accuracy(model, x_test, y_test, device)
        images = min(len(order), steps * args.batch_size) * info.world_size / (time.perf_counter() - epoch_start)
        say(f"epoch {epoch}: loss {loss.item():.4f}  test accuracy {test_acc:.2%}  ({images:.0f} images/s, all ranks)")
        if args.max_steps is not None and steps >= args.max_steps:
            break
    elapsed = time.perf_counter() - start
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
        "--profile",
        default=None,
        metavar="PATH",
        help="write a Chrome trace of the run (netcl.profiler); rank r > 0 writes PATH.rank<r>",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    profiled(parse_args(), train)
