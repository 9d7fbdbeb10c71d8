"""Which modules' ``training`` flags a traced or captured step read.

A compiled plan (``jit_compile``) or a captured step (``fuse_graph``) bakes in what the model did in the
mode it was in: dropout or not, BatchNorm's batch statistics or its running ones. ``Module.training``
reports every read to the ``recording`` blocks open on this thread, so that the plan can tell when one
of those flags has changed since (``jit_compile`` traces again, ``FusedGraph.execute`` raises
``StaleCaptureError``) instead of computing the other mode's numbers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _Recording(threading.local):
    """This thread's open record (None: nothing records; the class attribute is the default)."""

    reads: dict[int, tuple[Any, bool]] | None = None


_local = _Recording()


def note(module: Any, mode: bool) -> None:
    """``module``'s training flag was read as ``mode`` (the first read of each module counts)."""
    reads = _local.reads
    if reads is not None and id(module) not in reads:
        reads[id(module)] = (module, mode)


@contextmanager
def recording() -> Iterator[dict[int, tuple[Any, bool]]]:
    """Within the block, every module whose training flag is read: id -> (module, the mode read).
    Blocks nest; an inner block's reads also count for the one around it."""
    outer = _local.reads
    reads: dict[int, tuple[Any, bool]] = {}
    _local.reads = reads
    try:
        yield reads
    finally:
        _local.reads = outer
        if outer is not None:
            for key, read in reads.items():
                outer.setdefault(key, read)


def changed(reads: dict[int, tuple[Any, bool]]) -> list[tuple[Any, bool]]:
    """The (module, mode read) pairs whose module is in the other mode now."""
    return [(module, mode) for module, mode in reads.values() if module._training is not mode]


def describe(pairs: list[tuple[Any, bool]]) -> str:
    """``pairs`` for an error message: "Dropout (captured in training mode, now in eval mode), ..."."""
    modes = {True: "training", False: "eval"}
    return ", ".join(f"{type(m).__name__} (captured in {modes[v]} mode, now in {modes[not v]} mode)" for m, v in pairs)
