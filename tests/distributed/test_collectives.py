"""netcl.runtime.distributed on 2 MPI ranks (subprocess mpiexec), OpenCL and the NumPy backend.

With two ranks the deterministic all-reduce computes fl32(a + b) (and fl32(fl32(a + b) / 2)) for
each element, summed in rank order on one rank and copied to the other: the tests compare with
exactly that, bit for bit, and require both ranks to hold identical bits.
"""

from __future__ import annotations

import numpy as np
import pytest


def rank_data(rank: int, size: int) -> np.ndarray:
    return np.random.default_rng(1000 * rank + size).normal(size=size).astype(np.float32)


def check_ok(results, proc) -> None:
    assert proc.returncode == 0 and all(r is not None for r in results), proc.stdout + proc.stderr


@pytest.mark.parametrize("spec", ["opencl", "cpu"])
def test_collectives_two_ranks(mpirun, spec, device_kinds):
    if spec not in device_kinds:
        pytest.skip("no OpenCL device")
    results, proc = mpirun("collectives", spec)
    check_ok(results, proc)
    r0, r1 = results
    for size in (1, 5, 1000, 4099):
        a, b = rank_data(0, size), rank_data(1, size)
        total = a + b  # float32 + float32: the exact expected bits
        np.testing.assert_array_equal(r0[f"sum{size}"], total)
        np.testing.assert_array_equal(r0[f"mean{size}"], total / np.float32(2))
        for op in ("sum", "mean"):  # bit-identical on both ranks
            assert r0[f"{op}{size}"].tobytes() == r1[f"{op}{size}"].tobytes()
    np.testing.assert_array_equal(r0["int_sum"], np.arange(10) * 3)
    np.testing.assert_array_equal(r1["async_a"], rank_data(0, 300) + rank_data(1, 300))
    np.testing.assert_array_equal(r1["async_b"], (rank_data(0, 301) + rank_data(1, 301)) / np.float32(2))
    for n, got, kept in zip((3, 4), r0["coalesced"], r0["coalesced_inputs_kept"], strict=True):
        np.testing.assert_array_equal(got, rank_data(0, n) + rank_data(1, n))
        np.testing.assert_array_equal(kept, rank_data(0, n))  # out-of-place left the inputs alone
    for r in results:
        np.testing.assert_array_equal(r["broadcast"], np.full((2, 3), 6.0))  # root 1 holds 1 + 5
        np.testing.assert_array_equal(r["all_gather"], [[0] * 4, [1] * 4])
        assert r["objects"] == [{"rank": 0}, {"rank": 1}]
        assert r["broadcast_object"] == "from 1"
        errors = r["errors"]
        assert errors["op"].startswith("ValueError") and "'max'" in errors["op"]
        assert errors["int_mean"].startswith("DTypeError") and "int32" in errors["int_mean"]
        assert errors["root"].startswith("ValueError") and "[0, 2)" in errors["root"]
        assert errors["type"].startswith("TypeError") and "ndarray" in errors["type"]
    if spec == "opencl":  # captured in a Graph: the replay all-reduces the new contents again
        np.testing.assert_array_equal(r0["captured"], (rank_data(0, 6) + 1) + (rank_data(1, 6) + 1))
        np.testing.assert_array_equal(r0["replayed"], (rank_data(0, 6) * 2 + 1) + (rank_data(1, 6) * 2 + 1))
        assert r0["replayed"].tobytes() == r1["replayed"].tobytes()


def test_dead_rank_raises_timeout_on_the_other(mpirun):
    # rank 1 exits right after init; rank 0's all-reduce must fail with a clear error, not hang
    results, proc = mpirun("dead", "cpu", timeout=2.0)
    r0, r1 = results
    assert r1 is None and r0 is not None, proc.stdout + proc.stderr
    assert r0["error"].startswith("DistributedTimeoutError"), r0["error"]
    assert "timed out after 2 s on rank 0 of 2" in r0["error"] and "NETCL_DIST_TIMEOUT" in r0["error"]
    assert r0["after"].startswith("DistributedError") and "unusable" in r0["after"]


def test_one_rank_is_a_no_op(mpirun):
    results, proc = mpirun("single", "cpu", ranks=1)
    check_ok(results, proc)
    (r,) = results
    assert r["world_size"] == 1
    np.testing.assert_array_equal(r["all_reduce"], np.arange(4))
    np.testing.assert_array_equal(r["all_gather"], [np.arange(4)])
    for got, ref in zip(r["grads"], r["reference_grads"], strict=True):
        np.testing.assert_array_equal(got, ref)  # no communication, no rescaling
