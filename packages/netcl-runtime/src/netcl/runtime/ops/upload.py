"""``write_``: host values into a tensor's existing buffer (an upload, not a launch).

Optimizers (hyperparameters, step counts), gradient scalers, modules (``load_state_dict``) and the
trainer rewrite device state this way; a captured graph keeps reading the same buffer and sees the
new values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Tensor


def write_(dst: Tensor, values: Any) -> Tensor:
    """Copy host ``values`` (cast to dst's dtype and shape) into dst's existing buffer (blocking).

    A host upload, not a launch: a captured graph keeps reading the buffer and sees the new values.
    """
    host = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=dst.dtype), dst.shape))
    if dst.device.kind == "cpu":
        dst.data[...] = host
    elif host.nbytes:
        cl.enqueue_copy(dst.device.queue, dst.data, host, is_blocking=True)
    return dst
