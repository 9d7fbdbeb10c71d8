"""Deterministic algorithms (``torch.use_deterministic_algorithms``'s contract, netcl's choices).

netcl's kernels add in a fixed order (no float atomics: scatter-adds, pooling and convolution
gradients gather), so one configuration of an op gives the same bits every run. What can change
the bits between runs or processes is the *choice* of configuration: the GEMM tile and split-K,
the convolution's algorithm (implicit GEMM or im2col + host BLAS) and its kernel tiles, all picked
by a timed search (``netcl.runtime.tune``) whose winner depends on the clock.

``use_deterministic_algorithms(True)`` fixes each of those choices to its documented default
(``tune.select``'s ``default``: a pure function of the device and the problem's shape, never of a
measurement) and ignores stored search winners; a request for a search (``tune.select(force=True)``,
``python -m netcl.runtime.tune``) raises ``RuntimeError``, or only warns with ``warn_only=True``.
Winograd or not is already a pure function of the layer, the precision and ``NETCL_WINOGRAD``.
``NETCL_DETERMINISTIC=1`` turns the mode on at import.
"""

from __future__ import annotations

import os
import threading
import warnings

ENV = "NETCL_DETERMINISTIC"
_lock = threading.Lock()
_state = {"on": os.environ.get(ENV, "").strip().lower() in ("1", "true", "on", "yes"), "warn_only": False}


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Turn deterministic algorithms on (``True``) or off, process-wide.

    On: every choice that changes rounding takes its documented default (no timed search, no stored
    winner) and a path that cannot be deterministic raises ``RuntimeError`` naming it; with
    ``warn_only`` such a path warns (``UserWarning``) and runs.
    """
    if not isinstance(mode, bool):
        raise TypeError(f"use_deterministic_algorithms: mode must be a bool, got {type(mode).__name__}")
    if not isinstance(warn_only, bool):
        raise TypeError(f"use_deterministic_algorithms: warn_only must be a bool, got {type(warn_only).__name__}")
    with _lock:
        _state["on"], _state["warn_only"] = mode, warn_only and mode


def are_deterministic_algorithms_enabled() -> bool:
    """Whether ``use_deterministic_algorithms(True)`` (or ``NETCL_DETERMINISTIC=1``) is in force."""
    return bool(_state["on"])


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    """Whether the deterministic mode only warns about nondeterministic paths."""
    return bool(_state["on"] and _state["warn_only"])


def alert_not_deterministic(what: str) -> None:
    """Called by a path whose result may differ run to run: raises ``RuntimeError`` (warns in
    ``warn_only`` mode) while the deterministic mode is on; nothing otherwise."""
    if not _state["on"]:
        return
    message = (
        f"{what} does not have a deterministic implementation, but use_deterministic_algorithms(True) is on; "
        "turn it off, or pass warn_only=True to only warn"
    )
    if _state["warn_only"]:
        warnings.warn(message, UserWarning, stacklevel=3)
        return
    raise RuntimeError(message)
