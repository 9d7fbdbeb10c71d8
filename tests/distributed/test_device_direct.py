"""The device-direct all-reduce (NCCL on memory OpenCL and CUDA share): the choice, its errors, and on a
host with two or more NVIDIA GPUs, DDP through it against the host-staged path and one process."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime.distributed import device_direct, nccl
from tests.distributed.test_ddp import GRAD_ATOL, check_ok, same_bits


def _nvidia_gpus() -> int:
    return sum(1 for d in nc.usable_opencl_devices() if d.is_gpu and "NVIDIA" in d.platform_name)


def _not_nvidia(spec: str) -> nc.Device:
    """The first device of ``spec`` ("cpu": the NumPy backend; "opencl"), skipping where it is an NVIDIA GPU."""
    devices = nc.usable_opencl_devices() if spec == "opencl" else [nc.get_device("cpu")]
    if not devices or (spec == "opencl" and devices[0].is_gpu and "NVIDIA" in devices[0].platform_name):
        pytest.skip("needs a device that is not an NVIDIA GPU")
    return devices[0]


@pytest.mark.parametrize("value", ["2", "maybe", "nccl"])
def test_a_bad_mode_is_named(monkeypatch, value):
    monkeypatch.setenv("NETCL_DEVICE_DIRECT", value)
    with pytest.raises(ValueError, match=f"NETCL_DEVICE_DIRECT='{value}': expected 0 .never., 1 .required."):
        device_direct.mode()


@pytest.mark.parametrize("spec", ["cpu", "opencl"])
def test_the_probe_names_what_is_missing_off_nvidia(spec):
    device = _not_nvidia(spec)
    answer = device_direct.probe(device)
    assert not answer.ok and not answer.applicable
    assert answer.reason == f"{device.name!r} is not an NVIDIA GPU under NVIDIA's OpenCL"


def test_a_missing_nccl_library_names_the_place_tried(monkeypatch):
    monkeypatch.setattr(nccl, "_LIBRARY", None)
    monkeypatch.setenv("NETCL_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
    with pytest.raises(
        nccl.NcclError, match=r"NCCL cannot be loaded \(set NETCL_NCCL_LIBRARY.*/nonexistent/libnccl\.so\.2"
    ):
        nccl.library()


def test_required_where_it_cannot_run_fails_on_every_rank(mpirun, monkeypatch):
    monkeypatch.setenv("NETCL_DEVICE_DIRECT", "1")
    results, proc = mpirun("direct_required", "cpu")
    check_ok(results, proc)
    for r in results:
        assert r["error"].startswith("DistributedError: NETCL_DEVICE_DIRECT=1 but the device-direct all-reduce"), r
        assert "rank 0: 'NumPy' is not an NVIDIA GPU" in r["error"]


def test_deterministic_mode_keeps_the_mpi_path(mpirun, monkeypatch):
    monkeypatch.setenv("NETCL_DEVICE_DIRECT", "1")
    results, proc = mpirun("direct_deterministic", "cpu")
    check_ok(results, proc)
    for r in results:
        assert "rank 0: use_deterministic_algorithms(True) keeps the rank-ordered MPI sum" in r["error"], r


@pytest.mark.parametrize("spec", ["opencl", "cpu"])
def test_one_exchange_per_dtype_equals_the_inline_path(mpirun, spec, device_kinds):
    if spec not in device_kinds:
        pytest.skip("no OpenCL device")
    results, proc = mpirun("ddp_coalesced_dtypes", spec)
    check_ok(results, proc)
    for r in results:
        coalesced, inline = r["coalesced"], r["inline"]
        assert coalesced["buckets"] == inline["buckets"] >= 3  # 104-byte buckets, one dtype each
        assert coalesced["overlapped"] == coalesced["buckets"] and coalesced["started_during_backward"] == 0
        assert [g.dtype for g in coalesced["grads"]] == [np.float32] * 4 + [np.float64]
        assert same_bits(coalesced["grads"], inline["grads"])  # the same rank-ordered sums
    assert same_bits(results[0]["coalesced"]["grads"], results[1]["coalesced"]["grads"])


def test_ddp_through_nccl_equals_the_staged_path_and_one_process(mpirun, monkeypatch):
    if _nvidia_gpus() < 2:
        pytest.skip("needs two NVIDIA GPUs (one per rank)")
    monkeypatch.setenv("NETCL_PEER_ALLREDUCE", "0")  # the peer path comes first where it can run
    results, proc = mpirun("ddp_overlap", "auto")
    check_ok(results, proc)
    r0, r1 = results
    for r in results:
        assert r["overlap"]["all_reduce_path"] == "device-direct", r["overlap"]["all_reduce_path"]
        # every bucket handed to the reducer, as one exchange when the backward ended
        assert r["overlap"]["overlapped"] == r["overlap"]["buckets"] == 4
        assert r["overlap"]["started_during_backward"] == 0
        for step in range(2):  # two ranks: NCCL's average (a * 0.5 + b * 0.5) is the staged (a + b) / 2
            assert same_bits(r["overlap"]["grads"][step], r["inline"]["grads"][step]), step
    for step in range(2):
        assert same_bits(r0["overlap"]["grads"][step], r1["overlap"]["grads"][step])
    for got, ref in zip(r0["overlap"]["grads"][0], r0["reference_grads"], strict=True):
        np.testing.assert_allclose(got, ref, rtol=0, atol=GRAD_ATOL)


def test_a_dead_rank_times_out_on_the_nccl_path(mpirun, monkeypatch):
    if _nvidia_gpus() < 2:
        pytest.skip("needs two NVIDIA GPUs (one per rank)")
    monkeypatch.setenv("NETCL_PEER_ALLREDUCE", "0")
    results, proc = mpirun("ddp_dead", "auto", timeout=3.0)
    r0, r1 = results
    assert r1 is None and r0 is not None, proc.stdout + proc.stderr
    assert r0["error"].startswith("DistributedTimeoutError"), r0["error"]
    assert "timed out after 3 s on rank 0 of 2" in r0["error"]
