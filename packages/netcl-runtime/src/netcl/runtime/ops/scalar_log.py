"""A device-side log of scalars (a training loop's losses): appended by a launch, read back once.

``log_scalar_(log, position, value, divisor, weight, advance)`` adds ``value[0] / divisor[0] * weight``
to ``log[position[0]]`` and, when ``advance``, moves ``position`` on by one. The position lives on
the device, so appending after every step needs no host read and a captured step could record it;
the host reads ``log`` and ``position`` when it wants the values (once per epoch, say). An append
past the end of ``log`` writes nothing but still advances ``position``, so the reader sees the
overflow. The NumPy twin runs the same float32 arithmetic.
"""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.core.errors import DTypeError
from netcl.runtime.ops._common import device_of, get_kernel
from netcl.runtime.ops._grid import launch_prepared
from netcl.runtime.ops.backend import backend_op

_TWINS = "netcl.runtime.numpy_twins.scalar_log"

_LOG = """
__kernel void netcl_log_scalar(__global float* log, __global int* position, __global const {vt}* value,
                               __global const float* divisor, const float weight, const int advance,
                               const int capacity) {{
    if (get_global_id(0) != 0) return;
    const int i = position[0];
    if (i >= 0 && i < capacity) log[i] += (float)value[0] / divisor[0] * weight;
    if (advance) position[0] = i + 1;
}}
"""

_C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def log_scalar_(
    log: Tensor, position: Tensor, value: Tensor, divisor: Tensor, weight: float = 1.0, advance: bool = True
) -> None:
    """``log[position] += value / divisor * weight``, then ``position += 1`` when ``advance`` (all on the device).

    ``log``: 1-d float32; ``position``: one int32; ``value``: one float32 or float64 element;
    ``divisor``: one float32 (a loss scale, or ones).
    """
    op = "log_scalar_"
    if not isinstance(log, Tensor) or log.dtype != np.float32 or log.ndim != 1:
        raise DTypeError(f"{op}: log must be a 1-d float32 Tensor, got {getattr(log, 'shape', log)}")
    for name, t, dtypes in (
        ("position", position, (np.dtype(np.int32),)),
        ("value", value, tuple(_C_TYPES)),
        ("divisor", divisor, (np.dtype(np.float32),)),
    ):
        if not isinstance(t, Tensor) or t.size != 1 or t.dtype not in dtypes:
            got = f"{getattr(t, 'shape', None)} {getattr(t, 'dtype', type(t).__name__)}"
            raise DTypeError(f"{op}: {name} must be a one-element {' or '.join(map(str, dtypes))} Tensor, got {got}")
    device_of([log, position, value, divisor], op)  # one device (DeviceError naming both otherwise)
    append(log, position, value, divisor, weight, advance)


@backend_op(_TWINS)
def append(log: Tensor, position: Tensor, value: Tensor, divisor: Tensor, weight: float, advance: bool) -> None:
    """``log_scalar_`` of a checked call."""
    device = log.device
    vt = _C_TYPES[value.dtype]
    key = ("scalar_log", vt)
    types = [None, None, None, None, np.float32, np.int32, np.int32]
    pragma = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if vt == "double" else ""
    resolved = get_kernel(key, device, lambda: pragma + _LOG.format(vt=vt), "netcl_log_scalar", types)
    args = [log, position, value, divisor, np.float32(weight), np.int32(bool(advance)), np.int32(log.shape[0])]
    launch_prepared(key, device, resolved.kernel, (1,), (1,), args)
