"""The register-blocked attention kernels (``ops.attention_blocked``), forced with ``NETCL_ATTENTION=blocked``:
forward, lse and dq/dk/dv against the float64 reference of tests/autograd/test_attention.py, and which calls
they take.

Cases cross the block sizes the kernels use (``attention_blocked.configs``: 64 query rows, 16 to 64 keys)
with odd tails, causal (L = S, L < S, L > S), GQA (causal and not), a scale, L = 1 and S = 1, for E 16, 32
and 64; at E 128 the blocked forward with the next variant's backward. Tolerance: each output or gradient
element is a float32 sum of at most ``group * max(L, S)`` (<= 520 here) products of O(1) values, plus
16-128-term score dot products, so its rounding error is a few 1e-6 at most (observed <= 4e-6); 2e-5
absolute and 1e-4 relative, as the other attention tests.
"""

from __future__ import annotations

import zlib

import file_modules
import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime.ops import attention as RA
from netcl.runtime.ops import attention_blocked as blocked
from netcl.runtime.ops import attention_mma_tf32

ATOL, RTOL = 2e-5, 1e-4


_REF = file_modules.load("tests/autograd/test_attention.py", "netcl_attention_reference")
F32 = np.dtype(np.float32)


def check_blocked(device, qs, ks, causal=False, gqa=False, scale=None) -> None:
    """Forward, lse and gradients of the blocked kernels against float64 (v has k's shape: E == Ev)."""
    rng = np.random.default_rng(zlib.crc32(repr((qs, ks, causal, gqa, scale)).encode()))
    q, k, v = (rng.standard_normal(s).astype(np.float32).astype(np.float64) for s in (qs, ks, ks))
    tensors = [nc.Tensor.from_host(device, a, np.float32) for a in (q, k, v)]
    spec = RA.check_attention(*tensors, None, 0.0, causal, scale, gqa)
    assert RA.select_variant(device, F32, spec).name == "blocked"
    out, lse = RA.attention_forward(*tensors, None, spec)
    kw = {"causal": causal, "scale": scale, "gqa": gqa}
    np.testing.assert_allclose(out.to_host(), _REF.reference(q, k, v, **kw), atol=ATOL, rtol=RTOL, err_msg="out")
    ke, _, _ = _REF._expand_kv(q, k, v, gqa)
    s = q @ np.swapaxes(ke, -1, -2) * (1 / np.sqrt(qs[-1]) if scale is None else scale)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    top = s.max(axis=-1)
    want_lse = top + np.log(np.exp(s - top[..., None]).sum(axis=-1))
    np.testing.assert_allclose(lse.to_host(), want_lse, atol=ATOL, rtol=RTOL, err_msg="lse")
    g = rng.standard_normal((*qs[:-1], ks[-1]))
    grads = RA.attention_backward(nc.Tensor.from_host(device, g, np.float32), *tensors, out, lse, None, spec)
    for got, want, arg in zip(grads, _REF.reference_grads(g, q, k, v, **kw), "qkv", strict=True):
        np.testing.assert_allclose(got.to_host(), want, atol=ATOL, rtol=RTOL, err_msg=f"d{arg}")


@pytest.fixture
def forced(cl_device, monkeypatch) -> nc.Device:
    monkeypatch.setenv("NETCL_ATTENTION", "blocked")
    return cl_device


# (name, q shape, k shape (= v shape), options)
CASES = [
    ("plain E64", (2, 2, 37, 64), (2, 2, 45, 64), {}),
    ("plain E32 tiles", (1, 2, 130, 32), (1, 2, 100, 32), {}),
    ("plain E16", (2, 3, 70, 16), (2, 3, 33, 16), {}),
    ("causal E64", (1, 2, 130, 64), (1, 2, 130, 64), {"causal": True}),
    ("causal E32", (1, 2, 70, 32), (1, 2, 70, 32), {"causal": True}),
    ("causal E16", (2, 1, 67, 16), (2, 1, 67, 16), {"causal": True}),
    ("causal L<S", (2, 1, 20, 64), (2, 1, 150, 64), {"causal": True}),
    ("causal L>S", (1, 2, 150, 64), (1, 2, 19, 64), {"causal": True}),
    ("gqa", (2, 6, 13, 64), (2, 2, 129, 64), {"gqa": True}),
    ("gqa causal", (1, 4, 100, 32), (1, 1, 100, 32), {"gqa": True, "causal": True}),
    ("scale", (1, 2, 21, 64), (1, 2, 35, 64), {"scale": 0.3}),
    ("L=1", (2, 2, 1, 64), (2, 2, 40, 64), {}),
    ("S=1 causal", (1, 2, 40, 32), (1, 2, 1, 32), {"causal": True}),
    ("3-d", (3, 17, 16), (3, 9, 16), {}),
    ("E128 causal (next variant's backward)", (1, 2, 45, 128), (1, 2, 45, 128), {"causal": True}),
    ("E128 gqa", (1, 4, 33, 128), (1, 2, 70, 128), {"gqa": True}),
]


@pytest.mark.parametrize(("name", "qs", "ks", "opts"), CASES, ids=[c[0] for c in CASES])
def test_blocked_forward_and_grads_match_float64(forced, name, qs, ks, opts) -> None:
    check_blocked(forced, qs, ks, **opts)


# ---- which calls the blocked kernels take ------------------------------------------------------------
def _spec(e=64, ev=64, mask=None, dropout=0.0, causal=False):
    q = nc.Tensor.empty((2, 4, 8, e), np.float32, "cpu")
    k = nc.Tensor.empty((2, 4, 8, e), np.float32, "cpu")
    v = nc.Tensor.empty((2, 4, 8, ev), np.float32, "cpu")
    return RA.check_attention(q, k, v, mask, dropout, causal)


def test_other_calls_go_to_the_next_variant(forced) -> None:
    mask = nc.Tensor.empty((8, 8), np.bool_, "cpu")
    for spec, dtype in [
        (_spec(), np.dtype(np.float64)),
        (_spec(e=8, ev=8), F32),
        (_spec(ev=32), F32),
        (_spec(mask=mask), F32),
        (_spec(dropout=0.1), F32),
    ]:
        assert RA.select_variant(forced, dtype, spec).name != "blocked"
    for spec in (_spec(causal=True), _spec(e=128, ev=128)):
        assert RA.select_variant(forced, F32, spec).name == "blocked"


@pytest.mark.parametrize("choice", ["quad", "portable"])
def test_netcl_attention_quad_or_portable_turns_them_off(cl_device, monkeypatch, choice) -> None:
    monkeypatch.setenv("NETCL_ATTENTION", choice)
    assert RA.select_variant(cl_device, F32, _spec()).name != "blocked"


def test_default_follows_is_default(cl_device, monkeypatch) -> None:
    monkeypatch.delenv("NETCL_ATTENTION", raising=False)
    monkeypatch.setattr(attention_mma_tf32, "HIGHEST", None)  # "highest" off the tf32x3 tensor-core kernels
    taken = RA.select_variant(cl_device, F32, _spec()).name == "blocked"
    assert taken == blocked.is_default(cl_device)


@pytest.mark.parametrize("e", [16, 32, 64])
def test_blocks_fit_48_kb_and_tile_the_work_items(e) -> None:
    for kernel, b in blocked.configs(e, 1 << 20).items():
        assert b is not None, kernel
        assert 4 * blocked._local_floats(kernel, e, b) <= blocked.LOCAL_BUDGET
        owners = b.BM // 4 if kernel == "bwd_kv" else b.BN // 4
        assert (e // 4) % owners == 0 and b.BM % 16 == 0 and b.BN % 16 == 0
    at128 = blocked.configs(128, 1 << 20)  # bwd_kv has no blocks within 48 KB: the next variant's backward runs
    assert at128["fwd"] is not None and at128["bwd_kv"] is None
