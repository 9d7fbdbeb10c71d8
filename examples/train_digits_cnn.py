"""Train a small CNN on scikit-learn's bundled 8x8 digits with netcl.nn and netcl.optim.

The model is PyTorch-shaped (conv-relu-pool twice, then a linear layer); ``netcl.train.Trainer``
runs the loop: shuffled minibatches from a ``netcl.data.DataLoader``, SGD with momentum or Adam
under a cosine learning-rate schedule, the step captured once and replayed (``--replay off``: eager
steps), a tqdm progress bar (steps/s, samples/s, loss) and the test accuracy after every epoch.
At the end the weights are saved as a safetensors checkpoint, loaded into a fresh model and
evaluated again: the accuracy must be identical.
No download: ``load_digits`` ships with scikit-learn (install the ``examples`` extra).

Run: ``python examples/train_digits_cnn.py [--optimizer sgd|adam] [--epochs 8] [--device cpu]
[--trainer-checkpoint PATH]`` (the last saves the Trainer after every epoch and resumes from it
when the file exists: an interrupted run continues bit-identically).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time

import numpy as np

import netcl.autograd as ag
import netcl.nn as nn
from netcl.core import get_device
from netcl.data import DataLoader, TensorDataset
from netcl.optim import SGD, Adam, CosineAnnealingLR
from netcl.profiler import profile
from netcl.train import Callback, Checkpoint, Trainer
from netcl.train import accuracy as accuracy_metric


def digits_cnn(device=None) -> nn.Module:
    """(N, 1, 8, 8) -> conv 32 -> relu -> pool -> conv 64 -> relu -> pool -> (N, 256) -> 10 logits."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, device=device),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, device=device),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 2 * 2, 10, device=device),
    )


def load_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): images scaled to [0, 1] as (N, 1, 8, 8), a stratified 80/20 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return x_train, y_train, x_test, y_test


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, device, batch_size: int = 256) -> float:
    """Fraction of ``x`` classified as ``y`` (eval mode, no gradients)."""
    model.eval()
    correct = 0
    with ag.no_grad():
        for start in range(0, len(x), batch_size):
            logits = model(ag.tensor(x[start : start + batch_size], device=device)).to_host()
            correct += int(np.sum(logits.argmax(axis=1) == y[start : start + batch_size]))
    model.train()
    return correct / len(x)


def make_optimizer(name: str, params, lr: float | None):
    if name == "sgd":
        return SGD(params, lr=0.1 if lr is None else lr, momentum=0.9)
    return Adam(params, lr=5e-3 if lr is None else lr)


class StopAfter(Callback):
    """End training after ``max_steps`` optimizer steps (the epoch in progress ends there)."""

    def __init__(self, max_steps: int | None) -> None:
        self.max_steps = max_steps

    def on_step_end(self, trainer: Trainer, step: dict[str, int]) -> None:
        if self.max_steps is not None and step["step"] >= self.max_steps:
            trainer.should_stop = True


class Report(Callback):
    """One line per epoch: the mean training loss, the test accuracy, steps per second."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.steps = 0

    def on_epoch_end(self, trainer: Trainer, logs: dict[str, float]) -> None:
        rate = (trainer.global_step - self.steps) / max(time.perf_counter() - self.start, 1e-9)
        print(f"epoch {int(logs['epoch']) + 1}: loss {logs['loss']:.4f}  test accuracy {logs['accuracy']:.2%}  "
              f"({rate:.1f} steps/s)")  # fmt: skip
        self.start, self.steps = time.perf_counter(), trainer.global_step


def train(args: argparse.Namespace) -> dict[str, float]:
    device = get_device(args.device)
    ag.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    train_loader = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True,
                              seed=args.seed, device=device)  # fmt: skip
    test_loader = DataLoader(TensorDataset(x_test, y_test), batch_size=256, device=device)
    model = digits_cnn(device)
    opt = make_optimizer(args.optimizer, model.parameters(), args.lr)
    schedule = CosineAnnealingLR(opt, T_max=args.epochs)  # the lr decays to 0 over the run, per epoch
    options = {"scheduler": schedule, "replay": args.replay, "progress": not args.quiet}
    if args.trainer_checkpoint and os.path.exists(args.trainer_checkpoint):
        trainer = Trainer.resume(args.trainer_checkpoint, model, opt, ag.cross_entropy, **options)
        print(f"resumed from {args.trainer_checkpoint} at epoch {trainer.epoch}, step {trainer.global_step}")
    else:
        trainer = Trainer(model, opt, ag.cross_entropy, **options)
    print(f"training {sum(p.size for p in model.parameters())} parameters with {type(opt).__name__} on {device}")
    callbacks: list[Callback] = [Report(), StopAfter(args.max_steps)]
    if args.trainer_checkpoint:
        callbacks.append(Checkpoint(args.trainer_checkpoint))
    start = time.perf_counter()
    trainer.fit(train_loader, args.epochs, val_loader=test_loader, metrics={"accuracy": accuracy_metric},
                callbacks=callbacks)  # fmt: skip
    elapsed = time.perf_counter() - start
    test_acc = accuracy(model, x_test, y_test, device)

    path = args.checkpoint or os.path.join(tempfile.mkdtemp(prefix="netcl-digits-"), "digits_cnn.safetensors")
    nn.save(model.state_dict(), path)
    reloaded = digits_cnn(device)
    reloaded.load_state_dict(nn.load(path))
    reloaded_acc = accuracy(reloaded, x_test, y_test, device)
    if reloaded_acc != test_acc:
        raise RuntimeError(f"the reloaded checkpoint scores {reloaded_acc:.2%}, the trained model {test_acc:.2%}")
    steps = trainer.global_step
    print(f"test accuracy {test_acc:.2%} after {steps} steps ({elapsed:.1f} s) on {device.spec}")
    print(f"checkpoint {path} reloaded: test accuracy {reloaded_acc:.2%} (identical)")
    return {"test_accuracy": test_acc, "reloaded_accuracy": reloaded_acc, "steps": steps}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="NETCL_DEVICE-style spec: gpu, opencl, cpu, P:D")
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam", help="Adam, or SGD with momentum 0.9")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default 5e-3 Adam, 0.1 SGD)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (quick runs)")
    parser.add_argument("--checkpoint", default=None, help="where to save the weights (default: a temp dir)")
    parser.add_argument(
        "--trainer-checkpoint", default=None, metavar="PATH", help="save the Trainer here each epoch; resume from it"
    )
    parser.add_argument("--replay", choices=["auto", "off"], default="auto", help="capture and replay the step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--profile", default=None, metavar="PATH", help="write a Chrome trace of the run (netcl.profiler; few steps)"
    )
    return parser.parse_args(argv)


def profiled(args: argparse.Namespace, run) -> dict[str, float]:
    """``run(args)``, inside a ``netcl.profiler.profile`` when ``--profile PATH`` was given: then its top
    kernels are printed and the Chrome trace is written to PATH."""
    with profile() if args.profile else contextlib.nullcontext() as prof:
        result = run(args)
    if prof is not None:
        print(prof.key_averages().table(sort_by="device_time", row_limit=15))
        prof.export_chrome_trace(args.profile)
        print(f"wrote the Chrome trace to {args.profile} (open it in https://ui.perfetto.dev)")
    return result


if __name__ == "__main__":
    args = parse_args()
    profiled(args, train)
