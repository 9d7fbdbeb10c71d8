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
    #: backward kernels sum a bias's gradient down the rows themselves (``column_source``; GPUs)
    column_sums: bool = False


#: Measured defaults per kind of device and direction: on GPUs forward kernels use float4 and
#: backward kernels (which recompute the forward, so hold more registers) float2 and 128-wide groups.
#: On CPU devices 64-wide groups (their compilers vectorize across work-items). Column sums are a
#: GPU default only: PoCL's CPU device runs work-items one after another, each down its own column of
#: rows (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", tuning.py).
GPU_DEFAULT = {"forward": LaunchConfig(4, 256), "backward": LaunchConfig(2, 128, column_sums=True)}
CPU_DEFAULT = {"forward": LaunchConfig(8, 64, 1, True), "backward": LaunchConfig(8, 64, 1, True)}
_WIDTHS = (1, 2, 4, 8, 16)


def launch_config(device: Device, direction: str = "forward") -> LaunchConfig:
    """The configuration fused ``direction`` kernels use on ``device`` (environment overrides first).

    On CPU devices the vector width is ``Device.vector_width`` (the preferred float width, 8 with
    AVX2 and 16 with AVX-512, unless the compiler crashes on it) and the body is evaluated on vectors.
    """
    base = (GPU_DEFAULT if device.is_gpu else CPU_DEFAULT)[direction]
    if not device.is_gpu and device.cl_device is not None:
        base = LaunchConfig(device.vector_width, base.local_size, base.items, base.vector_body, base.column_sums)
    width = int(os.environ.get("NETCL_JIT_VECTOR", base.vector_width))
    local = int(os.environ.get("NETCL_JIT_LOCAL", base.local_size))
    items = int(os.environ.get("NETCL_JIT_ITEMS", base.items))
    if width not in _WIDTHS:
        raise ValueError(f"NETCL_JIT_VECTOR must be one of {_WIDTHS}, got {width}")
    if items < 1:
        raise ValueError(f"NETCL_JIT_ITEMS must be >= 1, got {items}")
    limit = device.cl_device.max_work_group_size if device.cl_device is not None else local
    vector_body = _flag("NETCL_JIT_VECTOR_BODY", base.vector_body)
    column_sums = _flag("NETCL_JIT_COLUMN_SUMS", base.column_sums)
    return LaunchConfig(width, max(1, min(local, limit)), items, vector_body, column_sums)


def _flag(name: str, default: bool) -> bool:
    return os.environ.get(name, str(int(default))).strip() not in ("0", "")


#: Work-items a column-sum backward kernel aims for (``column_source``), per compute unit: on GPUs
#: enough loads in flight to cover memory latency, on CPUs a few work-groups per core (see
#: benchmarks/RESULTS.md, "Measurements moved out of source docstrings", tuning.py).
COLUMN_ITEMS_PER_UNIT = {"gpu": 4096, "cpu": 256}


def column_groups(device: Device, vectors: int) -> int:
    """How many partial rows a column-sum kernel with ``vectors`` work-items per row writes
    (``NETCL_JIT_COLUMN_GROUPS`` overrides; the kernel clamps it to the row count)."""
    override = os.environ.get("NETCL_JIT_COLUMN_GROUPS")
    if override is not None:
        if not override.strip().isdigit() or int(override) < 1:
            raise ValueError(f"NETCL_JIT_COLUMN_GROUPS must be a whole number >= 1, got {override!r}")
        return int(override)
    units = device.cl_device.max_compute_units if device.cl_device is not None else 1
    per_unit = COLUMN_ITEMS_PER_UNIT["gpu" if device.is_gpu else "cpu"]
    return max(1, -(-units * per_unit // max(vectors, 1)))
