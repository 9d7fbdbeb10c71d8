"""The `hatch run bench` driver: measure every case, then print one table per workload."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from cases import Case, all_cases
from dispatch import cold_vs_warm_compile, jit_vs_raw_launch, replay_vs_enqueue
from measure import Timing, kernel_breakdown, time_device, time_wall
from peers import measure_torch, torch_status
from plot import plot
from verdict import overlaps, ratio_words, short, spread, verdict

from netcl.core import Device, get_device
from netcl.runtime.cache import program_cache
from netcl.runtime.launch import launch

#: seconds between workloads on CPU devices, for BLAS worker threads to stop spinning
BLAS_SETTLE_S = 0.3

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


def measure_case(device: Device, case: Case, repeats: int, progress: Progress, torch_backend) -> dict[str, Any]:
    timings: dict[str, dict[str, Timing]] = {}
    for variant, modes in case.runners.items():
        for mode, runner in modes.items():
            progress(f"{case.name}: {variant} {mode}")
            timer = time_wall(runner, repeats) if variant == "numpy" else time_device(device, runner, repeats)
            timings.setdefault(variant, {})[mode] = timer
    if torch_backend is not None:
        timings.update(measure_torch(device, case, repeats, progress))
    return timings


def measure_kernels(
    device: Device, case: Case, progress: Progress, profiles: list | None = None
) -> dict[str, dict[str, Any]]:
    """Per-kernel device time of one call of each netcl variant (what the verdict's reasons quote), from
    a ``netcl.profiler`` profile of the call; ``profiles`` (a list) collects those profiles."""
    kernels: dict[str, dict[str, Any]] = {}
    for variant, modes in case.runners.items():
        if variant == "numpy":
            continue
        for mode, runner in modes.items():
            progress(f"{case.name}: kernels of {variant} {mode}")
            label = f"{case.name}: {variant} {mode}"
            kernels.setdefault(variant, {})[mode] = kernel_breakdown(device, runner, label, profiles)
    return kernels


def _gbps(nbytes: int | None, timing: Timing | None) -> float | None:
    return nbytes / (timing.median_ms * 1e6) if timing and nbytes else None


def print_case(
    case: Case, timings: dict[str, dict[str, Timing]], kernels: dict[str, dict[str, Any]], copy_gbps: float
) -> dict[str, Any]:
    """The workload's table (median and min-max per cell), its ratio lines and its verdict."""
    cell = 27
    header = f"{'variant':<16}" + "".join(f"{m + ' ms (min-max)':>{cell}}{'GB/s':>8}{'% copy':>8}" for m in MODES)
    print(f"\n{case.name}: {case.description}  ({case.elements:,} elements)")
    print(header)
    print("-" * len(header))
    rows: dict[str, Any] = {}
    for variant, modes in timings.items():
        cells = f"{variant:<16}"
        rows[variant] = {}
        for mode in MODES:
            timing = modes.get(mode)
            if timing is None:
                cells += f"{'-':>{cell}}{'-':>8}{'-':>8}"
                continue
            gbps = _gbps(case.min_bytes.get(mode), timing)
            share = f"{100 * gbps / copy_gbps:>7.0f}%" if gbps else f"{'-':>8}"
            cells += f"{spread(timing):>{cell}}{(f'{gbps:.1f}' if gbps else '-'):>8}{share}"
            rows[variant][mode] = {
                **timing.as_dict(),
                "gbps": gbps,
                "share_of_copy": gbps / copy_gbps if gbps else None,
            }
        print(cells)
    primary = case.primary
    speedups: dict[str, float] = {}
    for other in timings:
        if other == primary:
            continue
        words = []
        for mode in MODES:
            mine, theirs = timings.get(primary, {}).get(mode), timings[other].get(mode)
            if mine and theirs:
                speedups[f"{mode} vs {short(other)}"] = theirs.median_ms / mine.median_ms
                noise = " (within spread)" if overlaps(mine, theirs) else ""
                words.append(f"{mode}: {ratio_words(short(primary), mine, short(other), theirs)}{noise}")
        if words:
            print(f"  {short(primary)} vs {short(other)}: " + "; ".join(words))
    for variant in (primary, "netcl unfused"):
        for mode in MODES:
            shares = kernels.get(variant, {}).get(mode)
            if shares:
                total = sum(k.ms for k in shares)
                top = ", ".join(f"{k.name} x{k.launches} {k.ms:.3f}" for k in shares[:3])
                more = f", +{len(shares) - 3} more" if len(shares) > 3 else ""
                launches = sum(k.launches for k in shares)
                print(f"  kernels of {short(variant)} {mode}: {launches} launch(es), {total:.3f} ms: {top}{more}")
    copy_ms = {m: b / (copy_gbps * 1e6) for m, b in case.min_bytes.items() if b}
    line = verdict(primary, timings, kernels, MODES, copy_ms)
    print(f"verdict: {line}")
    return {
        "elements": case.elements,
        "min_bytes": case.min_bytes,
        "primary": primary,
        "variants": rows,
        "speedups": speedups,
        "verdict": line,
        "kernels": {v: {m: [vars(k) for k in ks] for m, ks in modes.items() if ks} for v, modes in kernels.items()},
    }


def write_profile(profiles: list, path: str, device: Device) -> None:
    """``--profile PATH``: one Chrome trace of the per-kernel calls (one call of each netcl variant and
    mode of each workload, each in a range named "workload: variant mode"), and their top kernels."""
    from netcl.profiler import export_chrome_trace, key_averages

    if device.kind != "opencl":
        print(f"--profile: the NumPy backend launches no kernels; {path} holds no device work")
    export_chrome_trace(profiles, path)
    print("\nkernels of one call of each netcl variant, all workloads (netcl.profiler):")
    print(key_averages(profiles).table(sort_by="device_time", row_limit=20))
    print(f"wrote the Chrome trace to {path} (open it in https://ui.perfetto.dev)")


def device_words(device: Device, chosen_with: str | None) -> str:
    """``"Intel(R) UHD 630 [GPU] on platform Intel(R) OpenCL HD Graphics, driver 31.0"`` and so on."""
    if device.kind != "opencl":
        return "the NumPy backend (host CPU, no OpenCL)"
    import pyopencl as cl

    kind = cl.device_type.to_string(device.cl_device.type)
    return f"{device.name} [{kind}] on platform {device.platform_name}, driver {device.driver_version}"


def selection_reason(chosen_with: str | None) -> str:
    """Why this device: the --device flag, or netcl.core's reason for its default."""
    if chosen_with:
        return f"chosen with --device {chosen_with}"
    import netcl.core as core

    reason_of = getattr(core, "default_reason", None) or getattr(core, "selection_reason", None)
    try:
        reason = reason_of() if callable(reason_of) else None
    except Exception as exc:  # the bench must not die on a report detail
        reason = f"(the selection reason could not be read: {type(exc).__name__})"
    return f"the default device because {reason}" if reason else "the default device"


def main(args: argparse.Namespace) -> dict[str, Any]:
    device = get_device(args.device)
    n = args.size or default_size(device, args.quick)
    repeats = args.repeats or (5 if args.quick else (30 if device.is_gpu else 10))
    progress = Progress()
    words, why = device_words(device, args.device), selection_reason(args.device)
    backend, peer_line = (None, "peers: torch skipped (--no-peers given; leave it out to compare)")
    if not args.no_peers:
        backend, peer_line = torch_status(device)
        peer_line = f"peers: {peer_line}"
    print(f"netcl bench on {words}")
    print(f"  {why}")
    quick = " (--quick: small sizes, where launch costs weigh more)" if args.quick else ""
    print(f"  {n:,} float32 per tensor, {repeats} repeats{quick}")
    print(f"  {peer_line}")
    print("times: median ms and (min-max) of the repeats; device time from OpenCL profiling events (program")
    print("builds excluded), wall-clock on the NumPy backend and for NumPy. Ratios name their direction.")
    progress("device copy bandwidth (float4)")
    copy_timing, copy_gbps = copy_bandwidth(device, n, repeats)
    print(f"device copy: {copy_gbps:.1f} GB/s ({copy_timing.median_ms:.3f} ms for {2 * n * 4 / 1e6:.0f} MB moved)")
    results: dict[str, Any] = {
        "device": repr(device),
        "device_words": words,
        "selection": why,
        "peers": peer_line,
        "driver": device.driver_version,
        "elements": n,
        "repeats": repeats,
        "copy": {**copy_timing.as_dict(), "gbps": copy_gbps},
        "workloads": {},
    }
    progress("building the workloads")
    profiles: list | None = [] if getattr(args, "profile_path", None) else None
    for case in all_cases(device, n, getattr(args, "only", None)):
        timings = measure_case(device, case, repeats, progress, backend)
        kernels = measure_kernels(device, case, progress, profiles)
        results["workloads"][case.name] = print_case(case, timings, kernels, copy_gbps)
        if not device.is_gpu:
            # The NumPy peer's products leave OpenBLAS's worker threads spinning for ~0.1 s; on a
            # 2-vCPU machine they took a core from the next workload's first measurement (the
            # fused detection loss after mlp_block: 5-8 ms instead of 3). Let them go to sleep.
            time.sleep(BLAS_SETTLE_S)
    print(f"\n{peer_line}")
    if profiles is not None:
        write_profile(profiles, args.profile_path, device)
    if device.kind == "opencl":
        progress("host cost: cache-hit jit call vs raw launch")
        dispatch = jit_vs_raw_launch(device, repeats=max(repeats, 5))
        progress("host cost: Graph replay vs eager launches")
        replay = replay_vs_enqueue(device, repeats=max(repeats, 5))
        print("\nhost cost per call (µs, 1K elements)")
        print(
            f"  cache-hit jit call {dispatch['jit_call_us']:.1f} vs raw pyopencl launch {dispatch['raw_launch_us']:.1f}"
            f"  (the jit call costs {dispatch['ratio']:.2f}x the raw launch)"
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
        plot(results, args.plot_path)
    return results
