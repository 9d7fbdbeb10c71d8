"""``Adam`` and ``AdamW`` (torch semantics: bias-corrected moments; L2 vs decoupled weight decay)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.optim.optimizer import Optimizer, by_dtype
from netcl.runtime.ops.optim_kernels import adam_multi_step_, adam_step_


class Adam(Optimizer):
    """Adam: ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
    ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``; ``weight_decay`` adds ``wd * p`` to g.
    ``amsgrad``: ``v`` in the step is the largest second moment so far (state ``max_exp_avg_sq``, torch's).
    One multi-tensor kernel per group, dtype and 16 parameters; the step ``t`` is counted on the device."""

    hyper_names = ("lr", "beta1", "beta2", "eps", "weight_decay")
    state_names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    decoupled_weight_decay = False
    skips_on_device = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
    ) -> None:
        if not isinstance(amsgrad, bool):
            raise TypeError(f"{type(self).__name__}: amsgrad must be a bool, got {amsgrad!r}")
        #: torch's AMSGrad variant (one setting for every group)
        self.amsgrad = amsgrad
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def check_hyperparameters(self, group: dict[str, Any]) -> None:
        name = type(self).__name__
        for key in ("lr", "eps", "weight_decay"):
            value = group[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name}: {key} must be a number >= 0, got {value!r}")
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in betas):
            raise ValueError(f"{name}: betas must be two numbers in [0, 1), got {betas!r}")

    def hyper_values(self, group: dict[str, Any]) -> tuple[float, ...]:
        b1, b2 = group["betas"]
        return (float(group["lr"]), float(b1), float(b2), float(group["eps"]), float(group["weight_decay"]))

    def _init_state(self, param: Node, state: dict[str, Any]) -> None:
        names = self.state_names if self.amsgrad else self.state_names[:2]
        for name in names:
            if name not in state:
                state[name] = Tensor.zeros(param.shape, param.dtype, param.device)

    def update(
        self, param: Node, grad: Tensor, state: dict[str, Any], group: dict[str, Any], index: int, hyper: Tensor
    ) -> None:
        self._init_state(param, state)
        adam_step_(
            param.value,
            grad,
            state["exp_avg"],
            state["exp_avg_sq"],
            self.steps,
            index,
            hyper,
            self.decoupled_weight_decay,
            self.skip_flag,
            state.get("max_exp_avg_sq") if self.amsgrad else None,
        )

    def update_many(
        self, batch: list[tuple[Node, Tensor, dict[str, Any], int]], group: dict[str, Any], hyper: Tensor
    ) -> None:
        for bucket in by_dtype(batch):
            for param, _, state, _ in bucket:
                self._init_state(param, state)
            adam_multi_step_(
                [item[0].value for item in bucket],
                [item[1] for item in bucket],
                [item[2]["exp_avg"] for item in bucket],
                [item[2]["exp_avg_sq"] for item in bucket],
                self.steps,
                [item[3] for item in bucket],
                hyper,
                self.decoupled_weight_decay,
                self.skip_flag,
                [item[2]["max_exp_avg_sq"] for item in bucket] if self.amsgrad else None,
            )


class AdamW(Adam):
    """Adam with decoupled weight decay: ``p *= 1 - lr * weight_decay`` before the Adam update (default 0.01)."""

    decoupled_weight_decay = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)
