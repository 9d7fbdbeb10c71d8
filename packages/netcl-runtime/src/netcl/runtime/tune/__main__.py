"""``python -m netcl.runtime.tune``: the tile search's command line.

It searches GEMM tiles for common shapes on one device and stores the winners where
``netcl.runtime.tune`` reads them. The command line lives here, above the ops it runs, so that
``netcl.runtime.tune`` (which the GEMM and convolution modules import) imports no op module back.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

import numpy as np

import netcl.core as nc
from netcl.runtime import tune
from netcl.runtime.ops import gemm_mma
from netcl.runtime.ops.linalg import matmul

#: (M, N, K, transpose_a, transpose_b) the command searches by default: squares, MLP layers at
#: batch 128 (forward and both gradients), a weight gradient with a long K.
DEFAULT_SHAPES = [
    (256, 256, 256, False, False),
    (1024, 1024, 1024, False, False),
    (2048, 2048, 2048, False, False),
    (4096, 4096, 4096, False, False),
    (128, 512, 784, False, False),
    (128, 784, 512, False, True),
    (784, 512, 128, True, False),
    (128, 512, 512, False, False),
    (64, 256, 262144, True, False),
]


def parse_shape(text: str) -> tuple[int, int, int, bool, bool]:
    """(M, N, K, transpose_a, transpose_b) of ``MxNxK`` with an optional ``:NN`` / ``:NT`` / ``:TN`` /
    ``:TT`` layout suffix (NN when left out)."""
    dims, _, layout = text.partition(":")
    m, n, k = (int(v) for v in dims.lower().split("x"))
    layout = (layout or "NN").upper()
    return m, n, k, layout[0] == "T", layout[1] == "T"


def print_winners(device: nc.Device) -> None:
    """One line per stored winner of ``device``, in key order."""
    for key, value in sorted(tune.winners(device).items()):
        print(f"  {key}: {value}")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m netcl.runtime.tune``: search GEMM tiles for common shapes on a device, store them."""
    parser = argparse.ArgumentParser(prog="python -m netcl.runtime.tune", description=main.__doc__)
    parser.add_argument("--device", default=None, help="NETCL_DEVICE-style spec (default: the default device)")
    parser.add_argument("--shape", action="append", default=None, help="MxNxK[:NN|NT|TN|TT], repeatable")
    parser.add_argument("--force", action="store_true", help="search again even where a winner is stored")
    parser.add_argument("--show", action="store_true", help="print the stored winners and exit")
    parser.add_argument("--clear", action="store_true", help="forget this device's winners and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = nc.get_device(args.device)
    if device.kind != "opencl":
        raise SystemExit(f"{device!r} runs no OpenCL kernels; nothing to tune")
    print(f"{device!r}: winners in {tune.store_path(device)}")
    if args.clear:
        tune.clear(device)
        return
    if args.show:
        print_winners(device)
        return
    if args.force:
        tune.clear(device)
    os.environ[tune.ENV] = "1"
    precisions = ["highest"] + [
        p for p, mode in (("high", "tf32"), ("medium", "bf16")) if gemm_mma.available(device, mode)
    ]
    shapes = [parse_shape(s) for s in args.shape] if args.shape else DEFAULT_SHAPES
    rng = np.random.default_rng(0)
    for m, n, k, ta, tb in shapes:
        a = nc.tensor(rng.uniform(-1, 1, (k, m) if ta else (m, k)).astype(np.float32), device=device)
        b = nc.tensor(rng.uniform(-1, 1, (n, k) if tb else (k, n)).astype(np.float32), device=device)
        for precision in precisions:
            matmul(a, b, transpose_a=ta, transpose_b=tb, precision=precision)
        device.queue.finish()
    print_winners(device)


if __name__ == "__main__":
    main()
