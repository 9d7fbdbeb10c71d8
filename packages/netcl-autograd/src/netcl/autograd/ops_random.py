"""``dropout`` on the runtime's counter-based Philox generator, and ``manual_seed``.

Each call draws a fresh seed from the global generator (``netcl.runtime.manual_seed`` makes the
sequence repeat). The mask is a pure function of (seed, element index), so the backward
regenerates it instead of storing it: the gradient is ``dropout(grad, p, seed)``. The seed of each
forward execution is remembered per output tensor, so a traced (jitted) dropout draws a new mask
on every call and its backward uses that call's mask. While a capture records (``CompiledGraph``,
``Graph.capture``), dropout also reads a device counter that a recorded launch advances before
the forward, so every replay draws a new mask and its backward uses it.
"""

from __future__ import annotations

import weakref
from typing import Any

from netcl.autograd.engine import apply_op
from netcl.core import Tensor
from netcl.runtime.capture import is_recording
from netcl.runtime.ops import random
from netcl.runtime.ops.random import initial_seed, manual_seed

#: output tensor -> (seed, device counter or None) its forward used (weak: dies with the tensor).
_SEEDS: weakref.WeakKeyDictionary[Tensor, tuple[int, Tensor | None]] = weakref.WeakKeyDictionary()


def dropout(x: Any, p: float = 0.5, training: bool = True) -> Any:
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p); x itself when not training."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"dropout: p must be a probability in [0, 1], got {p!r}")
    if not hasattr(x, "shape"):
        raise TypeError(f"dropout: x must be a Node or Tensor, got {type(x).__name__}")
    p = float(p)
    if not training or p == 0.0:
        return x

    def forward(v: Tensor) -> Tensor:
        seed = random.next_seed()
        counter = None
        if v.device.kind == "opencl" and is_recording(v.device.queue):
            counter = random.advance_counter(random.new_counter(v.device))
        out = random.dropout(v, p, seed, counter)
        _SEEDS[out] = (seed, counter)
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        seed, counter = _SEEDS[out]
        return [random.dropout(g, p, seed, counter)]

    return apply_op(forward, grad, x, op_name="dropout", attrs={"p": p})


__all__ = ["dropout", "initial_seed", "manual_seed"]
