"""DDP's overlapped all-reduce (own thread and queue, chunked pipeline) on 2 MPI ranks: bit for bit the
inline path, the one-process gradients, a dead rank's timeout, and the bucket handshake."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed.test_ddp import GRAD_ATOL, check_ok, same_bits


@pytest.mark.parametrize("spec", ["opencl", "cpu"])
def test_overlapped_equals_inline_and_one_process(mpirun, spec, device_kinds):
    if spec not in device_kinds:
        pytest.skip("no OpenCL device")
    results, proc = mpirun("ddp_overlap", spec)
    check_ok(results, proc)
    r0, r1 = results
    over, inline = r0["overlap"], r0["inline"]
    # 100-byte buckets: one per parameter (6x24, 24, 24x3, 3 floats), each a pipeline of 40-byte chunks
    assert over["buckets"] == inline["buckets"] == 4
    assert (over["all_reduce_path"], inline["all_reduce_path"]) == ("overlapped", "inline")
    assert over["overlapped"] == over["buckets"] and inline["overlapped"] == 0
    assert over["started_during_backward"] == over["buckets"]  # each bucket left from its hook
    for r in results:
        for step in range(2):  # same reduction order: the same bits as the inline all-reduce
            assert same_bits(r["overlap"]["grads"][step], r["inline"]["grads"][step]), step
        assert same_bits(r["overlap"]["params"], r["inline"]["params"])
    for step in range(2):
        assert same_bits(r0["overlap"]["grads"][step], r1["overlap"]["grads"][step])  # ranks agree
    for got, ref in zip(over["grads"][0], r0["reference_grads"], strict=True):
        np.testing.assert_allclose(got, ref, rtol=0, atol=GRAD_ATOL)  # see test_ddp.GRAD_ATOL


@pytest.mark.parametrize("spec", ["opencl", "cpu"])
def test_dead_rank_times_out_on_the_overlapped_path(mpirun, spec, device_kinds):
    if spec not in device_kinds:
        pytest.skip("no OpenCL device")
    results, proc = mpirun("ddp_dead", spec, timeout=2.0)
    r0, r1 = results
    assert r1 is None and r0 is not None, proc.stdout + proc.stderr
    assert r0["error"].startswith("DistributedTimeoutError"), r0["error"]
    # the thread's exchange or the waiting caller, whichever deadline passes first: both name the path
    assert "overlapped" in r0["error"] and "timed out after 2 s on rank 0 of 2" in r0["error"]
    assert r0["after"].startswith("DistributedError") and "unusable" in r0["after"]


def test_bucket_layout_mismatch_names_the_parameter(mpirun):
    results, proc = mpirun("bucket_mismatch", "cpu")
    check_ok(results, proc)
    for r in results:
        error = r["error"]
        assert error.startswith("DistributedError"), error
        assert (
            "rank 1 puts parameter 'fc2.weight' in bucket 0 (position 1), rank 0 in bucket 1" in error
            and "bucket_cap_mb" in error
        )
