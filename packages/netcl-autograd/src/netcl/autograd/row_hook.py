"""A hook through which netcl.jit serves the built-in row ops with its fused row kernels.

netcl-autograd does not import netcl.jit: netcl.jit installs a provider at import
(``set_row_provider``). ``softmax``, ``log_softmax``, ``layer_norm``, ``rms_norm`` and
``cross_entropy`` ask ``provided(...)`` first; it returns the provider's Node, or None (the op then
runs its own runtime kernels) when no provider is installed, a trace is running (the op is being
traced), the provider declines the arguments, or the call comes from inside the provider.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from netcl.autograd import engine

Provider = Callable[[str, tuple, dict], Any]
_provider: Provider | None = None
_local = threading.local()


def set_row_provider(provider: Provider | None) -> None:
    """Install (or remove, with None) the provider of the built-in row ops."""
    global _provider
    _provider = provider


def row_provider_installed() -> bool:
    """Whether a provider is installed (``provided`` may then return a Node)."""
    return _provider is not None


def provided(name: str, args: tuple, attrs: dict) -> Any:
    """The provider's result for op ``name`` on ``args``, or None (see the module docstring)."""
    if _provider is None or engine.get_tracer() is not None or getattr(_local, "busy", False):
        return None
    _local.busy = True
    try:
        return _provider(name, args, attrs)
    finally:
        _local.busy = False
