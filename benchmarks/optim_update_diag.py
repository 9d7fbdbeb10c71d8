"""Device time of AdamW's update on the GPT block's parameters, per work-item split and parameters a launch.

``python benchmarks/optim_update_diag.py [--device gpu]``: the ``gpt_block`` model of the transformer workload
(vocab 1024, seq 256, d 512, 8 heads: 18 parameters, 4.32 M float32), random gradients, ``AdamW.step()``
timed by profiling events (the update launches summed, median of 15 steps) with each work-item taking one
element or a vector of 4 (``GPU_VECTOR``, what ``optim_kernels.update_split`` gives a GPU) or 8 elements, 16 or
32 parameters a launch (``update_arity``'s two values, where the device's kernel arguments have room for 32).
One line a variant.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

import netcl.core as nc
from netcl.optim import AdamW
from netcl.runtime.ops import optim_kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT
from measure import launches


def update_us(device, split, arity: int, steps: int = 15) -> tuple[int, float]:
    """(launches, median µs) of the update kernels of ``AdamW.step()`` under ``split`` and ``arity``."""
    device_split, most = optim_kernels.update_split, optim_kernels.UPDATE_ARITY
    optim_kernels.update_split = lambda _device: split
    optim_kernels.UPDATE_ARITY = arity
    try:
        model = GPT(1024, 256, d_model=512, n_head=8, n_layer=1, device=device)
        rng = np.random.default_rng(1)
        for p in model.parameters():
            p.grad = nc.tensor(rng.standard_normal(p.shape).astype(np.float32), device=device)
        opt = AdamW(model.parameters(), lr=1e-3)
        samples, count = [], 0
        for _ in range(steps):
            updates = [launch for launch in launches(device, opt.step) if "adam" in launch.name]
            count = len(updates)
            samples.append(sum(launch.ms for launch in updates) * 1e3)
        return count, statistics.median(samples)
    finally:
        optim_kernels.update_split, optim_kernels.UPDATE_ARITY = device_split, most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="gpu")
    device = nc.get_device(parser.parse_args().device)
    print(f"AdamW update, gpt_block's parameters, on {device!r}")
    splits = {"one element": None}
    splits.update({f"vector of {width}": optim_kernels.ItemSplit(width, vector=True) for width in (4, 8)})
    if not device.is_gpu:
        splits = {"one element": None, "the device's split": optim_kernels.update_split(device)}
    for arity in sorted({optim_kernels.MULTI_ARITY, optim_kernels.update_arity(device, 4)}):
        for name, split in splits.items():
            count, us = update_us(device, split, arity)
            print(f"  {arity:2d} a launch, {name:<18} {count} launch(es) {us:8.1f} us")


if __name__ == "__main__":
    main()
