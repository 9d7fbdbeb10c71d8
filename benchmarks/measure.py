"""Timing helpers: device time from profiling events on OpenCL, wall-clock on the NumPy backend."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from netcl.core import Device
from netcl.runtime.perf import timing_region


@dataclass
class Timing:
    """Median and spread of repeated runs, in milliseconds, and which clock measured them."""

    median_ms: float
    min_ms: float
    max_ms: float
    clock: str

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms, "clock": self.clock}


def time_device(device: Device, fn: Callable[[], object], repeats: int, warmup: int = 2) -> Timing:
    """Run ``fn`` ``warmup`` times, then time ``repeats`` runs on ``device``'s queue."""
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        with timing_region("bench", device.queue) as region:
            fn()
        samples.append(region.elapsed_ms)
    _sync(device)
    clock = "events" if device.kind == "opencl" else "wall"
    return Timing(statistics.median(samples), min(samples), max(samples), clock)


def time_host(fn: Callable[[], object], repeats: int, inner: int, warmup: int = 3) -> float:
    """Median host microseconds per call of ``fn`` (each sample is ``inner`` back-to-back calls)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner * 1e6)
    return statistics.median(samples)


def time_wall(
    fn: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None, warmup: int = 2
) -> Timing:
    """Wall-clock timing of ``fn`` followed by ``sync`` (NumPy, torch on CPU)."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return Timing(statistics.median(samples), min(samples), max(samples), "wall")


def time_cuda(torch, fn: Callable[[], object], repeats: int, warmup: int = 2) -> Timing:
    """``fn`` on torch's current CUDA stream: ``warmup`` runs, then ``repeats`` runs each timed by a pair
    of CUDA events (the peer's device time, as ``time_device`` is netcl's)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return Timing(statistics.median(samples), min(samples), max(samples), "cuda-events")


def _sync(device: Device) -> None:
    if device.queue is not None:
        device.queue.finish()


def paired_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median over repeats of each repeat's ratio: the two were timed back to back, so a drift of the
    shared host's speed between repeats cancels (a ratio of medians would mix repeats of different speeds)."""
    return statistics.median(a / b for a, b in zip(numerators, denominators, strict=True))


def rand(shape: tuple[int, ...], seed: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


@dataclass
class KernelShare:
    """Device time of one kernel name during one call of a runner."""

    name: str
    launches: int
    ms: float


@dataclass
class Launch:
    """One command of a measured call: its name, global and local size (kernels), device ms."""

    name: str
    global_size: tuple
    local_size: tuple
    ms: float


def launches(
    device: Device, fn: Callable[[], object], label: str | None = None, keep: list | None = None
) -> list[Launch] | None:
    """Run ``fn`` once (after a warm call: no builds inside) and return what it ran on the device (None off OpenCL).

    A ``netcl.profiler.profile`` of ``device`` records the call: every kernel (eager, prepared,
    replayed), device copy and fill, and the host BLAS products of CPU OpenCL devices (their
    device time is their host time), in enqueue order, with the device time of each. With
    ``keep`` (a list) the profile is appended to it, the call inside a ``record_function(label)``
    range, for one trace of many calls (``netcl.profiler.export_chrome_trace``).
    """
    if device.kind != "opencl":
        return None
    from netcl.profiler import profile, record_function

    fn()
    _sync(device)
    with profile(device) as prof, record_function(label or getattr(fn, "__name__", "call")):
        fn()
    _sync(device)
    if keep is not None:
        keep.append(prof)
    return [
        Launch(e.name, tuple(e.global_size or ()), tuple(e.local_size or ()), (e.device_time or 0.0) * 1e-3)
        for e in prof.events()
        if e.kind != "range"
    ]


def kernel_breakdown(
    device: Device, fn: Callable[[], object], label: str | None = None, keep: list | None = None
) -> list[KernelShare] | None:
    """Run ``fn`` once and return its kernels' device times by name, largest first (None off OpenCL);
    ``label`` and ``keep`` as in ``launches``."""
    recorded = launches(device, fn, label, keep)
    if recorded is None:
        return None
    shares: dict[str, KernelShare] = {}
    for launch in recorded:
        share = shares.setdefault(launch.name, KernelShare(launch.name, 0, 0.0))
        share.launches += 1
        share.ms += launch.ms
    return sorted(shares.values(), key=lambda s: -s.ms)


def standalone_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of a ``bench_<name>.py`` run alone: --quick, --device, --repeats, --no-peers, --json."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--json", dest="json_path", default=None)
    return parser


def write_results(results: dict, path: str | None) -> None:
    """``results`` as indented JSON at ``path`` (nothing when None)."""
    if path:
        Path(path).write_text(json.dumps(results, indent=2))
