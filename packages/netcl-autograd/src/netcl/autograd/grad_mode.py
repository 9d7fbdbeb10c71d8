"""Process-wide switches: gradient recording (``no_grad``) and anomaly detection."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: The switches ``engine.apply_op`` reads on every op; change them only through ``set_grad_enabled`` /
#: ``set_detect_anomaly`` (or ``no_grad`` / ``detect_anomaly``).
grad_enabled = True
anomaly_enabled = False


def set_grad_enabled(mode: bool) -> None:
    """Turn gradient recording on or off for every subsequent ``apply_op`` in the process."""
    global grad_enabled
    grad_enabled = bool(mode)


def is_grad_enabled() -> bool:
    """Whether ``apply_op`` currently builds the graph (True by default)."""
    return grad_enabled


class no_grad:  # noqa: N801  (spec name)
    """Context manager (and decorator) that disables gradient recording and restores the prior mode."""

    def __init__(self) -> None:
        self._prev: list[bool] = []

    def __enter__(self) -> no_grad:
        self._prev.append(is_grad_enabled())
        set_grad_enabled(False)
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        set_grad_enabled(self._prev.pop())

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with no_grad():
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def set_detect_anomaly(enable: bool) -> None:
    """Turn anomaly detection on or off: creation traces on every Node, NaN/Inf checks in backward."""
    global anomaly_enabled
    anomaly_enabled = bool(enable)


def is_anomaly_enabled() -> bool:
    """Whether anomaly detection is on."""
    return anomaly_enabled


class detect_anomaly:  # noqa: N801  (spec name)
    """Context manager that sets anomaly detection to ``enable`` and restores the prior setting on exit."""

    def __init__(self, enable: bool = True) -> None:
        self.enable = enable
        self._prev: list[bool] = []

    def __enter__(self) -> detect_anomaly:
        self._prev.append(is_anomaly_enabled())
        set_detect_anomaly(self.enable)
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        set_detect_anomaly(self._prev.pop())
