"""Learning-rate schedulers with torch's semantics: ``StepLR``, ``MultiStepLR``, ``ExponentialLR``, ``ConstantLR``,
``LinearLR``, ``PolynomialLR``, ``CosineAnnealingLR``, ``CosineAnnealingWarmRestarts``, ``LambdaLR``,
``MultiplicativeLR``, ``OneCycleLR``, ``SequentialLR`` and ``ReduceLROnPlateau``.

Construction performs step 0 (as torch); each ``step()`` sets every group's ``lr`` (``OneCycleLR`` also its
momentum or beta1) and uploads it to the optimizer's device-side hyperparameters, so a captured training step
replays with it. ``step(epoch)`` (torch's deprecated form, which ``SequentialLR`` uses at its milestones) jumps to
``epoch`` through the scheduler's closed form where it has one.
"""

from __future__ import annotations

import math
import warnings
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
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

    def step(self, epoch: int | None = None) -> None:
        """Advance one epoch (or iteration) and set the new learning rates; ``epoch`` (deprecated in torch) jumps
        there, through the closed form where the scheduler has one."""
        if epoch is not None:
            warnings.warn("LRScheduler.step(epoch) is deprecated in torch; call step() once per epoch", UserWarning, 2)
        self._apply(lambda: self._next_lrs(epoch))

    def _next_lrs(self, epoch: int | None) -> list[float]:
        """Advance the schedule's counters (one step, or to ``epoch``) and return the new learning rates."""
        self._step_count += 1
        if epoch is None:
            self.last_epoch += 1
            return self.get_lr()
        self.last_epoch = int(epoch)
        return self._closed_form_lr() if hasattr(self, "_closed_form_lr") else self.get_lr()

    def _apply(self, advance: Callable[[], list[float]]) -> None:
        """Run ``advance`` and set its learning rates on the groups; a refused value (a negative lr) or any error
        leaves the groups and the scheduler's own state as they were (nothing half-done)."""
        groups = self.optimizer.param_groups
        saved_groups = [dict(group) for group in groups]
        saved_state = {k: v for k, v in self.__dict__.items() if k != "optimizer"}
        try:
            for group, lr in zip(groups, advance(), strict=True):
                group["lr"] = lr
            self.optimizer.sync_hyperparameters()  # checks the values (a negative lr raises) before uploading
        except BaseException:
            for group, saved in zip(groups, saved_groups, strict=True):
                group.clear()
                group.update(saved)
            self.__dict__.update(saved_state)
            raise
        self._last_lr = [group["lr"] for group in groups]

    def get_last_lr(self) -> list[float]:
        """The learning rates the last ``step()`` set."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)

    def _lrs(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]


def _positive_int(owner: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    return value


class StepLR(LRScheduler):
    """Multiply the lr by ``gamma`` every ``step_size`` steps."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size, self.gamma = _positive_int("StepLR", "step_size", step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]

    def _closed_form_lr(self) -> list[float]:
        return [b * self.gamma ** (self.last_epoch // self.step_size) for b in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """``eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2``, in torch's recursive form."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803
        self.T_max, self.eta_min = _positive_int("CosineAnnealingLR", "T_max", T_max), float(eta_min)
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

    def _closed_form_lr(self) -> list[float]:
        cosine = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
        return [self.eta_min + (b - self.eta_min) * cosine for b in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from each group's initial lr to ``eta_min`` over ``T_i`` steps, restarting at the initial lr;
    the period starts at ``T_0`` and is multiplied by ``T_mult`` at each restart (torch's SGDR). ``step(epoch)``
    takes fractional epochs (``scheduler.step(epoch + i / iters)``), as torch's does, without a warning."""

    def __init__(
        self,
        optimizer: Optimizer,
        T_0: int,  # noqa: N803 - torch's name
        T_mult: int = 1,  # noqa: N803 - torch's name
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        self.T_0 = _positive_int("CosineAnnealingWarmRestarts", "T_0", T_0)
        self.T_mult = _positive_int("CosineAnnealingWarmRestarts", "T_mult", T_mult)
        self.T_i, self.T_cur, self.eta_min = T_0, last_epoch, float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        cosine = (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
        return [self.eta_min + (b - self.eta_min) * cosine for b in self.base_lrs]

    def step(self, epoch: float | None = None) -> None:
        if epoch is not None and epoch < 0:
            raise ValueError(f"CosineAnnealingWarmRestarts: epoch must be >= 0, got {epoch!r}")
        self._apply(lambda: self._restarted_lrs(epoch))

    def _restarted_lrs(self, epoch: float | None) -> list[float]:
        self._step_count += 1
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur += 1
            if self.T_cur >= self.T_i:
                self.T_cur -= self.T_i
                self.T_i *= self.T_mult
        elif epoch >= self.T_0:
            if self.T_mult == 1:
                self.T_cur = epoch % self.T_0
            else:
                n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                self.T_cur = epoch - self.T_0 * (self.T_mult**n - 1) / (self.T_mult - 1)
                self.T_i = self.T_0 * self.T_mult**n
        else:
            self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        return self.get_lr()


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
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = _positive_int("LinearLR", "total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, start, end = self.last_epoch, self.start_factor, self.end_factor
        if t == 0:
            return [lr * start for lr in self._lrs()]
        if t > self.total_iters:
            return self._lrs()
        factor = 1 + (end - start) / (self.total_iters * start + (t - 1) * (end - start))
        return [lr * factor for lr in self._lrs()]

    def _closed_form_lr(self) -> list[float]:
        ramp = min(self.total_iters, self.last_epoch) / self.total_iters
        return [b * (self.start_factor + (self.end_factor - self.start_factor) * ramp) for b in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the lr by ``gamma`` at each of the ``milestones`` (a milestone listed twice applies twice)."""

    def __init__(
        self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        self.milestones, self.gamma = Counter(int(m) for m in milestones), float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch not in self.milestones:
            return self._lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._lrs()]

    def _closed_form_lr(self) -> list[float]:
        passed = bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return [b * self.gamma**passed for b in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply the lr by ``gamma`` every step."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return self._lrs() if self.last_epoch == 0 else [lr * self.gamma for lr in self._lrs()]

    def _closed_form_lr(self) -> list[float]:
        return [b * self.gamma**self.last_epoch for b in self.base_lrs]


class ConstantLR(LRScheduler):
    """The lr times ``factor`` until ``total_iters`` steps, then the lr itself."""

    def __init__(
        self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1
    ) -> None:
        if not 0 <= factor <= 1:
            raise ValueError(f"ConstantLR: factor must be in [0, 1], got {factor!r}")
        self.factor, self.total_iters = float(factor), _positive_int("ConstantLR", "total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._lrs()]
        if self.last_epoch != self.total_iters:
            return self._lrs()
        return [lr * (1.0 / self.factor) for lr in self._lrs()]

    def _closed_form_lr(self) -> list[float]:
        scale = self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor)
        return [b * scale for b in self.base_lrs]


class PolynomialLR(LRScheduler):
    """Decay the lr as ``(1 - t / total_iters) ** power`` until ``total_iters``."""

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1) -> None:
        self.total_iters, self.power = _positive_int("PolynomialLR", "total_iters", total_iters), float(power)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, total = self.last_epoch, self.total_iters
        if t == 0 or t > total:
            return self._lrs()
        decay = ((1.0 - t / total) / (1.0 - (t - 1) / total)) ** self.power
        return [lr * decay for lr in self._lrs()]

    def _closed_form_lr(self) -> list[float]:
        left = 1.0 - min(self.total_iters, self.last_epoch) / self.total_iters
        return [b * left**self.power for b in self.base_lrs]


def _per_group(owner: str, optimizer: Optimizer, value: Any, name: str) -> list[Any]:
    """``value`` for every param group: a list or tuple of one per group, or one for all."""
    groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ValueError(f"{owner}: expected {groups} {name} (one per param group), got {len(value)}")
        return list(value)
    return [value] * groups


class LambdaLR(LRScheduler):
    """The initial lr times ``lr_lambda(epoch)`` (one function, or one per param group)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
                 last_epoch: int = -1) -> None:  # fmt: skip
        self.lr_lambdas = _per_group("LambdaLR", optimizer, lr_lambda, "lr_lambdas")
        if not all(callable(f) for f in self.lr_lambdas):
            raise TypeError(f"LambdaLR: lr_lambda must be callable (or one callable per group), got {lr_lambda!r}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [b * f(self.last_epoch) for f, b in zip(self.lr_lambdas, self.base_lrs, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        """As torch's: the functions are not saved (only the scheduler's counters)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}


class MultiplicativeLR(LambdaLR):
    """The lr times ``lr_lambda(epoch)`` every step after the first."""

    def get_lr(self) -> list[float]:
        if self.last_epoch <= 0:
            return self._lrs()
        return [lr * f(self.last_epoch) for f, lr in zip(self.lr_lambdas, self._lrs(), strict=True)]


class OneCycleLR(LRScheduler):
    """torch's 1cycle policy: the lr rises from ``max_lr / div_factor`` to ``max_lr`` over ``pct_start`` of the
    ``total_steps`` and anneals to ``initial / final_div_factor`` (``three_phase``: back to the initial lr first),
    cosine or linear; with ``cycle_momentum`` the momentum (or Adam's beta1) moves the other way between
    ``max_momentum`` and ``base_momentum``. Step it once per batch."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | Sequence[float],
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float | Sequence[float] = 0.85,
        max_momentum: float | Sequence[float] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        owner = "OneCycleLR"
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError(f"{owner}: give total_steps, or epochs and steps_per_epoch")
            total_steps = _positive_int(owner, "epochs", epochs) * _positive_int(
                owner, "steps_per_epoch", steps_per_epoch
            )
        self.total_steps = _positive_int(owner, "total_steps", total_steps)
        if not 0 <= pct_start <= 1 or isinstance(pct_start, bool):
            raise ValueError(f"{owner}: pct_start must be a number in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"{owner}: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.anneal_strategy, self.cycle_momentum = anneal_strategy, bool(cycle_momentum)
        up = float(pct_start * self.total_steps) - 1
        if three_phase:
            self.phases = [
                (up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (float(2 * pct_start * self.total_steps) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                (self.total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"),
            ]
        else:
            self.phases = [
                (up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (self.total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
            ]
        groups = optimizer.param_groups
        if last_epoch == -1:
            for group, top in zip(groups, _per_group(owner, optimizer, max_lr, "max_lr"), strict=True):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.use_beta1 = "betas" in optimizer.defaults
        if self.cycle_momentum:
            if "momentum" not in optimizer.defaults and not self.use_beta1:
                raise ValueError(f"{owner}: the optimizer has no momentum or betas to cycle (cycle_momentum=False)")
            if last_epoch == -1:
                highs = _per_group(owner, optimizer, max_momentum, "max_momentum")
                lows = _per_group(owner, optimizer, base_momentum, "base_momentum")
                for group, high, low in zip(groups, highs, lows, strict=True):
                    self._set_momentum(group, high)
                    group["max_momentum"], group["base_momentum"] = high, low
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group: dict[str, Any], value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {step} times, the schedule has total_steps={self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr_from, lr_to, m_from, m_to) in enumerate(self.phases):
                if step <= end or i == len(self.phases) - 1:
                    pct = (step - start) / (end - start)
                    lrs.append(self._anneal(group[lr_from], group[lr_to], pct))
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(group[m_from], group[m_to], pct))
                    break
                start = end
        return lrs


class SequentialLR(LRScheduler):
    """torch's ``SequentialLR``: ``schedulers[i]`` drives the lr from ``milestones[i - 1]`` on (the later ones restart
    at their epoch 0 there), e.g. a ``LinearLR`` warmup then a ``CosineAnnealingLR``."""

    def __init__(
        self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int], last_epoch: int = -1
    ) -> None:
        if not schedulers or len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"SequentialLR: expected one milestone fewer than schedulers, got {len(schedulers)} schedulers "
                f"and {len(milestones)} milestones"
            )
        for i, scheduler in enumerate(schedulers):
            if getattr(scheduler, "optimizer", None) is not optimizer:
                raise ValueError(f"SequentialLR: scheduler {i} drives another optimizer than the one given")
        self.optimizer, self._schedulers, self._milestones = optimizer, list(schedulers), [int(m) for m in milestones]
        self.last_epoch = last_epoch + 1
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        for scheduler in self._schedulers:
            scheduler.last_epoch -= 1
        first = self._schedulers[0]
        first._step_count = 0
        first.step()
        self._last_lr = first.get_last_lr()

    def step(self, epoch: int | None = None) -> None:
        self.last_epoch += 1
        index = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                scheduler.step(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = dict(state_dict)
        for scheduler, inner in zip(self._schedulers, saved.pop("_schedulers"), strict=True):
            scheduler.load_state_dict(inner)
        self.__dict__.update(saved)


class ReduceLROnPlateau(LRScheduler):
    """torch's ``ReduceLROnPlateau``, an ``LRScheduler`` stepped with a metric (no step at construction):
    ``step(metric)`` once per epoch; after more than ``patience`` epochs without an improvement (``threshold``,
    relative or absolute, in ``mode`` "min" or "max") every lr is multiplied by ``factor`` (not below ``min_lr``;
    a change below ``eps`` is skipped), then ``cooldown`` epochs pass before counting again. The metric is read
    on the host (a loss Node is read once per call)."""

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float | Sequence[float] = 0.0,
        eps: float = 1e-8,
    ) -> None:  # no LRScheduler.__init__: nothing steps at construction
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"ReduceLROnPlateau: expected a netcl Optimizer, got {type(optimizer).__name__}")
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1.0, got {factor!r}")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max' and threshold_mode 'rel' or 'abs', "
                             f"got {mode!r}, {threshold_mode!r}")  # fmt: skip
        self.optimizer, self.mode, self.factor, self.patience = optimizer, mode, float(factor), int(patience)
        self.threshold, self.threshold_mode, self.cooldown, self.eps = (
            float(threshold),
            threshold_mode,
            int(cooldown),
            eps,
        )
        self.min_lrs = [float(v) for v in _per_group("ReduceLROnPlateau", optimizer, min_lr, "min_lr")]
        self.last_epoch = 0
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    def is_better(self, current: float, best: float) -> bool:
        if self.mode == "min":
            return current < (best * (1 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return current > (best * (self.threshold + 1) if self.threshold_mode == "rel" else best + self.threshold)

    def step(self, metrics: Any) -> None:  # type: ignore[override]
        current = float(metrics)
        self.last_epoch += 1
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for group, floor in zip(self.optimizer.param_groups, self.min_lrs, strict=True):
                old = float(group["lr"])
                new = max(old * self.factor, floor)
                if old - new > self.eps:
                    group["lr"] = new
            self.optimizer.sync_hyperparameters()
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]
