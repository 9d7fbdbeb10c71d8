"""The result tensors of eager ops' hot paths: ``results.tensor(data, shape, dtype, device)`` is
``Tensor(data, shape, dtype, device)``, a tensor with no base, no gradient and no write yet.

Hot paths call it through this module (``results.tensor(...)``, not a name imported from it): the first device pool
made where ``netcl.runtime.native`` is in use puts its C ``Maker`` here (``install``), which makes the same tensor
without running ``Tensor.__init__`` (a Python frame and seven attribute stores on every op's output). Until then, and
where the extension is not in use, it is ``Tensor`` itself; either way the tensor is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from netcl.core import Tensor
from netcl.runtime import native

#: the arguments ``tensor`` takes, in order: the fields ``Tensor.__init__`` sets from its first four arguments
GIVEN = ("data", "shape", "dtype", "device")

#: ``Tensor(data, shape, dtype, device)``: the class itself, or its C maker once ``install`` ran
tensor: Callable[..., Tensor] = Tensor


def constants() -> dict[str, Any]:
    """The fields ``Tensor.__init__`` sets besides ``GIVEN``, with the values it sets them to (read from a tensor it
    made, so the maker follows ``__init__``)."""
    probe = Tensor(None, (), None, None)
    fields = [name for name in Tensor.__slots__ if name not in GIVEN and name != "__weakref__"]
    return {name: getattr(probe, name) for name in fields if hasattr(probe, name)}


def install() -> None:
    """Put ``native``'s maker of tensors in ``tensor`` where the extension is in use (once a process)."""
    global tensor
    if tensor is Tensor:
        made = native.maker(Tensor, GIVEN, constants())
        if made is not None:
            tensor = made
