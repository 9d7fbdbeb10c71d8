"""The words of the bench: ratios with their direction, spreads, and one verdict line per workload.

Every sentence is built from numbers measured in the same run: medians and min-max spreads of
the timed repeats, and per-kernel device times of one call (``measure.kernel_breakdown``).
"""

from __future__ import annotations

from measure import KernelShare, Timing

#: Variant name -> how a sentence names it.
SHORT = {"netcl fused": "fused", "netcl unfused": "un-fused", "numpy": "NumPy"}


def short(variant: str) -> str:
    return SHORT.get(variant, variant)


def spread(timing: Timing) -> str:
    """``"1.234 (1.20-1.31)"``: the median and the min-max of the repeats, in ms."""
    return f"{timing.median_ms:.3f} ({timing.min_ms:.3g}-{timing.max_ms:.3g})"


def overlaps(a: Timing, b: Timing) -> bool:
    """True when the min-max ranges of two timings overlap (their difference is within noise)."""
    return a.min_ms <= b.max_ms and b.min_ms <= a.max_ms


def ratio_words(a: str, a_t: Timing, b: str, b_t: Timing) -> str:
    """``"fused is 2.30x faster than un-fused"`` (or ``slower``), from the medians."""
    if a_t.median_ms <= b_t.median_ms:
        return f"{a} is {b_t.median_ms / a_t.median_ms:.2f}x faster than {b}"
    return f"{a} is {a_t.median_ms / b_t.median_ms:.2f}x slower than {b}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def slow_reason(
    mode: str,
    other: str,
    primary_t: Timing,
    other_t: Timing,
    primary_k: list[KernelShare] | None,
    other_k: list[KernelShare] | None,
    copy_ms: float | None,
) -> str:
    """Why the primary variant lost to ``other`` in ``mode``, from what this run measured.

    ``copy_ms``: the time this device's copy kernel needs for the workload's minimum bytes.
    """
    reasons = []
    if overlaps(primary_t, other_t):
        reasons.append(f"within the run-to-run spread ({spread(primary_t)} vs {spread(other_t)} ms)")
    if primary_k:
        mine = sum(k.ms for k in primary_k)
        launches = sum(k.launches for k in primary_k)
        top = primary_k[0]
        if other_k:
            theirs = sum(k.ms for k in other_k)
            their_launches = sum(k.launches for k in other_k)
            if mine > theirs:
                reasons.append(
                    f"its {_plural(launches, 'kernel')} {'takes' if launches == 1 else 'take'} {mine:.3f} ms of "
                    f"device time, the {_plural(their_launches, 'kernel')} of {short(other)} {theirs:.3f} ms: "
                    f"{top.name} ({top.ms:.3f} ms) is slower on this device than the separate kernels it replaces"
                )
            else:
                reasons.append(
                    f"its kernels take {mine:.3f} ms, less than {short(other)}'s {theirs:.3f} ms, but its median is "
                    f"{primary_t.median_ms:.3f} ms: the difference is device idle time between launches"
                )
        else:
            if copy_ms:
                share = 100 * copy_ms / primary_t.median_ms
                reasons.append(
                    f"a device copy of the same bytes takes {copy_ms:.3f} ms here, {short(other)} needs "
                    f"{other_t.median_ms:.3f} ms; it runs at {share:.0f}% of copy speed"
                )
            if top.ms > 0.5 * mine and launches > 1:
                reasons.append(f"{100 * top.ms / mine:.0f}% of its device time is in {top.name}")
    elif copy_ms:
        reasons.append(f"a device copy of the same bytes takes {copy_ms:.3f} ms here")
    return "; ".join(reasons) or "no kernel-level measurement on this backend"


def verdict(
    primary: str,
    timings: dict[str, dict[str, Timing]],
    kernels: dict[str, dict[str, list[KernelShare] | None]],
    modes: tuple[str, ...],
    copy_ms: dict[str, float] | None = None,
) -> str:
    """One line: how ``primary`` compares with every other variant, and a measured reason where it loses.

    ``copy_ms[mode]``: the device's copy time for the workload's minimum bytes in that mode.
    """
    own = timings.get(primary, {})
    wins, losses = [], []
    for other, other_modes in timings.items():
        if other == primary:
            continue
        for mode in modes:
            if mode not in own or mode not in other_modes:
                continue
            words = ratio_words(short(primary), own[mode], short(other), other_modes[mode]) + f" ({mode})"
            if own[mode].median_ms <= other_modes[mode].median_ms:
                wins.append(words)
            else:
                reason = slow_reason(
                    mode,
                    other,
                    own[mode],
                    other_modes[mode],
                    kernels.get(primary, {}).get(mode),
                    kernels.get(other, {}).get(mode),
                    (copy_ms or {}).get(mode),
                )
                losses.append(f"{words}: {reason}")
    if not wins and not losses:
        return f"{short(primary)} had nothing to compare with"
    text = ", ".join(wins)
    if losses:
        text += ("; " if text else "") + f"{short(primary)} is slower here: " + "; ".join(losses)
    return text
