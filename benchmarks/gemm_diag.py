"""Register and spill report of the GEMM kernels on an NVIDIA OpenCL device (``-cl-nv-verbose``).

``python benchmarks/gemm_diag.py``: builds the default portable config and the main tensor-core
configs (NN layout, float32 operands) and prints ptxas' "Used N registers, ... spill" lines.
"""

from __future__ import annotations

import re

import numpy as np
import pyopencl as cl

import netcl.core as nc
from netcl.core.kernels.primitives import PRIMITIVE_PREAMBLE
from netcl.runtime.ops.gemm_mma_source import MmaConfig, mma_source
from netcl.runtime.ops.gemm_source import GemmConfig, portable_source

F32 = np.dtype(np.float32)


def report(device, label: str, source: str) -> None:
    program = cl.Program(device.context, PRIMITIVE_PREAMBLE + source)
    try:
        program.build(options=["-cl-nv-verbose"])
    except cl.RuntimeError as exc:
        print(f"{label}: build failed: {str(exc)[:300]}")
        return
    log = program.get_build_info(device.cl_device, cl.program_build_info.LOG)
    lines = [ln.strip() for ln in log.splitlines() if re.search(r"registers|spill|stack", ln)]
    print(f"{label}: " + " | ".join(lines))


def main() -> None:
    device = nc.get_device()
    print(device)
    for cfg in (GemmConfig(16, 16, 8, 8, 16, 4, 4, 4), GemmConfig(16, 8, 8, 8, 16, 4, 4, 4)):
        report(device, f"portable {cfg.short()}", portable_source(cfg, False, False, F32, F32, F32))
    for mode in ("tf32", "bf16"):
        for cfg in (
            MmaConfig(2, 2, 4, 8, 16),
            MmaConfig(2, 2, 4, 8, 8),
            MmaConfig(2, 4, 4, 4, 16),
            MmaConfig(4, 2, 2, 8, 16),
            MmaConfig(2, 2, 4, 8, 8, stages=3),
        ):
            if cfg.problems(mode, False, False):
                continue
            report(device, f"{mode} {cfg.short()}", mma_source(cfg, mode, False, False, F32, F32, F32))


if __name__ == "__main__":
    main()
