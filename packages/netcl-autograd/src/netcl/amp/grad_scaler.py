"""``GradScaler``: dynamic loss scaling for float16 training (torch.amp.GradScaler's rules)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.runtime import ops as R  # noqa: N812
from netcl.runtime.ops.optim_kernels import unscale_


class GradScaler:
    """Multiply the loss by ``scale`` before backward so float16 gradients do not underflow; ``step``
    divides the gradients by it and skips the optimizer step when any is inf/NaN; ``update`` halves
    the scale after such a step (``backoff_factor``) and doubles it (``growth_factor``) after
    ``growth_interval`` clean steps in a row.

    ``scaler.scale_loss(loss)`` -> backward -> ``scaler.step(opt, params)`` -> ``scaler.update()``.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        if not init_scale > 0:
            raise ValueError(f"GradScaler: init_scale must be > 0, got {init_scale!r}")
        if not growth_factor > 1:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor!r}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval <= 0:
            raise ValueError(f"GradScaler: growth_interval must be a positive int, got {growth_interval!r}")
        self.enabled = bool(enabled)
        self._scale = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = growth_interval
        self._growth_tracker = 0
        #: inf/NaN found by this iteration's unscale (None: not unscaled yet)
        self._found_inf: bool | None = None
        self._flags: dict[Any, Tensor] = {}

    def get_scale(self) -> float:
        return self._scale if self.enabled else 1.0

    def is_enabled(self) -> bool:
        return self.enabled

    def scale_loss(self, loss: Node) -> Node:
        """``loss * scale`` (the loss itself when disabled)."""
        if not isinstance(loss, Node):
            raise TypeError(f"scale_loss: expected a Node, got {type(loss).__name__}")
        return ag.mul(loss, self._scale) if self.enabled else loss

    scale = scale_loss

    def unscale_(self, optimizer: Any, params: Iterable[Node] | None = None) -> bool:
        """Divide the gradients of ``params`` (default: the optimizer's) by the scale in place; True if
        any gradient holds inf/NaN. Runs once per iteration (a second call returns the first result)."""
        if self._found_inf is not None:
            return self._found_inf
        chosen = _params(optimizer, params)
        found = False
        if self.enabled:
            seen: set[int] = set()
            grads = []
            for p in chosen:
                if p.grad is not None and id(p.grad.data) not in seen:  # a buffer shared by two params once
                    seen.add(id(p.grad.data))
                    grads.append(p.grad)
            if grads:
                flag = self._flag(grads[0])
                R.fill_(flag, 0)
                for g in grads:
                    unscale_(g, 1.0 / self._scale, flag)
                found = bool(np.asarray(flag.to_host()).reshape(-1)[0])
        self._found_inf = found
        return found

    def step(self, optimizer: Any, params: Iterable[Node] | None = None) -> Any:
        """Unscale the gradients (unless ``unscale_`` did), then ``optimizer.step()`` unless one is inf/NaN.

        Returns the optimizer's return value, or None when the step was skipped.
        """
        if not self.enabled:
            return optimizer.step()
        if self.unscale_(optimizer, params):
            return None
        return optimizer.step()

    def update(self, new_scale: float | None = None) -> None:
        """Back off after a skipped step, grow after ``growth_interval`` clean ones (or set ``new_scale``)."""
        if not self.enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale)
        elif self._found_inf:
            self._scale *= self.backoff_factor
            self._growth_tracker = 0
        elif self._found_inf is not None:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._scale *= self.growth_factor
                self._growth_tracker = 0
        self._found_inf = None

    def _flag(self, like: Tensor) -> Tensor:
        flag = self._flags.get(like.device)
        if flag is None:
            flag = self._flags[like.device] = Tensor.zeros((1,), np.int32, like.device)
        return flag

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self._scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale = float(state["scale"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])

    def __repr__(self) -> str:
        return f"GradScaler(scale={self._scale}, growth_tracker={self._growth_tracker}, enabled={self.enabled})"


def _params(optimizer: Any, params: Iterable[Node] | None) -> list[Node]:
    if params is not None:
        return list(params)
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(f"GradScaler: cannot find parameters of {type(optimizer).__name__}; pass params=")
    return [p for g in groups for p in g["params"]]
