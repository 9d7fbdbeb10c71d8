"""Fixtures of the autograd tests: ``check`` is ``helpers.check_op`` bound to the ``device`` fixture."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import file_modules
import pytest

import netcl.core as nc


def _load_helpers() -> Any:
    return file_modules.load("tests/autograd/helpers.py", "netcl_autograd_test_helpers")


helpers = _load_helpers()


@pytest.fixture
def raises_before_launch() -> Callable[..., None]:
    """``raises_before_launch(device, error, match, fn)``: ``helpers.raises_before_launch``."""
    return helpers.raises_before_launch


@pytest.fixture
def check(device: nc.Device) -> Callable[..., None]:
    """``check_op`` on the current ``device`` (OpenCL, then the NumPy backend)."""
    return functools.partial(helpers.check_op, device=device)
