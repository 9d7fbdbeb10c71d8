"""The least a Python eager op can do, as a bound on what any Python op layer over pyopencl can reach.

``least_op(x, y)`` is an "add" whose launch is prepared once (its inputs' arguments set, the cheapest enqueue of
the platform, ``enqueue.enqueuer``): it finds that launch by its operands' shapes and dtypes (one dict lookup),
takes an output buffer off a free list, wraps it in a result object (``__slots__``) that puts the buffer back
when it dies, sets it as the kernel's output argument and enqueues. It makes no checks, no broadcast, no autograd
Node, no dtype promotion, and its pool never grows: everything a real op adds comes on top of it. The ``eager``
bench prints its host cost beside the raw launches (``raw least op``), and ``eager_instructions.py`` counts its
instructions; its ratio to ``raw floor`` is what a Python op pays before doing any of an op's own work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class _Operand:
    """An input: a buffer, a shape and a dtype (the fields a launch is looked up by)."""

    __slots__ = ("buffer", "dtype", "shape")

    def __init__(self, buffer: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.buffer, self.shape, self.dtype = buffer, shape, dtype


def make_least_op(
    kernel: Any, floor: Callable[[], object], inputs: tuple[Any, Any], make_buffer: Callable[[], Any], n: int
) -> Callable[[], object]:
    """A no-argument call of ``least_op`` on two ``n``-element float32 inputs (``inputs``, the buffers the kernel's
    first two arguments are set to); ``floor`` enqueues ``kernel``, ``make_buffer`` makes an output buffer. Four
    output buffers circulate (the result of a call dies before the next call's)."""
    free = [make_buffer() for _ in range(4)]

    class Result(_Operand):
        """The op's output: puts its buffer back on the free list when it dies."""

        __slots__ = ()

        def __del__(self) -> None:
            free.append(self.buffer)

    shape, dtype = (n,), np.dtype(np.float32)
    x, y = _Operand(inputs[0], shape, dtype), _Operand(inputs[1], shape, dtype)
    launches = {(shape, dtype, shape, dtype): (kernel.set_arg, floor)}

    def least_op(a: _Operand, b: _Operand) -> Result:
        set_arg, launch = launches[(a.shape, a.dtype, b.shape, b.dtype)]
        out = Result(free.pop(), a.shape, a.dtype)
        set_arg(2, out.buffer)
        launch()
        return out

    def call() -> None:
        least_op(x, y)

    call.keep = (free, x, y)  # type: ignore[attr-defined]
    return call
