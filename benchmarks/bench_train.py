"""The ``train`` workload: milliseconds per training step, eager and replayed, with torch as the peer.

Two steps at batch 128: an MLP 784-512-512-10 (ReLU) with SGD (momentum 0.9), and the digits CNN
of ``examples/train_digits_cnn.py`` (8x8 inputs, conv-relu-pool x2, linear) with Adam; each is
forward, cross-entropy, backward and the optimizer update, on random data. And a ResNet basic block
(conv3x3-bn-relu-conv3x3-bn, + identity, relu; no conv bias) with SGD (momentum 0.9) and an MSE loss
against a random target: batch 64, 64 channels, 56x56 on a GPU (batch 8, 16 channels, 16x16 with
``--quick`` or off a GPU), in float32 (torch: TF32 off), in float32 under the ``"tf32x3"`` matmul
precision where the device has tensor cores (netcl's convolutions as Winograd F(4x4) on tf32x3
products, the fp32 implicit GEMM's accuracy; torch: fp32, TF32 off), under the ``"high"`` matmul
precision (netcl's 3x3 convolutions as Winograd F(4x4) on tf32x3 products where the tensor cores
take them, or whichever of F(4x4) on bf16x3 and F(2x2) on tf32 a layer's search finds faster, else on
tf32 tensor cores; torch with its default, TF32 convolutions) and under ``amp``
(``autocast`` + ``GradScaler``; torch: the same with ``torch.autocast`` and
``torch.amp.GradScaler``). And ResNet-50's bottleneck block (conv1x1-bn-relu, conv3x3-bn-relu,
conv1x1-bn, + identity, relu) in float32: batch 64, 256 channels (64 inside), 56x56 on a GPU (batch
8, 32 channels, 16x16 otherwise). And two whole CIFAR-style networks of ``examples/resnet.py``
(32x32 inputs, cross-entropy, SGD with momentum 0.9): ResNet-8 (3x3 stem, three stride-2 basic
blocks with 1x1 shortcut convolutions, global pooling, linear) and ResNet-18, at batch 128 on a GPU
(batch 8 at an eighth of the width with ``--quick`` or off a GPU), each in float32 (torch: TF32 off),
under ``"high"`` (torch: TF32 matmuls and convolutions, its default at ``"high"``) and under amp;
the torch twin starts from netcl's initial weights (same state-dict keys). Variants:

- ``netcl eager``: ``Tape`` + ``backward`` + ``opt.step()`` + ``opt.zero_grad()`` every step;
- ``netcl replayed``: the step captured once by ``fuse_graph(..., optimizer_step=opt.step)`` and
  replayed per step (on the NumPy backend there is nothing to capture: it runs the jitted step);
  amp steps replay with ``GradScaler(capturable=True)`` (no host read of the inf flag);
- ``torch eager`` and, on CUDA, ``torch CUDA graph`` (the whole step captured with
  ``torch.cuda.graph``), when torch is importable (no CUDA graph of the amp steps).

On OpenCL each eager step is also broken down by kernel (device time of each kernel
name, from profiling events), to show where the time goes.

Times are wall-clock per step (median of repeats of ``STEPS`` back-to-back steps, the device
drained at the end of each repeat), so host overhead counts, as it does in training. Run alone
(``python benchmarks/bench_train.py [--quick] [--device SPEC]``) or as
``hatch run bench --workload train``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from measure import standalone_parser, write_results

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl import amp
from netcl.optim import SGD, Adam
from netcl.runtime.ops import gemm_mma, matmul_precision

BATCH = 128
STEPS = 10
#: (batch, channels, height = width) of the ResNet basic block step: full size on a GPU, else small.
BLOCK_FULL, BLOCK_SMALL = (64, 64, 56), (8, 16, 16)
#: the same for the bottleneck block (its inner width: a quarter of the channels)
BOTTLENECK_FULL, BOTTLENECK_SMALL = (64, 256, 56), (8, 32, 16)
#: (batch, width multiplier) of the whole-ResNet steps (32x32 inputs): full size on a GPU, else small.
RESNET_FULL, RESNET_SMALL = (BATCH, 1.0), (8, 0.125)
WIDTH = 48


def mlp(device) -> nn.Module:
    return nn.Sequential(
        nn.Linear(784, 512, device=device),
        nn.ReLU(),
        nn.Linear(512, 512, device=device),
        nn.ReLU(),
        nn.Linear(512, 10, device=device),
    )


class BasicBlock(nn.Module):
    """ResNet's basic block with an identity shortcut: relu(bn2(conv2(relu(bn1(conv1(x))))) + x)."""

    def __init__(self, channels: int, device) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(channels, device=device)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False, device=device)
        self.bn2 = nn.BatchNorm2d(channels, device=device)

    def forward(self, x):
        out = ag.relu(self.bn1(self.conv1(x)))
        return ag.relu(self.bn2(self.conv2(out)) + x)


class Bottleneck(nn.Module):
    """ResNet-50's bottleneck block with an identity shortcut: a 1x1 convolution down to a quarter of
    the channels, a 3x3 one, a 1x1 one back up, each with batch norm; relu(... + x)."""

    def __init__(self, channels: int, device) -> None:
        super().__init__()
        width = channels // 4
        self.conv1 = nn.Conv2d(channels, width, 1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(width, device=device)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False, device=device)
        self.bn2 = nn.BatchNorm2d(width, device=device)
        self.conv3 = nn.Conv2d(width, channels, 1, bias=False, device=device)
        self.bn3 = nn.BatchNorm2d(channels, device=device)

    def forward(self, x):
        out = ag.relu(self.bn1(self.conv1(x)))
        out = ag.relu(self.bn2(self.conv2(out)))
        return ag.relu(self.bn3(self.conv3(out)) + x)


def block_size(device, quick: bool, bottleneck: bool = False) -> tuple[int, int, int]:
    full = device.kind == "opencl" and _is_gpu(device) and not quick
    if bottleneck:
        return BOTTLENECK_FULL if full else BOTTLENECK_SMALL
    return BLOCK_FULL if full else BLOCK_SMALL


def resnet_size(device, quick: bool) -> tuple[int, float]:
    full = device.kind == "opencl" and _is_gpu(device) and not quick
    return RESNET_FULL if full else RESNET_SMALL


def _is_gpu(device) -> bool:
    import pyopencl as cl

    return bool(device.cl_device.type & cl.device_type.GPU)


def workloads(device, quick: bool = False) -> list[dict]:
    """Each training step: name, model, optimizer factory, input shape, loss, target shape, amp or not."""
    from train_digits_cnn import digits_cnn

    n, c, hw = block_size(device, quick)
    sgd = lambda p: SGD(p, lr=0.01, momentum=0.9)  # noqa: E731
    block = f"resnet block {n}x{c}x{hw}x{hw}, SGD"

    def block_row(suffix: str = "", **options) -> dict:
        return dict(
            name=block + suffix, model=BasicBlock(c, device), opt=sgd, shape=(n, c, hw, hw), loss="mse", **options
        )

    rows = [
        dict(name="mlp 784-512-512-10, SGD", model=mlp(device), opt=sgd, shape=(BATCH, 784), loss="ce"),
        dict(name="mlp 784-512-512-10, SGD, amp", model=mlp(device), opt=sgd, shape=(BATCH, 784), amp=True),
        dict(name="digits CNN, Adam", model=digits_cnn(device), opt=lambda p: Adam(p, lr=1e-3), shape=(BATCH, 1, 8, 8)),
        block_row(),
    ]
    if device.kind == "opencl" and gemm_mma.available(device, "tf32x3"):
        rows.append(block_row(", tf32x3", precision="tf32x3"))
    rows += [block_row(", tf32", precision="high"), block_row(", amp", amp=True)]
    bn, bc, bhw = block_size(device, quick, bottleneck=True)
    rows.append(
        dict(
            name=f"resnet bottleneck {bn}x{bc}x{bhw}x{bhw}, SGD",
            model=Bottleneck(bc, device),
            opt=sgd,
            shape=(bn, bc, bhw, bhw),
            loss="mse",
        )
    )
    rows += resnet_rows(device, quick, sgd)
    for row in rows:
        row.setdefault("loss", "ce")
        row.setdefault("amp", False)
        row.setdefault("precision", "highest")
    return rows


def resnet_rows(device, quick: bool, sgd) -> list[dict]:
    """ResNet-8 and ResNet-18 steps (float32, "high", amp); each row keeps its model's initial weights
    (``state``) so the torch twin starts from the same ones."""
    from resnet import RESNET8, RESNET18, ResNet, host_state

    n, width = resnet_size(device, quick)
    scale = "" if width == 1.0 else f" (width x{width:g})"
    rows = []
    for label, config in (("ResNet-8", RESNET8), ("ResNet-18", RESNET18)):
        for suffix, options in (("", {}), (", tf32", {"precision": "high"}), (", amp", {"amp": True})):
            model = ResNet(*config, width=width, device=device)
            rows.append(
                dict(
                    name=f"{label} {n}x3x32x32{scale}, SGD{suffix}",
                    model=model,
                    opt=sgd,
                    shape=(n, 3, 32, 32),
                    arch=(config, width),
                    state=host_state(model),
                    **options,
                )
            )
    return rows


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


def netcl_variants(device, row, x_host, y_host, repeats) -> tuple[dict[str, float], list | None]:
    """ms per step of each netcl variant (under the row's matmul precision), and the eager step's
    kernel breakdown (OpenCL)."""
    with matmul_precision(row["precision"]):
        return _netcl_variants(device, row, x_host, y_host, repeats)


def _netcl_variants(device, row, x_host, y_host, repeats) -> tuple[dict[str, float], list | None]:
    sync = device.queue.finish if device.kind == "opencl" else (lambda: None)
    model = row["model"]
    x, y = ag.tensor(x_host, device=device), ag.tensor(y_host, device=device)
    opt = row["opt"](model.parameters())
    loss_fn = ag.cross_entropy if row["loss"] == "ce" else ag.mse_loss
    scaler = amp.GradScaler() if row["amp"] else None

    def eager() -> None:
        opt.zero_grad()
        with ag.Tape() as tape:
            if scaler is None:
                loss = loss_fn(model(x), y)
            else:
                with amp.autocast():
                    loss = scaler.scale(loss_fn(model(x), y))
        tape.backward(loss)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()

    results = {"netcl eager": _per_step_ms(eager, sync, repeats)}
    breakdown = None
    if device.kind == "opencl":
        from measure import kernel_breakdown

        breakdown = kernel_breakdown(device, eager)
    from netcl.jit import fuse_graph

    if scaler is None:
        graph = fuse_graph(model, x, y, loss_fn, optimizer_step=opt.step)
    else:  # the scale, its schedule and the skip of an inf step stay on the device: the step replays
        capturable = amp.GradScaler(capturable=True)

        def scaled_step() -> None:
            capturable.step(opt)
            capturable.update()

        with amp.autocast():
            graph = fuse_graph(model, x, y, lambda o, t: capturable.scale(loss_fn(o, t)), optimizer_step=scaled_step)
    results["netcl replayed"] = _per_step_ms(lambda: graph.execute(x, y), sync, repeats)
    return results, breakdown


def _torch():
    try:
        import torch
    except Exception:
        return None
    return torch


def _torch_block(torch, channels: int):
    tnn = torch.nn

    class Block(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn1 = tnn.BatchNorm2d(channels)
            self.conv2 = tnn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn2 = tnn.BatchNorm2d(channels)

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + x)

    return Block()


def _torch_bottleneck(torch, channels: int):
    tnn = torch.nn
    width = channels // 4

    class Block(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(channels, width, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(width)
            self.conv2 = tnn.Conv2d(width, width, 3, padding=1, bias=False)
            self.bn2 = tnn.BatchNorm2d(width)
            self.conv3 = tnn.Conv2d(width, channels, 1, bias=False)
            self.bn3 = tnn.BatchNorm2d(channels)

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = torch.relu(self.bn2(self.conv2(out)))
            return torch.relu(self.bn3(self.conv3(out)) + x)

    return Block()


def torch_variants(torch, row, x_host, y_host, repeats) -> dict[str, float]:
    name = row["name"]
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    tnn = torch.nn
    if "arch" in row:  # a whole ResNet, from netcl's initial weights
        from resnet import torch_resnet

        config, width = row["arch"]
        model = torch_resnet(torch, config, width=width)
        model.load_state_dict({key: torch.from_numpy(value) for key, value in row["state"].items()})
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    elif name.startswith("mlp"):
        model = tnn.Sequential(tnn.Linear(784, 512), tnn.ReLU(), tnn.Linear(512, 512), tnn.ReLU(), tnn.Linear(512, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    elif name.startswith("resnet"):
        block = _torch_bottleneck if name.startswith("resnet bottleneck") else _torch_block
        model = block(torch, x_host.shape[1])
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
    y = torch.from_numpy(y_host.astype(np.int64) if row["loss"] == "ce" else y_host).to(dev)
    loss_fn = tnn.CrossEntropyLoss() if row["loss"] == "ce" else tnn.MSELoss()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    scaler = torch.amp.GradScaler(dev) if row["amp"] else None
    # "highest" and "tf32x3": fp32 convolutions (TF32 off), the accuracy class netcl's are in
    torch.backends.cudnn.allow_tf32 = row["precision"] not in ("highest", "tf32x3")
    # "high": TF32 matmuls too (torch.set_float32_matmul_precision("high")); else torch's default, off
    torch.backends.cuda.matmul.allow_tf32 = row["precision"] == "high"

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss_fn(model(x), y).backward()
            opt.step()
            return
        with torch.autocast(dev, dtype=torch.float16 if cuda else torch.bfloat16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    results = {"torch eager": _per_step_ms(step, sync, repeats)}
    if cuda and scaler is None:
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


def run(
    device_spec: str | None = None,
    quick: bool = False,
    repeats: int | None = None,
    peers: bool = True,
    only: list[str] | None = None,
) -> dict:
    """Every training step of ``workloads``, or those whose name contains one of ``only``'s strings."""
    device = nc.get_device(device_spec)
    repeats = repeats or (3 if quick else 10)
    torch = _torch() if peers else None
    peer = "none" if torch is None else f"torch {torch.__version__} on {'CUDA' if torch.cuda.is_available() else 'CPU'}"
    print(f"train: ms per training step on {device!r} (peer: {peer})")
    rng = np.random.default_rng(0)
    results: dict = {"device": repr(device), "batch": BATCH, "rows": []}
    header = f"{'workload':<{WIDTH}}{'variant':<20}{'ms/step':>10}"
    print(header)
    print("-" * len(header))
    for row in workloads(device, quick):
        if only and not any(part in row["name"] for part in only):
            continue
        name, shape = row["name"], row["shape"]
        x_host = rng.normal(size=shape).astype(np.float32)
        if row["loss"] == "ce":
            y_host = rng.integers(0, 10, shape[0]).astype(np.int32)
        else:
            y_host = rng.normal(size=shape).astype(np.float32)
        times, breakdown = netcl_variants(device, row, x_host, y_host, repeats)
        if torch is not None:
            times.update(torch_variants(torch, row, x_host, y_host, repeats))
        for variant, ms in times.items():
            print(f"{name:<{WIDTH}}{variant:<20}{ms:>10.3f}", flush=True)
        if "netcl replayed" in times:
            ratio = times["netcl eager"] / times["netcl replayed"]
            print(f"{'':<{WIDTH}}replay speed-up {ratio:.2f}x over netcl eager")
        if "torch eager" in times:
            print(f"{'':<{WIDTH}}netcl eager / torch eager: {times['netcl eager'] / times['torch eager']:.2f}x")
        entry = {"workload": name, "ms_per_step": times}
        if breakdown:
            total = sum(k.ms for k in breakdown)
            print(f"{'':<{WIDTH}}device time of one eager step by kernel ({total:.3f} ms in all):")
            for k in breakdown[:12]:
                print(f"{'':<{WIDTH}}  {k.name:<40}{k.launches:>4} x {k.ms:>9.3f} ms {100 * k.ms / total:5.1f}%")
            entry["kernels"] = [{"name": k.name, "launches": k.launches, "ms": k.ms} for k in breakdown]
        results["rows"].append(entry)
    return results


def main() -> None:
    args = standalone_parser(__doc__).parse_args()
    write_results(run(args.device, args.quick, args.repeats, not args.no_peers), args.json_path)


if __name__ == "__main__":
    main()
