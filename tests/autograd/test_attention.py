"""scaled_dot_product_attention: forward and gradients against float64 NumPy, gradcheck, dropout,
bad inputs, launch counts and peak memory, on PoCL and the NumPy backend.

The reference (``reference`` / ``reference_grads``) is textbook attention in float64 over the full
``(..., L, S)`` scores; its analytic gradient is itself checked against central differences on a
small case. float32 kernels accumulate in float32 over at most ``S`` or ``L`` terms of O(1)
values, so outputs and gradients agree to ~1e-6; the tolerances (2e-5 abs, 1e-4 rel) leave ~10x room.
"""

from __future__ import annotations

import gc
import zlib

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.core import DTypeError, ShapeError
from netcl.nn import functional as F
from netcl.runtime import memory
from netcl.runtime.ops import dropout as raw_dropout
from netcl.runtime.ops import random as RR

ATOL, RTOL = 2e-5, 1e-4


# ---- float64 reference -----------------------------------------------------------------------
def _expand_kv(q, k, v, gqa):
    if gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        return np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3), rep
    return k, v, 1


def _probs(q, k, mask, causal, scale, keep):
    """Softmax probabilities (0 on fully masked rows, as torch >= 2.5) and their dropped version."""
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0, m)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1)
    return p, p if keep is None else p * keep


def reference(q, k, v, mask=None, causal=False, scale=None, gqa=False, keep=None):
    k, v, _ = _expand_kv(q, k, v, gqa)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    return _probs(q, k, mask, causal, scale, keep)[1] @ v


def reference_grads(g, q, k, v, mask=None, causal=False, scale=None, gqa=False, keep=None):
    """Analytic float64 gradients (dq, dk, dv) of sum(g * reference(...))."""
    ke, ve, rep = _expand_kv(q, k, v, gqa)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    p, pd = _probs(q, ke, mask, causal, scale, keep)
    dv = np.swapaxes(pd, -1, -2) @ g
    dpd = g @ np.swapaxes(ve, -1, -2)
    dp = dpd if keep is None else dpd * keep
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dq, dk = ds @ ke, np.swapaxes(ds, -1, -2) @ q
    if rep > 1:
        shape = (*k.shape[:-3], k.shape[-3], rep, *k.shape[-2:])
        dk = dk.reshape(shape).sum(axis=-3)
        dv = dv.reshape((*v.shape[:-3], v.shape[-3], rep, *v.shape[-2:])).sum(axis=-3)
    return dq, dk, dv


def test_reference_gradient_matches_central_differences() -> None:
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 4, 3, 3)), rng.standard_normal((2, 2, 4, 3)), rng.standard_normal((2, 2, 4, 2))
    mask = rng.random((3, 4)) > 0.4
    g = rng.standard_normal((2, 4, 3, 2))
    grads = reference_grads(g, q, k, v, mask=mask, gqa=True)
    arrays = [q, k, v]
    for i, got in enumerate(grads):
        num = np.zeros_like(arrays[i])
        for j in range(num.size):
            total = []
            for step in (1e-6, -1e-6):
                moved = [a.copy() for a in arrays]
                moved[i].reshape(-1)[j] += step
                total.append(np.sum(g * reference(*moved, mask=mask, gqa=True)))
            num.reshape(-1)[j] = (total[0] - total[1]) / 2e-6
        np.testing.assert_allclose(got, num, atol=1e-7, rtol=1e-6)


# ---- forward and gradients -------------------------------------------------------------------
# (name, q shape, k shape, v shape, options); masks are built by _mask from their shape and kind
CASES = [
    ("plain", (2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), {}),
    ("causal", (1, 2, 70, 8), (1, 2, 70, 8), (1, 2, 70, 8), {"is_causal": True}),
    ("causal L<S", (2, 1, 20, 8), (2, 1, 50, 8), (2, 1, 50, 4), {"is_causal": True}),
    ("causal L>S", (1, 2, 50, 8), (1, 2, 19, 8), (1, 2, 19, 8), {"is_causal": True}),
    ("Ev != E", (2, 2, 9, 12), (2, 2, 33, 12), (2, 2, 33, 5), {}),
    ("3-d", (3, 17, 8), (3, 9, 8), (3, 9, 8), {}),
    ("2-d", (17, 8), (9, 8), (9, 3), {}),
    ("L=1", (2, 2, 1, 8), (2, 2, 40, 8), (2, 2, 40, 8), {}),
    ("S=1", (2, 2, 40, 8), (2, 2, 1, 8), (2, 2, 1, 6), {}),
    ("L=S=1 causal", (1, 1, 1, 4), (1, 1, 1, 4), (1, 1, 1, 4), {"is_causal": True}),
    ("scale", (1, 2, 21, 8), (1, 2, 35, 8), (1, 2, 35, 8), {"scale": 0.9}),
    ("gqa", (2, 6, 13, 8), (2, 2, 29, 8), (2, 2, 29, 4), {"enable_gqa": True}),
    ("gqa causal", (1, 4, 40, 8), (1, 1, 40, 8), (1, 1, 40, 8), {"enable_gqa": True, "is_causal": True}),
    ("bool mask (L, S)", (2, 2, 19, 8), (2, 2, 37, 8), (2, 2, 37, 8), {"mask": ((19, 37), "bool")}),
    ("bool mask (B, 1, 1, S)", (3, 2, 11, 8), (3, 2, 23, 8), (3, 2, 23, 8), {"mask": ((3, 1, 1, 23), "bool")}),
    ("bool mask full", (2, 2, 7, 8), (2, 2, 9, 8), (2, 2, 9, 8), {"mask": ((2, 2, 7, 9), "bool")}),
    ("additive mask (H, L, 1)", (2, 3, 15, 8), (2, 3, 34, 8), (2, 3, 34, 8), {"mask": ((3, 15, 1), "add")}),
    ("additive mask (B, 1, L, S)", (2, 3, 15, 8), (2, 3, 34, 8), (2, 3, 34, 8), {"mask": ((2, 1, 15, 34), "add")}),
    ("gqa + mask", (1, 4, 9, 8), (1, 2, 12, 8), (1, 2, 12, 8), {"enable_gqa": True, "mask": ((9, 12), "bool")}),
]


def _mask(rng, shape, kind):
    if kind == "bool":
        return rng.random(shape) > 0.35
    m = rng.standard_normal(shape).astype(np.float32).astype(np.float64)
    return np.where(rng.random(shape) > 0.8, -np.inf, m)


def _inputs(rng, qs, ks, vs):
    return [rng.standard_normal(s).astype(np.float32).astype(np.float64) for s in (qs, ks, vs)]


@pytest.mark.parametrize(("name", "qs", "ks", "vs", "opts"), CASES, ids=[c[0] for c in CASES])
def test_forward_and_grads_match_float64(device, name, qs, ks, vs, opts) -> None:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q, k, v = _inputs(rng, qs, ks, vs)
    mask = _mask(rng, *opts["mask"]) if "mask" in opts else None
    kw = {key: val for key, val in opts.items() if key != "mask"}
    ref_kw = {"causal": kw.get("is_causal", False), "scale": kw.get("scale"), "gqa": kw.get("enable_gqa", False)}
    nodes = [ag.tensor(a.astype(np.float32), requires_grad=True, device=device) for a in (q, k, v)]
    m = None if mask is None else ag.tensor(mask if mask.dtype == bool else mask.astype(np.float32), device=device)
    with ag.Tape() as tape:
        out = F.scaled_dot_product_attention(*nodes, attn_mask=m, **kw)
    expected = reference(q, k, v, mask=mask, **ref_kw)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.to_host(), expected, atol=ATOL, rtol=RTOL, err_msg="forward")
    g = rng.standard_normal(expected.shape)
    tape.backward(out, grad=g.astype(np.float32))
    for node, want, arg in zip(nodes, reference_grads(g, q, k, v, mask=mask, **ref_kw), "qkv", strict=True):
        np.testing.assert_allclose(node.grad.to_host(), want, atol=ATOL, rtol=RTOL, err_msg=f"d{arg}")


def test_fully_masked_row_is_zero_with_zero_gradients(device) -> None:
    """A query row that sees no key gives 0 (torch >= 2.5's math backend), not NaN, and no gradient."""
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, (1, 2, 5, 4), (1, 2, 6, 4), (1, 2, 6, 4))
    mask = np.ones((5, 6), bool)
    mask[2] = False
    nodes = [ag.tensor(a.astype(np.float32), requires_grad=True, device=device) for a in (q, k, v)]
    with ag.Tape() as tape:
        out = ag.scaled_dot_product_attention(*nodes, attn_mask=ag.tensor(mask, device=device))
    got = out.to_host()
    assert np.all(got[:, :, 2] == 0)
    np.testing.assert_allclose(got, reference(q, k, v, mask=mask), atol=ATOL, rtol=RTOL)
    tape.backward(out, grad=np.ones(out.shape, np.float32))
    assert np.all(nodes[0].grad.to_host()[:, :, 2] == 0)
    assert all(np.isfinite(n.grad.to_host()).all() for n in nodes)


GRADCHECK_CASES = [
    ("plain", (1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3), {}),
    ("causal", (1, 1, 5, 3), (1, 1, 4, 3), (1, 1, 4, 2), {"is_causal": True}),
    ("gqa", (1, 4, 3, 2), (1, 2, 4, 2), (1, 2, 4, 2), {"enable_gqa": True}),
]


@pytest.mark.parametrize(("name", "qs", "ks", "vs", "opts"), GRADCHECK_CASES, ids=[c[0] for c in GRADCHECK_CASES])
def test_gradcheck(device, name, qs, ks, vs, opts) -> None:
    rng = np.random.default_rng(11)
    nodes = [ag.tensor(a.astype(np.float32), requires_grad=True, device=device) for a in _inputs(rng, qs, ks, vs)]
    assert ag.gradcheck(lambda q, k, v: ag.scaled_dot_product_attention(q, k, v, **opts), *nodes)


def test_gradcheck_with_additive_mask(device) -> None:
    rng = np.random.default_rng(12)
    nodes = [ag.tensor(a.astype(np.float32), requires_grad=True, device=device) for a in _inputs(rng, *[(2, 3, 3)] * 3)]
    mask = ag.tensor(rng.standard_normal((1, 3, 3)).astype(np.float32), device=device)
    assert ag.gradcheck(lambda q, k, v: ag.scaled_dot_product_attention(q, k, v, attn_mask=mask), *nodes)


# ---- dropout --------------------------------------------------------------------------------
def test_dropout_uses_the_dropout_philox_stream_and_regenerates_it(device) -> None:
    """Kept probabilities are exactly those ``ops.dropout`` keeps in a (BH, L, S) tensor of ones with the
    op's seed; forward and gradients match the float64 reference with that mask."""
    rng = np.random.default_rng(21)
    p = 0.3
    q, k, v = _inputs(rng, (2, 2, 19, 8), (2, 2, 37, 8), (2, 2, 37, 4))
    ag.manual_seed(1234)
    seed = RR.next_seed()  # the seed the next dropout draw gets
    ones = nc.Tensor.from_host(device, np.ones((4, 19, 37), np.float32))
    keep = raw_dropout(ones, p, seed).to_host().astype(np.float64).reshape(2, 2, 19, 37)
    assert 0.2 < (keep == 0).mean() < 0.4
    ag.manual_seed(1234)
    nodes = [ag.tensor(a.astype(np.float32), requires_grad=True, device=device) for a in (q, k, v)]
    with ag.Tape() as tape:
        out = ag.scaled_dot_product_attention(*nodes, dropout_p=p)
    np.testing.assert_allclose(out.to_host(), reference(q, k, v, keep=keep), atol=ATOL, rtol=RTOL)
    g = rng.standard_normal(out.shape)
    tape.backward(out, grad=g.astype(np.float32))
    for node, want in zip(nodes, reference_grads(g, q, k, v, keep=keep), strict=True):
        np.testing.assert_allclose(node.grad.to_host(), want, atol=ATOL, rtol=RTOL)


def test_dropout_is_deterministic_per_seed_and_equal_across_backends() -> None:
    rng = np.random.default_rng(22)
    arrays = _inputs(rng, (1, 2, 16, 8), (1, 2, 24, 8), (1, 2, 24, 8))
    results = {}
    for spec in ("opencl", "cpu"):
        try:
            device = nc.get_device(spec)
        except nc.DeviceError:
            continue
        runs = []
        for seed in (5, 5, 6):
            ag.manual_seed(seed)
            t = [ag.tensor(a.astype(np.float32), device=device) for a in arrays]
            runs.append(ag.scaled_dot_product_attention(*t, dropout_p=0.5).to_host())
        np.testing.assert_array_equal(runs[0], runs[1])
        assert not np.allclose(runs[0], runs[2])
        results[spec] = runs[0]
    if len(results) == 2:
        np.testing.assert_allclose(results["opencl"], results["cpu"], atol=ATOL, rtol=RTOL)


# ---- bad inputs -----------------------------------------------------------------------------
def _t(shape, device, dtype=np.float32):
    return ag.tensor(np.ones(shape, dtype), requires_grad=dtype == np.float32, device=device)


SDPA = ag.scaled_dot_product_attention
BAD = [
    (
        "batch dims",
        lambda d: SDPA(_t((2, 4, 3, 8), d), _t((3, 4, 5, 8), d), _t((3, 4, 5, 8), d)),
        ShapeError,
        r"query and key batch/head dims disagree: \(2, 4\) vs \(3, 4\)",
    ),
    (
        "head dims",
        lambda d: SDPA(_t((2, 4, 3, 8), d), _t((2, 2, 5, 8), d), _t((2, 2, 5, 8), d)),
        ShapeError,
        r"\(2, 4\) vs \(2, 2\) \(set enable_gqa=True",
    ),
    (
        "gqa not a multiple",
        lambda d: SDPA(_t((1, 4, 3, 8), d), _t((1, 3, 5, 8), d), _t((1, 3, 5, 8), d), enable_gqa=True),
        ShapeError,
        r"query heads \(4\) must be a multiple of the key/value heads \(3\)",
    ),
    (
        "key/value heads",
        lambda d: SDPA(_t((1, 2, 3, 8), d), _t((1, 2, 5, 8), d), _t((1, 1, 5, 8), d)),
        ShapeError,
        r"key and value must have the same batch and head dims",
    ),
    (
        "feature dim",
        lambda d: SDPA(_t((1, 3, 8), d), _t((1, 5, 4), d), _t((1, 5, 4), d)),
        ShapeError,
        r"key's feature dim 4 must equal query's 8",
    ),
    (
        "value length",
        lambda d: SDPA(_t((1, 3, 8), d), _t((1, 5, 8), d), _t((1, 6, 8), d)),
        ShapeError,
        r"value's sequence dim 6 must equal key's 5",
    ),
    (
        "mask broadcast",
        lambda d: SDPA(_t((2, 3, 8), d), _t((2, 5, 8), d), _t((2, 5, 8), d), attn_mask=_t((3, 4), d, np.bool_)),
        ShapeError,
        r"attn_mask of shape \(3, 4\) does not broadcast to \(\.\.\., L, S\) = \(2, 3, 5\)",
    ),
    (
        "mask dtype",
        lambda d: SDPA(_t((3, 8), d), _t((5, 8), d), _t((5, 8), d), attn_mask=_t((3, 5), d, np.int32)),
        DTypeError,
        r"attn_mask must be bool or query's dtype float32, got int32",
    ),
    (
        "dropout_p 1",
        lambda d: SDPA(_t((3, 8), d), _t((5, 8), d), _t((5, 8), d), dropout_p=1.0),
        ValueError,
        r"dropout_p must be in \[0, 1\), got 1.0",
    ),
    (
        "dropout_p negative",
        lambda d: SDPA(_t((3, 8), d), _t((5, 8), d), _t((5, 8), d), dropout_p=-0.1),
        ValueError,
        r"dropout_p must be in \[0, 1\)",
    ),
    (
        "causal with mask",
        lambda d: SDPA(_t((3, 8), d), _t((5, 8), d), _t((5, 8), d), attn_mask=_t((3, 5), d), is_causal=True),
        ValueError,
        r"either attn_mask or is_causal=True, not both",
    ),
    (
        "int query",
        lambda d: SDPA(_t((3, 8), d, np.int32), _t((5, 8), d), _t((5, 8), d)),
        DTypeError,
        r"query must be a floating-point tensor",
    ),
    ("1-d query", lambda d: SDPA(_t((8,), d), _t((5, 8), d), _t((5, 8), d)), ShapeError, r"query must have at least 2"),
]


@pytest.mark.parametrize(("name", "fn", "error", "match"), BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_raise_before_any_launch(device, raises_before_launch, name, fn, error, match) -> None:
    raises_before_launch(device, error, match, lambda: fn(device))


# ---- launches and memory ---------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_forward_is_one_launch_and_backward_two(cl_device, launch_counter, causal) -> None:
    rng = np.random.default_rng(31)
    arrays = _inputs(rng, (2, 2, 40, 8), (2, 2, 40, 8), (2, 2, 40, 8))
    mask = None if causal else ag.tensor(rng.random((40, 40)) > 0.3, device=cl_device)
    g = nc.Tensor.from_host(cl_device, rng.standard_normal((2, 2, 40, 8)).astype(np.float32))

    def step(launches=None):
        nodes = [ag.tensor(a.astype(np.float32), requires_grad=True, device=cl_device) for a in arrays]
        with ag.Tape() as tape:
            if launches is None:
                out = ag.scaled_dot_product_attention(*nodes, attn_mask=mask, is_causal=causal)
            else:
                with launches[0]:
                    out = ag.scaled_dot_product_attention(*nodes, attn_mask=mask, is_causal=causal)
        if launches is None:
            tape.backward(out, grad=g)
        else:
            with launches[1]:
                tape.backward(out, grad=g)

    step()  # builds the programs (and uploads the mask's offset table) outside the counted calls
    counted = (launch_counter(cl_device.queue), launch_counter(cl_device.queue))
    step(counted)
    assert counted[0].names == ["netcl_attention_fwd"]
    assert counted[1].names == ["netcl_attention_bwd_kv", "netcl_attention_bwd_q"]


def test_peak_memory_stays_below_one_score_matrix(cl_device) -> None:
    """b1 h1 s2048 d16: inputs, output, lse and gradients take ~1 MB; one float32 S x S matrix 16 MiB."""
    S, E = 2048, 16
    rng = np.random.default_rng(41)
    nodes = [
        ag.tensor(rng.standard_normal((1, 1, S, E)).astype(np.float32), requires_grad=True, device=cl_device)
        for _ in range(3)
    ]
    g = nc.Tensor.from_host(cl_device, rng.standard_normal((1, 1, S, E)).astype(np.float32))
    gc.collect()
    cl_device.queue.finish()
    memory.reset_peak(cl_device)
    base = memory.max_allocated(cl_device)
    with ag.Tape() as tape:
        out = ag.scaled_dot_product_attention(*nodes, is_causal=True)
    tape.backward(out, grad=g)
    cl_device.queue.finish()
    used = memory.max_allocated(cl_device) - base
    assert 4 * S * E * 4 <= used < S * S * 4 // 8, used  # output + 3 gradients at least; far below S x S


def test_max_allocated_counts_with_the_pool_switched_off(cl_device) -> None:
    try:
        memory.install_caching_allocator(False)
        gc.collect()
        memory.reset_peak(cl_device)
        base = memory.max_allocated(cl_device)
        t = nc.Tensor.empty((1 << 18,), np.float32, cl_device)
        assert memory.max_allocated(cl_device) - base == 1 << 20
        del t
        gc.collect()
        assert memory.memory_stats(cl_device).allocated_bytes == base
    finally:
        memory.install_caching_allocator(True)


# ---- float16 storage ------------------------------------------------------------------------
def test_float16_inputs_compute_in_float32(cl_device) -> None:
    rng = np.random.default_rng(51)
    q, k, v = (a.astype(np.float16) for a in _inputs(rng, (1, 2, 21, 8), (1, 2, 33, 8), (1, 2, 33, 8)))
    out = ag.scaled_dot_product_attention(*(ag.tensor(a, device=cl_device) for a in (q, k, v)), is_causal=True)
    assert out.dtype == np.float16
    want = reference(*(a.astype(np.float64) for a in (q, k, v)), causal=True)
    np.testing.assert_allclose(out.to_host().astype(np.float64), want, atol=2e-3, rtol=2e-3)  # float16 rounding


def test_float64_computes_in_double(device) -> None:
    """float64 inputs run the same kernels in double: forward and gradients to ~1e-13."""
    rng = np.random.default_rng(61)
    q, k, v = _inputs(rng, (2, 2, 35, 8), (2, 1, 41, 8), (2, 1, 41, 6))
    mask = rng.standard_normal((35, 41))
    nodes = [ag.tensor(a, requires_grad=True, device=device, dtype=np.float64) for a in (q, k, v)]
    with ag.Tape() as tape:
        out = ag.scaled_dot_product_attention(*nodes, attn_mask=ag.tensor(mask, device=device, dtype=np.float64),
                                              enable_gqa=True)  # fmt: skip
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.to_host(), reference(q, k, v, mask=mask, gqa=True), atol=1e-13, rtol=1e-12)
    g = rng.standard_normal(out.shape)
    tape.backward(out, grad=g)
    for node, want in zip(nodes, reference_grads(g, q, k, v, mask=mask, gqa=True), strict=True):
        np.testing.assert_allclose(node.grad.to_host(), want, atol=1e-12, rtol=1e-11)
