"""The hypothesis profiles of the reliability suite: ``ci`` (the default) and ``long``.

Registered by ``tests/conftest.py`` (so ``pytest tests --hypothesis-profile=long`` finds them
before hypothesis reads the option) and by ``tests/reliability/conftest.py``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,  # a new program is a new kernel build: 0.3-1 s on PoCL
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}


def register() -> None:
    """Register ``ci`` and ``long``; max_examples is the NumPy-backend fuzz count (OpenCL: a quarter)."""
    # ci runs the same examples every time (a red CI names a bug, never bad luck) and keeps no
    # example database between runs; long explores new ones on every run.
    settings.register_profile("ci", max_examples=240, derandomize=True, database=None, **_COMMON)
    settings.register_profile("long", max_examples=4000, **_COMMON)
