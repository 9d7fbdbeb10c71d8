"""The tensor-core attention (``ops.attention_mma``) against the blocked float32 kernels and torch SDPA.

``python benchmarks/attention_mma.py`` (an NVIDIA GPU; torch with CUDA for the peers): d 64, (b, h, s) =
(4, 8, 2048) and (1, 8, 8192) causal, (8, 8, 1024) not; forward and forward + backward device time (medians of
10, OpenCL profiling events / CUDA events) of netcl's mma kernels on float16 tensors and on float32 tensors at
matmul precision "fp16" (autocast's), the blocked float32 kernels, and torch's SDPA in bf16 and fp16; the
device time of each mma kernel (float16 tensors); first ptxas' registers, spills and shared memory of the mma
kernels (``-cl-nv-verbose``).
"""

import os
import sys
import traceback
from pathlib import Path

import numpy as np
import pyopencl as cl

import netcl.core as nc
from netcl.runtime.ops import attention as RA
from netcl.runtime.ops import attention_mma as M
from netcl.runtime.ops.attention_mma_source import attention_source
from netcl.runtime.ops.precision import matmul_precision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import time_cuda, time_device

D = 64
SHAPES = [(4, 8, 2048, True), (1, 8, 8192, True), (8, 8, 1024, False)]
REPEATS = 10


def ptxas(device):
    for e in (64, 128):
        for kernel in ("fwd", "bwd_q", "bwd_kv"):
            for half in (False, True):  # float32 / float16 outputs
                src = attention_source(kernel, e, True, half, "int")
                try:
                    program = cl.Program(device.context, src).build(options=["-cl-nv-verbose"])
                    log = program.get_build_info(device.cl_device, cl.program_build_info.LOG)
                    lines = [x.strip() for x in log.splitlines() if any(w in x for w in ("registers", "spill", "smem"))]
                    print(f"ptxas E{e} {kernel} half={half}: {' | '.join(lines)}", flush=True)
                except Exception as exc:
                    print(f"BUILD FAILED E{e} {kernel} half={half}: {exc}"[:3000], flush=True)


def netcl_ms(device, b, h, s, causal, mode):
    rng = np.random.default_rng(0)
    dtype = np.float16 if mode == "mma-f16" else np.float32
    q, k, v, g = (nc.Tensor.from_host(device, rng.standard_normal((b, h, s, D)), dtype) for _ in range(4))
    os.environ["NETCL_ATTENTION"] = "blocked" if mode == "blocked" else ""
    prec = "fp16" if mode == "mma-f32" else "highest"
    with matmul_precision(prec):
        spec = RA.check_attention(q, k, v, None, 0.0, causal, None, False)
        taken = RA.select_variant(device, np.dtype(dtype), spec).name

        def forward():
            return RA.attention_forward(q, k, v, None, spec)

        def both():
            out, lse = forward()
            return RA.attention_backward(g, q, k, v, out, lse, None, spec)

        fwd = time_device(device, forward, REPEATS).median_ms
        fb = time_device(device, both, REPEATS).median_ms
    os.environ.pop("NETCL_ATTENTION", None)
    return taken, fwd, fb


def kernel_ms(device, b, h, s, causal):
    """Device ms of each mma kernel on float16 tensors, and of the float32 -> f16 copy of one operand."""
    rng = np.random.default_rng(0)
    q, k, v, g = (nc.Tensor.from_host(device, rng.standard_normal((b, h, s, D)), np.float16) for _ in range(4))
    x32 = nc.Tensor.from_host(device, rng.standard_normal((b, h, s, D)), np.float32)
    spec = RA.check_attention(q, k, v, None, 0.0, causal, None, False)
    out, lse = M.forward(q, k, v, None, spec, 0, None)
    dq, dk, dv = (nc.Tensor.empty(x.shape, x.dtype, device) for x in (q, k, v))
    drow = nc.Tensor.empty(lse.shape, np.float32, device)
    runs = {
        "fwd": lambda: M._run("fwd", [q, k, v, out, lse], s, b * h, spec, False, True),
        "bwd_q": lambda: M._run("bwd_q", [q, k, v, out, g, lse, dq, drow], s, b * h, spec, False, True),
        "bwd_kv": lambda: M._run("bwd_kv", [q, k, v, g, lse, drow, dk, dv], s, b * h, spec, False, True),
        "f16 copy": lambda: M._operand(x32, "f16"),
    }
    return {name: time_device(device, fn, REPEATS).median_ms for name, fn in runs.items()}


def torch_ms(b, h, s, causal, dtype_name):
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention
    dt = getattr(torch, dtype_name)
    q, k, v, g = (torch.randn(b, h, s, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(4))
    with torch.no_grad():
        fwd = time_cuda(torch, lambda: sdpa(q, k, v, is_causal=causal), REPEATS).median_ms
    fb = time_cuda(torch, lambda: torch.autograd.backward(sdpa(q, k, v, is_causal=causal), g), REPEATS).median_ms
    return fwd, fb


def main():
    device = nc.get_device("gpu")
    print(f"device: {device.name} ({device.platform_name})", flush=True)
    ptxas(device)
    for b, h, s, causal in SHAPES:
        cells = []
        for mode in ("mma-f16", "mma-f32", "blocked"):
            try:
                taken, fwd, fb = netcl_ms(device, b, h, s, causal, mode)
                cells.append(f"netcl {mode} [{taken}] {fwd:.3f} / {fb:.3f}")
            except Exception:
                traceback.print_exc()
                cells.append(f"netcl {mode} FAILED")
        for dt in ("bfloat16", "float16"):
            try:
                fwd, fb = torch_ms(b, h, s, causal, dt)
                cells.append(f"torch SDPA {dt} {fwd:.3f} / {fb:.3f}")
            except Exception as exc:
                cells.append(f"torch {dt} failed: {exc}")
        print(
            f"b{b} h{h} s{s} {'causal' if causal else 'full'} d{D} fwd / fwd+bwd ms: " + " | ".join(cells), flush=True
        )
        times = kernel_ms(device, b, h, s, causal)
        print("  mma kernels (float16), ms: " + ", ".join(f"{k} {t:.3f}" for k, t in times.items()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
