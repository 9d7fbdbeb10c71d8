"""Devices: every OpenCL device on every platform, plus the NumPy ``cpu`` backend.

Selection order, unless ``NETCL_DEVICE`` says otherwise: an OpenCL GPU; then the fastest CPU
engine (``engine_choice``): the best CPU OpenCL device by capability (a compiler that targets
the host's vector ISA first), measured once against the NumPy backend's fused path; the NumPy
backend when there is no OpenCL device at all. A CPU OpenCL device whose compiler cannot build
a program on this host (the pip PoCL's LLVM 14 on a CPU newer than it, e.g. AMD Zen 5: "unknown
target CPU 'generic'"), or whose compiler crashes on every vector width (``netcl.core.vector_width``),
is never chosen, and the reason names it (``Device.build_error``).
``default_reason()`` (and ``python -m netcl.core``) says why. ``NETCL_DEVICE`` takes ``gpu``,
``opencl``, ``cpu`` (NumPy) or ``<platform>:<device>``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core.device_errors import ErrorWord
from netcl.core.dtypes import REQUIRED_EXTENSION, STORAGE_ONLY, as_dtype
from netcl.core.errors import DeviceError, DTypeError
from netcl.core.storage import NUMPY, OPENCL, Storage, check_allocation
from netcl.core.vector_width import preferred_width, usable_width

ENV_VAR = "NETCL_DEVICE"

#: PoCL's pthread CPU device pins its worker threads to cores only when asked. Unpinned, the scheduler
#: often stacks a small VM's workers on one core (see benchmarks/RESULTS.md, "Measurements moved out of
#: source docstrings", devices.py).
#: PoCL reads it when its platform loads (the first ``devices()``); a user's own setting wins.
os.environ.setdefault("POCL_AFFINITY", "1")


class Device:
    """One place tensors live: an OpenCL device (``kind == "opencl"``) or NumPy (``"cpu"``)."""

    def __init__(self, kind: str, spec: str, cl_device: cl.Device | None = None) -> None:
        self.kind = kind
        self.spec = spec
        self.cl_device = cl_device
        self.name = cl_device.name.strip() if cl_device is not None else "NumPy"
        self._lock = threading.Lock()
        #: Called with (device, nbytes) to get a cl.Buffer; netcl.runtime installs a pool here.
        self.allocator: Callable[[Device, int], Any] = raw_allocate
        #: How tensors' data lives here (``netcl.core.storage``): cl.Buffers, or NumPy arrays without a device.
        self.storage: Storage = OPENCL if cl_device is not None else NUMPY

    @property
    def is_opencl(self) -> bool:
        return self.kind == "opencl"

    @property
    def has_queue(self) -> bool:
        """Whether ops run as commands on an OpenCL queue (which a graph can capture and replay); False on
        the NumPy backend, which computes eagerly on host arrays."""
        return self.cl_device is not None

    @cached_property
    def is_gpu(self) -> bool:
        """Whether the OpenCL device is a GPU (read once: ``cl_device`` never changes, and a pyopencl
        info query costs microseconds on paths that ask per op)."""
        return self.cl_device is not None and bool(self.cl_device.type & cl.device_type.GPU)

    @cached_property
    def build_error(self) -> str | None:
        """Why this CPU OpenCL device cannot build a program here, or None when it can.

        Checked once per process by building an empty kernel, then (once per machine, in child
        processes: ``netcl.core.vector_width``) by building and running a vector kernel. GPUs and
        the NumPy backend are not checked (None): their drivers compile for the device they run on.
        """
        if self.cl_device is None or self.is_gpu:
            return None
        try:
            cl.Program(self.context, "__kernel void netcl_build_check(__global int* x) { x[0] = 1; }").build()
        except cl.Error as exc:
            return _first_log_line(exc)
        width, failures = usable_width(self)
        if width is None:
            return "no vector width works: " + "; ".join(failures)
        return None

    @cached_property
    def vector_width(self) -> int:
        """Float vector width of fused kernels on a CPU OpenCL device: the preferred width (8 with
        AVX2, 16 with AVX-512), or the widest narrower one where the compiler crashes on it
        (``netcl.core.vector_width``, checked once per machine). 4 elsewhere."""
        if self.cl_device is None or self.is_gpu:
            return 4
        width, _ = usable_width(self)
        return width if width is not None else preferred_width(self)

    @cached_property
    def context(self) -> cl.Context | None:
        """The device's own OpenCL context (None on the NumPy backend)."""
        return cl.Context([self.cl_device]) if self.cl_device is not None else None

    @cached_property
    def queue(self) -> cl.CommandQueue | None:
        """The default in-order queue, profiling enabled (None on the NumPy backend)."""
        if self.context is None:
            return None
        return cl.CommandQueue(self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)

    @cached_property
    def error_word(self) -> ErrorWord | None:
        """The word index-checking kernels set (``netcl.core.device_errors``); None on the NumPy backend."""
        return ErrorWord(self.context) if self.context is not None else None

    @cached_property
    def platform_name(self) -> str:
        return self.cl_device.platform.name.strip() if self.cl_device is not None else "NumPy"

    @property
    def driver_version(self) -> str:
        return self.cl_device.driver_version.strip() if self.cl_device is not None else np.__version__

    @property
    def extensions(self) -> set[str]:
        return set(self.cl_device.extensions.split()) if self.cl_device is not None else set()

    @cached_property
    def global_mem_size(self) -> int:
        if self.cl_device is None:
            return _host_memory_bytes()
        return int(self.cl_device.global_mem_size)

    @property
    def max_alloc_size(self) -> int:
        if self.cl_device is None:
            return self.global_mem_size
        return int(self.cl_device.max_mem_alloc_size)

    def supports(self, dtype: object) -> bool:
        """Whether tensors of ``dtype`` can live on this device (float16 everywhere: see ``computes``)."""
        result = as_dtype(dtype)
        return result in STORAGE_ONLY or self.computes(result)

    def computes(self, dtype: object) -> bool:
        """Whether kernels compute in ``dtype`` here; float16 without ``cl_khr_fp16`` is storage-only."""
        needed = REQUIRED_EXTENSION.get(as_dtype(dtype))
        return self.cl_device is None or needed is None or needed in self.extensions

    def check_dtype(self, dtype: object) -> np.dtype:
        """Return the normalized dtype, or raise ``DTypeError`` if this device lacks it."""
        result = as_dtype(dtype)
        if not self.supports(result):
            raise DTypeError(f"dtype {result} needs {REQUIRED_EXTENSION[result]}, which device {self.name!r} lacks")
        return result

    def __copy__(self) -> Device:
        return self  # one Device per device: its context, queue and pools are shared, never copied

    def __deepcopy__(self, memo: dict[int, Any]) -> Device:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its spec: loading gives that process's device of the same spec (``get_device``)."""
        return (get_device, (self.spec,))

    def __repr__(self) -> str:
        if self.cl_device is None:
            return "<Device cpu: NumPy backend>"
        kind = cl.device_type.to_string(self.cl_device.type)
        return f"<Device {self.spec}: {self.name} ({kind}, {self.platform_name})>"


def raw_allocate(device: Device, nbytes: int) -> cl.Buffer:
    """Allocate a fresh device buffer (at least one byte), checking the device's limits first."""
    check_allocation(device, nbytes)
    return cl.Buffer(device.context, cl.mem_flags.READ_WRITE, size=max(int(nbytes), 4))


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**34


_registry_lock = threading.Lock()
_registry: list[Device] | None = None
_default: Device | None = None
_default_reason = ""


def devices() -> list[Device]:
    """Every OpenCL device on every platform, then the NumPy ``cpu`` backend."""
    global _registry
    with _registry_lock:
        if _registry is None:
            found: list[Device] = []
            for p_index, platform in enumerate(_platforms()):
                try:
                    cl_devices = platform.get_devices()
                except cl.Error:
                    continue
                for d_index, cl_device in enumerate(cl_devices):
                    found.append(Device("opencl", f"{p_index}:{d_index}", cl_device))
            found.append(Device("cpu", "cpu"))
            _registry = found
        return list(_registry)


def _platforms() -> list[cl.Platform]:
    try:
        return cl.get_platforms()
    except cl.Error:  # no ICD loader platforms at all
        return []


def _opencl_devices() -> list[Device]:
    return [d for d in devices() if d.kind == "opencl"]


def _first_log_line(exc: Exception) -> str:
    """The build log's first error line (``error: unknown target CPU 'generic'``), else the message."""
    text = str(exc)
    for line in text.splitlines():
        if "error" in line.lower() and "clBuildProgram failed" not in line:
            return line.strip()
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def unusable_cpu_devices() -> list[tuple[Device, str]]:
    """CPU OpenCL devices that cannot build a program on this host, each with the reason."""
    return [(d, d.build_error) for d in _opencl_devices() if not d.is_gpu and d.build_error is not None]


def usable_opencl_devices() -> list[Device]:
    """OpenCL GPUs, then the CPU OpenCL devices that build programs here (best-ranked first)."""
    return [d for d in _opencl_devices() if d.is_gpu] + _usable_cpu_devices()


def _usable_cpu_devices() -> list[Device]:
    from netcl.core.engine_choice import cpu_rank

    return sorted((d for d in _opencl_devices() if not d.is_gpu and d.build_error is None), key=cpu_rank)


def _unusable_text() -> str:
    return "; ".join(f"{d.spec} {d.name!r} cannot build programs ({why})" for d, why in unusable_cpu_devices())


def _select(spec: str) -> tuple[Device, str]:
    text = spec.strip().lower()
    opencl = _opencl_devices()
    if text == "cpu":
        return devices()[-1], f"spec {spec!r} names the NumPy backend"
    if text == "gpu":
        gpus = [d for d in opencl if d.is_gpu]
        if not gpus:
            raise DeviceError(f"device spec {spec!r}: no OpenCL GPU found; available: {_available()}")
        return gpus[0], f"spec {spec!r}: first OpenCL GPU"
    if text == "cuda" or text.startswith("cuda:"):  # torch's name for "the GPU" (on AMD's ROCm too)
        gpus = [d for d in opencl if d.is_gpu]
        number = text[5:] if text != "cuda" else "0"
        if not number.isdigit():
            raise DeviceError(f"device spec {spec!r}: expected 'cuda' or 'cuda:<index>' (torch's form)")
        if int(number) >= len(gpus):
            raise DeviceError(
                f"device spec {spec!r} (torch's name for GPU {number}): {len(gpus)} OpenCL GPU(s) found; "
                f"available: {_available()}"
            )
        return gpus[int(number)], f"spec {spec!r}: OpenCL GPU {number} (torch's name)"
    if text == "opencl":
        if not opencl:
            raise DeviceError(f"device spec {spec!r}: no OpenCL device found; available: {_available()}")
        gpus = [d for d in opencl if d.is_gpu]
        if gpus:
            return gpus[0], f"spec {spec!r}: first OpenCL GPU"
        usable = _usable_cpu_devices()
        if not usable:
            raise DeviceError(
                f"device spec {spec!r}: no usable OpenCL device: {_unusable_text()}; a system PoCL "
                "(apt-get install pocl-opencl-icd) or another CPU OpenCL runtime may know this CPU"
            )
        return usable[0], f"spec {spec!r}: no OpenCL GPU; the best CPU OpenCL device that builds programs"
    if ":" in text:
        for device in opencl:
            if device.spec == text.replace(" ", ""):
                return device, f"spec {spec!r} names platform:device"
    raise DeviceError(
        f"unknown device spec {spec!r}; expected 'gpu', 'opencl', 'cpu', 'cuda[:<index>]' or '<platform>:<device>' "
        f"from: {_available()}"
    )


def _available() -> str:
    return ", ".join(f"{d.spec} ({d.name})" for d in devices())


def _auto_select() -> tuple[Device, str]:
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        try:
            device, why = _select(env)
        except DeviceError as exc:
            raise DeviceError(f"the environment variable {ENV_VAR}={env!r} is not a usable device: {exc}") from None
        return device, f"{ENV_VAR}={env!r} ({why})"
    from netcl.core import engine_choice

    opencl = _opencl_devices()
    gpus = [d for d in opencl if d.is_gpu]
    if gpus:
        return gpus[0], f"first OpenCL GPU ({gpus[0].name!r})"
    probe = os.environ.get(engine_choice.PROBE_ENV, "").strip() not in ("0", "false", "no", "off")
    measure = engine_choice.cached_measure if probe else None
    usable, unusable = _usable_cpu_devices(), _unusable_text()
    if not usable and unusable:
        return devices()[-1], f"no OpenCL device here builds programs ({unusable}); NumPy backend"
    device, why = engine_choice.choose_cpu_engine(usable, devices()[-1], measure)
    return device, (f"{why} (not considered: {unusable})" if unusable else why)


def get_device(spec: str | Device | None = None) -> Device:
    """The process default device (``spec=None``) or the one ``spec`` names."""
    global _default, _default_reason
    if isinstance(spec, Device):
        return spec
    if spec is not None:
        if not isinstance(spec, str):
            raise DeviceError(f"device spec must be a str or Device, got {type(spec).__name__}")
        return _select(spec)[0]
    if _default is None:
        _default, _default_reason = _auto_select()
    return _default


def default_reason() -> str:
    """Why the current default device was chosen."""
    get_device()
    return _default_reason


def set_device(spec: str | Device | None) -> Device:
    """Change the process default device; ``None`` re-runs automatic selection."""
    global _default, _default_reason
    if spec is None:
        _default, _default_reason = _auto_select()
    else:
        device = get_device(spec)
        _default, _default_reason = device, f"set_device({spec!r})"
    return _default


def device_of_queue(queue: cl.CommandQueue) -> Device:
    """The registered ``Device`` whose context owns ``queue``."""
    for device in _opencl_devices():
        if device.cl_device == queue.device and "context" in device.__dict__ and device.context == queue.context:
            return device
    raise DeviceError(
        f"queue on {queue.device.name!r} does not belong to any netcl device context; pass a Device or use device.queue"
    )


def same_device(*devices_: Device) -> Device:
    """The one device all arguments share; ``DeviceError`` naming both when two differ."""
    first = devices_[0]
    for other in devices_[1:]:
        if other is not first:
            raise DeviceError(f"tensors on two devices in one op: {first!r} and {other!r}; move one first")
    return first
