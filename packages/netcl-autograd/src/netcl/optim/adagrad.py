"""``Adagrad`` (torch semantics): one multi-tensor kernel per group, dtype and 16 parameters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.optim.optimizer import Optimizer, by_dtype, non_negative
from netcl.runtime.ops import pointwise
from netcl.runtime.ops.optim_kernels import ADAGRAD_HYPER, adagrad_multi_step_


class Adagrad(Optimizer):
    """``s += g^2``; ``p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(s) + eps)`` (``g`` with ``weight_decay * p``
    added; ``t`` the step, counted on the device). State ``sum``, made at construction and filled with
    ``initial_accumulator_value`` (torch's)."""

    hyper_names = ADAGRAD_HYPER
    state_names = ("sum",)
    skips_on_device = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
    ) -> None:
        defaults = {
            "lr": lr,
            "lr_decay": lr_decay,
            "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value,
            "eps": eps,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for param in group["params"]:
                total = Tensor.zeros(param.shape, param.dtype, param.device)
                if group["initial_accumulator_value"]:
                    pointwise.fill_(total, float(group["initial_accumulator_value"]))
                self.state.setdefault(param, {})["sum"] = total

    def check_hyperparameters(self, group: dict[str, Any]) -> None:
        non_negative("Adagrad", group, ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"))

    def update_many(
        self, batch: list[tuple[Node, Tensor, dict[str, Any], int]], group: dict[str, Any], hyper: Tensor
    ) -> None:
        for bucket in by_dtype(batch):
            adagrad_multi_step_(
                [item[0].value for item in bucket],
                [item[1] for item in bucket],
                [item[2]["sum"] for item in bucket],
                self.steps,
                [item[3] for item in bucket],
                hyper,
                self.skip_flag,
            )
