"""batch_norm training forward and forward+backward at a ResNet shape: netcl's channel kernels vs torch.

netcl: device time (profiling events) of ``batch_norm_forward`` (statistics, normalize, running
statistics) and of forward + ``batch_norm_backward`` (dx, dweight, dbias): one kernel each, or on a
GPU with few channels two (each channel's chunks summed, then applied: ``batchnorm._parts``), with
a same-run device copy of x as the bandwidth reference; torch eager (``F.batch_norm``) timed with
CUDA events when torch sees a GPU. Run alone: ``python benchmarks/bench_batch_norm.py [--shape N C H W]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import time_cuda, time_device

import netcl.core as nc
from netcl.runtime import ops as R
from netcl.runtime.ops import batchnorm as BN


def _torch_ms(shape: tuple[int, ...], repeats: int) -> dict[str, float]:
    try:
        import torch
    except Exception:
        return {}
    if not torch.cuda.is_available():
        return {}
    F = torch.nn.functional
    c = shape[1]
    x = torch.randn(shape, device="cuda", requires_grad=True)
    w = torch.ones(c, device="cuda", requires_grad=True)
    b = torch.zeros(c, device="cuda", requires_grad=True)
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    g = torch.randn(shape, device="cuda")

    def fwd():
        with torch.no_grad():
            F.batch_norm(x, rm, rv, w, b, True)

    def both():
        y = F.batch_norm(x, rm, rv, w, b, True)
        torch.autograd.grad(y, (x, w, b), g)

    out = {}
    for name, fn in (
        ("torch eager fwd", fwd),
        ("torch eager fwd+bwd", both),
        ("torch copy", lambda: x.detach().clone()),
    ):
        out[name] = time_cuda(torch, fn, repeats, warmup=3).median_ms
    return out


def run(shape: tuple[int, ...], device_spec: str | None = None, repeats: int = 20) -> dict[str, float]:
    device = nc.get_device(device_spec)
    rng = np.random.default_rng(0)
    c = shape[1]
    x = nc.tensor(rng.standard_normal(shape).astype(np.float32), device=device)
    g = nc.tensor(rng.standard_normal(shape).astype(np.float32), device=device)
    w, b = nc.tensor(np.ones(c, np.float32), device=device), nc.tensor(np.zeros(c, np.float32), device=device)
    rm, rv = nc.tensor(np.zeros(c, np.float32), device=device), nc.tensor(np.ones(c, np.float32), device=device)
    _, mean, rstd = BN.batch_norm_forward(x, rm, rv, w, b, True)
    times = {
        "netcl fwd": time_device(device, lambda: BN.batch_norm_forward(x, rm, rv, w, b, True), repeats).median_ms,
        "netcl bwd": time_device(device, lambda: BN.batch_norm_backward(g, x, mean, rstd, w, True), repeats).median_ms,
        "netcl copy": time_device(device, lambda: R.copy(x), repeats).median_ms,
    }
    times["netcl fwd+bwd"] = times["netcl fwd"] + times["netcl bwd"]
    times.update(_torch_ms(shape, repeats))
    print(f"batch_norm training at {shape} float32 on {device!r}: ms (median of {repeats})")
    for name, ms in times.items():
        print(f"  {name:<24}{ms:>9.4f}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs="+", default=[64, 64, 56, 56])
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    run(tuple(args.shape), args.device, args.repeats)


if __name__ == "__main__":
    main()
