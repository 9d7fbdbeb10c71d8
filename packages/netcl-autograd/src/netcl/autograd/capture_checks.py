"""What a captured step depends on besides its inputs, and the check that it still holds.

A captured step (``CompiledGraph``, ``fuse_graph``) bakes in three things the host can change later:
the training flag of every module it read (dropout or not, BatchNorm's batch or running statistics),
which parameters want gradients (the recorded backward computes and the recorded update applies
exactly those), and the tensor each parameter holds (the recorded kernels read and update those
buffers). ``CaptureChecks`` records them around the capture; ``stale_reason`` says which one changed,
so a replay raises ``StaleCaptureError`` instead of computing the captured setting's numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from netcl.autograd import mode_reads
from netcl.autograd.engine import Node


class CaptureChecks:
    """The module modes, ``requires_grad`` flags and parameter tensors one capture of ``params`` used."""

    def __init__(self, params: Sequence[Node]) -> None:
        self.params = list(params)
        #: the modules whose training flag the captured step read, and the mode it read (``mode_reads``)
        self.modes: dict[int, tuple[Any, bool]] = {}
        #: each parameter's ``requires_grad`` at capture: which gradients and updates the step holds
        self.wants = tuple(p.requires_grad for p in self.params)
        #: each parameter's tensor at capture: the buffers the captured kernels read and update
        self.values = tuple(p.value for p in self.params)

    @contextmanager
    def recording(self) -> Iterator[CaptureChecks]:
        """Around the captured run: records the modes it reads and the parameters as they are."""
        self.wants = tuple(p.requires_grad for p in self.params)
        with mode_reads.recording() as self.modes:
            yield self
        self.values = tuple(p.value for p in self.params)

    def stale_reason(self) -> str | None:
        """Why a replay would compute other numbers than the current modules and parameters ask for, or None."""
        stale = mode_reads.changed(self.modes)
        if stale:
            return (
                f"this step was captured with other module modes: {mode_reads.describe(stale)}. "
                "Capture it again in the current mode, or switch the model back (train()/eval())."
            )
        for i, (p, wanted, value) in enumerate(zip(self.params, self.wants, self.values, strict=True)):
            if p.requires_grad != wanted:
                count = sum(q.requires_grad != w for q, w in zip(self.params, self.wants, strict=True))
                return (
                    f"parameter {i} (shape {tuple(p.shape)}) was captured with requires_grad={wanted} and now has "
                    f"{p.requires_grad} ({count} parameter(s) changed): the captured step computes and applies the "
                    "gradients it held at capture. Capture the step again after freezing or unfreezing parameters."
                )
            if p.value is not value:
                return (
                    f"parameter {i} holds another tensor than at capture (on {p.value.device!r}: Module.to, or a new "
                    "value assigned): the captured kernels read and update the old buffers. Capture the step again."
                )
        return None
