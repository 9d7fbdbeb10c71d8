"""The peer all-reduce (kernels reading every rank's window over the GPUs' peer links): the choice, its
errors, and on a host with two or more NVIDIA GPUs, DDP through it against the MPI path and a dead rank."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.runtime.distributed import peer
from tests.distributed.test_ddp import check_ok, same_bits
from tests.distributed.test_device_direct import _not_nvidia, _nvidia_gpus


@pytest.mark.parametrize("value", ["2", "maybe", "nvlink"])
def test_a_bad_mode_is_named(monkeypatch, value):
    monkeypatch.setenv("NETCL_PEER_ALLREDUCE", value)
    with pytest.raises(ValueError, match=f"NETCL_PEER_ALLREDUCE='{value}': expected 0 .never., 1 .required."):
        peer.mode()


@pytest.mark.parametrize("spec", ["cpu", "opencl"])
def test_the_reason_off_nvidia_names_the_device(spec):
    device = _not_nvidia(spec)
    assert peer.applicable(device) == f"{device.name!r} is not an NVIDIA GPU under NVIDIA's OpenCL"


def test_required_where_it_cannot_run_fails_on_every_rank(mpirun, monkeypatch):
    monkeypatch.setenv("NETCL_PEER_ALLREDUCE", "1")
    results, proc = mpirun("peer_required", "cpu")
    check_ok(results, proc)
    for r in results:
        assert r["error"].startswith("DistributedError: NETCL_PEER_ALLREDUCE=1 but the peer all-reduce"), r
        assert "rank 0: 'NumPy' is not an NVIDIA GPU" in r["error"]


@pytest.mark.parametrize(
    ("where", "reason"),
    [("allocate", "rank 1: no memory to export here"), ("import", "rank 0: import refused")],
)
def test_a_setup_failing_on_one_rank_fails_on_every_rank(mpirun, monkeypatch, device_kinds, where, reason):
    if "opencl" not in device_kinds:
        pytest.skip("no OpenCL device")
    monkeypatch.setenv("NETCL_PEER_ALLREDUCE", "1")
    monkeypatch.setenv("PEER_FAILURE", where)
    results, proc = mpirun("peer_window_fails", "opencl", timeout=60.0)
    check_ok(results, proc)
    for r in results:
        assert r["error"] == (
            f"DistributedError: NETCL_PEER_ALLREDUCE=1 but the peer all-reduce cannot run: peer window: {reason}"
        ), r["error"]
        assert r["after"] == "no error"  # the group is still in step
    if where == "import":  # the descriptors crossed the sockets: each rank got its own and its peer's
        assert [len(r["received"]) for r in results] == [1, 2] and all(all(r["received"]) for r in results)


def test_ddp_through_peer_windows_equals_the_mpi_path_bit_for_bit(mpirun):
    if _nvidia_gpus() < 2:
        pytest.skip("needs two NVIDIA GPUs (one per rank)")
    results, proc = mpirun("ddp_peer", "auto")
    check_ok(results, proc)
    r0, r1 = results
    for r in results:
        assert r["peer"]["path"] == "peer" and r["inline"]["path"] == "inline"
        # five steps: both slots of each window (float32, float16, float64) taken twice; the same rank-ordered
        # sums and IEEE division as the MPI path's, so the same bits, and so the same parameters after SGD
        # (and two more from zeroed grads, the last after a local no_sync backward of another shard)
        for step in range(7):
            assert same_bits(r["peer"]["grads"][step], r["inline"]["grads"][step]), step
        assert same_bits(r["peer"]["params"], r["inline"]["params"])
        assert [g.dtype for g in r["peer"]["grads"][0]][-2:] == [np.float16, np.float64]
        # the peer path writes a parameter's averaged grad into the step before's tensor where the round began with
        # it as the grad (zeroed with set_to_none=False, or never zeroed), else into a new one (as torch after
        # set_to_none=True): the SGD parameters are set to None in steps 1-4 and zeroed in place in 5 and 6, the
        # float16 and float64 ones never zeroed; step 6's local no_sync backward first replaced every grad by a
        # new sum (a parameter with grad-ready hooks accumulates out of place), so its exchange writes new tensors
        kept = [[False] * 4 + [True, True]] * 4 + [[True] * 6, [False] * 6]
        assert r["peer"]["grads_kept"] == kept, r["peer"]["grads_kept"]
        assert not any(any(step) for step in r["inline"]["grads_kept"])
    for step in range(7):
        assert same_bits(r0["peer"]["grads"][step], r1["peer"]["grads"][step])


def test_a_replayed_ddp_step_exchanges_through_the_windows(mpirun):
    if _nvidia_gpus() < 2:
        pytest.skip("needs two NVIDIA GPUs (one per rank)")
    results, proc = mpirun("peer_replay", "auto")
    check_ok(results, proc)
    r0, r1 = results
    for r in results:
        assert r["path"] == "peer"
        for name in ("sgd", "adam"):
            # no host all-reduce step: the pack, meet and reduce kernels are commands of the graph, and the
            # three replays (tickets advancing in the windows) give the eager steps' bits
            assert r[f"{name}_recorded"] == []
            assert r[f"{name}_peer_kernels"] == ["netcl_peer_pack", "netcl_peer_meet", "netcl_peer_reduce_mean"]
            assert same_bits(r[f"{name}_replay"], r[f"{name}_eager"]), name
    for name in ("sgd", "adam"):
        assert same_bits(r0[f"{name}_replay"], r1[f"{name}_replay"])


def test_a_dead_rank_is_raised_at_the_next_host_read(mpirun):
    if _nvidia_gpus() < 2:
        pytest.skip("needs two NVIDIA GPUs (one per rank)")
    results, proc = mpirun("peer_dead", "auto", timeout=3.0)
    r0, r1 = results
    assert r1 is None and r0 is not None, proc.stdout + proc.stderr
    assert r0["path"] == "peer"
    expected = "PeerTimeoutError: peer all-reduce on rank 0 of 2: rank 1 did not reach exchange 2"
    assert r0["error"].startswith(expected), r0
    assert r0["after"].startswith("DistributedError: the process group is unusable"), r0["after"]
