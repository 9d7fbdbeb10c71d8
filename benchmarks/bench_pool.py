"""max_pool2d forward and backward at a CNN's shapes: netcl's kernels vs torch, device time.

netcl: device time (profiling events; wall time on the NumPy backend) of ``pool.max_pool2d`` and of its
backward (``pool.max_pool2d_backward``) per shape, with a same-run device copy of x as the bandwidth reference;
on a CPU OpenCL device these are ``pool_cpu``'s kernels (see docs/cpu-kernels.md). torch eager
(``F.max_pool2d`` and its gradient) on CUDA events where torch sees a GPU, else on the CPU by wall time.
Default shapes: the digits CNN's two poolings (batch 128) and a ResNet stem's. Run alone:
``python benchmarks/bench_pool.py [--shape N C H W] [--kernel K] [--device SPEC]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import standalone_parser, time_cuda, time_device, time_wall, write_results

import netcl.core as nc
from netcl.runtime import ops as R
from netcl.runtime.ops import pool

#: (N, C, H, W): the digits CNN's poolings at batch 128, then a 32x32 CNN's first.
SHAPES = [(128, 32, 8, 8), (128, 64, 4, 4), (128, 64, 32, 32)]


def _torch_ms(shape: tuple[int, ...], kernel: int, repeats: int) -> dict[str, float]:
    """torch eager forward and backward ms on its GPU where it sees one, else on the CPU; {} without torch."""
    try:
        import torch
    except Exception:
        return {}
    F = torch.nn.functional
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    x = torch.randn(shape, device=device, requires_grad=True)
    y = F.max_pool2d(x, kernel)
    g = torch.randn(y.shape, device=device)

    def forward():
        with torch.no_grad():
            F.max_pool2d(x, kernel)

    def backward():
        torch.autograd.grad(y, x, g, retain_graph=True)

    if gpu:
        return {
            f"torch {name}": time_cuda(torch, fn, repeats).median_ms
            for name, fn in (("fwd", forward), ("bwd", backward))
        }
    return {f"torch cpu {name}": time_wall(fn, repeats).median_ms for name, fn in (("fwd", forward), ("bwd", backward))}


def run(
    shape: tuple[int, ...], kernel: int = 2, device_spec: str | None = None, repeats: int = 50, peers: bool = True
) -> dict[str, float]:
    """ms (medians of ``repeats``) of netcl's pooling forward, backward and a copy of x, and torch's where asked."""
    device = nc.get_device(device_spec)
    rng = np.random.default_rng(0)
    x = nc.tensor(rng.standard_normal(shape).astype(np.float32), device=device)
    y = pool.max_pool2d(x, kernel)
    g = nc.tensor(rng.standard_normal(y.shape).astype(np.float32), device=device)
    times = {
        "netcl fwd": time_device(device, lambda: pool.max_pool2d(x, kernel), repeats).median_ms,
        "netcl bwd": time_device(device, lambda: pool.max_pool2d_backward(g, x, kernel), repeats).median_ms,
        "netcl copy of x": time_device(device, lambda: R.copy(x), repeats).median_ms,
    }
    if peers:
        times.update(_torch_ms(shape, kernel, repeats))
    print(f"max_pool2d {kernel}x{kernel} at {shape} float32 on {device!r}: ms (median of {repeats})")
    for name, ms in times.items():
        print(f"  {name:<24}{ms:>9.4f}")
    return times


def main() -> None:
    parser = standalone_parser(__doc__)
    parser.add_argument("--shape", type=int, nargs=4, default=None)
    parser.add_argument("--kernel", type=int, default=2)
    args = parser.parse_args()
    repeats = args.repeats or (10 if args.quick else 50)
    shapes = [tuple(args.shape)] if args.shape else SHAPES
    results = {str(s): run(s, args.kernel, args.device, repeats, not args.no_peers) for s in shapes}
    write_results(results, args.json_path)


if __name__ == "__main__":
    main()
