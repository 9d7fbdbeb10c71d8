"""RNN, LSTM and GRU against float64 NumPy transcriptions of torch's recurrences (same weights, loaded through the
state dict with torch's keys): outputs and final states within 1e-5, the input's and a weight's gradient by central
differences of the reference; bidirectional, two layers, batch_first, unbatched input, given initial states; a
captured training step replays like eager steps; bad arguments and shapes refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn as nn
from netcl.core import ShapeError
from netcl.optim import SGD

IN, HIDDEN, STEPS, BATCH = 3, 4, 5, 2


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _cell(mode, x_proj, h, c, w_hh, b_hh):
    """One step of torch's recurrence (float64): the new (h, c)."""
    hidden = h @ w_hh.T + b_hh
    if mode in ("tanh", "relu"):
        pre = x_proj + hidden
        return (np.tanh(pre) if mode == "tanh" else np.maximum(pre, 0)), None
    if mode == "lstm":
        i, f, g, o = np.split(x_proj + hidden, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        return _sigmoid(o) * np.tanh(c), c
    x_r, x_z, x_n = np.split(x_proj, 3, axis=-1)
    h_r, h_z, h_n = np.split(hidden, 3, axis=-1)
    r, z = _sigmoid(x_r + h_r), _sigmoid(x_z + h_z)
    n = np.tanh(x_n + r * h_n)
    return (1 - z) * n + z * h, None


def reference(mode, state, x, layers, directions, h0=None, c0=None):
    """torch's multi-layer recurrence on time-major x (L, N, in): output (L, N, D * H), h_n, c_n."""
    h_n, c_n = [], []
    for layer in range(layers):
        outputs = []
        for direction in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            w_ih, w_hh = state[f"weight_ih{suffix}"], state[f"weight_hh{suffix}"]
            b_ih, b_hh = state.get(f"bias_ih{suffix}", 0.0), state.get(f"bias_hh{suffix}", 0.0)
            index = layer * directions + direction
            h = np.zeros((x.shape[1], HIDDEN)) if h0 is None else h0[index]
            c = np.zeros((x.shape[1], HIDDEN)) if c0 is None else c0[index]
            seq = [None] * x.shape[0]
            for t in reversed(range(x.shape[0])) if direction else range(x.shape[0]):
                h, c = _cell(mode, x[t] @ w_ih.T + b_ih, h, c, w_hh, b_hh)
                seq[t] = h
            outputs.append(np.stack(seq))
            h_n.append(h)
            c_n.append(c)
        x = np.concatenate(outputs, axis=-1)
    return x, np.stack(h_n), (np.stack(c_n) if mode == "lstm" else None)


def _host_state(layer):
    return {k: v.to_host().astype(np.float64) for k, v in layer.state_dict().items()}


def _layer(mode, **kwargs):
    if mode == "lstm":
        return nn.LSTM(IN, HIDDEN, **kwargs)
    if mode == "gru":
        return nn.GRU(IN, HIDDEN, **kwargs)
    return nn.RNN(IN, HIDDEN, nonlinearity=mode, **kwargs)


CASES = {
    "lstm": ("lstm", {}),
    "gru": ("gru", {}),
    "rnn_tanh": ("tanh", {}),
    "rnn_relu": ("relu", {}),
    "lstm_2_layers_bidirectional": ("lstm", {"num_layers": 2, "bidirectional": True}),
    "gru_batch_first_no_bias": ("gru", {"batch_first": True, "bias": False}),
}


@pytest.mark.parametrize(("mode", "kwargs"), CASES.values(), ids=list(CASES))
def test_recurrence_matches_reference(device, mode, kwargs):
    rng = np.random.default_rng(0)
    layer = _layer(mode, device=device, **kwargs)
    state = _host_state(layer)
    x = rng.normal(size=(STEPS, BATCH, IN))
    batch_first = kwargs.get("batch_first", False)
    given = x.transpose(1, 0, 2) if batch_first else x
    layers, directions = kwargs.get("num_layers", 1), 2 if kwargs.get("bidirectional") else 1
    node = ag.tensor(given.astype(np.float32).copy(), requires_grad=True, device=device)
    out, hidden = layer(node)
    h_n = hidden[0] if mode == "lstm" else hidden
    x32 = x.astype(np.float32).astype(np.float64)
    want, want_h, want_c = reference(mode, state, x32, layers, directions)
    np.testing.assert_allclose(out.to_host(), want.transpose(1, 0, 2) if batch_first else want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_n.to_host(), want_h, rtol=1e-5, atol=1e-6)
    if mode == "lstm":
        np.testing.assert_allclose(hidden[1].to_host(), want_c, rtol=1e-5, atol=1e-6)
    weights = rng.normal(size=want.shape)
    ag.sum(ag.mul(out, ag.tensor((weights.transpose(1, 0, 2) if batch_first else weights).astype(np.float32),
                                 device=device))).backward()  # fmt: skip

    def loss(xv, w_hh):
        moved = {**state, "weight_hh_l0": w_hh}
        return (reference(mode, moved, xv, layers, directions)[0] * weights).sum()

    eps, w_hh = 1e-6, state["weight_hh_l0"]
    numeric_x, numeric_w = np.zeros_like(x32), np.zeros_like(w_hh)
    for grid, numeric, args in ((x32, numeric_x, 0), (w_hh, numeric_w, 1)):
        for index in np.ndindex(grid.shape):
            up, down = grid.copy(), grid.copy()
            up[index] += eps
            down[index] -= eps
            pair = [(up, w_hh), (down, w_hh)] if args == 0 else [(x32, up), (x32, down)]
            numeric[index] = (loss(*pair[0]) - loss(*pair[1])) / (2 * eps)
    grad_x = node.grad.to_host()
    np.testing.assert_allclose(grad_x.transpose(1, 0, 2) if batch_first else grad_x, numeric_x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.weight_hh_l0.grad.to_host(), numeric_w, rtol=1e-4, atol=1e-5)


def test_given_states_and_unbatched_input(device):
    rng = np.random.default_rng(1)
    lstm = nn.LSTM(IN, HIDDEN, device=device)
    state = _host_state(lstm)
    x = rng.normal(size=(STEPS, IN)).astype(np.float32)
    h0, c0 = (rng.normal(size=(1, HIDDEN)).astype(np.float32) for _ in range(2))
    out, (h_n, c_n) = lstm(ag.tensor(x, device=device), (ag.tensor(h0, device=device), ag.tensor(c0, device=device)))
    want, want_h, want_c = reference("lstm", state, x[:, None].astype(np.float64), 1, 1, h0[:, None], c0[:, None])
    assert out.shape == (STEPS, HIDDEN) and h_n.shape == c_n.shape == (1, HIDDEN)
    np.testing.assert_allclose(out.to_host(), want[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_n.to_host(), want_h[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c_n.to_host(), want_c[:, 0], rtol=1e-5, atol=1e-6)


def test_captured_training_step_replays_like_eager_steps(device):
    ag.manual_seed(4)
    rng = np.random.default_rng(2)
    batches = [(rng.normal(size=(BATCH, STEPS, IN)), rng.normal(size=(BATCH, HIDDEN))) for _ in range(3)]

    def make():
        return nn.GRU(IN, HIDDEN, batch_first=True, device=device)

    def loss_fn(outputs, target):
        return ag.mse_loss(outputs[1][0], target)

    captured, eager = make(), make()
    eager.load_state_dict({k: v.to_host() for k, v in captured.state_dict().items()})
    opt_c, opt_e = SGD(captured.parameters(), lr=0.1), SGD(eager.parameters(), lr=0.1)
    from netcl.jit import fuse_graph

    tensors = [(ag.tensor(x.astype(np.float32), device=device), ag.tensor(y.astype(np.float32), device=device))
               for x, y in batches]  # fmt: skip
    graph = fuse_graph(captured, *tensors[0], loss_fn, optimizer_step=opt_c.step)
    for step, (x, y) in enumerate(tensors):
        opt_e.zero_grad()
        expected = loss_fn(eager(x), y)
        expected.backward()
        opt_e.step()
        got = graph.outputs if step == 0 else graph.execute(x, y)
        np.testing.assert_allclose(got.item(), expected.item(), rtol=1e-5)
    for name, value in _host_state(eager).items():
        np.testing.assert_allclose(_host_state(captured)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_bad_arguments_are_refused_by_name(device):
    with pytest.raises(ValueError, match="RNN: nonlinearity must be 'tanh' or 'relu', got 'sigmoid'"):
        nn.RNN(IN, HIDDEN, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="LSTM: proj_size is not supported by netcl"):
        nn.LSTM(IN, HIDDEN, proj_size=2)
    with pytest.raises(ValueError, match=r"GRU: dropout must be a probability in \[0, 1\], got 2"):
        nn.GRU(IN, HIDDEN, dropout=2)
    with pytest.raises(ValueError, match="LSTM: hidden_size must be a positive int, got 0"):
        nn.LSTM(IN, 0)
    lstm = nn.LSTM(IN, HIDDEN, device=device)
    x = ag.tensor(np.zeros((STEPS, BATCH, IN), np.float32), device=device)
    with pytest.raises(ShapeError, match=r"LSTM: input must be \(L, N, 3\)"):
        lstm(ag.tensor(np.zeros((STEPS, BATCH, 5), np.float32), device=device))
    with pytest.raises(TypeError, match=r"LSTM: hx must be a pair \(h_0, c_0\)"):
        lstm(x, x)
    bad = ag.tensor(np.zeros((2, BATCH, HIDDEN), np.float32), device=device)
    with pytest.raises(ShapeError, match=r"LSTM: h_0 must have shape \(1, 2, 4\), got \(2, 2, 4\)"):
        lstm(x, (bad, bad))
    assert repr(nn.GRU(IN, HIDDEN, num_layers=2, batch_first=True)) == "GRU(3, 4, num_layers=2, batch_first=True)"


@pytest.mark.parametrize(("batch_first", "side"), [(False, "right"), (True, "left")])
def test_pad_sequence(device, batch_first, side):
    """torch's ``nn.utils.rnn.pad_sequence``: sequences padded to the longest with the value, on either side, stacked
    time- or batch-first; the gradient reaches each sequence's own rows."""
    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=(n, 3)).astype(np.float32) for n in (4, 2, 5)]
    nodes = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
    out = nn.utils.rnn.pad_sequence(nodes, batch_first=batch_first, padding_value=-1.0, padding_side=side)
    want = np.full((3, 5, 3), -1.0, np.float32)
    for i, a in enumerate(arrays):
        want[i, slice(0, len(a)) if side == "right" else slice(5 - len(a), 5)] = a
    np.testing.assert_array_equal(out.to_host(), want if batch_first else want.transpose(1, 0, 2))
    ag.sum(ag.mul(out, 2.0)).backward()
    for node, a in zip(nodes, arrays, strict=True):
        np.testing.assert_array_equal(node.grad.to_host(), np.full_like(a, 2.0))
    with pytest.raises(ShapeError, match="pad_sequence: sequences must be"):
        nn.utils.rnn.pad_sequence([nodes[0], ag.tensor(np.zeros((2, 4), np.float32), device=device)])
