"""``ag.packed_self_attention`` (q, k and v read from one fused in-projection's output) and the
``nn.MultiheadAttention`` self-attention path on it, against a float64 NumPy reference, on PoCL and the
NumPy backend; on NVIDIA GPUs in the GPU suite.

Head sizes 16 and 64 run the blocked kernels' packed layout where they are the default (OpenCL CPUs and
NVIDIA GPUs), 8 the copies around the per-head kernels. Tolerance: float32 scores and sums over at most
37 keys of O(1) values, relative error ~1e-6 (2e-5 leaves 10x room); the packed kernels do the arithmetic
of the per-head ones on the same values, so they must match the composed ops bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl import nn
from netcl.runtime.graph import capture_graph
from netcl.runtime.ops import attention, attention_blocked

TOL = 2e-5


def reference(qkv: np.ndarray, g: np.ndarray, heads: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(output, dqkv) in float64: per head softmax(q k^T / sqrt(E) + causal mask) v, heads merged."""
    B, L, W = qkv.shape
    E = W // (3 * heads)
    q, k, v = qkv.astype(np.float64).reshape(B, L, 3, heads, E).transpose(2, 0, 3, 1, 4)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(E)
    if causal:
        s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    go = g.astype(np.float64).reshape(B, L, heads, E).transpose(0, 2, 1, 3)
    dp = go @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq, dk, dv = ds @ k / np.sqrt(E), ds.transpose(0, 1, 3, 2) @ q / np.sqrt(E), p.transpose(0, 1, 3, 2) @ go
    dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, L, W)
    return (p @ v).transpose(0, 2, 1, 3).reshape(B, L, heads * E), dqkv


def composed(x: ag.Node, heads: int, causal: bool) -> ag.Node:
    """What a torch user writes: split, reshape, permute, attention, and back."""
    B, L, W = x.shape
    d = W // 3
    q, k, v = (ag.permute(ag.reshape(t, (B, L, heads, d // heads)), (0, 2, 1, 3)) for t in ag.split(x, d, axis=-1))
    return ag.reshape(ag.permute(ag.scaled_dot_product_attention(q, k, v, is_causal=causal), (0, 2, 1, 3)), (B, L, d))


def _run(fn, qkv: np.ndarray, g: np.ndarray, device: nc.Device) -> tuple[np.ndarray, np.ndarray]:
    x = ag.tensor(qkv, requires_grad=True, device=device)
    with ag.Tape() as tape:
        out = fn(x)
    tape.backward(out, grad=nc.tensor(g, device=device))
    return out.to_host(), x.grad.to_host()


@pytest.mark.parametrize("head_dim", [16, 64, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_and_the_composed_ops(device, head_dim, causal):
    rng = np.random.default_rng(head_dim + causal)
    B, L, H = 2, 37, 3
    qkv = rng.standard_normal((B, L, 3 * H * head_dim)).astype(np.float32)
    g = rng.standard_normal((B, L, H * head_dim)).astype(np.float32)
    out, dqkv = _run(lambda x: ag.packed_self_attention(x, H, is_causal=causal), qkv, g, device)
    want_out, want_dqkv = reference(qkv, g, H, causal)
    np.testing.assert_allclose(out, want_out, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(dqkv, want_dqkv, rtol=TOL, atol=TOL)
    same_out, same_dqkv = _run(lambda x: composed(x, H, causal), qkv, g, device)
    np.testing.assert_array_equal(out, same_out)
    np.testing.assert_array_equal(dqkv, same_dqkv)


def test_blocked_kernels_read_the_packed_layout_in_place(cl_device):
    """Where the blocked kernels take the call: one launch forward, two backward, no copies."""
    spec = attention.check_packed_attention(nc.tensor(np.zeros((2, 5, 96), np.float32), device=cl_device), 2)
    if not attention_blocked.supports_packed(cl_device, np.dtype(np.float32), spec):
        pytest.skip("the blocked kernels are not this device's default")
    rng = np.random.default_rng(1)
    qkv = nc.tensor(rng.standard_normal((2, 5, 96)).astype(np.float32), device=cl_device)
    g = nc.tensor(rng.standard_normal((2, 5, 32)).astype(np.float32), device=cl_device)

    def step(qkv, g):
        out, lse = attention.packed_attention_forward(qkv, spec)
        return out, attention.packed_attention_backward(g, qkv, out, lse, spec)

    graph = capture_graph(cl_device.queue, step, qkv, g)
    names = [launch.name for launch in graph.launches]
    assert names == ["netcl_attention_fwd_blk", "netcl_attention_bwd_q_blk", "netcl_attention_bwd_kv_blk"], names


def test_multihead_self_attention_takes_the_packed_path(device):
    """``mha(x, x, x, need_weights=False)`` without masks or dropout: one in-projection, the packed op; the
    same values (to rounding) as the per-projection path with distinct key and value tensors."""
    rng = np.random.default_rng(2)
    E, H, N, L = 32, 2, 3, 9
    mha = nn.MultiheadAttention(E, H, batch_first=True, device=device)
    mha.load_state_dict({k: rng.standard_normal(v.shape) * 0.3 for k, v in mha.state_dict().items()})
    x_host = rng.standard_normal((N, L, E)).astype(np.float32)
    grads = []
    for distinct in (False, True):
        x = ag.tensor(x_host, requires_grad=True, device=device)
        args = [ag.tensor(x_host, requires_grad=True, device=device) for _ in range(3)] if distinct else [x] * 3
        with ag.Tape() as tape:
            out, weights = mha(*args, need_weights=False)
            ops = [node.op_name for node in tape.nodes]
        assert weights is None
        assert ("packed_self_attention" in ops) != distinct, ops
        tape.backward(ag.sum(out * out))
        dx = sum(a.grad.to_host() for a in args) if distinct else x.grad.to_host()  # x's three uses
        grads.append((out.to_host(), dx, mha.in_proj_weight.grad.to_host()))
        mha.zero_grad()
    for packed, general in zip(*grads, strict=True):  # float32 sums in other orders: ~1e-6 of the scale
        np.testing.assert_allclose(packed, general, rtol=1e-4, atol=1e-5 * np.abs(general).max())


@pytest.mark.parametrize("self_attention", [True, False])
def test_multihead_is_causal_hint_runs_causal_attention(device, self_attention):
    """torch's rule: ``is_causal=True`` with its causal ``attn_mask``, no key padding and ``need_weights=False``
    drops the mask and runs causal attention (the packed op for self-attention): the values of the mask
    applied as given."""
    rng = np.random.default_rng(4)
    E, H, N, L = 32, 2, 2, 11
    mha = nn.MultiheadAttention(E, H, batch_first=True, device=device)
    mha.load_state_dict({k: rng.standard_normal(v.shape) * 0.3 for k, v in mha.state_dict().items()})
    x = ag.tensor(rng.standard_normal((N, L, E)).astype(np.float32), device=device)
    kv = x if self_attention else ag.tensor(x.to_host(), device=device)
    causal = ag.tensor(np.triu(np.ones((L, L), bool), 1), device=device)
    with ag.Tape() as tape:
        hinted = mha(x, kv, kv, attn_mask=causal, is_causal=True, need_weights=False)[0]
        names = [node.op_name for node in tape.nodes]
    masked = mha(x, kv, kv, attn_mask=causal, need_weights=False)[0]
    np.testing.assert_allclose(hinted.to_host(), masked.to_host(), rtol=1e-5, atol=1e-5)
    assert ("packed_self_attention" in names) == self_attention, names


def _qkv(shape, device, dtype=np.float32):
    return nc.tensor(np.zeros(shape, dtype), dtype=dtype, device=device)


BAD = [
    ("2-d", lambda d: ag.packed_self_attention(_qkv((4, 12), d), 2), nc.ShapeError, r"\(batch, seq, 3 \* embed_dim\)"),
    ("width", lambda d: ag.packed_self_attention(_qkv((2, 4, 10), d), 2), nc.ShapeError,
     r"3 \* num_heads \* head_dim with head_dim >= 1 \(num_heads 2\), got shape \(2, 4, 10\)"),
    ("heads", lambda d: ag.packed_self_attention(_qkv((2, 4, 12), d), 0), ValueError,
     "num_heads must be a positive int, got 0"),
    ("heads bool", lambda d: ag.packed_self_attention(_qkv((2, 4, 12), d), True), ValueError, "positive int"),
    ("int", lambda d: ag.packed_self_attention(_qkv((2, 4, 12), d, np.int32), 2), nc.DTypeError, "floating-point"),
    ("scale", lambda d: ag.packed_self_attention(_qkv((2, 4, 12), d), 2, scale="x"), TypeError, "scale must be"),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs_raise_before_launch(device, case, raises_before_launch):
    _, fn, error, match = case
    raises_before_launch(device, error, match, lambda: fn(device))
