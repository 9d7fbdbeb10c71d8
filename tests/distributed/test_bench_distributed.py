"""``benchmarks/bench_distributed.py`` runs on 2 MPI ranks and its rows keep their invariants (no timing thresholds:
the rows are measurements)."""

from __future__ import annotations

from tests.distributed.test_ddp import check_ok


def test_the_distributed_bench_rows(mpirun):
    results, proc = mpirun("bench_rows", "cpu")
    check_ok(results, proc)
    row = results[0]
    assert row["model"] == "mlp" and row["ranks"] == 2 and row["batch_per_rank"] == 4
    assert row["all_reduce_path"] in ("overlapped", "inline")
    # each repeat's slowest rank alone is at least as slow as rank 0 alone, so the medians and the paired
    # efficiencies are ordered that way whatever the timings
    assert row["slowest_alone_ms"] >= row["one_rank_ms"] > 0
    assert row["efficiency_vs_slowest_alone"] >= row["scaling_efficiency"] > 0
    assert row["efficiency_vs_local"] > 0 and row["ddp_ms"] > 0 and row["replay_efficiency"] is None  # NumPy: no replay
    # the ranks agree on every timing the bench gathers (broadcast, or the slowest rank's)
    for key in ("one_rank_ms", "slowest_alone_ms", "local_ms", "ddp_ms", "allreduce_ms"):
        assert results[1][key] == row[key], key
