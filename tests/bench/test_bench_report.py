"""The bench explains itself: ratio wording, spreads, verdicts with measured reasons, registry, plot; `--only` rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from measure import KernelShare, Timing  # noqa: E402
from verdict import overlaps, ratio_words, spread, verdict  # noqa: E402


def t(median: float, low: float | None = None, high: float | None = None) -> Timing:
    return Timing(median, median if low is None else low, median if high is None else high, "events")


def test_ratios_name_their_direction() -> None:
    assert ratio_words("fused", t(1.0), "un-fused", t(2.3)) == "fused is 2.30x faster than un-fused"
    assert ratio_words("fused", t(4.5), "NumPy", t(1.0)) == "fused is 4.50x slower than NumPy"


def test_spread_and_overlap() -> None:
    assert spread(t(1.2345, 1.2, 1.31)) == "1.234 (1.2-1.31)"
    assert overlaps(t(1.0, 0.9, 1.2), t(1.1, 1.15, 1.3))
    assert not overlaps(t(1.0, 0.9, 1.0), t(2.0, 1.9, 2.1))


def test_verdict_of_a_win_lists_every_comparison() -> None:
    timings = {
        "netcl fused": {"fwd": t(1.0, 0.9, 1.1)},
        "netcl unfused": {"fwd": t(2.3, 2.2, 2.4)},
        "numpy": {"fwd": t(1.4, 1.3, 1.5)},
    }
    line = verdict("netcl fused", timings, {}, ("fwd", "fwd+bwd"))
    assert line == "fused is 2.30x faster than un-fused (fwd), fused is 1.40x faster than NumPy (fwd)"


def test_verdict_of_a_loss_gives_the_measured_reason() -> None:
    timings = {"netcl fused": {"fwd": t(3.0, 2.9, 3.1)}, "netcl unfused": {"fwd": t(2.0, 1.9, 2.1)}}
    kernels = {
        "netcl fused": {"fwd": [KernelShare("fused_forward", 1, 2.8)]},
        "netcl unfused": {"fwd": [KernelShare("netcl_ew", 8, 1.6)]},
    }
    line = verdict("netcl fused", timings, kernels, ("fwd",))
    assert line.startswith("fused is slower here: fused is 1.50x slower than un-fused (fwd): ")
    assert "its 1 kernel takes 2.800 ms of device time, the 8 kernels of un-fused 1.600 ms" in line
    assert "fused_forward (2.800 ms) is slower on this device than the separate kernels it replaces" in line


def test_verdict_against_numpy_quotes_the_copy_floor_and_the_dominant_kernel() -> None:
    timings = {"netcl fused": {"fwd": t(2.0, 1.9, 2.1)}, "numpy": {"fwd": t(0.2, 0.19, 0.21)}}
    kernels = {"netcl fused": {"fwd": [KernelShare("netcl_matmul", 1, 1.8), KernelShare("fused_forward", 1, 0.2)]}}
    line = verdict("netcl fused", timings, kernels, ("fwd",), copy_ms={"fwd": 0.5})
    assert "fused is 10.00x slower than NumPy (fwd)" in line
    assert (
        "a device copy of the same bytes takes 0.500 ms here, NumPy needs 0.200 ms; it runs at 25% of copy speed"
        in line
    )
    assert "90% of its device time is in netcl_matmul" in line


def test_verdict_says_when_a_loss_is_within_the_spread() -> None:
    timings = {"netcl fused": {"fwd": t(1.05, 0.9, 1.3)}, "netcl unfused": {"fwd": t(1.0, 0.95, 1.2)}}
    assert "within the run-to-run spread" in verdict("netcl fused", timings, {}, ("fwd",))


def test_workload_registry_is_one_line_per_workload() -> None:
    import cases

    assert list(cases.WORKLOADS)[:4] == ["chain8", "bias_gelu", "mlp_block", "detection_loss"]
    sentinel = cases.register_workload("nothing_here", lambda device, n: None)
    try:
        assert cases.WORKLOADS["nothing_here"] is sentinel
        assert cases.all_cases(None, 16, only=["nothing_here"]) == []  # a builder may decline
        with pytest.raises(SystemExit, match="unknown workload"):
            cases.all_cases(None, 16, only=["no_such_workload"])
    finally:
        del cases.WORKLOADS["nothing_here"]


def test_plot_draws_both_modes_speedups_and_the_device(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from plot import plot

    cell = {"median_ms": 1.0, "min_ms": 0.9, "max_ms": 1.2}
    results = {
        "device_words": "Some GPU [GPU] on platform P, driver 1.0",
        "workloads": {
            "chain8": {
                "elements": 1024,
                "primary": "netcl fused",
                "variants": {"netcl fused": {"fwd": cell, "fwd+bwd": cell}, "numpy": {"fwd": cell}},
                "speedups": {"fwd vs NumPy": 1.0, "fwd+bwd vs un-fused": 2.5},
            }
        },
    }
    path = tmp_path / "chart.png"
    assert plot(results, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_matmul_only_picks_the_shapes_whose_label_contains_a_string() -> None:
    from bench_matmul import QUICK, selected_shapes

    assert [s[0] for s in selected_shapes(False, ["sq8192", "mlp"])] == ["sq8192", "mlp784", "mlp512"]
    assert selected_shapes(True) == QUICK
    with pytest.raises(ValueError, match="matches no shape; the quick labels are sq128, mlp, wgrad, dx"):
        selected_shapes(True, ["sq8192"])
