"""Hypothesis profiles of the reliability tests, and the ``long`` marker.

``ci`` (the default) keeps the fuzz file to about a minute on a 2-core box; ``long`` runs
thousands of examples and the 10,000-iteration leak checks:
``pytest tests/reliability --hypothesis-profile=long``.
"""

from __future__ import annotations

import os

import file_modules
import pytest
from hypothesis import settings


def _profiles():
    return file_modules.load("tests/reliability/profiles.py", "netcl_reliability_profiles")


_profiles().register()

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
