"""The `hatch run bench` driver: measure every case, then print one table per workload."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from cases import Case, all_cases
from dispatch import cold_vs_warm_compile, jit_vs_raw_launch, replay_vs_enqueue
from measure import Timing, time_device, time_wall
from peers import measure_torch

from netcl.core import Device, get_device
from netcl.runtime.cache import program_cache
from netcl.runtime.launch import launch

MODES = ("fwd", "fwd+bwd")


class Progress:
    """One line per measurement on stderr, so a long run shows where it is."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.count = 0

    def __call__(self, what: str) -> None:
        self.count += 1
        print(f"[{time.perf_counter() - self.start:6.1f}s] {what}", file=sys.stderr, flush=True)


def default_size(device: Device, quick: bool) -> int:
    if device.kind == "opencl" and device.is_gpu:
        return 1 << 24 if quick else 1 << 26
    if device.kind == "opencl":
        return 1 << 20 if quick else 1 << 24
    return 1 << 20 if quick else 1 << 22


def copy_bandwidth(device: Device, n: int, repeats: int) -> tuple[Timing, float]:
    """Time to copy ``n`` float32 with float4 loads/stores, and the resulting GB/s (read + write)."""
    if device.kind != "opencl":
        src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
        timing = time_wall(lambda: np.copyto(dst, src), repeats)
    else:
        from netcl.core import Tensor

        source = (
            "__kernel void copy4(__global const float4* restrict src, __global float4* restrict dst, const int n4)"
            " { int i = get_global_id(0); if (i < n4) dst[i] = src[i]; }"
        )
        handle = program_cache.get_or_compile(("bench", "copy4"), source, device.context)
        kernel = handle.kernel("copy4", [None, None, np.int32])
        src, dst = Tensor.zeros((n,), device=device), Tensor.empty((n,), device=device)
        n4 = n // 4
        gsize = -(-n4 // 256) * 256
        timing = time_device(device, lambda: launch(kernel, gsize, 256, src, dst, n4), repeats)
    return timing, 2 * n * 4 / (timing.median_ms * 1e6)


def measure_case(device: Device, case: Case, repeats: int, progress: Progress, peers: bool) -> dict[str, Any]:
    timings: dict[str, dict[str, Timing]] = {}
    for variant, modes in case.runners.items():
        for mode, runner in modes.items():
            progress(f"{case.name}: {variant} {mode}")
            timer = time_wall(runner, repeats) if variant == "numpy" else time_device(device, runner, repeats)
            timings.setdefault(variant, {})[mode] = timer
    if peers:
        timings.update(measure_torch(device, case, repeats, progress))
    return timings


def _gbps(nbytes: int, timing: Timing | None) -> float | None:
    return nbytes / (timing.median_ms * 1e6) if timing else None


def print_case(case: Case, timings: dict[str, dict[str, Timing]], copy_gbps: float) -> dict[str, Any]:
    header = f"{'variant':<16}" + "".join(f"{m + ' ms':>12}{'GB/s':>9}{'% copy':>8}" for m in MODES)
    print(f"\n{case.name}: {case.description}  ({case.elements:,} elements)")
    print(header)
    print("-" * len(header))
    rows: dict[str, Any] = {}
    for variant, modes in timings.items():
        cells = f"{variant:<16}"
        rows[variant] = {}
        for mode in MODES:
            timing = modes.get(mode)
            gbps = _gbps(case.min_bytes[mode], timing)
            if timing is None:
                cells += f"{'-':>12}{'-':>9}{'-':>8}"
                continue
            cells += f"{timing.median_ms:>12.3f}{gbps:>9.1f}{100 * gbps / copy_gbps:>7.0f}%"
            rows[variant][mode] = {**timing.as_dict(), "gbps": gbps, "share_of_copy": gbps / copy_gbps}
        print(cells)
    speedups = {}
    for mode in MODES:
        fused, unfused = timings.get("netcl fused", {}).get(mode), timings.get("netcl unfused", {}).get(mode)
        if fused and unfused:
            speedups[mode] = unfused.median_ms / fused.median_ms
    for peer in ("torch eager", "torch.compile"):
        for mode in MODES:
            fused, other = timings.get("netcl fused", {}).get(mode), timings.get(peer, {}).get(mode)
            if fused and other:
                speedups[f"{mode} vs {peer}"] = other.median_ms / fused.median_ms
    if speedups:
        print("speed-up of netcl fused: " + ", ".join(f"{k} {v:.2f}x" for k, v in speedups.items()))
    return {"elements": case.elements, "min_bytes": case.min_bytes, "variants": rows, "speedups": speedups}


def main(args: argparse.Namespace) -> dict[str, Any]:
    device = get_device(args.device)
    n = args.size or default_size(device, args.quick)
    repeats = args.repeats or (5 if args.quick else (30 if device.is_gpu else 10))
    progress = Progress()
    print(f"netcl bench on {device!r}, driver {device.driver_version}, {n:,} float32 per tensor, {repeats} repeats")
    print("times: median device ms (OpenCL profiling events; wall-clock on the NumPy backend)")
    progress("device copy bandwidth (float4)")
    copy_timing, copy_gbps = copy_bandwidth(device, n, repeats)
    print(f"device copy: {copy_gbps:.1f} GB/s ({copy_timing.median_ms:.3f} ms for {2 * n * 4 / 1e6:.0f} MB moved)")
    results: dict[str, Any] = {
        "device": repr(device),
        "driver": device.driver_version,
        "elements": n,
        "repeats": repeats,
        "copy": {**copy_timing.as_dict(), "gbps": copy_gbps},
        "workloads": {},
    }
    progress("building the workloads")
    for case in all_cases(device, n):
        timings = measure_case(device, case, repeats, progress, peers=not args.no_peers)
        results["workloads"][case.name] = print_case(case, timings, copy_gbps)
    if device.kind == "opencl":
        progress("host cost: cache-hit jit call vs raw launch")
        dispatch = jit_vs_raw_launch(device, repeats=max(repeats, 5))
        progress("host cost: Graph replay vs eager launches")
        replay = replay_vs_enqueue(device, repeats=max(repeats, 5))
        print("\nhost cost per call (µs, 1K elements)")
        print(
            f"  cache-hit jit call {dispatch['jit_call_us']:.1f} vs raw pyopencl launch {dispatch['raw_launch_us']:.1f}"
            f"  ({dispatch['ratio']:.2f}x)"
        )
        print(
            f"  Graph.execute {replay['replay_us_per_kernel']:.1f} per kernel vs eager "
            f"{replay['eager_us_per_kernel']:.1f} per kernel ({replay['kernels']} kernels)"
        )
        results["dispatch"], results["replay"] = dispatch, replay
    progress("cold compile vs warm disk cache (two fresh processes)")
    compile_times = cold_vs_warm_compile(device)
    print(
        f"\ncompile chain8 fwd+bwd in a fresh process: cold {compile_times['cold_s']:.2f} s "
        f"({compile_times['cold_builds']} builds), warm disk cache {compile_times['warm_s']:.2f} s "
        f"({compile_times['warm_builds']} builds, {compile_times['warm_disk_hits']} disk hits)"
    )
    results["compile"] = compile_times
    if args.plot_path:
        _plot(results, args.plot_path)
    return results


def _plot(results: dict[str, Any], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'netcl-jit[plot]' or matplotlib); no plot written")
        return
    workloads = list(results["workloads"])
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 4))
    for ax, name in zip(np.atleast_1d(axes), workloads, strict=True):
        variants = results["workloads"][name]["variants"]
        labels = [v for v in variants if "fwd" in variants[v]]
        ax.bar(labels, [variants[v]["fwd"]["median_ms"] for v in labels])
        ax.set_title(f"{name} forward")
        ax.set_ylabel("ms (lower is better)")
        ax.tick_params(axis="x", rotation=45)
    fig.suptitle(results["device"])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
