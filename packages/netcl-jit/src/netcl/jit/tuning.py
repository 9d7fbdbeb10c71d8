"""Launch configuration of fused elementwise kernels: elements per work-item and local size.

The defaults come from measurement (benchmarks/tune_fused.py sweeps them on a device; the
numbers behind each choice are in benchmarks/RESULTS.md). ``NETCL_JIT_VECTOR`` and
``NETCL_JIT_LOCAL`` override them, which is how the sweep runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from netcl.core import Device


@dataclass(frozen=True)
class LaunchConfig:
    """``vector_width`` elements per vector, ``items`` vectors per work-item, and the local size."""

    vector_width: int
    local_size: int
    items: int = 1
    #: evaluate the body on ``float{vector_width}`` values (CPU devices), not lane by lane
    vector_body: bool = False


#: Measured defaults per kind of device and direction (see benchmarks/RESULTS.md): on an H200
#: forward kernels are fastest with float4 and backward kernels (which recompute the forward,
#: so hold more registers) with float2 and 128-wide groups. On PoCL's CPU device one element
#: per work-item and 64-wide groups win (its compiler vectorizes across work-items itself):
#: chain8 at 4M elements, forward 166 ms vs 207 ms with float4/256.
GPU_DEFAULT = {"forward": LaunchConfig(4, 256), "backward": LaunchConfig(2, 128)}
CPU_DEFAULT = {"forward": LaunchConfig(8, 64, 1, True), "backward": LaunchConfig(8, 64, 1, True)}
_WIDTHS = (1, 2, 4, 8, 16)


def launch_config(device: Device, direction: str = "forward") -> LaunchConfig:
    """The configuration fused ``direction`` kernels use on ``device`` (environment overrides first).

    On CPU devices the vector width is ``Device.vector_width`` (the preferred float width, 8 with
    AVX2 and 16 with AVX-512, unless the compiler crashes on it) and the body is evaluated on vectors.
    """
    base = (GPU_DEFAULT if device.is_gpu else CPU_DEFAULT)[direction]
    if not device.is_gpu and device.cl_device is not None:
        base = LaunchConfig(device.vector_width, base.local_size, base.items, base.vector_body)
    width = int(os.environ.get("NETCL_JIT_VECTOR", base.vector_width))
    local = int(os.environ.get("NETCL_JIT_LOCAL", base.local_size))
    items = int(os.environ.get("NETCL_JIT_ITEMS", base.items))
    if width not in _WIDTHS:
        raise ValueError(f"NETCL_JIT_VECTOR must be one of {_WIDTHS}, got {width}")
    if items < 1:
        raise ValueError(f"NETCL_JIT_ITEMS must be >= 1, got {items}")
    limit = device.cl_device.max_work_group_size if device.cl_device is not None else local
    vector_body = os.environ.get("NETCL_JIT_VECTOR_BODY", str(int(base.vector_body))).strip() not in ("0", "")
    return LaunchConfig(width, max(1, min(local, limit)), items, vector_body)
