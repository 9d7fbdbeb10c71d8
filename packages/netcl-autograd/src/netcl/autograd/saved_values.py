"""The check that a backward's saved values are still what its forward saw.

A recorded op keeps its inputs' values and its output for the backward, and the clock of
``netcl.core.writes`` as it read when the op ran. If an in-place write (an optimizer step, ``nn.init``,
``load_state_dict``, the runtime's ``add_`` / ``fill_`` / ``write_``) hit one of those buffers since, the
gradient would be computed from the new values: the backward raises ``ModifiedInPlaceError`` instead, as
torch raises for a tensor whose version changed after it was saved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from netcl.core import Tensor
from netcl.core.writes import written_since


class ModifiedInPlaceError(RuntimeError):
    """A value the backward of an op needs was overwritten in place after the op ran."""


def check_unmodified(op_name: str, values: Sequence[Any], out: Any, number: int, reads: Sequence[int]) -> None:
    """Raise ``ModifiedInPlaceError`` if the value at one of the positions ``reads`` of ``values``, or ``out`` when
    ``reads`` holds -1, was written in place after the writes clock read ``number``."""
    for i in reads:
        value = out if i == -1 else values[i]
        if isinstance(value, Tensor) and written_since(value, number):
            which = "its output" if i == -1 else f"its input {i}"
            raise ModifiedInPlaceError(_message(op_name, which, value))


def _message(op_name: str, which: str, value: Tensor) -> str:
    return (
        f"the backward of op {op_name!r} needs {which} (shape {value.shape}, {value.dtype}), which was modified in "
        "place after the forward ran (an optimizer step, nn.init, load_state_dict or an in-place runtime op such "
        "as add_ / fill_ / write_ on it or a view of it). The gradient would use the new values: call backward "
        "before changing it, or run the forward again after the change."
    )
