"""The fused LSTM and GRU steps (``ops_recurrent``), every variant (with and without the hidden projection and the
previous state), one ``check`` line each against float64 NumPy: forward within 1e-5, gradients of every input by
central differences (the backward kernels recompute the gates)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.autograd import ops_recurrent

N, H = 3, 4


def _sig(x):
    return 1 / (1 + np.exp(-x))


def lstm(xg, hg=None, hc=None):
    pre = xg if hg is None else xg + hg
    i, f, g, o = np.split(pre, 4, axis=1)
    c = _sig(i) * np.tanh(g) + (0 if hc is None else _sig(f) * hc[1])
    return np.stack([_sig(o) * np.tanh(c), c])


def gru(xg, hg=None, h=None):
    x_r, x_z, x_n = np.split(xg, 3, axis=1)
    h_r, h_z, h_n = np.split(np.zeros_like(xg) if hg is None else hg, 3, axis=1)
    r, z = _sig(x_r + h_r), _sig(x_z + h_z)
    n = np.tanh(x_n + r * h_n)
    return (1 - z) * n + z * (0 if h is None else h)


CASES = {
    "lstm": ([(N, 4 * H), (N, 4 * H), (2, N, H)], lstm, ops_recurrent.lstm_cell),
    "lstm_no_state": (
        [(N, 4 * H), (N, 4 * H)],
        lambda x, g: lstm(x, g),
        lambda x, g: ops_recurrent.lstm_cell(x, g, None),
    ),
    "lstm_first_step": ([(N, 4 * H)], lambda x: lstm(x), lambda x: ops_recurrent.lstm_cell(x, None, None)),
    "gru": ([(N, 3 * H), (N, 3 * H), (N, H)], gru, ops_recurrent.gru_cell),
    "gru_no_state": ([(N, 3 * H), (N, 3 * H)], lambda x, g: gru(x, g), lambda x, g: ops_recurrent.gru_cell(x, g, None)),
    "gru_first_step": ([(N, 3 * H)], lambda x: gru(x), lambda x: ops_recurrent.gru_cell(x, None, None)),
}


@pytest.mark.parametrize(("shapes", "ref", "fn"), CASES.values(), ids=list(CASES))
def test_fused_cell(check, shapes, ref, fn):
    check(shapes, ref, fn, gradcheck=False)


def test_cells_refuse_bad_shapes(device):
    import netcl.autograd as ag
    from netcl.core import ShapeError

    xg = ag.tensor(np.zeros((N, 4 * H), np.float32), device=device)
    with pytest.raises(ShapeError, match=r"lstm_cell: the state must have shape \(2, 3, 4\), got \(3, 4\)"):
        ops_recurrent.lstm_cell(xg, None, ag.tensor(np.zeros((N, H), np.float32), device=device))
    with pytest.raises(ShapeError, match=r"gru_cell: xg must be \(N, 3 \* H\), got shape \(3, 16\)"):
        ops_recurrent.gru_cell(ag.tensor(np.zeros((N, 16), np.float32), device=device), None, None)
