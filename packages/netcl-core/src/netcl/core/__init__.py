"""netcl.core: what data is and where it lives (tensors, dtypes, devices, broadcasting)."""

from netcl.core.__about__ import __version__
from netcl.core.broadcast import broadcast_index_lines, broadcast_shapes, contiguous_strides, needs_64bit_index
from netcl.core.devices import (
    Device,
    default_reason,
    devices,
    get_device,
    same_device,
    set_device,
    usable_opencl_devices,
)
from netcl.core.dtypes import as_dtype, bfloat16, bool_, c_type, float16, float32, float64, int32, int64, uint8
from netcl.core.errors import DeviceError, DTypeError, NetclError, ShapeError
from netcl.core.tensor import Tensor, tensor

__all__ = [
    "Device",
    "DeviceError",
    "DTypeError",
    "NetclError",
    "ShapeError",
    "Tensor",
    "__version__",
    "as_dtype",
    "bfloat16",
    "bool_",
    "broadcast_index_lines",
    "broadcast_shapes",
    "c_type",
    "contiguous_strides",
    "default_reason",
    "devices",
    "usable_opencl_devices",
    "float16",
    "float32",
    "float64",
    "get_device",
    "int32",
    "int64",
    "needs_64bit_index",
    "same_device",
    "set_device",
    "tensor",
    "uint8",
]
