"""A conv-free detection-style head trained on synthetic data with netcl's fused kernels.

Each of B "anchors" has F features. The head predicts K = 2*C channels per anchor: C heatmap
logits ("is there an object of class c here?") and C box-offset regressions. Both kinds of
channel go through one fused loss, with weights selecting the term per channel:

    loss = heat_scale * sum(heat_weight * bce_logits(pred, target))
         + reg_scale  * sum(reg_weight  * smooth_l1(pred - target, beta))

heat_weight is 1 on heatmap channels, reg_weight is 1 on the regression channels of positive
anchors. The hidden activation ``gelu(x @ w1 + b1)`` has its bias + GELU fused into one kernel
pair by ``jit_compile``; the loss is ``fused_weighted_bce_smooth_l1_loss`` (2 launches forward,
1 backward). Run: ``python examples/detection_head.py --steps 100``.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np

import netcl.autograd as ag
from netcl.core import get_device
from netcl.jit import fused_weighted_bce_smooth_l1_loss, jit_compile
from netcl.profiler import profile, record_function
from netcl.runtime import ops as rops

B, F, H, C = 256, 16, 64, 4  # anchors, features, hidden units, classes
K = 2 * C  # heatmap logits + box offsets


@jit_compile
def bias_gelu(z, b):
    """Bias add + GELU: one fused forward kernel and one fused backward kernel."""
    return ag.gelu(z + b)


def synthetic_batch(rng: np.random.Generator, device) -> tuple[ag.Node, ...]:
    """Features, targets and the per-channel weights of one batch (a fixed hidden rule)."""
    rule = np.random.default_rng(1234).normal(size=(F, K)).astype(np.float32)
    x = rng.normal(size=(B, F)).astype(np.float32)
    z = x @ rule
    target = np.empty((B, K), np.float32)
    target[:, :C] = z[:, :C] > 0.5  # objectness per class
    target[:, C:] = np.tanh(z[:, C:])  # box offsets
    heat_w = np.zeros((B, K), np.float32)
    heat_w[:, :C] = 1.0
    reg_w = np.zeros((B, K), np.float32)
    reg_w[:, C:] = target[:, :C]  # regress boxes only where there is an object
    return tuple(ag.tensor(a, device=device) for a in (x, target, heat_w, reg_w))


class DetectionHead:
    """``gelu(x @ w1 + b1) @ w2 + b2``; ``parameters()`` are the four leaf Nodes."""

    def __init__(self, device, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = ag.tensor(rng.normal(0, F**-0.5, (F, H)).astype(np.float32), requires_grad=True, device=device)
        self.b1 = ag.tensor(np.zeros((1, H), np.float32), requires_grad=True, device=device)
        self.w2 = ag.tensor(rng.normal(0, H**-0.5, (H, K)).astype(np.float32), requires_grad=True, device=device)
        self.b2 = ag.tensor(np.zeros((1, K), np.float32), requires_grad=True, device=device)

    def parameters(self) -> list[ag.Node]:
        return [self.w1, self.b1, self.w2, self.b2]

    def __call__(self, x: ag.Node) -> ag.Node:
        return ag.matmul(bias_gelu(ag.matmul(x, self.w1), self.b1), self.w2) + self.b2


def train(
    steps: int = 100, lr: float = 0.5, device: str | None = None, log_every: int = 10, seed: int = 0
) -> list[float]:
    """Train the head with SGD; prints the loss and time of logged steps and returns every step's loss."""
    dev = get_device(device)
    model = DetectionHead(dev, seed)
    rng = np.random.default_rng(seed)
    heat_scale, reg_scale = 1.0 / (B * C), 1.0 / (B * C)
    losses = []
    seconds = []
    for step in range(steps):
        with record_function(f"step {step}"):  # a range in the trace of --profile (free without one)
            start = time.perf_counter()
            x, target, heat_w, reg_w = synthetic_batch(rng, dev)
            with ag.Tape() as tape:
                pred = model(x)
                loss = fused_weighted_bce_smooth_l1_loss(pred, target, heat_w, reg_w, heat_scale, reg_scale, beta=0.05)
            tape.backward(loss)
            for p in model.parameters():  # SGD, in place on the device
                rops.add_(p.value, rops.mul(p.grad, -lr))
                p.grad = None
            losses.append(loss.item())  # a host read: the step's device work is done
            seconds.append(time.perf_counter() - start)
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {losses[-1]:.4f}  ({1e3 * seconds[-1]:.1f} ms)")
    if seconds:
        later = seconds[1:]
        per_step = f", then {1e3 * sum(later) / len(later):.2f} ms per step" if later else ""
        print(f"time: first step {1e3 * seconds[0]:.1f} ms (builds or loads its programs){per_step}")
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="training steps (0: build the model, train nothing)")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--device", default=None, help="NETCL_DEVICE-style spec: gpu, opencl, cpu, P:D")
    parser.add_argument(
        "--profile", default=None, metavar="PATH", help="write a Chrome trace of the run (netcl.profiler)"
    )
    args = parser.parse_args()
    if args.steps < 0:
        parser.error(f"--steps must be 0 or more, got {args.steps}")
    with profile() if args.profile else contextlib.nullcontext() as prof:
        history = train(args.steps, args.lr, args.device)
    if prof is not None:
        print(prof.key_averages().table(sort_by="device_time", row_limit=15))
        prof.export_chrome_trace(args.profile)
        print(f"wrote the Chrome trace to {args.profile} (open it in https://ui.perfetto.dev)")
    if history:
        print(f"loss {history[0]:.4f} -> {history[-1]:.4f} on {get_device(args.device).name}")
    else:
        print(f"no steps run (--steps 0) on {get_device(args.device).name}")
