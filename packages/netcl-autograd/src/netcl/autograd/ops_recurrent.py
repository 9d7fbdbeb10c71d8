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


def lstm_cell(xg: Any, hg: Any, hc: Any) -> Node:
    """torch's LSTM step: the new (2, N, H) state from ``xg``, ``hg`` (N, 4H) and ``hc`` (2, N, H)."""
    _check("lstm_cell", xg, hg, hc, 4, lambda n, h: (2, n, h))
    has_h, has_c = hg is not None, hc is not None
    args = [xg] + ([hg] if has_h else []) + ([hc] if has_c else [])

    def split(values: tuple[Any, ...]) -> tuple[Any, Any, Any]:
        rest = list(values[1:])
        return values[0], rest.pop(0) if has_h else None, rest.pop(0) if has_c else None

    def forward(*values: Tensor) -> Tensor:
        return recurrent_cells.lstm_cell(*split(values))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        x, h, c = split(values)
        dgates, dhc = recurrent_cells.lstm_cell_backward(x, h, c, out, g)
        return [dgates] + ([dgates] if has_h else []) + ([dhc] if has_c else [])

    return apply_op(forward, grad, *args, op_name="lstm_cell")


def gru_cell(xg: Any, hg: Any, h: Any) -> Node:
    """torch's GRU step: the new (N, H) state from ``xg``, ``hg`` (N, 3H) and ``h`` (N, H)."""
    _check("gru_cell", xg, hg, h, 3, lambda n, size: (n, size))
    has_hg, has_h = hg is not None, h is not None
    args = [xg] + ([hg] if has_hg else []) + ([h] if has_h else [])

    def split(values: tuple[Any, ...]) -> tuple[Any, Any, Any]:
        rest = list(values[1:])
        return values[0], rest.pop(0) if has_hg else None, rest.pop(0) if has_h else None

    def forward(*values: Tensor) -> Tensor:
        return recurrent_cells.gru_cell(*split(values))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        x, hidden, state = split(values)
        dxg, dhg, dh = recurrent_cells.gru_cell_backward(x, hidden, state, g)
        return [dxg] + ([dhg] if has_hg else []) + ([dh] if has_h else [])

    return apply_op(forward, grad, *args, op_name="gru_cell")


__all__ = ["gru_cell", "lstm_cell"]
