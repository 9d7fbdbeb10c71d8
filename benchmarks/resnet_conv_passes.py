"""Each convolution of ResNet-8 or ResNet-18 pass by pass, netcl against cuDNN in the same process.

``python benchmarks/resnet_conv_passes.py [--precision highest|high] [--batch 128] [--repeats 20] [--model 8|18]
[--paths] [--layers NAME,...]``: for every distinct convolution (or those ``--layers`` names) of
``examples/resnet.py``'s ResNet-8 (32x32 inputs; the stem, each block's two 3x3 layers and its 1x1 shortcut) or
ResNet-18 (``--model 18``; the count column says how many layers of the network share the row's shape) the forward,
the weight gradient and (but for the stem) the input gradient.
``--paths`` times each layer's forward and input gradient as products of stored operands too (``gemm_forward``,
``gemm_backward_input`` as one product and per image), and each 3x3 stride-1 pass as Winograd (``winograd=True``)
and without it (``winograd=False``: the implicit GEMM, or on a GPU the searched choice among the other paths), beside
the path netcl picks. netcl's figure is the
summed device time of every kernel the pass launches (``netcl.profiler``: a split product's sum included, the
host's gaps between them not), cuDNN's the median of CUDA events around each ``torch.nn.functional.conv2d`` /
``aten.convolution_backward`` call in benchmark mode (``measure.time_cuda``); both in µs a call.
``--precision high`` runs both on TF32 (netcl's matmul precision "high", torch's ``allow_tf32``), the default
neither. Needs an NVIDIA GPU and torch
with CUDA; results in benchmarks/RESULTS.md ("Thirty-first session", "Thirty-second session").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import netcl.core as nc
from netcl.core import Tensor
from netcl.profiler import profile
from netcl.runtime.ops import conv
from netcl.runtime.ops.precision import set_float32_matmul_precision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import time_cuda

#: (name, in channels, out channels, input side, window, stride) of ResNet-8's convolutions.
LAYERS = [
    ("stem", 3, 64, 32, 3, 1),
    ("l1.c1", 64, 64, 32, 3, 2),
    ("l1.c2", 64, 64, 16, 3, 1),
    ("l1.sc", 64, 64, 32, 1, 2),
    ("l2.c1", 64, 128, 16, 3, 2),
    ("l2.c2", 128, 128, 8, 3, 1),
    ("l2.sc", 64, 128, 16, 1, 2),
    ("l3.c1", 128, 256, 8, 3, 2),
    ("l3.c2", 256, 256, 4, 3, 1),
    ("l3.sc", 128, 256, 8, 1, 2),
]
#: ResNet-18's distinct convolutions (as ``LAYERS``) and how many layers of the network have each shape.
LAYERS18 = [
    ("stem", 3, 64, 32, 3, 1, 1),
    ("l1", 64, 64, 32, 3, 1, 4),
    ("l2.c1", 64, 128, 32, 3, 2, 1),
    ("l2", 128, 128, 16, 3, 1, 3),
    ("l2.sc", 64, 128, 32, 1, 2, 1),
    ("l3.c1", 128, 256, 16, 3, 2, 1),
    ("l3", 256, 256, 8, 3, 1, 3),
    ("l3.sc", 128, 256, 16, 1, 2, 1),
    ("l4.c1", 256, 512, 8, 3, 2, 1),
    ("l4", 512, 512, 4, 3, 1, 3),
    ("l4.sc", 256, 512, 8, 1, 2, 1),
]


def netcl_us(device: nc.Device, run, repeats: int) -> tuple[float, list[str]]:
    """(µs of device time a call, summed over the kernels a call launches; each kernel's name and µs a call)."""
    run()
    device.queue.finish()
    with profile() as prof:
        for _ in range(repeats):
            run()
        device.queue.finish()
    kernels: dict[str, float] = {}
    for event in prof.events():
        if event.device_time is not None:  # (µs)
            name = event.name.removeprefix("netcl_")
            kernels[name] = kernels.get(name, 0.0) + event.device_time / repeats
    return sum(kernels.values()), [f"{name} {us:.1f}" for name, us in sorted(kernels.items())]


def layer_passes(
    torch, device: nc.Device, rng, n: int, c: int, o: int, side: int, k: int, s: int, paths: bool = False
) -> dict:
    """pass name -> (netcl's call, cuDNN's call) of one layer on random operands (no input gradient for a layer
    of 3 input channels, the stem); with ``paths``, the forward and input gradient also as products of stored
    operands ("fwd/gemm", "dx/gemm", "dx/bgemm") and a 3x3 stride-1 layer's passes as Winograd ("fwd/wino", ...)
    and without it ("fwd/igemm", ...: the implicit GEMM, or what the search picks among the other paths)."""
    pad = 1 if k == 3 else 0
    x_host = rng.standard_normal((n, c, side, side)).astype(np.float32)
    w_host = (rng.standard_normal((o, c, k, k)) * 0.1).astype(np.float32)
    x, w = Tensor.from_host(device, x_host), Tensor.from_host(device, w_host)
    geo = conv.check_conv2d(x.shape, w.shape, None, s, pad, 1, 1)
    g_host = rng.standard_normal((n, o, geo.OH, geo.OW)).astype(np.float32)
    g = Tensor.from_host(device, g_host)
    tx, tw, tg = (torch.from_numpy(v).cuda() for v in (x_host, w_host, g_host))

    def aten_backward(mask: list[bool]):
        return torch.ops.aten.convolution_backward(tg, tx, tw, None, [s, s], [pad, pad], [1, 1], False, [0, 0], 1, mask)

    passes = {
        "fwd": (lambda: conv.conv2d(x, w, None, s, pad), lambda: torch.nn.functional.conv2d(tx, tw, None, s, pad)),
        "dw": (lambda: conv.conv2d_backward_weight(g, x, w.shape, geo, 1), lambda: aten_backward([False, True, False])),
    }
    if c > 3:
        passes["dx"] = (lambda: conv.conv2d_backward_input(g, w, geo, 1), lambda: aten_backward([True, False, False]))
    if paths and c > 3:  # the products of stored operands, as ``conv._gpu_algorithm`` times them
        passes["fwd/gemm"] = (lambda: conv.gemm_forward(x, w, None, geo), passes["fwd"][1])
        passes["dx/gemm"] = (lambda: conv.gemm_backward_input(g, w, geo), passes["dx"][1])
        passes["dx/bgemm"] = (lambda: conv.gemm_backward_input(g, w, geo, batched=True), passes["dx"][1])
    if paths and k == 3 and s == 1 and c > 3:
        for label, choice in (("wino", True), ("igemm", False)):
            passes[f"fwd/{label}"] = (lambda v=choice: conv.conv2d(x, w, None, s, pad, winograd=v), passes["fwd"][1])
            passes[f"dw/{label}"] = (
                lambda v=choice: conv.conv2d_backward_weight(g, x, w.shape, geo, 1, winograd=v),
                passes["dw"][1],
            )
            passes[f"dx/{label}"] = (
                lambda v=choice: conv.conv2d_backward_input(g, w, geo, 1, winograd=v),
                passes["dx"][1],
            )
    return passes


def parse_arguments(doc: str, networks: bool = False) -> argparse.Namespace:
    """``--precision``, ``--batch`` and ``--repeats`` of a per-layer script whose help is ``doc`` (with
    ``networks``, ``--model``, ``--paths`` and ``--layers`` too)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=["highest", "high"], default="highest")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    if networks:
        parser.add_argument("--model", choices=["8", "18"], default="8")
        parser.add_argument("--paths", action="store_true")
        parser.add_argument("--layers", help="comma-separated layer names to time (default: all)")
    return parser.parse_args()


def main() -> None:
    args = parse_arguments(__doc__, networks=True)
    import torch

    tf32 = args.precision == "high"
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    set_float32_matmul_precision(args.precision)
    device, rng, n = nc.get_device(None), np.random.default_rng(0), args.batch
    totals = {"netcl": 0.0, "cudnn": 0.0}
    print(f"{device.name}, precision {args.precision}, batch {n}: µs a call")
    print(f"{'layer':8} {'count':>5} {'pass':9} {'netcl':>9} {'cuDNN':>9} {'ratio':>6}  kernels")
    layers = LAYERS18 if args.model == "18" else [(*layer, 1) for layer in LAYERS]
    if args.layers:
        layers = [layer for layer in layers if layer[0] in args.layers.split(",")]
    for name, *sizes, count in layers:
        passes = layer_passes(torch, device, rng, n, *sizes, paths=args.paths)
        for pass_name, (ours, theirs) in passes.items():
            mine, kernels = netcl_us(device, ours, args.repeats)
            peer = time_cuda(torch, theirs, args.repeats).median_ms * 1e3
            if "/" not in pass_name:  # the totals count the picked path of each layer of the network
                totals["netcl"] += mine * count
                totals["cudnn"] += peer * count
            print(
                f"{name:8} {count:5} {pass_name:9} {mine:9.1f} {peer:9.1f} {mine / peer:6.2f}  {', '.join(kernels)}",
                flush=True,
            )
    print(f"all passes of the network: netcl {totals['netcl']:,.0f} µs, cuDNN {totals['cudnn']:,.0f} µs")


if __name__ == "__main__":
    main()
