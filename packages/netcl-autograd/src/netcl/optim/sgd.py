"""``SGD``: stochastic gradient descent with momentum, dampening, Nesterov and weight decay (torch semantics)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.optim.optimizer import Optimizer, by_dtype
from netcl.runtime.ops.optim_kernels import SGD_HYPER, sgd_multi_step_, sgd_step_


def _non_negative(group: dict[str, Any], name: str) -> None:
    value = group[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"SGD: {name} must be a number >= 0, got {value!r}")


class SGD(Optimizer):
    """``p -= lr * d`` with ``d = g + weight_decay * p``, through a momentum buffer when ``momentum > 0``
    (``buf = momentum * buf + (1 - dampening) * d``, the first step ``buf = d``; Nesterov uses
    ``d + momentum * buf``). One multi-tensor kernel per group, dtype and 16 parameters."""

    hyper_names = SGD_HYPER
    state_names = ("momentum_buffer",)
    skips_on_device = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "nesterov": nesterov,
            "weight_decay": weight_decay,
        }
        super().__init__(params, defaults)

    def check_hyperparameters(self, group: dict[str, Any]) -> None:
        for name in ("lr", "momentum", "dampening", "weight_decay"):
            _non_negative(group, name)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening = 0")

    def update(
        self, param: Node, grad: Tensor, state: dict[str, Any], group: dict[str, Any], index: int, hyper: Tensor
    ) -> None:
        buf = state.get("momentum_buffer")
        if buf is None and group["momentum"] != 0:
            buf = state["momentum_buffer"] = Tensor.zeros(param.shape, param.dtype, param.device)
        sgd_step_(param.value, grad, buf, self.steps, index, hyper, self.skip_flag)

    def update_many(
        self, batch: list[tuple[Node, Tensor, dict[str, Any], int]], group: dict[str, Any], hyper: Tensor
    ) -> None:
        momentum = group["momentum"] != 0
        for bucket in by_dtype(batch):
            bufs = []
            for param, _, state, _ in bucket:
                buf = state.get("momentum_buffer")
                if buf is None and momentum:
                    buf = state["momentum_buffer"] = Tensor.zeros(param.shape, param.dtype, param.device)
                bufs.append(buf)
            if any(b is not None for b in bufs) and not all(b is not None for b in bufs):
                for (param, grad, _state, index), buf in zip(bucket, bufs, strict=True):  # mixed: loaded state
                    sgd_step_(param.value, grad, buf, self.steps, index, hyper, self.skip_flag)
                continue
            params = [item[0].value for item in bucket]
            grads = [item[1] for item in bucket]
            sgd_multi_step_(params, grads, bufs, self.steps, [item[3] for item in bucket], hyper, self.skip_flag)
