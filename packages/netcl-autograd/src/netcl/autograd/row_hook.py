"""A hook through which netcl.jit serves the built-in row ops with its fused row kernels.

netcl-autograd does not import netcl.jit: netcl.jit installs a provider at import
(``set_row_provider``). ``softmax``, ``log_softmax``, ``layer_norm``, ``rms_norm`` and
``cross_entropy`` ask ``provided(...)`` first; it returns the provider's Node, or None (the op then
runs its own runtime kernels) when no provider is installed, a trace is running (the op is being
traced), the provider declines the arguments, or the call comes from inside the provider. A provider
installed with a ``declines`` says which tensors it never serves; ``declined`` asks it once per signature, and
``provided`` does not call the provider for a first argument of a declined signature (a planned eager softmax
asks ``declined`` before its checks, so it skips the hook altogether).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from netcl.autograd import engine
from netcl.core import Tensor
from netcl.runtime.ops._common import remember

Provider = Callable[[str, tuple, dict], Any]
#: ``declines(name, value)``: whether the provider returns None for every call of op ``name`` whose first
#: argument's value is a tensor of value's dtype, shape and device
Declines = Callable[[str, Tensor], bool]
_provider: Provider | None = None
_declines: Declines | None = None
#: (op name, shape, dtype, device) -> the installed provider's ``declines`` for that signature
_DECLINED: dict[tuple, bool] = {}
_local = threading.local()


def set_row_provider(provider: Provider | None, declines: Declines | None = None) -> None:
    """Install (or remove, with None) the provider of the built-in row ops, with its ``declines`` if it can say
    from a signature alone that it returns None (``declined`` then asks it once per signature)."""
    global _provider, _declines
    _provider, _declines = provider, declines
    forget_declined()


def forget_declined() -> None:
    """Forget every ``declined`` answer (the provider's ``declines`` changed: netcl.jit registered a row op)."""
    _DECLINED.clear()


def row_provider_installed() -> bool:
    """Whether a provider is installed (``provided`` may then return a Node)."""
    return _provider is not None


def declined(name: str, value: Tensor) -> bool:
    """Whether ``provided(name, (x, ...), attrs)`` returns None for every x whose value is a tensor of value's
    dtype, shape and device: True with no provider installed, the provider's ``declines`` (asked once per
    signature) otherwise, False for a provider without one. A caller that gets True may skip ``provided``."""
    if _provider is None:
        return True
    if _declines is None:
        return False
    key = (name, value.shape, value.dtype, value.device)
    found = _DECLINED.get(key)
    if found is None:
        found = remember(_DECLINED, key, bool(_declines(name, value)))
    return found


def provided(name: str, args: tuple, attrs: dict) -> Any:
    """The provider's result for op ``name`` on ``args``, or None (see the module docstring); a provider with a
    ``declines`` is not called where the first argument's value is a tensor of a signature it declines."""
    if _provider is None or engine.get_tracer() is not None or getattr(_local, "busy", False):
        return None
    first = args[0]
    value = first.value if isinstance(first, engine.Node) else first
    if isinstance(value, Tensor) and declined(name, value):  # (False for a provider without declines)
        return None
    _local.busy = True
    try:
        return _provider(name, args, attrs)
    finally:
        _local.busy = False
