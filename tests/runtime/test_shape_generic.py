"""Eager kernels are shape-generic: a new batch size builds no program (issue 17).

Builds are counted through ``program_cache.stats()`` (misses = builds + disk hits: a disk hit
is a program this process did not have, so it counts too).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.runtime.ops as R
from netcl.runtime.cache import key_kind, program_cache
from netcl.runtime.ops._common import FLAT, ONE, STRIDED, broadcast_layout, fast_divisor

#: The GEMM's programs (``ops/gemm.py``): shape-generic in M, N, K, but its tile configuration is
#: chosen per power-of-two class of M, N, K (and tuned per class on GPUs), so 57 or 1000 rows after
#: 100 may pick another config. 101 rows (the same class) must build nothing at all.
GEMM_KINDS = ("netcl.runtime.ops:gemm",)


def _misses() -> dict[str, int]:
    return dict(program_cache.stats().misses_by_kind)


def _new_programs(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _mlp_step(w: ag.Node, b: ag.Node, batch: int, device: nc.Device, rng: np.random.Generator) -> tuple:
    """One step of ``cross_entropy(relu(x @ w + b) * 0.5, y)`` with backward; (loss, x, y)."""
    x = rng.normal(size=(batch, w.shape[0])).astype(np.float32)
    y = rng.integers(0, w.shape[1], size=batch).astype(np.int32)
    w.grad = b.grad = None  # as an optimizer's zero_grad: accumulation is not what is counted here
    with ag.Tape() as tape:
        loss = ag.cross_entropy(ag.relu(ag.tensor(x, device=device) @ w + b) * 0.5, ag.tensor(y, device=device))
    tape.backward(loss)
    return loss, x, y


def _reference(x: np.ndarray, y: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """float64 loss and gradients of w and b."""
    x, w, b = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
    pre = x @ w + b
    h = np.maximum(pre, 0) * 0.5
    z = h - h.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    dh = p.copy()
    dh[np.arange(len(y)), y] -= 1
    dh /= len(y)
    dpre = dh * 0.5 * (pre > 0)
    return loss, x.T @ dpre, dpre.sum(axis=0)


def test_a_new_batch_size_builds_no_eager_program(cl_device: nc.Device) -> None:
    rng = np.random.default_rng(17)
    w_np = rng.normal(size=(20, 10)).astype(np.float32)
    b_np = rng.normal(size=(10,)).astype(np.float32)
    w = ag.tensor(w_np, requires_grad=True, device=cl_device)
    b = ag.tensor(b_np, requires_grad=True, device=cl_device)
    _mlp_step(w, b, 100, cl_device, rng)  # the first step builds the programs of every layout class
    # Past one column chunk (256 rows) the bias gradient's sum runs in two stages, and the second
    # stage (the partial sums' layout) is a program of its own, as a split GEMM's sum kernel is: a
    # step in that regime too, so the check below does not depend on another test having built it
    # in this process (run alone, batch 1000 built it here).
    _mlp_step(w, b, 300, cl_device, rng)
    # And on a CPU device the bias gradient of <= 64 rows sums one work-item an output ("serial", reduce's
    # SERIAL_MAX_CPU), a program of its own too: a step there as well (batch 57 below built it when no other test
    # of the process had).
    _mlp_step(w, b, 40, cl_device, rng)
    for batch in (101, 57, 1000):
        before = _misses()
        loss, x, y = _mlp_step(w, b, batch, cl_device, rng)
        new = _new_programs(before, _misses())
        if batch == 101:  # everything, matmul included: the GEMM takes M, N, K as arguments
            assert new == {}, f"batch {batch} built programs {new}"
        else:  # the GEMM picks its tile config per power-of-two shape class (and split-K) on purpose
            eager = {k: v for k, v in new.items() if not k.startswith(GEMM_KINDS)}
            assert eager == {}, f"batch {batch} built programs {eager}"
        ref_loss, ref_gw, ref_gb = _reference(x, y, w_np, b_np)
        # float32 over sums of <= 1000 terms of O(1) values: 1e-4 relative is ~100 ulps of headroom
        np.testing.assert_allclose(loss.to_host(), ref_loss, rtol=1e-4)
        np.testing.assert_allclose(w.grad.to_host(), ref_gw, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(b.grad.to_host(), ref_gb, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("shapes", "other_shapes"),
    [
        ([(7, 5), (5,)], [(13, 5), (5,)]),  # row bias: B changes
        ([(7, 5), (7, 1)], [(3, 9), (3, 1)]),  # column broadcast, both dims change
        ([(3, 5, 7), (5, 1)], [(2, 4, 9), (4, 1)]),  # rank 3 after collapsing
        ([(2, 3, 4, 5), (3, 1, 5)], [(3, 2, 3, 6), (2, 1, 6)]),  # rank 4: the z axis is peeled
        ([(6, 1, 4), (1, 5, 1)], [(2, 1, 3), (1, 7, 1)]),  # both operands broadcast
    ],
)
def test_broadcast_ops_share_one_program_across_shapes(cl_device: nc.Device, shapes, other_shapes) -> None:
    rng = np.random.default_rng(3)
    for i, group in enumerate((shapes, other_shapes)):
        a, b = (rng.normal(size=s).astype(np.float32) for s in group)
        before = _misses()
        got = R.sub(nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)).to_host()
        if i == 1:
            assert _new_programs(before, _misses()) == {}, f"{other_shapes} rebuilt what {shapes} built"
        np.testing.assert_array_equal(got, a - b)  # one float32 subtraction: exact


#: pairs of one reduction regime each: a column sum of more than one chunk (``reduce.COL_CHUNK``, 128 rows) runs
#: in two stages, the second a program of its own, so a pair that crossed that line would pass only where another
#: test in the process had built the second stage first
@pytest.mark.parametrize(
    ("shape", "axis", "other"),
    [
        ((6, 40), 1, (9, 33)),
        ((40, 12), 0, (100, 20)),
        ((400, 12), 0, (300, 20)),
        ((5, 6, 7), (0, 2), (8, 2, 9)),
        ((2000,), None, (5000,)),
    ],
)
def test_reductions_share_one_program_across_sizes(cl_device: nc.Device, shape, axis, other) -> None:
    rng = np.random.default_rng(5)
    for i, s in enumerate((shape, other)):
        x = rng.random(s).astype(np.float32)
        before = _misses()
        got = R.sum(nc.tensor(x, device=cl_device), axis=axis).to_host()
        if i == 1:
            assert _new_programs(before, _misses()) == {}, f"sum of {other} rebuilt what {shape} built"
        # float32 pairwise-ish sum of <= 5000 values in [0, 1): 1e-5 relative is ample
        np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=axis), rtol=1e-5)


@pytest.mark.parametrize(("shape", "perm", "other"), [((3, 4, 5), (2, 0, 1), (6, 2, 7)), ((5, 33), (1, 0), (70, 9))])
def test_transposes_share_one_program_across_sizes(cl_device: nc.Device, shape, perm, other) -> None:
    for i, s in enumerate((shape, other)):
        x = np.arange(np.prod(s), dtype=np.float32).reshape(s)
        before = _misses()
        got = R.transpose(nc.tensor(x, device=cl_device), perm).to_host()
        if i == 1:
            assert _new_programs(before, _misses()) == {}
        np.testing.assert_array_equal(got, x.transpose(perm))


def test_one_hot_takes_the_class_count_as_an_argument(cl_device: nc.Device) -> None:
    labels = nc.tensor(np.array([0, 2, 1, 5], np.int32), device=cl_device)
    R.one_hot(labels, 3)
    before = _misses()
    got = R.one_hot(labels, 6).to_host()
    assert _new_programs(before, _misses()) == {}
    np.testing.assert_array_equal(got, np.eye(6, dtype=np.float32)[[0, 2, 1, 5]])


@pytest.mark.parametrize("d", [1, 2, 3, 7, 10, 255, 256, 1000, 4097, 65535, 99991, 2**20 + 1, 2**30, 2**31 - 1])
def test_fast_divisor_matches_integer_division(d: int) -> None:
    magic, shift = fast_divisor(d)
    assert 0 < magic < 2**32
    rng = np.random.default_rng(d % 1000)
    n = np.concatenate([np.arange(0, 3000), rng.integers(0, 2**31, 5000), [2**31 - 1, d - 1, d, d + 1, 2 * d]])
    n = n[(n >= 0) & (n < 2**31)].astype(np.uint64)
    hi = (n * np.uint64(magic)) >> np.uint64(32)  # mul_hi of two 32-bit values
    q = ((hi + n) & np.uint64(0xFFFFFFFF)) >> np.uint64(shift)  # uint arithmetic, as in the kernel
    np.testing.assert_array_equal(q, n // np.uint64(d))


def test_broadcast_layout_collapses_to_the_layout_class() -> None:
    assert broadcast_layout((100, 10), [(100, 10), (10,), None]) == ((FLAT, STRIDED, None), (100, 10), ((0, 1),))
    assert broadcast_layout((57, 10), [(57, 10), (10,)])[1:] == ((57, 10), ((0, 1),))  # same class, other size
    assert broadcast_layout((4, 1, 6), [(1,), (4, 1, 6)])[0] == (ONE, FLAT)
    # (2, 3, 4) + (1, 3, 4): the last two axes merge
    assert broadcast_layout((2, 3, 4), [(1, 3, 4)]) == ((STRIDED,), (2, 12), ((0, 1),))


def test_cache_key_kind_labels() -> None:
    assert key_kind(("netcl.runtime.ops", ("reduce", "sum"))) == "netcl.runtime.ops:reduce"
    assert key_kind(("jit", "label")) == "jit"
    assert key_kind("bench_replay") == "bench_replay"
