"""``Callback``: hooks the ``Trainer`` calls at the start and end of ``fit``, after every step and epoch."""

from __future__ import annotations

from typing import Any


class Callback:
    """Override what you need; every hook gets the ``Trainer`` (its ``epoch``, ``global_step``,
    ``model``, ``save(path)`` ...). A hook that raises stops ``fit`` with that exception."""

    def on_fit_start(self, trainer: Any) -> None:
        """Before the first epoch of a ``fit`` call."""

    def on_step_end(self, trainer: Any, step: dict[str, int]) -> None:
        """After each batch: ``step`` is ``{"epoch", "batch", "step"}`` (``batch`` counts from 0 in the
        epoch, ``step`` is the number of optimizer steps so far). No loss here: reading it would sync."""

    def on_epoch_end(self, trainer: Any, logs: dict[str, float]) -> None:
        """After each epoch (scheduler stepped, validation done): ``logs`` holds ``epoch``, ``step``,
        ``loss`` (the epoch's mean), ``lr`` and, with a val_loader, ``val_loss`` and the metrics."""

    def on_fit_end(self, trainer: Any, history: dict[str, list[float]]) -> None:
        """After the last epoch, with the history ``fit`` returns."""


class Checkpoint(Callback):
    """Save the Trainer to ``path`` (atomically) after every ``every_epochs`` epochs."""

    def __init__(self, path: str, every_epochs: int = 1) -> None:
        if isinstance(every_epochs, bool) or not isinstance(every_epochs, int) or every_epochs < 1:
            raise ValueError(f"Checkpoint: every_epochs must be an int >= 1, got {every_epochs!r}")
        self.path, self.every_epochs = path, every_epochs

    def on_epoch_end(self, trainer: Any, logs: dict[str, float]) -> None:
        if trainer.epoch % self.every_epochs == 0:
            trainer.save(self.path)
