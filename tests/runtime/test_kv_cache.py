"""netcl.runtime.ops.kv_cache: row writes/reads at a bound position and attention over a cache prefix.

The reference is causal attention over the whole sequence of ``pos + L`` tokens in float64 NumPy,
its last ``L`` rows: what the cached call must equal. float32 kernels sum at most ``T`` products
of O(1) values in float32, so they agree to ~1e-6; the tolerances (2e-5 abs, 1e-4 rel) are the
fused attention tests'. float64 inputs compute in double: 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import Graph, Variable
from netcl.runtime.ops import kv_cache as K

ATOL, RTOL = 2e-5, 1e-4


def _t(device, array, dtype=None):
    array = np.ascontiguousarray(array)
    return nc.Tensor.from_host(device, array, array.dtype if dtype is None else dtype)


def causal_reference(q, k, v, scale):
    """Full causal attention of a (..., S, E) sequence in float64."""
    s = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) * scale
    S = s.shape[-1]
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v.astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_write_and_read_rows_at_a_bound_position(device, dtype):
    if dtype == np.float64 and not device.supports(np.float64):
        pytest.skip("no float64 on this device")
    rng = np.random.default_rng(0)
    cache_host = rng.standard_normal((2, 3, 10, 4)).astype(dtype)
    cache = _t(device, cache_host)
    new_host = rng.standard_normal((2, 3, 2, 4)).astype(dtype)
    pos = Variable("pos", 8, value=5)
    K.write_rows(cache, _t(device, new_host), pos)
    cache_host[:, :, 5:7] = new_host
    np.testing.assert_array_equal(cache.to_host(), cache_host)
    start = Variable("start", 7, value=1)  # 3 rows from at most 7 fit the 10 positions
    np.testing.assert_array_equal(K.read_rows(cache, start, 3).to_host(), cache_host[:, :, 1:4])
    np.testing.assert_array_equal(K.read_rows(cache, 9).to_host(), cache_host[:, :, 9:10])


@pytest.mark.parametrize(("E", "Ev", "T", "L"), [(8, 8, 12, 1), (16, 8, 70, 1), (4, 6, 40, 3)])
def test_cache_attention_equals_causal_attention_on_the_prefix(device, E, Ev, T, L):
    rng = np.random.default_rng(E * 100 + T)
    B, H = 2, 3
    q = rng.standard_normal((B, H, T, E)).astype(np.float32)
    k = rng.standard_normal((B, H, T, E)).astype(np.float32)
    v = rng.standard_normal((B, H, T, Ev)).astype(np.float32)
    k_cache, v_cache = _t(device, k), _t(device, v)  # rows past the prefix hold values that must be ignored
    pos = Variable("pos", T - L)
    for p in sorted({0, 1, (T - L) // 2, T - L}):
        pos.bind(p)
        out = K.cache_attention(_t(device, q[:, :, p : p + L]), k_cache, v_cache, pos).to_host()
        expected = causal_reference(q[:, :, : p + L], k[:, :, : p + L], v[:, :, : p + L], 1 / np.sqrt(E))[:, :, p:]
        np.testing.assert_allclose(out, expected, atol=ATOL, rtol=RTOL, err_msg=f"pos {p}")


def test_cache_attention_float64_and_scale(device):
    if not device.supports(np.float64):
        pytest.skip("no float64 on this device")
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 20, 5)) for _ in range(3))
    out = K.cache_attention(_t(device, q[:, :, 9:10]), _t(device, k), _t(device, v), 9, scale=0.3).to_host()
    expected = causal_reference(q[:, :, :10], k[:, :, :10], v[:, :, :10], 0.3)[:, :, 9:]
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, expected, atol=1e-12, rtol=1e-12)


def test_cache_attention_replays_for_every_position(cl_device):
    rng = np.random.default_rng(5)
    T, E = 24, 8
    q = rng.standard_normal((1, 2, T, E)).astype(np.float32)
    k = rng.standard_normal((1, 2, T, E)).astype(np.float32)
    v = rng.standard_normal((1, 2, T, E)).astype(np.float32)
    k_cache = nc.Tensor.zeros((1, 2, T, E), device=cl_device)
    v_cache = nc.Tensor.zeros((1, 2, T, E), device=cl_device)
    q_in, k_in, v_in = (nc.Tensor.empty((1, 2, 1, E), device=cl_device) for _ in range(3))
    pos = Variable("pos", T - 1)
    g = Graph()
    with g.capture(cl_device.queue, inputs=[q_in, k_in, v_in]):
        K.write_rows(k_cache, k_in, pos)
        K.write_rows(v_cache, v_in, pos)
        g.outputs = K.cache_attention(q_in, k_cache, v_cache, pos)
    launches = len(g.launches)
    reference = causal_reference(q, k, v, 1 / np.sqrt(E))
    for p in range(T):
        step = [_t(cl_device, a[:, :, p : p + 1]) for a in (q, k, v)]
        out = g.execute(*step, bindings={"pos": p}).to_host()
        np.testing.assert_allclose(out, reference[:, :, p : p + 1], atol=ATOL, rtol=RTOL, err_msg=f"pos {p}")
    assert len(g.launches) == launches == 3 and g.replays == T


def test_bad_inputs_raise_before_any_launch(device):
    cache = _t(device, np.zeros((2, 4, 8, 3), np.float32))
    new = _t(device, np.ones((2, 4, 1, 3), np.float32))
    too_far = Variable("pos", 8)
    with pytest.raises(ValueError, match=r"write_rows: pos \(Variable 'pos' with max_value 8\) .* reaches position 8"):
        K.write_rows(cache, new, too_far)
    with pytest.raises(ValueError, match=r"write_rows: pos=7 plus the 2 row\(s\)"):
        K.write_rows(cache, _t(device, np.ones((2, 4, 2, 3), np.float32)), 7)
    with pytest.raises(ValueError, match="pos must be >= 0"):
        K.write_rows(cache, new, -1)
    with pytest.raises(ValueError, match=r"cache \(2, 4, 8, 3\) and new \(2, 3, 1, 3\) must agree"):
        K.write_rows(cache, _t(device, np.ones((2, 3, 1, 3), np.float32)), 0)
    with pytest.raises(ValueError, match="cache is float32, new is float64"):
        K.write_rows(cache, _t(device, np.ones((2, 4, 1, 3)), np.float64), 0)
    with pytest.raises(ValueError, match=r"cache_attention: pos \(Variable 'pos' with max_value 8\)"):
        K.cache_attention(new, cache, cache, too_far)
    with pytest.raises(ValueError, match="v_cache must be a Tensor of shape"):
        K.cache_attention(new, cache, _t(device, np.zeros((2, 4, 7, 3), np.float32)), 0)
    with pytest.raises(ValueError, match="count must be a positive int"):
        K.read_rows(cache, 0, 0)
    np.testing.assert_array_equal(cache.to_host(), 0)  # nothing was written
