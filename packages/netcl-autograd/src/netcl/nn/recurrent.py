"""Recurrent layers as torch's: ``RNN`` (tanh or relu), ``LSTM`` and ``GRU``, with torch's arguments, parameter
names (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``, ``..._reverse``), shapes, gate order
(LSTM: input, forget, cell, output; GRU: reset, update, new) and initialization (every parameter uniform in
+-1 / sqrt(hidden_size)), so a torch state_dict loads and gives torch's outputs.

A layer's input projection for every time step is one product (``x @ weight_ih.T + bias_ih`` over all steps); each
step is then the product ``h @ weight_hh.T + bias_hh`` and, for an LSTM or a GRU, one cell kernel
(``netcl.autograd.ops_recurrent``: the gates and the state update, and one kernel back); an RNN step is its
activation. All differentiable, and recorded by ``fuse_graph`` like any other step: a captured training step replays
the whole sequence. An LSTM carries ``h`` and ``c`` as one (2, N, H) state whose ``h`` is a view.
"""

from __future__ import annotations

import math
from typing import Any

import netcl.autograd as ag
from netcl.autograd import ops_recurrent
from netcl.autograd.engine import Node
from netcl.core import Device, ShapeError
from netcl.nn import init
from netcl.nn.functional import dropout, linear
from netcl.nn.layers import empty_parameter, positive_int
from netcl.nn.module import Module

#: rows of the stacked gate weights per hidden unit
_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


class _RNNBase(Module):
    """What the three recurrent layers share: the parameters of every layer and direction, the checks, the loop
    over layers, directions and time steps; ``_cell`` is the per-step update of each kind."""

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.mode = mode
        self.input_size = positive_int("input_size", input_size, owner)
        self.hidden_size = positive_int("hidden_size", hidden_size, owner)
        self.num_layers = positive_int("num_layers", num_layers, owner)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{owner}: dropout must be a probability in [0, 1], got {dropout!r}")
        self.bias, self.batch_first, self.bidirectional = bool(bias), bool(batch_first), bool(bidirectional)
        self.dropout = float(dropout)
        gates = _GATES[mode] * hidden_size
        for layer in range(num_layers):
            for suffix in self._suffixes(layer):
                width = input_size if layer == 0 else hidden_size * self.directions
                setattr(self, f"weight_ih{suffix}", empty_parameter((gates, width), device))
                setattr(self, f"weight_hh{suffix}", empty_parameter((gates, hidden_size), device))
                if bias:
                    setattr(self, f"bias_ih{suffix}", empty_parameter((gates,), device))
                    setattr(self, f"bias_hh{suffix}", empty_parameter((gates,), device))
        self.reset_parameters()

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _suffixes(self, layer: int) -> list[str]:
        return [f"_l{layer}", f"_l{layer}_reverse"][: self.directions]

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for param in self.parameters():
            init.uniform_(param, -bound, bound)

    def _weights(self, layer: int, direction: int) -> tuple[Any, Any, Any, Any]:
        suffix = self._suffixes(layer)[direction]
        names = (f"weight_ih{suffix}", f"weight_hh{suffix}", f"bias_ih{suffix}", f"bias_hh{suffix}")
        return tuple(getattr(self, name) if self.bias or name.startswith("weight") else None for name in names)

    def _states(self, hx: Any, batch: int) -> list[Any] | None:
        """The initial states (h, and c for an LSTM), each (num_layers * directions, batch, hidden_size); None for
        zeros (the first step then skips the product with them: nothing is allocated, and a trace needs no
        constant)."""
        shape = (self.num_layers * self.directions, batch, self.hidden_size)
        count = 2 if self.mode == "LSTM" else 1
        if hx is None:
            return None
        given = list(hx) if count == 2 else [hx]
        if count == 2 and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError(f"{type(self).__name__}: hx must be a pair (h_0, c_0), got {type(hx).__name__}")
        for name, state in zip(("h_0", "c_0"), given, strict=False):
            if tuple(state.shape) != shape:
                raise ShapeError(f"{type(self).__name__}: {name} must have shape {shape}, got {tuple(state.shape)}")
        return given

    def forward(self, input: Any, hx: Any = None) -> tuple[Node, Any]:
        owner = type(self).__name__
        shape = tuple(input.shape)
        if len(shape) not in (2, 3) or shape[-1] != self.input_size:
            raise ShapeError(
                f"{owner}: input must be (L, N, {self.input_size}), (N, L, {self.input_size}) with batch_first or "
                f"(L, {self.input_size}) unbatched, got shape {shape}"
            )
        unbatched = len(shape) == 2
        x = ag.unsqueeze(input, 1) if unbatched else (ag.transpose(input, (1, 0, 2)) if self.batch_first else input)
        if unbatched and hx is not None:
            hx = tuple(ag.unsqueeze(h, 1) for h in hx) if self.mode == "LSTM" else ag.unsqueeze(hx, 1)
        steps, batch = tuple(x.shape)[:2]
        states = self._states(hx, batch)
        finals: list[list[Any]] = [[] for _ in range(2 if self.mode == "LSTM" else 1)]
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(self.directions):
                index = layer * self.directions + direction
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, direction)
                width = tuple(x.shape)[2]
                projected = ag.reshape(linear(ag.reshape(x, (steps * batch, width)), w_ih, b_ih), (steps, batch, -1))
                state = self._initial(None if states is None else [s[index] for s in states])
                sequence: list[Any] = [None] * steps
                for t in reversed(range(steps)) if direction else range(steps):
                    state, sequence[t] = self._cell(projected[t], state, w_hh, b_hh)
                outputs.append(ag.stack(sequence, 0))
                for kept, last in zip(finals, self._finals(state), strict=True):
                    kept.append(last)
            x = outputs[0] if len(outputs) == 1 else ag.cat(outputs, 2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = dropout(x, self.dropout)
        out = ag.squeeze(x, 1) if unbatched else (ag.transpose(x, (1, 0, 2)) if self.batch_first else x)
        final = [ag.stack(kept, 0) for kept in finals]
        if unbatched:
            final = [ag.squeeze(f, 1) for f in final]
        return out, (final[0], final[1]) if self.mode == "LSTM" else final[0]

    def _initial(self, given: list[Any] | None) -> Any:
        """The carried state of one layer and direction from the given initial states (None: zeros)."""
        return None if given is None else given[0]

    def _finals(self, state: Any) -> list[Any]:
        """The final states returned for one layer and direction (h, and c for an LSTM)."""
        return [state]

    def _cell(self, projected: Any, state: Any, w_hh: Any, b_hh: Any) -> tuple[Any, Any]:
        """One step: (the new carried state, this step's output h) from the step's input projection and the
        carried state (None: zeros)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if self.mode == "RNN_RELU":
            text += ", nonlinearity='relu'"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text


def _hidden(h: Any, w_hh: Any, b_hh: Any) -> Any:
    """``h @ w_hh.T + b_hh``; for a zero state (None) the bias alone, or None without one."""
    return b_hh if h is None else linear(h, w_hh, b_hh)


def _plus(a: Any, b: Any) -> Any:
    return a if b is None else ag.add(a, b)


class RNN(_RNNBase):
    """``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (``nonlinearity="relu"``: relu) per step."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Device | str | None = None,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(mode, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device)

    def _cell(self, projected: Any, state: Any, w_hh: Any, b_hh: Any) -> tuple[Any, Any]:
        pre = _plus(projected, _hidden(state, w_hh, b_hh))
        h = ag.tanh(pre) if self.mode == "RNN_TANH" else ag.relu(pre)
        return h, h


class LSTM(_RNNBase):
    """torch's LSTM: gates ``i, f, g, o`` of ``x W_ih^T + b_ih + h W_hh^T + b_hh``; ``c' = sigmoid(f) c +
    sigmoid(i) tanh(g)``, ``h' = sigmoid(o) tanh(c')``. Returns ``(output, (h_n, c_n))``; no ``proj_size``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Device | str | None = None,
    ) -> None:
        if proj_size:
            raise ValueError(f"LSTM: proj_size is not supported by netcl (only 0), got {proj_size!r}")
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device)

    def _initial(self, given: list[Any] | None) -> Any:
        return None if given is None else ag.stack(given, 0)  # (2, N, H): h, c

    def _finals(self, state: Any) -> list[Any]:
        return [state[0], state[1]]

    def _cell(self, projected: Any, state: Any, w_hh: Any, b_hh: Any) -> tuple[Any, Any]:
        hidden = None if state is None else linear(state[0], w_hh, b_hh)
        if state is None and b_hh is not None:  # a zero state: the hidden projection is the bias alone
            projected = ag.add(projected, b_hh)
        state = ops_recurrent.lstm_cell(projected, hidden, state)
        return state, state[0]


class GRU(_RNNBase):
    """torch's GRU: ``r = sigmoid(x_r + h_r)``, ``z = sigmoid(x_z + h_z)``, ``n = tanh(x_n + r * h_n)`` (the
    ``x_*`` and ``h_*`` parts of the two projections, biases included), ``h' = (1 - z) n + z h``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Device | str | None = None,
    ) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device)

    def _cell(self, projected: Any, state: Any, w_hh: Any, b_hh: Any) -> tuple[Any, Any]:
        hidden = _hidden(state, w_hh, b_hh)
        if hidden is not None and len(hidden.shape) == 1:  # a zero state: the bias alone, per row (r scales it)
            hidden = ag.broadcast_to(hidden, tuple(projected.shape))
        h = ops_recurrent.gru_cell(projected, hidden, state)
        return h, h
