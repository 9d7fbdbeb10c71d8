"""Train a character-level GPT on the Python standard library's own source files, then sample from it.

No download: the text is the ``*.py`` files of the running interpreter's standard library (found
through ``sysconfig``). The split is fixed by file: a file goes to validation when the CRC-32 of
its name is 0 mod 10, so it is the same on every machine with the same files. Characters are
tab, newline and printable ASCII; anything else (each byte of a non-ASCII character) is one
"unknown" token, so the vocabulary (98 tokens) does not depend on the data.

``netcl.train.Trainer`` runs the loop: each epoch is ``--steps-per-epoch`` AdamW steps on batches of
random windows of ``--block-size`` characters from a ``netcl.data.DataLoader`` (``Windows``, a
dataset whose ``gather_batch`` cuts a whole batch of windows in one NumPy gather), the step captured
once and replayed (``--replay off``: eager), a tqdm progress bar; then the validation loss and
perplexity over fixed windows. The
weights (and the model configuration, in the file's metadata) are saved as a safetensors
checkpoint. ``--sample "prompt"`` continues a prompt with the key/value cache, one decode step
captured once and replayed for every position (``--eager-sample`` runs it eagerly).

Run: ``python examples/train_gpt.py [--epochs 5] [--device cpu] [--sample "def "]``;
``--max-steps 3`` finishes in seconds on the CPU; ``--load ckpt --max-steps 0 --sample "import "`` only samples.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import sysconfig
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

import netcl.autograd as ag
import netcl.nn as nn
from netcl.core import get_device
from netcl.data import DataLoader, Dataset, RandomSampler
from netcl.nn.generation import Decoder
from netcl.optim import AdamW
from netcl.train import Callback, Trainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GPT  # examples/gpt.py, next to this file

#: token id -> character; the last id is "unknown"
CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127))
UNKNOWN = len(CHARS)
VOCAB = len(CHARS) + 1
_BYTE_TO_ID = np.full(256, UNKNOWN, np.int32)
for _i, _c in enumerate(CHARS):
    _BYTE_TO_ID[ord(_c)] = _i


def encode(text: str) -> np.ndarray:
    """Token ids (int32) of ``text``: one per byte of its UTF-8 form."""
    return _BYTE_TO_ID[np.frombuffer(text.encode("utf-8"), np.uint8)]


def decode(ids: np.ndarray) -> str:
    """Text of token ids (the unknown token prints as U+FFFD)."""
    return "".join(CHARS[i] if i < UNKNOWN else "\ufffd" for i in np.asarray(ids).tolist())


def stdlib_files() -> list[Path]:
    """The standard library's top-level ``*.py`` files, sorted by name."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def load_corpus() -> tuple[np.ndarray, np.ndarray, int, int]:
    """(train ids, validation ids, train file count, validation file count): the fixed split by file name."""
    train, val = [], []
    for path in stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        (val if zlib.crc32(path.name.encode()) % 10 == 0 else train).append(encode(text + "\n"))
    if not train or not val:
        raise RuntimeError(f"the standard library at {sysconfig.get_paths()['stdlib']} has too few *.py files")
    return np.concatenate(train), np.concatenate(val), len(train), len(val)


class Windows(Dataset):
    """Item ``i``: the ``length`` characters of ``data`` from ``starts[i]`` (int32) and the next character
    of each (the targets): a language model's input and target windows."""

    def __init__(self, data: np.ndarray, starts: np.ndarray, length: int) -> None:
        self.data, self.starts, self.length = data, np.asarray(starts, np.int64), length

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start = self.starts[i]
        chunk = self.data[start : start + self.length + 1]
        return chunk[:-1], chunk[1:]

    def gather_batch(self, indices, alloc) -> tuple[np.ndarray, np.ndarray]:
        """The windows at ``indices`` stacked into ``alloc``'s arrays in one gather (what the loader would
        stack item by item)."""
        rows = self.starts[np.asarray(indices)][:, None] + np.arange(self.length + 1)[None, :]
        chunk = self.data[rows]
        x, y = alloc((len(rows), self.length), np.dtype(np.int32)), alloc((len(rows), self.length), np.dtype(np.int32))
        np.copyto(x, chunk[:, :-1])
        np.copyto(y, chunk[:, 1:])
        return x, y


def lm_loss(logits: ag.Node, target) -> ag.Node:
    """Cross-entropy of ``(B, T, vocab)`` logits against ``(B, T)`` next-character targets."""
    count = int(np.prod(target.shape))
    return ag.cross_entropy(ag.reshape(logits, (count, VOCAB)), ag.reshape(target, (count,)))


def train_loader(data: np.ndarray, args: argparse.Namespace, device) -> DataLoader:
    """``--steps-per-epoch`` batches of windows at random starts, drawn anew each epoch (``set_epoch``)."""
    windows = Windows(data, np.arange(len(data) - args.block_size), args.block_size)
    sampler = RandomSampler(windows, replacement=True, num_samples=args.steps_per_epoch * args.batch_size,
                            seed=args.seed)  # fmt: skip
    return DataLoader(windows, batch_size=args.batch_size, sampler=sampler, device=device)


def val_loader(data: np.ndarray, args: argparse.Namespace, device) -> DataLoader:
    """``--val-batches`` batches of windows evenly spaced over the validation text."""
    starts = np.linspace(0, len(data) - args.block_size - 1, args.val_batches * args.batch_size).astype(np.int64)
    return DataLoader(Windows(data, starts, args.block_size), batch_size=args.batch_size, device=device)


class Report(Callback):
    """One line per epoch (the mean training loss, validation loss and perplexity, tokens/s); ends training
    after ``max_steps`` optimizer steps."""

    def __init__(self, tokens_per_step: int, max_steps: int | None) -> None:
        self.tokens_per_step, self.max_steps = tokens_per_step, max_steps
        self.start, self.steps = time.perf_counter(), 0

    def on_step_end(self, trainer: Trainer, step: dict[str, int]) -> None:
        if self.max_steps is not None and step["step"] >= self.max_steps:
            trainer.should_stop = True

    def on_epoch_end(self, trainer: Trainer, logs: dict[str, float]) -> None:
        rate = (trainer.global_step - self.steps) * self.tokens_per_step / max(time.perf_counter() - self.start, 1e-9)
        print(
            f"epoch {int(logs['epoch']) + 1}: train loss {logs['loss']:.4f}  val loss {logs['val_loss']:.4f}  "
            f"val perplexity {math.exp(logs['val_loss']):.2f}  ({rate:.0f} tokens/s)"
        )
        self.start, self.steps = time.perf_counter(), trainer.global_step


def build_model(args: argparse.Namespace, device) -> GPT:
    if args.load:
        from safetensors import safe_open

        with safe_open(args.load, "np") as f:
            config = json.loads((f.metadata() or {}).get("config", "null") or "null")
        if not isinstance(config, dict):
            raise SystemExit(f"--load {args.load}: no model configuration in its metadata (not a train_gpt checkpoint)")
        model = GPT(**config, device=device)
        model.load_state_dict(nn.load(args.load))
        return model
    return GPT(VOCAB, args.block_size, args.d_model, args.n_head, args.n_layer, device=device)


def train(args: argparse.Namespace) -> dict[str, float]:
    device = get_device(args.device)
    ag.manual_seed(args.seed)
    model = build_model(args, device)
    args.block_size = model.max_len
    check_sample_args(args)
    train_ids, val_ids, n_train, n_val = load_corpus()
    opt = AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    n_params = sum(p.size for p in model.parameters())
    print(
        f"GPT of {n_params} parameters on {device.spec}: {len(train_ids)} training characters from {n_train} "
        f"stdlib files, {len(val_ids)} validation characters from {n_val}"
    )
    trainer = Trainer(model, opt, lm_loss, replay=args.replay, progress=not args.quiet)
    history = {}
    if args.max_steps != 0:
        history = trainer.fit(
            train_loader(train_ids, args, device),
            args.epochs,
            val_loader=val_loader(val_ids, args, device),
            callbacks=[Report(args.batch_size * args.block_size, args.max_steps)],
        )
    steps = trainer.global_step
    val_loss = history["val_loss"][-1] if history.get("val_loss") else float("nan")
    path = args.checkpoint or os.path.join(tempfile.mkdtemp(prefix="netcl-gpt-"), "gpt.safetensors")
    if steps:
        nn.save(model.state_dict(), path, metadata={"config": json.dumps(model.config)})
        print(f"checkpoint {path} ({steps} steps)")
    result = {"steps": steps, "val_loss": val_loss, "checkpoint": path if steps else None}
    if args.sample is not None:
        result["sample"] = sample(model, args, device)
    return result


def check_sample_args(args: argparse.Namespace) -> None:
    """Refuse a sample that cannot fit the model's positions before any training."""
    if args.sample is None:
        return
    prompt = len(args.sample.encode("utf-8"))
    if prompt == 0:
        raise SystemExit('--sample: the prompt must not be empty (try --sample "def ")')
    needed = prompt + args.sample_tokens
    if needed > args.block_size:
        raise SystemExit(
            f"--sample-tokens {args.sample_tokens} with a {prompt}-character prompt needs {needed} "
            f"positions; the model has {args.block_size} (--block-size)"
        )


def sample(model: GPT, args: argparse.Namespace, device) -> str:
    """Continue ``--sample`` by ``--sample-tokens`` characters with the key/value cache; print and return it."""
    model.eval()
    decoder = Decoder(model, 1, replay=not args.eager_sample, device=device)
    start = time.perf_counter()
    ids = decoder.generate(
        encode(args.sample)[None, :], args.sample_tokens, args.temperature, args.top_k or None, args.seed
    )
    elapsed = time.perf_counter() - start
    text = decode(ids[0])
    mode = "eager" if args.eager_sample else "replayed"
    print(f"sample ({args.sample_tokens} tokens, {mode} decode, {ids.shape[1] / max(elapsed, 1e-9):.0f} tokens/s):")
    print(text)
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="NETCL_DEVICE-style spec: gpu, opencl, cpu, P:D")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps-per-epoch", type=int, default=200)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in all (quick runs)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=128, help="context length (the model's max_len)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-head", type=int, default=8)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (weight decay 0.1)")
    parser.add_argument("--val-batches", type=int, default=8, help="validation batches per epoch")
    parser.add_argument("--checkpoint", default=None, help="where to save the weights (default: a temp dir)")
    parser.add_argument("--load", default=None, help="start from this checkpoint (its configuration wins)")
    parser.add_argument("--sample", default=None, metavar="PROMPT", help="after training, continue PROMPT")
    parser.add_argument("--sample-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 samples greedily")
    parser.add_argument("--top-k", type=int, default=20, help="sample among the k likeliest (0: all)")
    parser.add_argument("--eager-sample", action="store_true", help="decode eagerly instead of replaying one step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", choices=["auto", "off"], default="auto", help="capture and replay the step")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    for name in ("epochs", "steps_per_epoch", "batch_size", "block_size", "val_batches", "sample_tokens"):
        if getattr(args, name) < (0 if name in ("epochs", "sample_tokens") else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.max_steps is not None and args.max_steps < 0:
        parser.error(f"--max-steps must be >= 0, got {args.max_steps}")
    return args


if __name__ == "__main__":
    train(parse_args())
