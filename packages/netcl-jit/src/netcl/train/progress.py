"""The Trainer's tqdm progress bar: steps/s and samples/s while an epoch runs, its last loss at the end."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """One epoch's bar (``enabled`` None: only when stderr is a terminal). The loss is shown when the
    epoch ends (the Trainer reads it from the device once per epoch)."""

    def __init__(self, enabled: bool | None, total: int, initial: int, desc: str) -> None:
        if enabled is None:
            enabled = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.bar: Any = None
        self.samples, self.steps = 0, 0
        self.start = time.perf_counter()
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", leave=False)

    def step(self, samples: int) -> None:
        self.steps += 1
        self.samples += samples
        if self.bar is not None:
            elapsed = max(time.perf_counter() - self.start, 1e-9)
            self.bar.update(1)
            if self.steps % 10 == 0:
                self.bar.set_postfix(
                    steps_per_s=f"{self.steps / elapsed:.1f}", samples_per_s=f"{self.samples / elapsed:.0f}"
                )

    def close(self, loss: float | None) -> None:
        if self.bar is None:
            return
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        postfix = {"steps_per_s": f"{self.steps / elapsed:.1f}", "samples_per_s": f"{self.samples / elapsed:.0f}"}
        if loss is not None:
            postfix["loss"] = f"{loss:.4f}"
        self.bar.set_postfix(postfix)
        self.bar.close()
