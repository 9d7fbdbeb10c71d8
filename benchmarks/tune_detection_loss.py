"""Sweep the fused detection loss's launch geometry on one device: blocks (partials) and vector width.

Prints device ms of the two forward kernels (partial + reduce, timed with profiling events
around the plan's forward, so no Python before the first launch is counted) and of the full
``fused_weighted_bce_smooth_l1_loss`` call.
"""

from __future__ import annotations

import argparse

from measure import rand, time_device

import netcl.autograd as ag
from netcl.core import get_device
from netcl.jit.detection_loss import compile_plan
from netcl.jit.training_compiler import fused_weighted_bce_smooth_l1_loss


def main(size: int, repeats: int) -> None:
    device = get_device()
    arrays = [
        rand((size,), 0, -6, 6),
        (rand((size,), 1, 0, 1) > 0.7) * 1.0,
        rand((size,), 2, 0, 1),
        rand((size,), 3, 0, 1),
    ]
    nodes = [ag.tensor(a, device=device) for a in arrays]
    values = [n.value for n in nodes]

    def full():
        with ag.no_grad():
            fused_weighted_bce_smooth_l1_loss(*nodes, 1.5, 0.5, 0.05)

    print(f"{device!r}, {size:,} elements; full call {time_device(device, full, repeats).median_ms:.3f} ms")
    print(f"{'vec':>4} {'blocks':>7} {'fwd kernels ms':>15}")
    for vec in (1, 4):
        plan = compile_plan(device, "int", vec)
        for blocks in (256, 512, 1024, 2048, 4096, 8192, 16384):
            plan.max_blocks = blocks
            t = time_device(device, lambda plan=plan: plan.forward(*values, 1.5, 0.5, 0.05), repeats).median_ms
            print(f"{vec:>4} {plan.blocks(size):>7} {t:>15.3f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1 << 26)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    main(args.size, args.repeats)
