"""The float vector width a CPU OpenCL device's fused kernels use, checked in a child process.

CPU devices evaluate fused bodies on ``floatN`` vectors, N the device's preferred float width (8
with AVX2, 16 with AVX-512). Some compilers do not fail on a width they mishandle, they crash: the
pip PoCL 3.0 (LLVM 14, target ``znver3``) on an AMD Zen 4 with AVX-512 builds a ``float16`` kernel
and then aborts the whole process when it generates the machine code at the first launch ("LLVM
ERROR: Cannot emit physreg copy instruction"); ``float8`` works there. A crash cannot be caught in
the process that suffers it, so each width, widest first, is built and run in a child process
(``python -m netcl.core.vector_width``) until one returns the right numbers. The answer is cached on
disk per device, driver and host CPU (``vector-width.json`` in ``NETCL_CACHE_DIR``, else
``~/.cache/netcl``), so only the first process on a machine pays (the build times: see
benchmarks/RESULTS.md, "Measurements moved out of source docstrings", vector_width.py).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from netcl.core.device_facts import DeviceFacts
from netcl.core.fact_cache import cache_file, read_entries, write_entries

CACHE_NAME = "vector-width.json"
WIDTHS = (16, 8, 4)
#: A child that has not finished in this many seconds counts as a failure (a hung compiler): well above
#: a cold build's time, a crashing one's included (see benchmarks/RESULTS.md, "Measurements moved out of
#: source docstrings", vector_width.py).
CHILD_TIMEOUT_S = 180
_PROBE_VERSION = "v1"
_PROBE_ELEMENTS = 4096

#: Runs one child: (argv, timeout) -> (return code, stderr text). A parameter so tests can stand in
#: a child that crashes.
ChildRunner = Callable[[Sequence[str], float], tuple[int, str]]


def _run_child(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    """Run ``argv`` with this netcl-core importable (also where the parent put it on ``sys.path``
    itself); a child past ``timeout`` is killed and reads as SIGKILL."""
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p))
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired:
        return -9, f"no answer within {timeout:.0f} s"
    return done.returncode, done.stderr


def preferred_width(device: DeviceFacts) -> int:
    """The device's preferred float vector width, if it is one fused kernels use (else 8)."""
    preferred = int(getattr(device.cl_device, "preferred_vector_width_float", 0) or 0)
    return preferred if preferred in WIDTHS else 8


def candidate_widths(device: DeviceFacts) -> list[int]:
    """Widths to try, widest first: the preferred one, then the narrower ones."""
    return [w for w in WIDTHS if w <= preferred_width(device)]


def check_width(device: DeviceFacts, width: int, runner: ChildRunner = _run_child) -> str | None:
    """None when a ``float{width}`` fused kernel builds, runs and is right on ``device`` (in a
    child process), else why not: the child's error, or the signal that killed it."""
    return _check(device, width, runner)[0]


def _check(device: DeviceFacts, width: int, runner: ChildRunner) -> tuple[str | None, bool]:
    """``check_width``'s answer, and whether the child was killed (a crash or a hang: a fact about
    the compiler, unlike an error exit, which may be this environment's, e.g. a failed import)."""
    platform_name, device_name = device.cl_device.platform.name, device.cl_device.name
    argv = [sys.executable, "-m", "netcl.core.vector_width", platform_name, device_name, str(width)]
    code, stderr = runner(argv, CHILD_TIMEOUT_S)
    if code == 0:
        return None, False
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    llvm = [line for line in lines if line.startswith("LLVM ERROR")]
    detail = llvm[0] if llvm else (lines[-1] if lines else "no message")
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return f"float{width} kernel: {how} ({detail})", code < 0


def usable_width(device: DeviceFacts, runner: ChildRunner = _run_child) -> tuple[int | None, list[str]]:
    """The widest width whose kernel works on ``device`` (None when none does), and why each wider
    one did not; from the disk cache when this device, driver and CPU were checked before. A "none
    works" answer is cached only when every child was killed: an error exit may be passing (a
    child that cannot import), and must not turn the device off for good."""
    path = cache_path()
    key = fingerprint(device)
    entries = read_entries(path)
    entry = entries.get(key)
    if isinstance(entry, dict) and "width" in entry and isinstance(entry.get("failures"), list):
        width = entry["width"]
        return (int(width) if width is not None else None), [str(f) for f in entry["failures"]]
    failures: list[str] = []
    found: int | None = None
    all_killed = True
    for width in candidate_widths(device):
        why, killed = _check(device, width, runner)
        if why is None:
            found = width
            break
        failures.append(why)
        all_killed = all_killed and killed
    if found is not None or all_killed:
        entries[key] = {"width": found, "failures": failures, "checked_at": time.time()}
        write_entries(path, entries)  # read-only directory: checked again next time
    return found, failures


def cache_path() -> Path:
    return cache_file(CACHE_NAME)


def fingerprint(device: DeviceFacts) -> str:
    """What the answer depends on: the device, its driver and compiler, the host CPU's identity."""
    cl_device = device.cl_device
    parts = [
        device.platform_name,
        str(getattr(cl_device.platform, "version", "")),
        device.name,
        device.driver_version,
        str(getattr(cl_device, "version", "")),
        platform.machine(),
        host_cpu_identity(),
        _PROBE_VERSION,
    ]
    return " | ".join(parts)


def host_cpu_identity() -> str:
    """Vendor, family, model and a hash of the feature flags of the host CPU (/proc/cpuinfo), which
    tell two CPUs with the same marketing name (``AMD EPYC``) apart."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("vendor_id", "cpu family", "model", "flags", "Features", "CPU part") and name not in fields:
                    fields[name] = value.strip()
                if not line.strip() and fields:
                    break
    except OSError:
        return platform.processor()
    flags = fields.pop("flags", fields.pop("Features", ""))
    digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return " ".join(f"{k}={v}" for k, v in sorted(fields.items())) + f" flags={digest}"


# ---- the child ------------------------------------------------------------------------------------
def _child(platform_name: str, device_name: str, width: int) -> None:
    """Build and run the chain8 probe at ``width`` on the named device; exit 1 on a wrong result."""
    import pyopencl as cl

    from netcl.core.probe_kernel import probe_kernel_source

    matches = [
        d for p in cl.get_platforms() if p.name == platform_name for d in p.get_devices() if d.name == device_name
    ]
    if not matches:
        raise SystemExit(f"no OpenCL device {device_name!r} on a platform {platform_name!r}")
    context = cl.Context(matches[:1])
    queue = cl.CommandQueue(context)
    kernel = cl.Program(context, probe_kernel_source(width)).build().probe_chain8
    rng = np.random.default_rng(0)
    x, a, b = (rng.uniform(-2.0, 2.0, _PROBE_ELEMENTS).astype(np.float32) for _ in range(3))
    flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
    buffers = [cl.Buffer(context, flags, hostbuf=array) for array in (x, a, b)]
    out = cl.Buffer(context, cl.mem_flags.WRITE_ONLY, x.nbytes)
    kernel(queue, (_PROBE_ELEMENTS // width,), None, *buffers, out, np.int32(_PROBE_ELEMENTS))
    result = np.empty_like(x)
    cl.enqueue_copy(queue, result, out)
    x64, a64, b64 = (v.astype(np.float64) for v in (x, a, b))
    h = np.maximum(x64 * a64 + b64, 0.0) * 0.5
    h = np.tanh(1.0 / (1.0 + np.exp(-h)) - x64)
    expected = h * h
    # float32 arithmetic with OpenCL's ulp bounds for exp/tanh: a few 1e-6 relative; 1e-4 flags garbage
    if not np.allclose(result, expected, rtol=1e-4, atol=1e-6):
        worst = float(np.max(np.abs(result - expected)))
        raise SystemExit(f"float{width} probe kernel returned wrong values (largest error {worst:.3g})")


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
