"""nn.MultiheadAttention against a float64 NumPy transcription of torch's multi_head_attention_forward,
from one state_dict in torch's keys (both need_weights paths, batch_first or not, kdim/vdim, masks).

float32 projections and attention accumulate over E or S terms of O(1) values: ~1e-6 off the
float64 reference; the tolerance (3e-5) leaves ~10x room.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl import nn

TOL = 3e-5


def reference_mha(state, query, key, value, heads, kpm=None, attn_mask=None, batch_first=False, need_weights=False):
    """torch's math, float64: projections, per-head softmax(q k^T / sqrt(hd) + masks) v, out_proj."""
    unbatched = query.ndim == 2
    if unbatched:
        query, key, value = query[None], key[None], value[None]
        kpm = None if kpm is None else kpm[None]
    elif not batch_first:
        query, key, value = (np.swapaxes(x, 0, 1) for x in (query, key, value))
    E = query.shape[-1]
    if "in_proj_weight" in state:
        wq, wk, wv = np.split(state["in_proj_weight"], 3)
    else:
        wq, wk, wv = state["q_proj_weight"], state["k_proj_weight"], state["v_proj_weight"]
    bq, bk, bv = np.split(state["in_proj_bias"], 3)
    q, k, v = query @ wq.T + bq, key @ wk.T + bk, value @ wv.T + bv
    N, L, S, hd = q.shape[0], q.shape[1], k.shape[1], E // heads
    q, k, v = (x.reshape(N, -1, heads, hd).transpose(0, 2, 1, 3) for x in (q, k, v))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    if kpm is not None:
        s = s + (np.where(kpm, -np.inf, 0) if kpm.dtype == bool else kpm)[:, None, None, :]
    if attn_mask is not None:
        add = np.where(attn_mask, -np.inf, 0) if attn_mask.dtype == bool else attn_mask
        s = s + (add.reshape(N, heads, L, S) if add.ndim == 3 else add)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = (p @ v).transpose(0, 2, 1, 3).reshape(N, L, E) @ state["out_proj.weight"].T + state["out_proj.bias"]
    weights = p.mean(axis=1)
    if unbatched:
        return out[0], weights[0]
    return (out if batch_first else np.swapaxes(out, 0, 1)), weights


def _state(rng, mha):
    return {k: rng.standard_normal(v.shape) * 0.3 for k, v in mha.state_dict().items()}


CASES = [
    ("seq-first", dict(batch_first=False), {}),
    ("batch-first", dict(batch_first=True), {}),
    ("kdim/vdim", dict(batch_first=True, kdim=6, vdim=5), {}),
    ("key_padding_mask", dict(batch_first=True), {"kpm": True}),
    ("attn_mask bool", dict(batch_first=False), {"attn": "bool"}),
    ("attn_mask float per head", dict(batch_first=True), {"attn": "float3"}),
    ("both masks", dict(batch_first=True, kdim=6, vdim=6), {"kpm": True, "attn": "float"}),
    ("unbatched", dict(), {"unbatched": True}),
]


@pytest.mark.parametrize(("name", "kw", "opts"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("need_weights", [True, False])
def test_outputs_equal_the_float64_reference(device, name, kw, opts, need_weights) -> None:
    rng = np.random.default_rng(len(name))
    E, H, N, L, S = 8, 2, 3, 5, 7
    mha = nn.MultiheadAttention(E, H, device=device, **kw)
    state = _state(rng, mha)
    mha.load_state_dict(state)
    state = {k: v.astype(np.float32).astype(np.float64) for k, v in state.items()}
    kd, vd = kw.get("kdim", E), kw.get("vdim", E)
    first = (N, L) if kw.get("batch_first") else (L, N)
    sfirst = (N, S) if kw.get("batch_first") else (S, N)
    if opts.get("unbatched"):
        first, sfirst = (L,), (S,)
    q = rng.standard_normal((*first, E)).astype(np.float32).astype(np.float64)
    k = rng.standard_normal((*sfirst, kd)).astype(np.float32).astype(np.float64)
    v = rng.standard_normal((*sfirst, vd)).astype(np.float32).astype(np.float64)
    kpm = attn = None
    if opts.get("kpm"):
        kpm = rng.random((N, S)) > 0.7
        kpm[:, 0] = False
    if opts.get("attn") == "bool":
        attn = rng.random((L, S)) > 0.7
        attn[:, 1] = False
    elif opts.get("attn") == "float":
        attn = rng.standard_normal((L, S)).astype(np.float32).astype(np.float64)
    elif opts.get("attn") == "float3":
        attn = rng.standard_normal((N * H, L, S)).astype(np.float32).astype(np.float64)
    t = lambda a: None if a is None else ag.tensor(a if a.dtype == bool else a.astype(np.float32), device=device)  # noqa: E731
    nodes = [ag.tensor(a.astype(np.float32), requires_grad=True, device=device) for a in (q, k, v)]
    with ag.Tape() as tape:
        out, weights = mha(*nodes, key_padding_mask=t(kpm), attn_mask=t(attn), need_weights=need_weights)
    want_out, want_w = reference_mha(
        state, q, k, v, H, kpm=kpm, attn_mask=attn, batch_first=kw.get("batch_first", False)
    )
    np.testing.assert_allclose(out.to_host(), want_out, atol=TOL, rtol=TOL)
    if need_weights:
        np.testing.assert_allclose(weights.to_host(), want_w, atol=TOL, rtol=TOL)
    else:
        assert weights is None
    tape.backward(ag.sum(out * out))
    assert all(n.grad is not None and np.isfinite(n.grad.to_host()).all() for n in nodes)


def test_state_dict_keys_are_torch_names(device) -> None:
    same = nn.MultiheadAttention(8, 2, device=device)
    assert list(same.state_dict()) == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    other = nn.MultiheadAttention(8, 2, kdim=3, vdim=5, bias=False, device=device)
    assert list(other.state_dict()) == ["q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight"]
    assert other.k_proj_weight.shape == (8, 3) and other.v_proj_weight.shape == (8, 5)


def test_input_gradient_passes_gradcheck(device) -> None:
    rng = np.random.default_rng(3)
    mha = nn.MultiheadAttention(4, 2, batch_first=True, device=device)
    mha.load_state_dict({k: rng.standard_normal(v.shape) * 0.5 for k, v in mha.state_dict().items()})
    x = ag.tensor(rng.standard_normal((1, 3, 4)).astype(np.float32), requires_grad=True, device=device)
    assert ag.gradcheck(lambda t: mha(t, t, t, need_weights=False)[0], x)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"embed_dim \(10\) must be divisible by num_heads \(3\)"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="add_bias_kv and add_zero_attn are not supported"):
        nn.MultiheadAttention(8, 2, add_bias_kv=True)
