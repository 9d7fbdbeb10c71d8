"""DistributedDataParallel on 2 MPI ranks vs one process, and DistributedSampler (no MPI needed)."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.nn.parallel import DistributedSampler

# Gradients of the mean loss over 16 samples vs the mean over ranks of two 8-sample means: the
# same sums in another order. float32 cross-entropy gradients of magnitude <= ~1 differ by a few
# ulps of the largest term, so 1e-6 absolute.
GRAD_ATOL = 1e-6


def check_ok(results, proc) -> None:
    assert proc.returncode == 0 and all(r is not None for r in results), proc.stdout + proc.stderr


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("spec", ["opencl", "cpu"])
def test_ddp_matches_one_process_and_ranks_agree(mpirun, spec, device_kinds):
    if spec not in device_kinds:
        pytest.skip("no OpenCL device")
    results, proc = mpirun("ddp", spec)
    check_ok(results, proc)
    r0, r1 = results
    # construction broadcast rank 0's parameters and buffer (the ranks were seeded differently)
    assert same_bits(r0["params_after_init"], r1["params_after_init"])
    np.testing.assert_array_equal(r1["buffer_after_init"], np.full(3, 10.0))
    assert r0["buckets"] == 4  # a 100-byte cap: one bucket per parameter
    assert r0["started_during_backward"] == 4  # every bucket started from a hook, mid-backward
    for key in ("grads", "accumulated", "synced_grads"):
        assert same_bits(r0[key], r1[key]), key
    for got, ref in zip(r0["grads"], r0["reference_grads"], strict=True):
        np.testing.assert_allclose(got, ref, rtol=0, atol=GRAD_ATOL)
    for acc, g in zip(r0["accumulated"], r0["grads"], strict=True):
        np.testing.assert_allclose(acc, 2 * g, rtol=0, atol=2 * GRAD_ATOL)
    for synced, l0, l1 in zip(r0["synced_grads"], r0["local_grads"], r1["local_grads"], strict=True):
        assert not np.array_equal(l0, l1)  # no_sync kept the ranks' own gradients
        np.testing.assert_array_equal(synced, (l0 + l1) / np.float32(2))
    # fuse_graph: a captured DDP step (all-reduces recorded in the graph on OpenCL) replayed 3 times
    # equals 4 eager steps; jit fusion reorders a few float32 operations (parameters ~0.5, 4 steps
    # of lr <= 0.1: a few ulps of each update), hence 1e-5
    for name in ("sgd", "adam"):  # netcl.optim's SGD (momentum) and Adam, captured with the step
        for r in results:
            for replayed, eager in zip(
                r["fuse_graph"][f"{name}_replay"], r["fuse_graph"][f"{name}_eager"], strict=True
            ):
                np.testing.assert_allclose(replayed, eager, rtol=0, atol=1e-5)
        assert same_bits(r0["fuse_graph"][f"{name}_replay"], r1["fuse_graph"][f"{name}_replay"])
        # on OpenCL the graph holds one recorded all-reduce per bucket (NumPy backend: nothing captured)
        assert r0["fuse_graph"][f"{name}_recorded"] == (["all_reduce_mean"] * 4 if spec == "opencl" else [])


def test_parameter_mismatch_fails_on_every_rank(mpirun):
    results, proc = mpirun("mismatch", "cpu")
    check_ok(results, proc)
    for r in results:
        error = r["error"]
        assert error.startswith("DistributedError"), error
        assert "rank 1 differs from rank 0" in error and "'fc1.weight'" in error
        assert "(6, 9)" in error and "(6, 8)" in error


# ---- DistributedSampler ---------------------------------------------------------------------------
@pytest.mark.parametrize("n, replicas, drop_last", [(10, 3, False), (10, 3, True), (9, 3, False), (2, 4, False)])
def test_sampler_shards_cover_dataset(n, replicas, drop_last):
    shards = [
        DistributedSampler(n, num_replicas=replicas, rank=r, shuffle=True, seed=5, drop_last=drop_last).indices()
        for r in range(replicas)
    ]
    per_rank = n // replicas if drop_last else -(-n // replicas)
    assert all(len(s) == per_rank for s in shards)
    merged = np.concatenate(shards)
    if drop_last:
        assert len(set(merged.tolist())) == len(merged)  # disjoint, some samples dropped
    else:
        assert set(merged.tolist()) == set(range(n))  # every sample, padded by repeats
    # the same permutation as torch's scheme: permute, pad from the start, take every replicas-th
    order = np.random.default_rng(5).permutation(n)
    total = per_rank * replicas
    padded = np.resize(order, total) if total > n else order[:total]
    for r, shard in enumerate(shards):
        np.testing.assert_array_equal(shard, padded[r:total:replicas])


def test_sampler_epochs_and_no_shuffle():
    a = DistributedSampler(list(range(12)), num_replicas=2, rank=1, seed=3)
    first = list(a)
    assert list(a) == first  # same epoch, same order
    a.set_epoch(1)
    assert list(a) != first
    b = DistributedSampler(12, num_replicas=2, rank=1, seed=3)
    b.set_epoch(1)
    assert list(b) == list(a)  # every rank derives the epoch's order from seed + epoch alone
    assert list(DistributedSampler(7, num_replicas=2, rank=0, shuffle=False)) == [0, 2, 4, 6]
    assert list(DistributedSampler(7, num_replicas=2, rank=1, shuffle=False)) == [1, 3, 5, 0]
    assert len(DistributedSampler(7, num_replicas=2, rank=1, drop_last=True)) == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_replicas": 0, "rank": 0}, "num_replicas must be an int >= 1, got 0"),
        ({"num_replicas": 2, "rank": 2}, r"rank must be an int in \[0, 2\), got 2"),
        ({"num_replicas": 2, "rank": -1}, r"rank must be an int in \[0, 2\), got -1"),
    ],
)
def test_sampler_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DistributedSampler(10, **kwargs)
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        DistributedSampler(10, num_replicas=1, rank=0).set_epoch(-1)
