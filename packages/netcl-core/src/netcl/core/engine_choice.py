"""Which CPU engine serves fused work best when there is no OpenCL GPU, and why.

CPU OpenCL devices are ranked by capability: a device whose compiler targets the host's vector
ISA (a system PoCL reports its LLVM CPU, e.g. ``pthread-haswell-...`` or ``HSTR: ...-skylake-avx512``;
Intel's CPU runtime always does) comes before one with a generic target, then wider preferred
float vectors, then the newer driver. The best-ranked one is then measured once against the
NumPy backend's fused path on a small probe (``chain8`` at 256K elements, written as netcl.jit
writes fused kernels for CPU devices: the body on ``floatN`` vectors) and the faster engine is
the default. The result is
cached on disk per machine, device and driver (``engine-choice.json`` in ``NETCL_CACHE_DIR``,
else ``~/.cache/netcl``), so only the first process on a machine pays for it (about a second).
``NETCL_ENGINE_PROBE=0`` skips the measurement: the best-ranked CPU OpenCL device is chosen.

The probe is the one program netcl-core builds; it is a measurement for device selection, not
part of any op (ops and their kernels live in netcl.runtime).
"""

from __future__ import annotations

import platform
import re
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from netcl.core.device_facts import DeviceFacts
from netcl.core.fact_cache import cache_file, read_entries, write_entries
from netcl.core.host_pool import block_elements, host_threads, run_blocks
from netcl.core.probe_kernel import probe_kernel_source

#: A device the engine choice ranks and returns (a ``netcl.core.devices.Device``).
DeviceT = TypeVar("DeviceT", bound=DeviceFacts)

PROBE_ENV = "NETCL_ENGINE_PROBE"
CACHE_NAME = "engine-choice.json"
PROBE_ELEMENTS = 1 << 20
#: LLVM CPU names that mean "no particular CPU": the compiler emits baseline x86-64/ARM code.
GENERIC_TARGETS = frozenset({"", "generic", "x86-64", "x86_64", "x86-64-v1", "i686", "aarch64", "generic-rv64"})
_HSTR = re.compile(r"HSTR:\s*\S*-(?:gnu\w*|musl\w*|elf|android\w*|none)-(\S+)")
_NAME = re.compile(r"^(?:pthread|basic|cpu)-([a-z][a-z0-9_.]*(?:-[a-z0-9_.]+)*)-(?=[A-Z])")


@dataclass(frozen=True)
class Measurement:
    """Probe times of one CPU OpenCL device and of the NumPy backend, in milliseconds."""

    opencl_ms: float
    numpy_ms: float
    cached: bool = False


def compiler_target(device: DeviceFacts) -> str | None:
    """The CPU the device's compiler generates code for (an LLVM CPU name), or None when unknown.

    PoCL names it in the device version (``HSTR: pthread-x86_64-pc-linux-gnu-haswell``) or, from
    3.1 on, in the device name (``pthread-haswell-AMD EPYC``). Intel's CPU runtime compiles for the
    host CPU it runs on.
    """
    cl_device = device.cl_device
    if cl_device is None:
        return None
    version = str(getattr(cl_device, "version", ""))
    match = _HSTR.search(version)
    if match:
        return match.group(1)
    name = device.name
    match = _NAME.match(name)
    if match:
        return match.group(1)
    vendor = str(getattr(cl_device.platform, "vendor", "")) + " " + str(getattr(cl_device.platform, "name", ""))
    if "Intel" in vendor and "CPU" in device.platform_name + " " + name.upper():
        return "host (Intel CPU runtime)"
    return None


def targets_host_isa(device: DeviceFacts) -> bool:
    """True when the compiler targets a particular CPU (its vector ISA), not a generic baseline."""
    target = compiler_target(device)
    return target is not None and target.lower() not in GENERIC_TARGETS


def _driver_key(device: DeviceFacts) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", device.driver_version)[:3])


def cpu_rank(device: DeviceFacts) -> tuple:
    """Sort key, best first: host-ISA compiler, wider preferred float vectors, newer driver."""
    return (not targets_host_isa(device), -device.vector_width, tuple(-v for v in _driver_key(device)))


def describe_target(device: DeviceFacts) -> str:
    target = compiler_target(device)
    if target is None:
        return "compiler target unknown"
    if target.lower() in GENERIC_TARGETS:
        return f"generic compiler target ({target or 'none'})"
    return f"compiler targets {target}"


def choose_cpu_engine(
    cpu_devices: list[DeviceT], numpy_device: DeviceT, measure: Callable[[DeviceT], Measurement] | None
) -> tuple[DeviceT, str]:
    """The default among CPU OpenCL devices and the NumPy backend, and the reason in words.

    ``measure`` times the best-ranked OpenCL device against the NumPy backend (None: no
    measurement, the best-ranked OpenCL device wins).
    """
    if not cpu_devices:
        return numpy_device, "no OpenCL device found; NumPy backend"
    ranked = sorted(cpu_devices, key=cpu_rank)
    best = ranked[0]
    why = f"{best.spec} {best.name!r}: {describe_target(best)}"
    if len(ranked) > 1:
        others = ", ".join(f"{d.spec} {d.name!r} ({describe_target(d)})" for d in ranked[1:])
        why += f"; ranked before {others}"
    if measure is None:
        return best, f"no OpenCL GPU; best CPU OpenCL device {why} (not measured: {PROBE_ENV}=0)"
    try:
        result = measure(best)
    except Exception as exc:  # a device that cannot build or run the probe cannot run fused kernels either
        return numpy_device, (
            f"no OpenCL GPU; the probe failed on the best CPU OpenCL device {why} ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no message'}); NumPy backend"
        )
    source = "cached measurement" if result.cached else "measured now"
    timing = (
        f"fused chain8 probe ({PROBE_ELEMENTS:,} elements): OpenCL {result.opencl_ms:.2f} ms, "
        f"NumPy backend fused path {result.numpy_ms:.2f} ms on {host_threads()} thread(s) ({source})"
    )
    if result.opencl_ms <= result.numpy_ms:
        return best, f"no OpenCL GPU; best CPU OpenCL device {why}; it beat the NumPy backend: {timing}"
    return numpy_device, (
        f"no OpenCL GPU; the NumPy backend beat the best CPU OpenCL device {why}: {timing}; "
        f"NETCL_DEVICE={best.spec} picks that device anyway"
    )


# ---- the measurement ------------------------------------------------------------------------------
def cache_path() -> Path:
    return cache_file(CACHE_NAME)


def fingerprint(device: DeviceFacts) -> str:
    """What the measurement depends on: this device and driver, the host CPU, NumPy, the thread count."""
    cl_device = device.cl_device
    parts = [
        device.platform_name,
        device.name,
        device.driver_version,
        str(getattr(cl_device, "version", "")),
        platform.machine(),
        _cpu_model(),
        np.__version__,
        f"threads={host_threads()}",
        f"probe=v3:{PROBE_ELEMENTS}:{probe_width(device)}",
    ]
    return " | ".join(parts)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cached_measure(device: DeviceFacts) -> Measurement:
    """The probe result for ``device`` from the disk cache, measuring (and storing) it on a miss."""
    path = cache_path()
    key = fingerprint(device)
    entries = read_entries(path)
    entry = entries.get(key)
    if isinstance(entry, dict) and {"opencl_ms", "numpy_ms"} <= entry.keys():
        return Measurement(float(entry["opencl_ms"]), float(entry["numpy_ms"]), cached=True)
    result = measure_probe(device)
    entries[key] = {"opencl_ms": result.opencl_ms, "numpy_ms": result.numpy_ms, "measured_at": time.time()}
    write_entries(path, entries)  # read-only directory: measured again next time
    return result


def measure_probe(device: DeviceFacts, n: int = PROBE_ELEMENTS, repeats: int = 9) -> Measurement:
    """Median times of ``repeats`` runs of the fused chain8 probe on ``device`` and on the NumPy backend.

    Medians, not minima: on a shared VM the NumPy backend's two threads are sometimes slowed for a
    whole call (a core taken by another VM, BLAS threads spinning), so its best run says little
    about its usual one (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", engine_choice.py)."""
    rng = np.random.default_rng(0)
    x, a, b = (rng.uniform(-2.0, 2.0, n).astype(np.float32) for _ in range(3))
    return Measurement(_time_opencl(device, x, a, b, repeats), _time_numpy(x, a, b, repeats))


def probe_width(device: DeviceFacts) -> int:
    """The vector width fused kernels use on this CPU device (``Device.vector_width``)."""
    return device.vector_width


def _time_opencl(device: DeviceFacts, x: np.ndarray, a: np.ndarray, b: np.ndarray, repeats: int) -> float:
    """The fused chain8 kernel as netcl.jit writes it for CPU devices: the body on float vectors."""
    import pyopencl as cl

    width = probe_width(device)
    context, queue = device.context, device.queue
    kernel = cl.Program(context, probe_kernel_source(width)).build().probe_chain8
    flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
    buffers = [cl.Buffer(context, flags, hostbuf=array) for array in (x, a, b)]
    out = cl.Buffer(context, cl.mem_flags.WRITE_ONLY, x.nbytes)
    n = x.size
    local = 64
    global_size = -(-(n // width) // local) * local
    samples = []
    for _ in range(repeats + 1):
        event = kernel(queue, (global_size,), (local,), *buffers, out, np.int32(n))
        event.wait()
        samples.append((event.profile.end - event.profile.start) * 1e-6)
    return statistics.median(samples[1:])


def _time_numpy(x: np.ndarray, a: np.ndarray, b: np.ndarray, repeats: int) -> float:
    """The NumPy backend's fused path for chain8: cache-sized blocks, per-thread out= scratch, the host
    thread pool, and a fresh output array per call, as a fused call allocates its result."""
    block = block_elements(6)
    f32 = np.float32
    local = threading.local()  # per-thread scratch, kept across calls as the fused path keeps it

    def one_block(start: int, stop: int) -> None:
        scratch = getattr(local, "scratch", None)
        if scratch is None:
            scratch = local.scratch = [np.empty(block, f32), np.empty(block, f32), np.zeros(block, f32)]
        m = stop - start
        xb, s0, s1, zeros = x[start:stop], scratch[0][:m], scratch[1][:m], scratch[2][:m]
        np.multiply(xb, a[start:stop], out=s0)
        np.add(s0, b[start:stop], out=s0)
        np.maximum(s0, zeros, out=s0)
        np.multiply(s0, f32(0.5), out=s0)
        np.absolute(s0, out=s1)  # the overflow-free SIGMOID, as the fused path evaluates it
        np.negative(s1, out=s1)
        np.exp(s1, out=s1)
        np.greater_equal(s0, f32(0), out=s0)
        np.maximum(s1, s0, out=s0)
        np.add(s1, f32(1), out=s1)
        np.divide(s0, s1, out=s0)
        np.subtract(s0, xb, out=s0)
        np.tanh(s0, out=s0)
        np.multiply(s0, s0, out=out[start:stop])

    samples = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        out = np.empty_like(x)
        run_blocks(x.size, block, one_block)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples[1:])
