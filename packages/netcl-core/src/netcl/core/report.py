"""The device report: platforms, devices, the default and why, memory and extensions."""

from __future__ import annotations

from netcl.core.devices import default_reason, devices, get_device
from netcl.core.engine_choice import describe_target
from netcl.core.errors import DeviceError
from netcl.core.host_pool import blas_info, host_threads

_NOTABLE_EXTENSIONS = ("cl_khr_fp16", "cl_khr_fp64", "cl_khr_command_buffer", "cl_khr_int64_base_atomics")


def device_report() -> str:
    """A human-readable report of every device netcl can use (even when ``NETCL_DEVICE`` is bad)."""
    try:
        default, problem = get_device(), None
    except DeviceError as exc:  # a bad NETCL_DEVICE: still list what there is, then say what is wrong
        default, problem = None, str(exc)
    lines = ["netcl devices", ""]
    for device in devices():
        marker = "*" if device is default else " "
        if device.cl_device is None:
            lines.append(f"{marker} cpu    NumPy backend (no OpenCL needed; fused work on {host_threads()} thread(s))")
            continue
        d = device.cl_device
        kind = __import__("pyopencl").device_type.to_string(d.type)
        exts = [e for e in _NOTABLE_EXTENSIONS if e in device.extensions]
        lines += [
            f"{marker} {device.spec:<6} {device.name} [{kind}]",
            f"         platform: {device.platform_name} ({d.platform.version.strip()})",
            f"         driver: {device.driver_version}   OpenCL C: {d.opencl_c_version.strip()}",
            f"         memory: {device.global_mem_size / 2**30:.1f} GiB global, "
            f"{device.max_alloc_size / 2**30:.1f} GiB max buffer, {d.local_mem_size // 1024} KiB local",
            f"         compute units: {d.max_compute_units}, max work-group: {d.max_work_group_size}"
            + ("" if device.is_gpu else f", {describe_target(device)}"),
            f"         extensions: {', '.join(exts) or 'none of ' + ', '.join(_NOTABLE_EXTENSIONS)}",
        ]
    if problem is not None:
        lines += ["", f"no default device: {problem}"]
    else:
        lines += ["", f"default: {default.spec} ({default.name}) because {default_reason()}"]
    lines.append(f"host BLAS (NumPy's, for products run on the host): {blas_summary()}")
    lines.append("override with NETCL_DEVICE=gpu|opencl|cpu|cuda[:<index>]|<platform>:<device>")
    return "\n".join(lines)


def blas_summary() -> str:
    """The BLAS libraries NumPy loaded (``host_pool.blas_info``): name, version, kernel set (a DYNAMIC_ARCH OpenBLAS
    picks it for the CPU when it loads, or as ``OPENBLAS_CORETYPE`` says), threads."""
    found = blas_info()
    if found is None:  # threadpoolctl is a dependency of netcl-core; a hand-made environment may lack it
        return "unknown (threadpoolctl is not installed)"
    if not found:
        return "none found"
    described = []
    for lib in found:
        kernels = f", {lib['architecture']} kernels" if lib.get("architecture") else ""
        described.append(f"{lib.get('internal_api')} {lib.get('version')}{kernels}, {lib.get('num_threads')} thread(s)")
    return "; ".join(described)
