"""``RMSprop`` (torch semantics): one multi-tensor kernel per group, dtype and 16 parameters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.optim.optimizer import Optimizer, by_dtype, non_negative
from netcl.runtime.ops.optim_kernels import RMSPROP_HYPER, rmsprop_multi_step_


class RMSprop(Optimizer):
    """``v = alpha v + (1 - alpha) g^2``; ``p -= lr g / (sqrt(v) + eps)`` (``g`` with ``weight_decay * p`` added).
    ``centered``: ``sqrt(v - m^2)`` with ``m`` the running mean of ``g``; ``momentum > 0``: ``b = momentum b +
    g / (...)`` and ``p -= lr b``. State ``square_avg``, ``grad_avg``, ``momentum_buffer`` (torch's names)."""

    hyper_names = RMSPROP_HYPER
    state_names = ("square_avg", "grad_avg", "momentum_buffer")
    skips_on_device = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "alpha": alpha,
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "centered": centered,
        }
        super().__init__(params, defaults)

    def check_hyperparameters(self, group: dict[str, Any]) -> None:
        non_negative("RMSprop", group, ("lr", "alpha", "eps", "weight_decay", "momentum"))
        if not isinstance(group["centered"], bool):
            raise TypeError(f"RMSprop: centered must be a bool, got {group['centered']!r}")

    def _state_of(self, param: Node, state: dict[str, Any], group: dict[str, Any]) -> None:
        wanted = ["square_avg"]
        if group["centered"]:
            wanted.append("grad_avg")
        if group["momentum"] != 0:
            wanted.append("momentum_buffer")
        for name in wanted:
            if state.get(name) is None:
                state[name] = Tensor.zeros(param.shape, param.dtype, param.device)

    def update_many(
        self, batch: list[tuple[Node, Tensor, dict[str, Any], int]], group: dict[str, Any], hyper: Tensor
    ) -> None:
        for bucket in by_dtype(batch):
            for param, _, state, _ in bucket:
                self._state_of(param, state, group)
            states = [item[2] for item in bucket]
            rmsprop_multi_step_(
                [item[0].value for item in bucket],
                [item[1] for item in bucket],
                [s["square_avg"] for s in states],
                [s["grad_avg"] for s in states] if group["centered"] else None,
                [s["momentum_buffer"] for s in states] if group["momentum"] != 0 else None,
                self.steps,
                [item[3] for item in bucket],
                hyper,
                self.skip_flag,
            )
