"""In-place writes into existing tensors, numbered on one process-wide clock.

A backward reads the values its forward saved. When one of them is overwritten in between (an optimizer
step before ``loss.backward()``, ``nn.init`` or ``load_state_dict`` on a weight the graph used), the
gradients would be computed from the new values: netcl.autograd checks, as torch's version counters do,
and raises ``ModifiedInPlaceError`` instead.

Every in-place writer a user reaches calls ``written`` before it enqueues (the runtime's ``add_``,
``fill_``, ``write_``, ``copy_into``, the optimizers' update kernels, ``nn.init``). It ticks the clock and
stamps the tensor that owns the buffer (a view's ``base``; views share their owner's stamp, as torch's
views share a version counter). A recorded op keeps the clock's reading; at its backward, if the clock
has not moved, nothing was written since (one comparison); else each saved value's stamp says whether it
was. Writes an op's own kernels make (BatchNorm's running statistics) are not stamped: they are part of
the op.
"""

from __future__ import annotations

import threading
from typing import Any

#: the number of the latest in-place write (0: none yet); only grows
clock = 0
_lock = threading.Lock()


def check_writable(*tensors: Any) -> None:
    """``ValueError`` when one of ``tensors`` is a strided view: views are read-only (``netcl.core.strided_view``).
    Writers that do not stamp (the gradient scalers and clippers) call it before they enqueue."""
    for t in tensors:
        if t.strided:
            raise ValueError(
                f"cannot write in place into a strided view (shape {t.shape}, strides {t.strides}, offset "
                f"{t.offset} of a tensor of shape {t.source.shape}, as x.T or x[:, 0] make): views are "
                "read-only; write into the source (x[key] = value) or into view.contiguous()"
            )


def written(*tensors: Any) -> None:
    """Stamp ``tensors`` (netcl Tensors) as overwritten now; call before the write is enqueued.

    ``ValueError`` (nothing stamped) when one is a strided view (``check_writable``)."""
    global clock
    check_writable(*tensors)
    with _lock:
        clock += 1
        number = clock
    for t in tensors:
        owner = t.base if t.base is not None else t
        owner._written_at = number


def written_since(tensor: Any, number: int) -> bool:
    """Whether ``tensor``'s buffer was overwritten after the clock read ``number``."""
    owner = tensor.base if tensor.base is not None else tensor
    return owner._written_at > number
