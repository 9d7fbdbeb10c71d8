"""Tuned choices agree across 2 MPI ranks (rank 0 decides), and use_deterministic_algorithms on PoCL."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.runtime.tune import shape_class
from tests.distributed.test_ddp import check_ok


def _key(m: int, n: int, k: int) -> str:
    """The tune key of the worker's float32 product of these sizes."""
    return shape_class("portable", m, n, k, False, "NN", "<f4")


def _reference(m: int, n: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32).astype(np.float64)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32).astype(np.float64)
    return a @ b


def test_rank_zero_decides_every_tuned_choice(mpirun, device_kinds):
    if "opencl" not in device_kinds:
        pytest.skip("no OpenCL device")
    results, proc = mpirun("tune_agree", "opencl", timeout=60)
    check_ok(results, proc)
    r0, r1 = results
    # rank 0 searched both shape classes; rank 1 searched nothing and ignored its own stored winner
    assert len(r0["searched"]) == 2 and r1["searched"] == []
    assert r0["stored"] and not r1["stored"]  # only rank 0 writes its tune store
    assert r0["agreed"] == r1["agreed"] and len(r0["agreed"]) == 2
    assert r1["agreed"][_key(64, 40, 48)]["wgm"] != 8  # not rank 1's stored (8, 8, ...) winner
    for (m, n, k), a, b in zip([(64, 40, 48), (20, 130, 70)], r0["products"], r1["products"], strict=True):
        assert a.tobytes() == b.tobytes()  # one config, the same operands: the same bits
        # float32 products of K <= 70 terms in [-1, 1]: rounding error well below 1e-4
        np.testing.assert_allclose(a, _reference(m, n, k), rtol=0, atol=1e-4)
    # inside local_choices each rank keeps its own (rank-dependent) search result, unshared
    assert r0["local"] != r1["local"] and not r0["local_agreed"] and not r1["local_agreed"]
    for r in results:  # ... but a key agreed before keeps the agreed config there
        assert r["local_reuses"] == r0["agreed"][_key(64, 40, 48)]
    # ranks that reach different shape classes: the same named error on both
    for r in results:
        assert r["mismatch"].startswith("DistributedError"), r["mismatch"]
        assert _key(16, 16, 16) in r["mismatch"] and _key(16, 16, 600) in r["mismatch"]
    # deterministic algorithms: the default config without search or exchange, same bits everywhere
    for r in results:
        assert r["det_searched"] == 0 and not r["det_key_agreed"]
        np.testing.assert_allclose(r["deterministic"], _reference(100, 3, 5), rtol=0, atol=1e-4)
        assert r["forced"].startswith("RuntimeError") and "use_deterministic_algorithms(True)" in r["forced"]
        assert r["forced_warn_only"] == 2 and any("deterministic" in w for w in r["warnings"])
    assert r0["deterministic"].tobytes() == r1["deterministic"].tobytes()


def test_a_choice_reached_alone_times_out_naming_it(mpirun, device_kinds):
    if "opencl" not in device_kinds:
        pytest.skip("no OpenCL device")
    results, proc = mpirun("tune_alone", "opencl", timeout=2.0)
    check_ok(results, proc)
    r0, r1 = results
    assert r0["error"].startswith("DistributedTimeoutError"), r0["error"]
    assert repr(_key(12, 12, 12)) in r0["error"] and "local_choices()" in r0["error"]
    assert r0["after"].startswith("DistributedError") and "unusable" in r0["after"]
    assert r1["error"].startswith("DistributedTimeoutError")  # its barrier never had a partner
