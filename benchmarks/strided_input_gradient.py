"""ResNet-8's strided input gradients by each of netcl's algorithms, against cuDNN in the same process.

``python benchmarks/strided_input_gradient.py [--precision highest|high] [--batch 128] [--repeats 20]``: for every
stride-2 convolution of ``examples/resnet.py``'s ResNet-8, the input gradient by the implicit GEMM, by
``conv.gemm_backward_input`` as one long product of dy with its images behind its channels ("gemm") and as one
product per image ("batched-gemm"), each with its kernels' device times (µs a call, ``resnet_conv_passes.netcl_us``),
the largest difference of each against the implicit GEMM, and cuDNN's ``aten.convolution_backward`` (median of
per-call CUDA events, ``measure.time_cuda``). These are the candidates of the layer's search
(``conv._gpu_algorithm``). Needs an NVIDIA GPU and torch with CUDA; results in benchmarks/RESULTS.md ("Thirty-third
session").
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import netcl.core as nc
from netcl.core import Tensor
from netcl.runtime.ops import conv, conv_implicit
from netcl.runtime.ops.precision import set_float32_matmul_precision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import time_cuda
from resnet_conv_passes import LAYERS, netcl_us, parse_arguments


def layer_runs(torch, device: nc.Device, rng, n: int, c: int, o: int, side: int, k: int, s: int) -> tuple[dict, object]:
    """(algorithm -> netcl's call, cuDNN's call) of one layer's input gradient on random operands."""
    pad = 1 if k == 3 else 0
    w_host = (rng.standard_normal((o, c, k, k)) * 0.1).astype(np.float32)
    geo = conv.check_conv2d((n, c, side, side), w_host.shape, None, s, pad, 1, 1)
    g_host = rng.standard_normal((n, o, geo.OH, geo.OW)).astype(np.float32)
    w, g = Tensor.from_host(device, w_host), Tensor.from_host(device, g_host)
    tx = torch.zeros((n, c, side, side), device="cuda")
    tw, tg = (torch.from_numpy(v).cuda() for v in (w_host, g_host))
    runs = {
        "implicit": lambda: conv_implicit.backward_input(g, w, geo),
        "gemm": lambda: conv.gemm_backward_input(g, w, geo, batched=False),
        "batched-gemm": lambda: conv.gemm_backward_input(g, w, geo, batched=True),
    }
    mask = [True, False, False]
    return runs, lambda: torch.ops.aten.convolution_backward(
        tg, tx, tw, None, [s] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, mask
    )


def main() -> None:
    args = parse_arguments(__doc__)
    import torch

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.precision == "high"
    torch.backends.cudnn.benchmark = True
    set_float32_matmul_precision(args.precision)
    device, rng, n = nc.get_device(None), np.random.default_rng(0), args.batch
    print(f"{device.name}, precision {args.precision}, batch {n}: µs a call (max |difference| from the implicit GEMM)")
    for name, *sizes in (layer for layer in LAYERS if layer[5] > 1):
        runs, cudnn = layer_runs(torch, device, rng, n, *sizes)
        reference = runs["implicit"]().to_host()
        for algorithm, run in runs.items():
            us, kernels = netcl_us(device, run, args.repeats)
            difference = np.abs(run().to_host() - reference).max()
            print(f"{name:6} {algorithm:13} {us:8.1f} ({difference:.1e})  {', '.join(kernels)}", flush=True)
        print(f"{name:6} {'cuDNN':13} {time_cuda(torch, cudnn, args.repeats).median_ms * 1e3:8.1f}", flush=True)


if __name__ == "__main__":
    main()
