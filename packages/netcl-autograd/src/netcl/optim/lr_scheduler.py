"""Learning-rate schedulers with torch's semantics: ``StepLR``, ``CosineAnnealingLR``, ``LinearLR``.

Construction performs step 0 (as torch); each ``step()`` sets every group's ``lr`` and uploads it
to the optimizer's device-side hyperparameters, so a captured training step replays with it.
"""

from __future__ import annotations

import math
from typing import Any

from netcl.optim.optimizer import Optimizer


class LRScheduler:
    """Base class: subclasses give ``get_lr()`` (torch's chainable form, from the current lrs)."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__}: expected a netcl Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self.step()

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def step(self) -> None:
        """Advance one epoch (or iteration) and set the new learning rates."""
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        self.optimizer.sync_hyperparameters()

    def get_last_lr(self) -> list[float]:
        """The learning rates the last ``step()`` set."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)

    def _lrs(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]


class StepLR(LRScheduler):
    """Multiply the lr by ``gamma`` every ``step_size`` steps."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size <= 0:
            raise ValueError(f"StepLR: step_size must be a positive int, got {step_size!r}")
        self.step_size, self.gamma = step_size, float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]


class CosineAnnealingLR(LRScheduler):
    """``eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2``, in torch's recursive form."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803
        if isinstance(T_max, bool) or not isinstance(T_max, int) or T_max <= 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be a positive int, got {T_max!r}")
        self.T_max, self.eta_min = T_max, float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, period, eta_min = self.last_epoch, self.T_max, self.eta_min
        if t == 0:
            return self._lrs()
        if self._step_count == 1 and t > 0:
            return [eta_min + (b - eta_min) * (1 + math.cos(t * math.pi / period)) / 2 for b in self.base_lrs]
        if (t - 1 - period) % (2 * period) == 0:
            return [
                lr + (b - eta_min) * (1 - math.cos(math.pi / period)) / 2
                for lr, b in zip(self._lrs(), self.base_lrs, strict=True)
            ]
        ratio = (1 + math.cos(math.pi * t / period)) / (1 + math.cos(math.pi * (t - 1) / period))
        return [ratio * (lr - eta_min) + eta_min for lr in self._lrs()]


class LinearLR(LRScheduler):
    """Scale the lr linearly from ``start_factor`` to ``end_factor`` over ``total_iters`` steps."""

    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError(
                f"LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1], got {start_factor}, {end_factor}"
            )
        if isinstance(total_iters, bool) or not isinstance(total_iters, int) or total_iters <= 0:
            raise ValueError(f"LinearLR: total_iters must be a positive int, got {total_iters!r}")
        self.start_factor, self.end_factor, self.total_iters = float(start_factor), float(end_factor), total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, start, end = self.last_epoch, self.start_factor, self.end_factor
        if t == 0:
            return [lr * start for lr in self._lrs()]
        if t > self.total_iters:
            return self._lrs()
        factor = 1 + (end - start) / (self.total_iters * start + (t - 1) * (end - start))
        return [lr * factor for lr in self._lrs()]
