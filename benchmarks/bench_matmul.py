"""The ``matmul`` workload: TFLOP/s by shape and precision, with cuBLAS (through torch) as the peer.

Run alone (``python benchmarks/bench_matmul.py [--quick] [--device SPEC] [--only LABEL ...]``) or as
``hatch run bench --workload matmul [--only LABEL ...]`` (``--only``: the shapes whose label contains one of
the strings, e.g. ``--only sq8192 mlp``, so that a GPU machine's time limit need not cover the whole
table). Each row times one product ``(M x K) @ (K x N)`` on the netcl device (median device time from
profiling events, around the call) and, when torch sees CUDA on an NVIDIA OpenCL device, the same
product through torch (CUDA events): fp32 with TF32 off, TF32, fp16 and bf16 (netcl's "tf32x3", three
tf32 products for near-fp32 accuracy, is compared with cuBLAS fp32, its "bf16x3", three bf16 products of
operands split into ~16 bits, with cuBLAS TF32, torch's "high"; netcl's "bf16" multiplies bfloat16
tensors, "bf16-f32" float32 tensors rounded to bf16 as the kernel loads them, amp's path, not in the
ratios). The error of every netcl precision against a float64 product is printed for one shape
(relative Frobenius norm, random uniform inputs in [-1, 1]).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import standalone_parser, time_cuda, write_results

import netcl.core as nc
from netcl.runtime import ops
from netcl.runtime.ops import gemm_mma
from netcl.runtime.perf import timing_region

#: (label, M, N, K, transpose_a, transpose_b): squares (one with B transposed), the MLP layers at
#: batch 128, a weight gradient x.T @ g, and mlp_block's three products (x @ w, g @ w.T; its x.T @ g is "wgrad").
SHAPES = [
    ("sq1024", 1024, 1024, 1024, False, False),
    ("sq2048", 2048, 2048, 2048, False, False),
    ("sq4096", 4096, 4096, 4096, False, False),
    ("sq8192", 8192, 8192, 8192, False, False),
    ("sq4096nt", 4096, 4096, 4096, False, True),  # B transposed: the layout tf32 wgmma reads
    ("mlp784", 128, 512, 784, False, False),
    ("mlp512", 128, 512, 512, False, False),
    ("wgrad", 64, 256, 262144, True, False),
    ("blk_fwd", 262144, 256, 64, False, False),
    ("blk_dx", 262144, 64, 256, False, True),
]
BACK_TO_BACK = 20
QUICK = [
    ("sq128", 128, 128, 128, False, False),
    ("mlp", 32, 64, 100, False, False),
    ("wgrad", 16, 32, 4096, True, False),
    ("dx", 100, 16, 32, False, True),
]


def _rand(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _median_ms(fn, repeats: int, queue) -> float:
    fn()
    fn()
    if queue is not None:
        queue.finish()
    samples = []
    for _ in range(repeats):
        if queue is None:
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        else:
            with timing_region("matmul", queue) as region:
                fn()
            samples.append(region.elapsed_ms)
    return statistics.median(samples)


def _torch():
    try:
        import torch
    except Exception:
        return None
    return torch if torch.cuda.is_available() else None


def _torch_ms(torch, fn, repeats: int) -> float:
    return time_cuda(torch, fn, repeats, warmup=3).median_ms


def netcl_modes(device) -> list[tuple[str, str, object]]:
    """(label, precision, operand dtype) of the netcl variants this device runs."""
    modes = [("fp32", "highest", np.float32)]
    if device.kind == "opencl":
        if gemm_mma.available(device, "tf32x3"):
            modes.append(("tf32x3", "tf32x3", np.float32))
        if gemm_mma.available(device, "bf16x3"):
            modes.append(("bf16x3", "bf16x3", np.float32))
        if gemm_mma.available(device, "tf32"):
            modes.append(("tf32", "high", np.float32))
        if gemm_mma.available(device, "bf16"):
            modes.append(("bf16", "highest", nc.bfloat16))  # bfloat16 tensors, as cuBLAS bf16 multiplies
            modes.append(("bf16-f32", "medium", np.float32))  # float32 rounded to bf16 in the kernel (amp)
        if device.supports(np.float16) and gemm_mma.available(device, "f16"):
            modes.append(("fp16", "highest", np.float16))
    return modes


def selected_shapes(quick: bool, only: Sequence[str] | None = None) -> list[tuple]:
    """The rows to time: ``QUICK`` or ``SHAPES``, narrowed to the labels containing one of ``only``'s strings."""
    shapes = QUICK if quick else SHAPES
    if not only:
        return list(shapes)
    picked = [s for s in shapes if any(word in s[0] for word in only)]
    if not picked:
        labels = ", ".join(s[0] for s in shapes)
        raise ValueError(
            f"--only {' '.join(only)} matches no shape; the {'quick ' if quick else ''}labels are {labels}"
        )
    return picked


def check_only(parser: argparse.ArgumentParser, quick: bool, only: Sequence[str] | None) -> None:
    """``parser.error`` (a usage error, before any device work) where ``--only`` matches no shape."""
    try:
        selected_shapes(quick, only)
    except ValueError as exc:
        parser.error(str(exc))


def run(
    device_spec: str | None = None,
    quick: bool = False,
    repeats: int | None = None,
    peers: bool = True,
    only: Sequence[str] | None = None,
) -> dict:
    shapes = selected_shapes(quick, only)
    device = nc.get_device(device_spec)
    repeats = repeats or (5 if quick else 20)
    torch = _torch() if peers and device.kind == "opencl" and device.is_gpu else None
    modes = netcl_modes(device)
    print(f"matmul on {device!r}, driver {device.driver_version}; netcl modes {[m[0] for m in modes]}")
    print(
        f"NETCL_TUNE={os.environ.get('NETCL_TUNE', '(default)')}; torch peer: {torch.__version__ if torch else 'none'}"
    )
    results: dict = {"device": repr(device), "rows": []}
    header = f"{'shape':<8}{'M x N x K':>22} " + "".join(f"{m[0]:>9}" for m in modes)
    peer_cols = ["cuBLAS fp32", "cuBLAS tf32", "cuBLAS fp16", "cuBLAS bf16"] if torch else []
    header += "".join(f"{p:>13}" for p in peer_cols) + "   ratios"
    print("TFLOP/s (median device time)")
    print(header)
    print("-" * len(header))
    for label, m, n, k, trans_a, trans_b in shapes:
        flops = 2.0 * m * n * k
        a_host = _rand((k, m) if trans_a else (m, k), 1)
        b_host = _rand((n, k) if trans_b else (k, n), 2)
        row = {"shape": label, "m": m, "n": n, "k": k, "trans_a": trans_a, "trans_b": trans_b, "netcl": {}, "peer": {}}
        for name, precision, dtype in modes:
            a = nc.tensor(a_host.astype(dtype), device=device)
            b = nc.tensor(b_host.astype(dtype), device=device)

            def call(a=a, b=b, precision=precision, trans_a=trans_a, trans_b=trans_b):
                return ops.matmul(a, b, transpose_a=trans_a, transpose_b=trans_b, precision=precision)

            start = time.perf_counter()
            call()  # first use: builds and, with tuning on, searches
            first_s = time.perf_counter() - start
            ms = _median_ms(call, repeats, device.queue)
            row["netcl"][name] = {"ms": ms, "tflops": flops / ms / 1e9, "first_call_s": first_s}
            if flops < 1e10:  # small: also per call when called back-to-back, as in a training step
                b2b = _median_ms(lambda call=call: [call() for _ in range(BACK_TO_BACK)], repeats, device.queue)
                row["netcl"][name]["b2b_ms"] = b2b / BACK_TO_BACK
            del a, b
        if torch:
            row["peer"] = _peer_row(torch, a_host, b_host, trans_a, trans_b, flops, repeats)
        cells = "".join(f"{row['netcl'][m[0]]['tflops']:>9.3g}" for m in modes)
        peer_cells = "".join(f"{row['peer'].get(p, {}).get('tflops', float('nan')):>13.2f}" for p in peer_cols)
        ratios = _ratios(row)
        row["ratios"] = ratios
        print(
            f"{label:<8}{f'{m} x {n} x {k}':>22} {cells}{peer_cells}   "
            + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()),
            flush=True,
        )
        results["rows"].append(row)
    small = [r for r in results["rows"] if any("b2b_ms" in v for v in r["netcl"].values())]
    if small:
        print(f"\nsmall products, µs per call when {BACK_TO_BACK} run back-to-back (single call in parentheses):")
        for r in small:
            mine = ", ".join(f"{k} {1e3 * v['b2b_ms']:.1f} ({1e3 * v['ms']:.1f})" for k, v in r["netcl"].items())
            peer = ", ".join(f"{k} {1e3 * v['b2b_ms']:.1f} ({1e3 * v['ms']:.1f})" for k, v in r["peer"].items())
            print(f"  {r['shape']:<8} netcl {mine}" + (f" | {peer}" if peer else ""))
    results["errors"] = errors(device, modes, 256 if quick else 2048)
    print(f"\nerror vs float64 (relative Frobenius norm, inputs uniform in [-1, 1], {256 if quick else 2048}^3):")
    for name, err in results["errors"].items():
        print(f"  {name:<8}{err:.2e}")
    return results


def _peer_row(torch, a_host, b_host, trans_a, trans_b, flops, repeats) -> dict:
    out = {}
    a32 = torch.from_numpy(a_host).cuda()
    b32 = torch.from_numpy(b_host).cuda()
    variants = [
        ("cuBLAS fp32", torch.float32, False),
        ("cuBLAS tf32", torch.float32, True),
        ("cuBLAS fp16", torch.float16, False),
        ("cuBLAS bf16", torch.bfloat16, False),
    ]
    for name, dtype, tf32 in variants:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a, b = a32.to(dtype), b32.to(dtype)
        x, y = (a.t() if trans_a else a), (b.t() if trans_b else b)
        fn = lambda x=x, y=y: x @ y  # noqa: E731
        ms = _torch_ms(torch, fn, repeats)
        out[name] = {"ms": ms, "tflops": flops / ms / 1e9}
        if flops < 1e10:
            b2b = _torch_ms(torch, lambda fn=fn: [fn() for _ in range(BACK_TO_BACK)], repeats)
            out[name]["b2b_ms"] = b2b / BACK_TO_BACK
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def _ratios(row) -> dict:
    pairs = [
        ("fp32", "cuBLAS fp32"),
        ("tf32x3", "cuBLAS fp32"),
        ("bf16x3", "cuBLAS tf32"),
        ("tf32", "cuBLAS tf32"),
        ("fp16", "cuBLAS fp16"),
        ("bf16", "cuBLAS bf16"),
    ]
    return {
        f"{mine}/{peer.split()[1]}": row["netcl"][mine]["tflops"] / row["peer"][peer]["tflops"]
        for mine, peer in pairs
        if mine in row["netcl"] and peer in row["peer"]
    }


def errors(device, modes, size: int) -> dict:
    a_host, b_host = _rand((size, size), 3), _rand((size, size), 4)
    exact = a_host.astype(np.float64) @ b_host.astype(np.float64)
    norm = np.linalg.norm(exact)
    out = {}
    for name, precision, dtype in modes:
        a = nc.tensor(a_host.astype(dtype), device=device)
        b = nc.tensor(b_host.astype(dtype), device=device)
        got = ops.matmul(a, b, precision=precision, out_dtype=np.float32).to_host().astype(np.float64)
        out[name] = float(np.linalg.norm(got - exact) / norm)
    return out


def main() -> None:
    parser = standalone_parser(__doc__)
    parser.add_argument("--only", nargs="+", default=None, metavar="LABEL", help="the shapes whose label contains one")
    args = parser.parse_args()
    check_only(parser, args.quick, args.only)
    write_results(run(args.device, args.quick, args.repeats, not args.no_peers, args.only), args.json_path)


if __name__ == "__main__":
    main()
