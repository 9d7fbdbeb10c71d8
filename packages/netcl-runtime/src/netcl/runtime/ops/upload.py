"""``write_``: host values into a tensor's existing buffer (an upload, not a launch); ``copy_into``: a
tensor's contents into another's existing buffer.

Optimizers (hyperparameters, step counts), gradient scalers, modules (``load_state_dict``) and the
trainer rewrite device state this way; a captured graph keeps reading the same buffer and sees the
new values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Tensor
from netcl.core.writes import written
from netcl.runtime.launch import enqueue_copy
from netcl.runtime.ops.backend import backend_op

_TWINS = "netcl.runtime.numpy_twins.upload"


def write_(dst: Tensor, values: Any) -> Tensor:
    """Copy host ``values`` (cast to dst's dtype and shape) into dst's existing buffer (blocking).

    A host upload, not a launch: a captured graph keeps reading the buffer and sees the new values.
    """
    host = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=dst.dtype), dst.shape))
    written(dst)
    return write_host(dst, host)


@backend_op(_TWINS)
def write_host(dst: Tensor, host: np.ndarray) -> Tensor:
    """``write_`` of a C-contiguous array of dst's dtype and shape."""
    if host.nbytes:
        cl.enqueue_copy(dst.device.queue, dst.data, host, is_blocking=True)
    return dst


def copy_into(dst: Tensor, src: Tensor) -> Tensor:
    """Copy src's contents into dst's existing buffer (same device, shape and dtype; a copy command on
    OpenCL, which a capture records)."""
    written(dst)
    return copy_buffer(dst, src)


@backend_op(_TWINS)
def copy_buffer(dst: Tensor, src: Tensor) -> Tensor:
    """``copy_into`` (stamped by it)."""
    if dst.nbytes:
        enqueue_copy(dst.device.queue, dst, src)
    return dst
