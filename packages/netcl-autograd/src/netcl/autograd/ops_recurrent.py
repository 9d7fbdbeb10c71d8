"""Differentiable LSTM and GRU steps, each one kernel forward and one backward (``runtime.ops.recurrent_cells``).

``lstm_cell(xg, hg, hc)`` and ``gru_cell(xg, hg, h)`` take a step's input projection ``xg`` and hidden projection
``hg`` (None: zeros) and the previous state (None: zeros); an LSTM's state is one (2, N, H) Node (``h``, ``c``).
"""

from __future__ import annotations

from typing import Any

from netcl.autograd.engine import Node, apply_op
from netcl.core import ShapeError, Tensor
from netcl.runtime.ops import recurrent_cells

_Grads = list[Tensor | None]


def _check(op: str, xg: Any, hg: Any, state: Any, blocks: int, state_shape: Any) -> None:
    shape = tuple(xg.shape)
    if len(shape) != 2 or shape[1] % blocks:
        raise ShapeError(f"{op}: xg must be (N, {blocks} * H), got shape {shape}")
    if hg is not None and tuple(hg.shape) != shape:
        raise ShapeError(f"{op}: hg must have xg's shape {shape}, got {tuple(hg.shape)}")
    want = state_shape(shape[0], shape[1] // blocks)
    if state is not None and tuple(state.shape) != want:
        raise ShapeError(f"{op}: the state must have shape {want}, got {tuple(state.shape)}")


def _cell_op(name: str, kernel: Any, backward: Any, xg: Any, hg: Any, state: Any) -> Node:
    """``apply_op`` of a cell ``kernel(xg, hg, state)`` whose inputs are ``xg`` and those of ``hg`` / ``state`` that
    are given (None: zeros, not an input); ``backward(xg, hg, state, out, g)`` returns the three operands'
    gradients, of which the given ones are returned."""
    given = (hg is not None, state is not None)
    args = [xg] + [a for a in (hg, state) if a is not None]

    def operands(values: tuple[Any, ...]) -> tuple[Any, Any, Any]:
        rest = iter(values[1:])
        first, second = (next(rest) if present else None for present in given)
        return values[0], first, second

    def forward(*values: Tensor) -> Tensor:
        return kernel(*operands(values))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        grads = backward(*operands(values), out, g)
        return [grads[0]] + [d for d, present in zip(grads[1:], given, strict=True) if present]

    return apply_op(forward, grad, *args, op_name=name)


def _lstm_backward(xg: Tensor, hg: Tensor | None, hc: Tensor | None, out: Tensor, g: Tensor) -> tuple:
    dgates, dhc = recurrent_cells.lstm_cell_backward(xg, hg, hc, out, g)
    return dgates, dgates, dhc  # the gates' gradient is both projections'


def _gru_backward(xg: Tensor, hg: Tensor | None, h: Tensor | None, out: Tensor, g: Tensor) -> tuple:
    return recurrent_cells.gru_cell_backward(xg, hg, h, g)


def lstm_cell(xg: Any, hg: Any, hc: Any) -> Node:
    """torch's LSTM step: the new (2, N, H) state from ``xg``, ``hg`` (N, 4H) and ``hc`` (2, N, H)."""
    _check("lstm_cell", xg, hg, hc, 4, lambda n, h: (2, n, h))
    return _cell_op("lstm_cell", recurrent_cells.lstm_cell, _lstm_backward, xg, hg, hc)


def gru_cell(xg: Any, hg: Any, h: Any) -> Node:
    """torch's GRU step: the new (N, H) state from ``xg``, ``hg`` (N, 3H) and ``h`` (N, H)."""
    _check("gru_cell", xg, hg, h, 3, lambda n, size: (n, size))
    return _cell_op("gru_cell", recurrent_cells.gru_cell, _gru_backward, xg, hg, h)


__all__ = ["gru_cell", "lstm_cell"]
