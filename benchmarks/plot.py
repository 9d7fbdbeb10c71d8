"""``--plot PATH``: one chart of the run, forward and forward+backward, with speed-ups and the device."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np

MODES = ("fwd", "fwd+bwd")


def plot(results: dict[str, Any], path: str) -> bool:
    """Write the chart to ``path``; False (and a line saying why) when matplotlib is missing.

    Top row: per workload, median ms of every variant for fwd and fwd+bwd side by side, with the
    min-max spread as error bars (log scale: variants differ by orders of magnitude). Bottom row:
    the primary variant's speed-up over each other variant (above 1: the primary is faster).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'netcl-jit[plot]' or matplotlib); no plot written")
        return False
    workloads = list(results["workloads"])
    if not workloads:
        print("no workloads ran; no plot written")
        return False
    fig, axes = plt.subplots(2, len(workloads), figsize=(4.6 * len(workloads), 8.2), squeeze=False)
    for col, name in enumerate(workloads):
        entry = results["workloads"][name]
        _times(axes[0][col], name, entry)
        _speedups(axes[1][col], entry)
    title = textwrap.fill(f"netcl bench: {results['device_words']}", width=int(18 * len(workloads)) + 30)
    fig.suptitle(title, fontsize=10)  # wrapped: one workload's figure is narrower than the device name
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
    return True


def _times(ax, name: str, entry: dict[str, Any]) -> None:
    variants = list(entry["variants"])
    width = 0.8 / max(len(variants), 1)
    x = np.arange(len(MODES))
    for i, variant in enumerate(variants):
        cells = entry["variants"][variant]
        medians = [cells[m]["median_ms"] if m in cells else np.nan for m in MODES]
        low = [cells[m]["median_ms"] - cells[m]["min_ms"] if m in cells else 0 for m in MODES]
        high = [cells[m]["max_ms"] - cells[m]["median_ms"] if m in cells else 0 for m in MODES]
        ax.bar(x + (i - (len(variants) - 1) / 2) * width, medians, width, yerr=[low, high], capsize=2, label=variant)
    ax.set_xticks(x, MODES)
    ax.set_yscale("log")
    finite = [c[m]["median_ms"] for c in entry["variants"].values() for m in MODES if m in c]
    _plain_log_labels(ax.yaxis, max(finite) / min(finite) if finite else 10.0)
    ax.set_ylabel("median ms, min-max bars (lower is better)")
    ax.set_title(f"{name} ({entry['elements']:,} elements)", fontsize=10)
    ax.legend(fontsize=7, loc="best", framealpha=0.6)


def _speedups(ax, entry: dict[str, Any]) -> None:
    ratios = entry.get("speedups", {})
    primary = entry.get("primary", "netcl fused")
    labels = list(ratios)
    if not labels:
        ax.text(0.5, 0.5, "nothing to compare", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    values = [ratios[k] for k in labels]
    colors = ["tab:green" if v >= 1 else "tab:red" for v in values]
    # bars grow from 1x: right (green) where the primary is faster, left (red) where it is slower
    bars = ax.barh(range(len(labels)), [v - 1 for v in values], left=1.0, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    low, high = min([*values, 1.0]), max([*values, 1.0])
    ax.set_xlim(low / 1.6, high * 6.0)  # room right of the longest bar for its label
    _plain_log_labels(ax.xaxis, high / low)
    ax.set_xlabel(f"speed-up of {primary} (right of 1x: {primary} faster)", fontsize=8)
    for bar, value in zip(bars, values, strict=True):
        # every label right of the bar's outer end (losses: right of the 1x line), clear of the tick labels
        ax.text(max(value, 1.0), bar.get_y() + bar.get_height() / 2, f" {value:.2f}x", va="center", fontsize=7)


def _plain_log_labels(axis, span: float = 10.0) -> None:
    """Ticks labelled as plain numbers (0.5, 1, 2), not 2x10^0: 1-2-5 steps over a short range,
    decades over a long one (so labels never overlap)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    subs = (1.0, 2.0, 5.0) if span <= 100 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
