"""``Variable``: a bound integer that kernels take as an ``int`` argument, rebound per replay.

A kernel that must work for every length up to a maximum (a decode step at position ``pos``, a
key/value cache holding ``pos + 1`` rows) takes the length as a scalar ``int`` argument and its
buffers are sized for the maximum. Passing a ``Variable`` in place of that scalar to
``netcl.runtime.launch`` sets the argument to the variable's current value; under capture the
launch records the *variable*, not the number, so one captured ``Graph`` replays for every value:

    pos = Variable("pos", max_value=255)
    with graph.capture(queue):
        step(pos)                       # kernels launched with pos as an argument
    for p in range(256):
        graph.execute(bindings={"pos": p})   # or pos.bind(p); graph.execute()

At each replay the graph reads every recorded variable's value and re-sets that argument in the
launches that use it (only when the value changed since the graph's previous replay). ``bind``
(and ``execute(bindings=...)``, which calls it) refuses a value outside ``[0, max_value]`` with a
``ValueError`` naming the variable, before anything is enqueued. The argument's C type is ``int``.
On the NumPy backend ops read ``variable.value`` when they run, and a replay re-runs the function.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

_INT_MAX = 2**31 - 1

#: Set once any Variable exists: ``launch`` looks for Variables among its arguments only then.
IN_USE: list[bool] = [False]


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    return operator.index(value)


class Variable:
    """A named integer in ``[0, max_value]`` passed to kernels as an ``int`` argument (see the module doc).

    ``value`` is the current binding; ``bind(v)`` changes it (ValueError outside the range).
    """

    __slots__ = ("name", "max_value", "_value")

    def __init__(self, name: str, max_value: int, value: int = 0) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Variable: name must be a non-empty str, got {name!r}")
        max_value = _as_int(max_value, f"Variable {name!r}: max_value")
        if not 0 <= max_value <= _INT_MAX:
            raise ValueError(f"Variable {name!r}: max_value must be in [0, {_INT_MAX}] (a C int), got {max_value}")
        self.name = name
        self.max_value = max_value
        self._value = 0
        self.bind(value)
        IN_USE[0] = True

    @property
    def value(self) -> int:
        """The current binding."""
        return self._value

    def check(self, value: int) -> int:
        """``value`` as an int if this variable may take it; TypeError / ValueError (naming it) if not."""
        value = _as_int(value, f"Variable {self.name!r}: value")
        if not 0 <= value <= self.max_value:
            raise ValueError(
                f"Variable {self.name!r}: value {value} is outside [0, {self.max_value}] "
                f"(the maximum it was declared with; buffers are sized for it)"
            )
        return value

    def bind(self, value: int) -> Variable:
        """Set the value the next launch (or replay) passes; returns self. ValueError outside [0, max_value]."""
        self._value = self.check(value)
        return self

    def arg(self) -> np.int32:
        """The kernel argument for the current value."""
        return np.int32(self._value)

    def __index__(self) -> int:
        return self._value

    def __int__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return f"Variable({self.name!r}, max_value={self.max_value}, value={self._value})"


def launch_values(raw: list[Any]) -> list[Any]:
    """``raw`` with every ``Variable`` replaced by its current kernel argument."""
    return [a.arg() if type(a) is Variable else a for a in raw]


def value_of(x: int | Variable) -> int:
    """The integer a plain int or a ``Variable`` stands for now."""
    return x.value if isinstance(x, Variable) else operator.index(x)


__all__ = ["Variable", "launch_values", "value_of"]
