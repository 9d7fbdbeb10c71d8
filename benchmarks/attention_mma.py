"""The tensor-core attention (``ops.attention_mma``) against the blocked float32 kernels and torch SDPA.

``python benchmarks/attention_mma.py`` (an NVIDIA GPU; torch with CUDA for the peers): d 64, (b, h, s) =
(4, 8, 2048) and (1, 8, 8192) causal, (8, 8, 1024) not; forward and forward + backward device time (medians of
10, OpenCL profiling events / CUDA events) of netcl's mma kernels on float16 tensors and on float32 tensors at
matmul precision "fp16" (autocast's), the blocked float32 kernels, and torch's SDPA in bf16 and fp16; the
device time of each mma kernel (float16 tensors); first ptxas' registers, spills and shared memory of the mma
kernels (``-cl-nv-verbose``).

``--fp32``: float32 rows only: the tf32 kernels (``ops.attention_mma_tf32``) at matmul precision "high"
(kind tf32) and "tf32x3", the blocked fp32 kernels, whatever "highest" (the default) runs, and torch's SDPA
float32 with ``torch.backends.cuda.matmul.allow_tf32 = False`` (its mem-efficient kernel: 3xTF32 on tensor
cores), ratio = torch ms / netcl ms (above 1: netcl faster); ptxas figures of the tf32 kernels.
``--sweep`` (with ``--fp32``): device ms of each tf32 kernel under alternative blockings
(``attention_mma_tf32_source.Plan``: tile, buffers, row tiles a warp) at (8, 8, 1024) full, to choose
``PLANS`` / ``X3_PLANS``. ``--errors``: the largest absolute error of out, dq, dk, dv against float64
(torch's math attention in float64 on the GPU, unit-normal inputs and upstream gradient) of each float32
path at each size.
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
from netcl.runtime.ops import attention_mma_tf32 as T
from netcl.runtime.ops import attention_mma_tf32_source as TS
from netcl.runtime.ops.attention_mma_source import attention_source
from netcl.runtime.ops.precision import matmul_precision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import time_cuda, time_device

D = 64
SHAPES = [(4, 8, 2048, True), (1, 8, 8192, True), (8, 8, 1024, False)]
REPEATS = 10


def _ptxas(device, src: str, label: str) -> None:
    """Build ``src`` with ``-cl-nv-verbose`` and print ptxas' registers, spills and shared memory for it."""
    try:
        program = cl.Program(device.context, src).build(options=["-cl-nv-verbose"])
        log = program.get_build_info(device.cl_device, cl.program_build_info.LOG)
        lines = [x.strip() for x in log.splitlines() if any(w in x for w in ("registers", "spill", "smem"))]
        print(f"ptxas {label}: {' | '.join(lines)}", flush=True)
    except Exception as exc:
        print(f"BUILD FAILED {label}: {exc}"[:3000], flush=True)


def ptxas(device):
    for e in (64, 128):
        for kernel in ("fwd", "bwd_q", "bwd_kv"):
            for half in (False, True):  # float32 / float16 outputs
                _ptxas(device, attention_source(kernel, e, True, half, "int"), f"E{e} {kernel} half={half}")


def ptxas_tf32(device):
    for e in (64, 128):
        for kernel in ("fwd", "bwd_q", "bwd_kv"):
            for kind in TS.KINDS:
                _ptxas(device, TS.attention_source(kernel, e, True, kind, "int"), f"E{e} {kernel} {kind}")


#: mode -> (matmul precision, NETCL_ATTENTION) of the netcl rows
MODES = {
    "mma-f16": ("highest", ""),
    "mma-f32": ("fp16", ""),
    "blocked": ("highest", "blocked"),
    "tf32": ("high", ""),
    "tf32x3": ("tf32x3", ""),
    "highest": ("highest", ""),
}


def netcl_ms(device, b, h, s, causal, mode):
    rng = np.random.default_rng(0)
    dtype = np.float16 if mode == "mma-f16" else np.float32
    q, k, v, g = (nc.Tensor.from_host(device, rng.standard_normal((b, h, s, D)), dtype) for _ in range(4))
    prec, choice = MODES[mode]
    os.environ["NETCL_ATTENTION"] = choice
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
        "fwd": lambda: M._run("fwd", [q, k, v, out, lse], s, b * h, spec, False, True, "f16"),
        "bwd_q": lambda: M._run("bwd_q", [q, k, v, out, g, lse, dq, drow], s, b * h, spec, False, True, "f16"),
        "bwd_kv": lambda: M._run("bwd_kv", [q, k, v, g, lse, drow, dk, dv], s, b * h, spec, False, True, "f16"),
        "f16 copy": lambda: M._operand(x32, "f16"),
    }
    return {name: time_device(device, fn, REPEATS).median_ms for name, fn in runs.items()}


def torch_ms(b, h, s, causal, dtype_name):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32: full precision (3xTF32 in the mem-efficient kernel)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    dt = getattr(torch, dtype_name)
    q, k, v, g = (torch.randn(b, h, s, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(4))
    with torch.no_grad():
        fwd = time_cuda(torch, lambda: sdpa(q, k, v, is_causal=causal), REPEATS).median_ms
    fb = time_cuda(torch, lambda: torch.autograd.backward(sdpa(q, k, v, is_causal=causal), g), REPEATS).median_ms
    return fwd, fb


def errors(device, b, h, s, causal):
    """mode -> max |error| of (out, dq, dk, dv) against float64 (torch's math attention in float64 on the GPU)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((b, h, s, D)).astype(np.float32) for _ in range(4)]
    ref = [torch.tensor(a, dtype=torch.float64, device="cuda", requires_grad=True) for a in arrays[:3]]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=causal)
    out.backward(torch.tensor(arrays[3], dtype=torch.float64, device="cuda"))
    want = [out.detach()] + [x.grad for x in ref]
    result = {}
    for mode in ("blocked", "tf32x3", "tf32", "highest"):
        prec, choice = MODES[mode]
        os.environ["NETCL_ATTENTION"] = choice
        q, k, v, g = (nc.Tensor.from_host(device, a, np.float32) for a in arrays)
        with matmul_precision(prec):
            spec = RA.check_attention(q, k, v, None, 0.0, causal, None, False)
            taken = RA.select_variant(device, np.dtype(np.float32), spec).name
            o, lse = RA.attention_forward(q, k, v, None, spec)
            grads = RA.attention_backward(g, q, k, v, o, lse, None, spec)
        got = [torch.from_numpy(x.to_host().astype(np.float64)).cuda() for x in (o, *grads)]
        result[f"{mode} [{taken}]"] = [float((x - w).abs().max()) for x, w in zip(got, want, strict=True)]
        os.environ.pop("NETCL_ATTENTION", None)
    tq = [torch.tensor(a, device="cuda", requires_grad=True) for a in arrays[:3]]
    o = torch.nn.functional.scaled_dot_product_attention(*tq, is_causal=causal)
    o.backward(torch.tensor(arrays[3], device="cuda"))
    got = [o.detach()] + [x.grad for x in tq]
    result["torch SDPA fp32"] = [float((x.double() - w).abs().max()) for x, w in zip(got, want, strict=True)]
    del ref, out, want, got, tq, o
    torch.cuda.empty_cache()
    return result


#: kernel -> the E 64 blockings ``--sweep`` times (each for both kinds)
SWEEP = {
    "fwd": [TS.Plan(32, 2), TS.Plan(16, 2, mt=2), TS.Plan(32, 2, mt=2), TS.Plan(64, 1)],
    "bwd_q": [TS.Plan(32, 2), TS.Plan(16, 2), TS.Plan(32, 1)],
    "bwd_kv": [TS.Plan(32, 2), TS.Plan(16, 2), TS.Plan(32, 1)],
}


def plan_sweep(device, b=8, h=8, s=1024, causal=False):
    """Device ms of each tf32 kernel (E 64) under each blocking of ``SWEEP``, both kinds."""
    rng = np.random.default_rng(0)
    q, k, v, g = (nc.Tensor.from_host(device, rng.standard_normal((b, h, s, D)), np.float32) for _ in range(4))
    spec = RA.check_attention(q, k, v, None, 0.0, causal, None, False)
    out, lse = (nc.Tensor.empty(shape, np.float32, device) for shape in ((b, h, s, D), (b, h, s)))
    dq, dk, dv = (nc.Tensor.empty(x.shape, np.float32, device) for x in (q, k, v))
    drow = nc.Tensor.empty(lse.shape, np.float32, device)
    buffers = {
        "fwd": [q, k, v, out, lse],
        "bwd_q": [q, k, v, out, g, lse, dq, drow],
        "bwd_kv": [q, k, v, g, lse, drow, dk, dv],
    }
    saved = dict(TS.PLANS), dict(TS.X3_PLANS)
    try:
        for kind in TS.KINDS:
            for kernel, plans in SWEEP.items():
                cells = []
                for p in plans:
                    TS.PLANS[(kernel, D)] = TS.X3_PLANS[(kernel, D)] = p
                    if TS.local_bytes(kernel, D, kind) > 48 * 1024:
                        continue
                    try:
                        T._run(kernel, buffers[kernel], s, b * h, spec, kind, False)  # build outside the timing
                        fn = lambda: T._run(kernel, buffers[kernel], s, b * h, spec, kind, False)  # noqa: B023, E731
                        cells.append(
                            f"tile {p.tile} nbuf {p.nbuf} mt {p.mt}: {time_device(device, fn, REPEATS).median_ms:.3f}"
                        )
                    except Exception as exc:
                        cells.append(f"tile {p.tile} nbuf {p.nbuf} mt {p.mt}: FAILED {exc}"[:300])
                print(f"sweep b{b} h{h} s{s} {kind} {kernel} ms: " + " | ".join(cells), flush=True)
    finally:
        TS.PLANS.clear(), TS.PLANS.update(saved[0])
        TS.X3_PLANS.clear(), TS.X3_PLANS.update(saved[1])


def main_fp32(device, with_errors):
    """float32 rows: tf32, tf32x3, blocked, the default ("highest"), torch SDPA fp32 (TF32 off)."""
    ptxas_tf32(device)
    if "--sweep" in sys.argv:
        plan_sweep(device)
    for b, h, s, causal in SHAPES:
        cells = []
        tfwd = peer = None
        try:
            tfwd, peer = torch_ms(b, h, s, causal, "float32")
        except Exception as exc:
            print(f"torch float32 failed: {exc}", flush=True)
        for mode in ("tf32", "tf32x3", "highest", "blocked"):
            try:
                taken, fwd, fb = netcl_ms(device, b, h, s, causal, mode)
                ratio = f", torch/netcl {peer / fb:.2f}" if peer else ""
                cells.append(f"netcl {mode} [{taken}] {fwd:.3f} / {fb:.3f}{ratio}")
            except Exception:
                traceback.print_exc()
                cells.append(f"netcl {mode} FAILED")
        if peer:
            cells.append(f"torch SDPA float32 (allow_tf32 False) {tfwd:.3f} / {peer:.3f}")
        tag = f"b{b} h{h} s{s} {'causal' if causal else 'full'} d{D}"
        print(f"{tag} fwd / fwd+bwd ms: " + " | ".join(cells), flush=True)
        if with_errors:
            for name, errs in errors(device, b, h, s, causal).items():
                print(f"  {tag} max |err| vs float64 out/dq/dk/dv {name}: " + " ".join(f"{e:.3g}" for e in errs))


def main():
    device = nc.get_device("gpu")
    print(f"device: {device.name} ({device.platform_name})", flush=True)
    if "--fp32" in sys.argv:
        return main_fp32(device, "--errors" in sys.argv)
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
