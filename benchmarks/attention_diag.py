"""Attention kernel variants side by side: the blocked, quad and portable kernels and torch SDPA fp32.

``python benchmarks/attention_diag.py [--device gpu] [--variants blocked,quad] [--repeats 5] [--quick]``: for d 64,
float32, (b, h, s) = (8, 8, 1024), (4, 8, 2048), (1, 8, 8192) causal and (8, 8, 1024) not, the forward and
forward + backward device time of each ``NETCL_ATTENTION`` variant (medians of OpenCL profiling events,
``measure.time_device``) and of torch's ``scaled_dot_product_attention`` (TF32 off, CUDA events) when torch
sees a GPU; one ``netcl.profiler`` table per variant (per-kernel device time); on NVIDIA's OpenCL, ptxas'
registers, spills and shared memory of the blocked kernels (``-cl-nv-verbose``). Each variant's result is
first checked against float64 on a small causal GQA case.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

import netcl.core as nc
import netcl.profiler
from netcl.runtime.ops import attention as RA
from netcl.runtime.ops import attention_blocked as blocked

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import time_cuda, time_device

SHAPES = [(8, 8, 1024, True), (4, 8, 2048, True), (1, 8, 8192, True), (8, 8, 1024, False)]
QUICK = [(1, 2, 256, True), (1, 2, 256, False)]
D = 64


def ptxas_info(device: nc.Device) -> None:
    """Registers / spills / shared memory of the blocked kernels at d 64 (NVIDIA's OpenCL only)."""
    if "NVIDIA" not in device.platform_name:
        return
    for kernel, blocks in blocked.configs(D, int(device.cl_device.local_mem_size)).items():
        owners, body = blocked._SOURCES[kernel]
        fields = {"E": D, "BM": blocks.BM, "BN": blocks.BN, "causal": 1, "idx": "int"}
        program = cl.Program(device.context, (owners + blocked._COMMON + body).format(**fields))
        program.build(options=["-cl-nv-verbose"])
        log = program.get_build_info(device.cl_device, cl.program_build_info.LOG)
        lines = [line.strip() for line in log.splitlines() if any(w in line for w in ("registers", "spill"))]
        print(f"ptxas {kernel} {blocks}: {' | '.join(lines)}", flush=True)


def check(device: nc.Device, variant: str) -> str:
    """Largest absolute error of output and gradients against float64 (causal, GQA, odd sizes)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 300, D), (2, 2, 257, D), (2, 2, 257, D)))
    tensors = [nc.Tensor.from_host(device, a, np.float32) for a in (q, k, v)]
    spec = RA.check_attention(*tensors, None, 0.0, True, None, True)
    out, lse = RA.attention_forward(*tensors, None, spec)
    g = rng.standard_normal(out.shape)
    grads = RA.attention_backward(nc.Tensor.from_host(device, g, np.float32), *tensors, out, lse, None, spec)
    ke, ve = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    s = np.where(np.tril(np.ones((300, 257), bool)), q @ ke.swapaxes(-1, -2) / np.sqrt(D), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = g @ ve.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(D)
    want = [p @ ve, ds @ ke, (ds.swapaxes(-1, -2) @ q).reshape(2, 2, 2, 257, D).sum(2)]
    want.append((p.swapaxes(-1, -2) @ g).reshape(2, 2, 2, 257, D).sum(2))
    errors = [np.abs(a.to_host() - b).max() for a, b in zip([out, *grads], want, strict=True)]
    return " ".join(f"{e:.1e}" for e in errors)


def netcl_ms(device: nc.Device, b: int, h: int, s: int, causal: bool, repeats: int) -> tuple[float, float, str]:
    rng = np.random.default_rng(0)
    q, k, v, g = (nc.Tensor.from_host(device, rng.standard_normal((b, h, s, D)), np.float32) for _ in range(4))
    spec = RA.check_attention(q, k, v, None, 0.0, causal, None, False)

    def forward():
        return RA.attention_forward(q, k, v, None, spec)

    def both():
        out, lse = forward()
        return RA.attention_backward(g, q, k, v, out, lse, None, spec)

    fwd, fb = time_device(device, forward, repeats).median_ms, time_device(device, both, repeats).median_ms
    with netcl.profiler.profile() as prof:
        both()
        device.queue.finish()
    return fwd, fb, prof.key_averages().table(sort_by="device_time", row_limit=5)


def torch_ms(b: int, h: int, s: int, causal: bool, repeats: int) -> tuple[float, float] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v, g = (torch.randn(b, h, s, D, device="cuda", requires_grad=True) for _ in range(4))

    def ms(fn) -> float:
        return time_cuda(torch, fn, repeats).median_ms

    with torch.no_grad():
        fwd = ms(lambda: sdpa(q, k, v, is_causal=causal))
    return fwd, ms(lambda: torch.autograd.backward(sdpa(q, k, v, is_causal=causal), g))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--variants", default="blocked,quad")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="two small shapes (a CPU device)")
    args = parser.parse_args()
    device = nc.get_device(args.device)
    print(f"device: {device.name} ({device.platform_name})", flush=True)
    ptxas_info(device)
    variants = args.variants.split(",")
    spec = RA.check_attention(*(nc.Tensor.empty((1, 1, 8, D), np.float32, "cpu") for _ in range(3)))
    for variant in variants:
        os.environ["NETCL_ATTENTION"] = variant
        taken = RA.select_variant(device, np.dtype(np.float32), spec).name
        print(f"check {variant} (runs {taken}): max |error| out dq dk dv = {check(device, variant)}", flush=True)
    for b, h, s, causal in QUICK if args.quick else SHAPES:
        cells = []
        for variant in variants:
            os.environ["NETCL_ATTENTION"] = variant
            fwd, fb, table = netcl_ms(device, b, h, s, causal, args.repeats)
            cells.append(f"{variant} {fwd:.3f} / {fb:.3f}")
            print(f"--- {variant} b{b} h{h} s{s} causal={causal}\n{table}", flush=True)
        peer = torch_ms(b, h, s, causal, args.repeats)
        if peer is not None:
            cells.append(f"torch SDPA fp32 {peer[0]:.3f} / {peer[1]:.3f}")
        print(f"b{b} h{h} s{s} {'causal' if causal else 'full'} fwd / f+b ms: " + " | ".join(cells), flush=True)
    os.environ.pop("NETCL_ATTENTION", None)


if __name__ == "__main__":
    main()
