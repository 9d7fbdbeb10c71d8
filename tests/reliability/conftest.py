"""Hypothesis profiles of the reliability tests, and the ``long`` marker.

``ci`` (the default) keeps the fuzz file to about a minute on a 2-core box; ``long`` runs
thousands of examples and the 10,000-iteration leak checks:
``pytest tests/reliability --hypothesis-profile=long``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,  # a new program is a new kernel build: 0.3-1 s on PoCL
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "print_blob": True,
}
#: max_examples is the NumPy-backend count; the OpenCL fuzz runs a quarter of it (kernel builds).
settings.register_profile("ci", max_examples=240, **_COMMON)
settings.register_profile("long", max_examples=4000, **_COMMON)

LONG_ENV = "NETCL_RELIABILITY_LONG"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"long: minutes-long reliability checks (profile 'long' or {LONG_ENV}=1)")
    settings.load_profile(config.getoption("--hypothesis-profile", None) or "ci")


def long_enabled() -> bool:
    """Whether the ``long`` paths run: the ``long`` hypothesis profile, or NETCL_RELIABILITY_LONG=1."""
    return settings.get_current_profile_name() == "long" or os.environ.get(LONG_ENV, "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if long_enabled():
        return
    skip = pytest.mark.skip(reason=f"long check: run with --hypothesis-profile=long or {LONG_ENV}=1")
    for item in items:
        if "long" in item.keywords and "reliability" in str(item.fspath):
            item.add_marker(skip)
