"""Whether a device's OpenCL compiler builds programs side by side: N distinct GEMM programs built one after
another, then on 2, 4, 8 and 16 threads (what ``netcl.runtime.tune.BUILD_THREADS`` is chosen by).

``python benchmarks/build_threads.py [--device SPEC] [--programs 16]``: the programs are the tensor-core GEMM
kernel's candidates for a 256 x 2048 x 576 product where the device has tensor cores (tf32), else the portable
GEMM's; each build gets a macro of its own on its command line, so no cache serves it. Prints the wall time
of each way and the summed build time (how much the builds slowed each other). Results in benchmarks/RESULTS.md
("Thirty-second session").
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyopencl as cl

import netcl.core as nc
from netcl.runtime.ops import gemm_configs, gemm_mma
from netcl.runtime.ops._common import PRIMITIVE_PREAMBLE
from netcl.runtime.ops.gemm_mma_source import mma_source
from netcl.runtime.ops.gemm_plan import Problem
from netcl.runtime.ops.gemm_source import portable_source

F4 = np.dtype(np.float32)


def sources(device: nc.Device, count: int) -> tuple[str, list[str]]:
    """(what the programs are, their sources) for ``count`` distinct candidates."""
    problem = Problem(256, 2048, 576, False, False, ())
    if gemm_mma.available(device, "tf32"):
        cands = [c for c in gemm_mma._grid() if not c.wg and gemm_mma._valid(device, c, "tf32", problem)][:count]
        return "tensor-core (tf32) GEMM", [mma_source(c, "tf32", False, False, F4, F4, F4) for c in cands]
    cands = list(gemm_configs._grid())[:count]
    return "portable GEMM", [portable_source(c, False, False, F4, F4, F4) for c in cands]


def build(device: nc.Device, source: str, salt: str) -> float:
    """Seconds of one build of ``source``; ``salt``, a macro defined on the command line, makes it a program no
    cache has seen (a comment in the source does not: PoCL's cache ignored one)."""
    start = time.perf_counter()
    cl.Program(device.context, source).build(options=[f"-DNETCL_BUILD_SALT={salt}"])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None)
    parser.add_argument("--programs", type=int, default=16)
    args = parser.parse_args()
    device = nc.get_device(args.device)
    kind, bodies = sources(device, args.programs)
    print(f"{device.name}: {len(bodies)} {kind} programs")
    for threads in (1, 2, 4, 8, 16):
        programs = [(PRIMITIVE_PREAMBLE + body, f"{threads}_{k}_{time.time_ns()}") for k, body in enumerate(bodies)]
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            each = list(pool.map(lambda program: build(device, *program), programs))
        wall = time.perf_counter() - start
        print(f"{threads:2d} thread(s): {wall:6.2f} s (builds summed {sum(each):6.2f} s)", flush=True)


if __name__ == "__main__":
    main()
