"""``debug_tape``: a context manager that exposes (and installs) the tape under inspection."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from netcl.autograd.engine import Tape, get_current_tape, set_current_tape


@contextmanager
def debug_tape(tape: Tape | None = None) -> Iterator[Tape]:
    """Yield ``tape`` (default: the current tape, else a new one), installed as the current tape.

    Ops run inside the block are recorded on it, so ``len(t.nodes)`` grows as the forward pass
    proceeds; the previously current tape is restored on exit.
    """
    previous = get_current_tape()
    target = tape if tape is not None else (previous if previous is not None else Tape())
    set_current_tape(target)
    try:
        yield target
    finally:
        set_current_tape(previous)
