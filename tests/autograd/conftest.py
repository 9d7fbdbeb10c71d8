"""Fixtures of the autograd tests: ``check`` is ``helpers.check_op`` bound to the ``device`` fixture."""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import netcl.core as nc


def _load_helpers() -> Any:
    name = "netcl_autograd_test_helpers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("helpers.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


helpers = _load_helpers()


@pytest.fixture
def raises_before_launch() -> Callable[..., None]:
    """``raises_before_launch(device, error, match, fn)``: ``helpers.raises_before_launch``."""
    return helpers.raises_before_launch


@pytest.fixture
def check(device: nc.Device) -> Callable[..., None]:
    """``check_op`` on the current ``device`` (OpenCL, then the NumPy backend)."""
    return functools.partial(helpers.check_op, device=device)
