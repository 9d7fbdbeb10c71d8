"""Per-device parameter search for the GEMM kernels, stored on disk (``python -m netcl.runtime.tune``).

At the first product of a shape class on a device, ``select`` times every candidate config on the
real problem (device time from profiling events, best of a few runs; the three fastest again by
median, ``search``), keeps the fastest, and
stores it in ``<kernel cache dir>/tune/<device key>.json``; the device key names what the
program cache's disk key names (platform, device, driver, device version) plus the kernel
generation, so a new driver or new kernels search again. Later processes read the file.

``NETCL_TUNE``: "0" turns the search off everywhere (defaults only; what tests and CI use), "1"
turns it on everywhere; unset, GPUs search and CPU devices use defaults (their compiles are
slow and a host-BLAS path serves them), except for choices between two paths that a CPU device
makes by measurement too (``select(..., cpu=True)``: conv's implicit GEMM or im2col + host BLAS).
A search at a first use inside a capture runs with the recording paused: the capture records the
winner's launches, never the trials', so a step captured first (``fuse_graph``) replays the tuned
configs, as one run eagerly first does.
In a distributed job rank 0 decides every choice and the others take it (``tune.agree``), and
``netcl.runtime.use_deterministic_algorithms(True)`` fixes every choice to its default.
Shape classes: M, N and K each rounded up to a power of two or 1.5 times one (``size_class``),
batched or not, the layout and dtype, so one search serves a range of sizes (and a new batch size
mostly reuses it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from netcl.core import Device, Tensor
from netcl.runtime import capture
from netcl.runtime.disk_cache import cache_dir
from netcl.runtime.tune.agree import local_choices as local_choices

log = logging.getLogger("netcl.tune")
ENV = "NETCL_TUNE"
#: Bump when the kernels, the candidates or how they are timed change, so stored winners of older searches are
#: not reused (gemm-19: the timed split runs share one workspace, epilogue keys).
GENERATION = "gemm-19"
_LOCK = threading.Lock()
_MEMORY: dict[str, dict[str, Any]] = {}


def enabled(device: Device, cpu: bool = False) -> bool:
    """Whether a first use searches on ``device`` (see ``NETCL_TUNE`` in the module docstring);
    ``cpu``: a search cheap enough for CPU devices too when ``NETCL_TUNE`` is unset."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("0", "false", "off", "no"):
        return False
    if value in ("1", "true", "on", "yes"):
        return True
    return device.is_gpu or cpu


def device_key(device: Device) -> str:
    d = device.cl_device
    parts = [d.platform.name, d.platform.version, d.name, d.driver_version, d.version, GENERATION]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


def store_path(device: Device) -> Path | None:
    directory = cache_dir()
    return None if directory is None else directory / "tune" / f"{device_key(device)}.json"


def winners(device: Device) -> dict[str, dict[str, Any]]:
    """A copy of ``device``'s stored winners: choice key -> the winning config's dict, with the
    winner's time in milliseconds (None where none was measured) under ``_ms``."""
    with _LOCK:
        return {key: dict(value) for key, value in _table(device).items()}


def _table(device: Device) -> dict[str, Any]:
    key = device_key(device)
    table = _MEMORY.get(key)
    if table is None:
        table = {}
        path = store_path(device)
        if path is not None:
            try:
                table = json.loads(path.read_text()).get("winners", {})
            except (OSError, ValueError, AttributeError):
                table = {}
        _MEMORY[key] = table
    return table


def _save(device: Device, table: dict[str, Any]) -> None:
    path = store_path(device)
    if path is None:
        return
    payload = {"device": device.cl_device.name.strip(), "driver": device.driver_version, "winners": table}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:  # an unwritable cache only costs a search in the next process
        log.warning("netcl tune: cannot store winners at %s (%s)", path, exc)


def pow2_class(value: int) -> int:
    return 1 << max(0, int(value) - 1).bit_length()


def size_class(value: int) -> int:
    """``value`` rounded up to the next of 1, 2, 3, 4, 6, 8, 12, 16, ...: powers of two and 1.5 times them, so a
    class spans sizes within a factor 1.5 (a transformer's 3 * 512 = 1536 apart from its 2048)."""
    power = pow2_class(value)
    three_quarters = 3 * power // 4
    return three_quarters if three_quarters >= value else power


def shape_class(family: str, m: int, n: int, k: int, batched: bool, layout: str, dtype: str) -> str:
    """The search key of a product: M, N and K by ``size_class``, batched or not, layout and dtype."""
    sizes = f"{size_class(m)}x{size_class(n)}x{size_class(k)}"
    return f"{family}|{layout}|{dtype}|{sizes}|{'b' if batched else '1'}"


def lookup(device: Device, key: str) -> dict[str, Any] | None:
    with _LOCK:
        return _table(device).get(key)


def remember(device: Device, key: str, winner: dict[str, Any], ms: float | None) -> None:
    with _LOCK:
        table = _table(device)
        table[key] = {**winner, "_ms": ms}
        _save(device, table)


def select(
    device: Device,
    key: str,
    candidates: Sequence[Any],
    default: Any,
    trial: Callable[[Any], None],
    encode: Callable[[Any], dict[str, Any]],
    decode: Callable[[dict[str, Any]], Any],
    force: bool = False,
    cpu: bool = False,
) -> Any:
    """The stored winner for ``key``, else (searching enabled; ``cpu`` as in ``enabled``) the fastest
    candidate, else ``default``.

    Under ``use_deterministic_algorithms(True)``: ``default`` (``force`` raises, or warns and searches
    in ``warn_only`` mode). In a distributed job of several ranks: rank 0's choice on every rank
    (``netcl.runtime.tune.agree``; collective at a key's first use in the process).
    """
    from netcl.runtime.determinism import alert_not_deterministic, are_deterministic_algorithms_enabled
    from netcl.runtime.tune import agree

    if are_deterministic_algorithms_enabled():
        if not force:
            return default
        alert_not_deterministic(f"the timed config search for {key!r} (tune.select(force=True))")

    def decide() -> Any:
        return _choose(device, key, candidates, default, trial, encode, decode, force, cpu)

    if agree.active():
        return agree.choose(device_key(device), key, decide, encode, decode)
    agreed = agree.agreed(device_key(device), key) if agree.agreed_any() else None
    return decide() if agreed is None else decode(dict(agreed))


def _choose(
    device: Device,
    key: str,
    candidates: Sequence[Any],
    default: Any,
    trial: Callable[[Any], None],
    encode: Callable[[Any], dict[str, Any]],
    decode: Callable[[dict[str, Any]], Any],
    force: bool,
    cpu: bool,
) -> Any:
    """``select`` in this process alone."""
    stored = None if force else lookup(device, key)
    if stored is not None:
        try:
            return decode({k: v for k, v in stored.items() if not k.startswith("_")})
        except (TypeError, ValueError):
            pass  # a stale entry: search again
    if not force and not enabled(device, cpu):
        return default
    with capture.paused(device.queue):  # inside a capture: its trials run, unrecorded
        best, best_ms = search(device, candidates, trial)
    if best is None:
        return default
    remember(device, key, encode(best), best_ms)
    log.info("netcl tune: %s -> %s (%.3f ms)", key, best, best_ms)
    return best


#: Threads that build a search's candidates ahead of its trials: NVIDIA's OpenCL compiler built 16 programs in
#: 6.4 s one after another and in 4.3 s on 4 threads, no faster on 8 or 16; PoCL builds one at a time
#: (``benchmarks/build_threads.py``; benchmarks/RESULTS.md, "Thirty-second session").
BUILD_THREADS = 4


def build_ahead(build: Callable[[Any], Any], candidates: Sequence[Any]) -> None:
    """``build(cfg)`` of every candidate on up to ``BUILD_THREADS`` threads, waiting for all. ``build`` makes only
    programs (no device memory, no launch: safe beside other builds); a candidate whose build fails is left to its
    trial, which fails the same way and is skipped there with the reason."""
    if len(candidates) < 2:
        return
    with ThreadPoolExecutor(min(BUILD_THREADS, len(candidates)), thread_name_prefix="netcl-tune-build") as pool:
        futures = [pool.submit(build, cfg) for cfg in candidates]
    for future in futures:
        future.exception()  # collected, not raised: the trial says why a candidate is skipped


def search(
    device: Device,
    candidates: Sequence[Any],
    trial: Callable[[Any], Any],
    repeats: int = 3,
    finalists: int = 3,
    rounds: int = 5,
    warmup_ms: float = 20.0,
):
    """(fastest candidate, its ms): every candidate is built (and run once) first, a warm-up of
    ``warmup_ms`` of device work follows, then each candidate's best of ``repeats`` timed runs; the
    ``finalists`` fastest are timed again in ``rounds`` interleaved rounds and ranked by their median,
    so neither a lucky minimum nor a clock change during the first pass picks the winner. Timing
    only after every build leaves no build's pause (an idle device, which may lower its clocks)
    between two timings; the warm-up (at most 100 runs, however short) brings the device to work
    before the first (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings",
    tune/__init__.py, and "Tile searches in the GPT block's first capture").

    A trial that returns a callable (its prepared run: plan built, output allocated) has that
    timed, so the ranking measures the kernels, not the trial's set-up (a plan and an output
    allocation per call); otherwise the trial itself. A trial may be called several times per
    candidate (its builds are cached). A trial with a ``build(cfg)`` method has every candidate's programs
    built on threads first (``build_ahead``). A trial with a ``timed(run) -> ms`` method times its runs itself
    (the device time of a run's kernels, where launches' host time would hide it: ``conv._WholeBatchTrial``).
    """
    from netcl.runtime.errors import CompileError, LaunchError
    from netcl.runtime.perf import timing_region

    def timed_region(run: Callable[[], Any]) -> float:
        with timing_region("tune", device.queue) as region:
            run()
        return region.elapsed_ms

    timed: Callable[[Callable[[], Any]], float] = getattr(trial, "timed", None) or timed_region

    def prepare(cfg: Any) -> Callable[[], Any]:
        prepared = trial(cfg)
        return prepared if callable(prepared) else (lambda: trial(cfg))

    def skipped(cfg: Any, exc: Exception) -> None:  # a config the device refuses (build, launch resources)
        log.debug("netcl tune: %s skipped (%s)", cfg, str(exc).splitlines()[0])

    build = getattr(trial, "build", None)
    if build is not None:
        build_ahead(build, candidates)
    built = []  # (position, candidate) of those the device builds and runs; the runs are not kept
    for position, cfg in enumerate(candidates):
        try:
            prepare(cfg)
        except (CompileError, LaunchError) as exc:
            skipped(cfg, exc)
            continue
        built.append((position, cfg))
    if not built:
        return None, float("inf")
    device.queue.finish()
    if warmup_ms > 0:  # at most 100 runs of the first candidate, however fast it is
        warm, spent, count = prepare(built[0][1]), 0.0, 0
        while spent < warmup_ms and count < 100:
            spent, count = spent + timed(warm), count + 1
        del warm
    top = []  # the fastest of the first pass so far: (best time, position, candidate, its run)
    for position, cfg in built:
        try:
            run = prepare(cfg)
            ms = min(timed(run) for _ in range(repeats))
        except (CompileError, LaunchError) as exc:  # refused after all: skipped as in the build pass
            skipped(cfg, exc)
            continue
        # only the finalists' runs are kept alive: each holds its plan and its output tensor
        top = sorted([*top, (ms, position, cfg, run)], key=lambda entry: entry[:2])[:finalists]
    if not top:
        return None, float("inf")
    if len(top) == 1:
        return top[0][2], top[0][0]
    samples: dict[int, list[float]] = {position: [] for _, position, _, _ in top}
    for _ in range(rounds):
        for _, position, _, run in top:
            samples[position].append(timed(run))
    ms, _, best = min((statistics.median(samples[position]), position, cfg) for _, position, cfg, _ in top)
    return best, ms


def trial_operand(elements: int, dtype: Any, device: Device, seed: int) -> Tensor:
    """A scratch operand for trials: uniform values in [-1, 1) (a pure function of ``seed``), as real
    data has. Constants can flatter a kernel: a split precision's lo parts of 0.5 are zeros, so a
    search on constants times tf32x3 kernels faster than they run on real data (see benchmarks/RESULTS.md,
    "Measurements moved out of source docstrings", tune/__init__.py)."""
    import numpy as np

    from netcl.runtime.ops.layout import cast
    from netcl.runtime.ops.random import uniform

    values = uniform((elements,), -1.0, 1.0, seed, device)
    return values if np.dtype(dtype) == values.dtype else cast(values, np.dtype(dtype))


def clear(device: Device) -> None:
    """Forget ``device``'s winners (memory and disk) and the choices agreed with other ranks."""
    from netcl.runtime.tune import agree

    agree.forget()
    with _LOCK:
        _MEMORY.pop(device_key(device), None)
        path = store_path(device)
        if path is not None:
            path.unlink(missing_ok=True)
