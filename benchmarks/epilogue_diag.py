"""Device time of mlp_block's GEMMs with and without the JIT's store epilogue (one line each).

``python benchmarks/epilogue_diag.py [--rows 262144]``: the forward product alone, with the fused
``relu(. + b) + 1`` in its store, with the product also saved (what autograd needs), and the two
products of the backward (``dX = dP W^T``, ``dW = X^T dP``). Medians of OpenCL profiling events.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import netcl.autograd as ag
from netcl.core import Tensor, get_device
from netcl.jit import jit_compile, workloads
from netcl.jit.gemm_epilogue import GemmEpilogueStep
from netcl.runtime.ops import gemm as gemm_mod

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import time_device


def _median_ms(device, fn, repeats: int = 20) -> float:
    return time_device(device, fn, repeats).median_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=262144)
    parser.add_argument("--inner", type=int, default=64)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--device", default="gpu")
    args = parser.parse_args()
    device = get_device(args.device)
    rng = np.random.default_rng(0)
    shapes = [(args.rows, args.inner), (args.inner, args.features), (1, args.features)]
    x, w, b = (ag.tensor(rng.uniform(-1, 1, s).astype(np.float32), device=device) for s in shapes)
    fused = jit_compile(workloads.mlp_block)
    step = fused.plan_for(x, w, b).steps[0]
    assert isinstance(step, GemmEpilogueStep), step
    out = Tensor.empty((args.rows, args.features), np.dtype(np.float32), device)
    rows = {
        "x @ w": lambda: gemm_mod.gemm(x.value, w.value),
        "x @ w, epilogue in the store": lambda: gemm_mod.gemm(
            x.value, w.value, epilogue=step.epilogues[False], epilogue_args=[b.value]
        ),
        "x @ w, epilogue + saved product": lambda: gemm_mod.gemm(
            x.value, w.value, epilogue=step.epilogues[True], epilogue_args=[b.value, out]
        ),
        "dX = dP @ w.T": lambda: gemm_mod.gemm(out, w.value, trans_b=True),
        "dW = x.T @ dP": lambda: gemm_mod.gemm(x.value, out, trans_a=True),
    }
    flops = 2 * args.rows * args.inner * args.features
    for name, fn in rows.items():
        ms = _median_ms(device, fn)
        print(f"{name:34s} {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s")


if __name__ == "__main__":
    main()
