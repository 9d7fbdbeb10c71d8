"""``GradScaler``: dynamic loss scaling for float16 training (torch.amp.GradScaler's rules)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.runtime.capture import is_recording, paused
from netcl.runtime.ops import pointwise
from netcl.runtime.ops.amp_kernels import ALWAYS, IF_FOUND, ZERO_IF_FOUND, copy_if_, unscale_many_, update_scale_
from netcl.runtime.ops.upload import write_


class GradScaler:
    """Multiply the loss by ``scale`` before backward so float16 gradients do not underflow; ``step``
    divides the gradients by it and skips the optimizer step when any is inf/NaN; ``update`` halves
    the scale after such a step (``backoff_factor``) and doubles it (``growth_factor``) after
    ``growth_interval`` clean steps in a row.

    ``scaler.scale_loss(loss)`` -> backward -> ``scaler.step(opt, params)`` -> ``scaler.update()``.

    The scale, the clean-step count and the inf/NaN flag live on the device (made at the first
    ``scale_loss`` or ``step``), as torch's do. With netcl's optimizers (SGD, Adam, AdamW:
    ``skips_on_device``) ``step`` hands the flag to the update kernels, which change nothing where it
    is up: a step reads nothing back to the host (torch's fused optimizers work so), and ``step``
    returns the optimizer's value. With another optimizer ``step`` reads the flag and returns None
    for a skipped step, unless ``capturable=True``: then the parameters, the optimizer's state tensors
    and its step counts are snapshot before ``optimizer.step()`` and restored on the device where the
    flag is up (state the step created is zeroed). Either way a step captured with ``fuse_graph`` /
    ``CompiledGraph`` replays the whole schedule; inside a capture the optimizer's lazy state is
    created first, with the recording paused. ``unscale_`` returns whether a gradient is inf/NaN
    (``capturable=True``: the flag tensor, no host read); ``get_scale()`` reads the scale back.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        capturable: bool = False,
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
        self.capturable = bool(capturable)
        #: the scale, clean-step count and inf/NaN flag on the device, made by the first scale_loss or step; each
        #: its own attribute, so the scale a compiled step multiplies in is one step from the scaler for its guard
        #: (``netcl.jit.guards``, a walk of bounded depth from the step's function)
        self._scale_tensor: Tensor | None = None
        self._tracker_tensor: Tensor | None = None
        self._found_tensor: Tensor | None = None
        #: capturable, another optimizer: id of a snapshot tensor -> (the tensor, its backup buffer)
        self._backups: dict[int, tuple[Tensor, Tensor]] = {}
        self._unscaled = False
        self._primed: set[int] = set()
        self._up: Tensor | None = None

    def get_scale(self) -> float:
        """The current scale (read back from the device once it lives there)."""
        if not self.enabled:
            return 1.0
        if self._scale_tensor is not None:
            return float(np.asarray(self._scale_tensor.to_host()).reshape(-1)[0])
        return self._scale

    def is_enabled(self) -> bool:
        return self.enabled

    def scale_loss(self, loss: Node) -> Node:
        """``loss * scale`` (the loss itself when disabled)."""
        if not isinstance(loss, Node):
            raise TypeError(f"scale_loss: expected a Node, got {type(loss).__name__}")
        if not self.enabled:
            return loss
        return ag.mul(loss, self._state(loss.device)[0])

    scale = scale_loss

    def unscale_(self, optimizer: Any, params: Iterable[Node] | None = None) -> bool | Tensor | None:
        """Divide the gradients of ``params`` (default: the optimizer's) by the scale in place; True if
        any gradient holds inf/NaN (``capturable=True``: the int32 flag tensor, or None without
        gradients). Runs once per iteration (a second call returns the first result)."""
        if not self.enabled:
            return False
        found = self._unscale_on_device(optimizer, params)
        if self.capturable:
            return found
        return found is not None and _is_up(found)

    def step(self, optimizer: Any, params: Iterable[Node] | None = None) -> Any:
        """Unscale the gradients (unless ``unscale_`` did), then ``optimizer.step()`` unless one is inf/NaN.

        Returns the optimizer's return value; None for a step skipped by a host read (an optimizer
        without ``skips_on_device``, ``capturable=False``).
        """
        if not self.enabled:
            return optimizer.step()
        found = self._unscale_on_device(optimizer, params)
        if found is None:
            return optimizer.step()
        if getattr(optimizer, "skips_on_device", False):
            self._prime_skipping(optimizer, found.device)
            return optimizer.step(skip_if=found)
        if self.capturable:
            return self._step_with_snapshots(optimizer, found)
        if _is_up(found):
            return None
        return optimizer.step()

    def update(self, new_scale: float | None = None) -> None:
        """Back off after a skipped step, grow after ``growth_interval`` clean ones (or set ``new_scale``)."""
        if not self.enabled:
            return
        if self._scale_tensor is None:  # nothing scaled or unscaled yet: the host values
            if new_scale is not None:
                self._scale = float(new_scale)
            return
        scale, tracker, found = self._scale_tensor, self._tracker_tensor, self._found_tensor
        if new_scale is not None:
            write_(scale, np.float32(new_scale))
        elif self._unscaled:
            update_scale_(scale, tracker, found, self.growth_factor, self.backoff_factor, self.growth_interval)
        self._unscaled = False

    # ---- on the device -------------------------------------------------------------------------------
    def _state(self, device: Any) -> tuple[Tensor, Tensor, Tensor]:
        if self._scale_tensor is None:
            self._scale_tensor = Tensor.from_host(device, np.asarray(self._scale, np.float32))
            self._tracker_tensor = Tensor.from_host(device, np.asarray(self._growth_tracker, np.int32))
            self._found_tensor = Tensor.zeros((1,), np.int32, device)
        elif self._scale_tensor.device is not device:
            raise ValueError(f"GradScaler lives on {self._scale_tensor.device!r}, got {device!r}")
        return self._scale_tensor, self._tracker_tensor, self._found_tensor

    def _unscale_on_device(self, optimizer: Any, params: Iterable[Node] | None) -> Tensor | None:
        chosen = _params(optimizer, params)
        grads, seen = [], set()
        for p in chosen:
            if p.grad is not None and id(p.grad.data) not in seen:  # a buffer shared by two params once
                seen.add(id(p.grad.data))
                grads.append(p.grad)
        if not grads:
            return None
        scale, _, found = self._state(grads[0].device)
        if not self._unscaled:
            pointwise.fill_(found, 0)
            unscale_many_(grads, scale, found)
            self._unscaled = True
        return found

    def _prime_skipping(self, optimizer: Any, device: Any) -> None:
        """Inside a capture, once per parameter: a step under a raised flag (recording paused) makes the
        optimizer's lazy state and changes nothing, so no recorded command creates state."""
        if device.kind != "opencl" or not is_recording(device.queue) or not self._unprimed(optimizer):
            return
        if self._up is None:
            self._up = Tensor.from_host(device, np.ones(1, np.int32))
        with paused(device.queue):
            optimizer.step(skip_if=self._up)

    def _step_with_snapshots(self, optimizer: Any, found: Tensor) -> Any:
        self._prime(optimizer, found)
        before = self._optimizer_tensors(optimizer)
        for t in before:
            copy_if_(self._backup(t), t, found, ALWAYS)
        result = optimizer.step()
        for t in before:
            copy_if_(t, self._backups[id(t)][1], found, IF_FOUND)
        known = {id(t) for t in before}
        for t in self._optimizer_tensors(optimizer):
            if id(t) not in known:  # state the step created: fresh state is zeros
                copy_if_(t, None, found, ZERO_IF_FOUND)
        return result

    def _prime(self, optimizer: Any, found: Tensor) -> None:
        """Inside a capture, once: make the optimizer create its lazy state (one step, undone), with the
        recording paused, so the recorded snapshot covers that state and a replayed skip restores it."""
        device = found.device
        if device.kind != "opencl" or not is_recording(device.queue) or not self._unprimed(optimizer):
            return
        with paused(found.device.queue):
            before = self._optimizer_tensors(optimizer)
            for t in before:
                copy_if_(self._backup(t), t, found, ALWAYS)
            optimizer.step()
            for t in before:
                copy_if_(t, self._backups[id(t)][1], found, ALWAYS)
            known = {id(t) for t in before}
            for t in self._optimizer_tensors(optimizer):
                if id(t) not in known:
                    pointwise.fill_(t, 0)

    def _unprimed(self, optimizer: Any) -> bool:
        """Whether a parameter with a gradient has no optimizer state yet and was not primed; marks
        such parameters primed."""
        fresh = [
            id(p)
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None and not optimizer.state.get(p) and id(p) not in self._primed
        ]
        self._primed.update(fresh)
        return bool(fresh)

    def _backup(self, t: Tensor) -> Tensor:
        entry = self._backups.get(id(t))
        if entry is None or entry[0] is not t:
            entry = self._backups[id(t)] = (t, Tensor.empty(t.shape, t.dtype, t.device))
        return entry[1]

    @staticmethod
    def _optimizer_tensors(optimizer: Any) -> list[Tensor]:
        """What ``optimizer.step()`` writes: its parameters, their state tensors and the step counts."""
        tensors: list[Tensor] = []
        for group in getattr(optimizer, "param_groups", []):
            for p in group["params"]:
                tensors.append(p.value)
                state = getattr(optimizer, "state", {}).get(p, {})
                tensors.extend(v for v in state.values() if isinstance(v, Tensor))
        steps = getattr(optimizer, "_steps", None)
        if isinstance(steps, Tensor):
            tensors.append(steps)
        return tensors

    def state_dict(self) -> dict[str, Any]:
        if self._scale_tensor is not None:
            self._scale = self.get_scale()
            self._growth_tracker = int(np.asarray(self._tracker_tensor.to_host()).reshape(-1)[0])
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
        if self._scale_tensor is not None:
            write_(self._scale_tensor, np.float32(self._scale))
            write_(self._tracker_tensor, np.int32(self._growth_tracker))

    def __repr__(self) -> str:
        capturable = ", capturable=True" if self.capturable else ""
        tracker = self._growth_tracker
        return f"GradScaler(scale={self._scale}, growth_tracker={tracker}, enabled={self.enabled}{capturable})"


def _params(optimizer: Any, params: Iterable[Node] | None) -> list[Node]:
    if params is not None:
        return list(params)
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(f"GradScaler: cannot find parameters of {type(optimizer).__name__}; pass params=")
    return [p for g in groups for p in g["params"]]


def _is_up(flag: Tensor) -> bool:
    """The inf/NaN flag read back to the host (waits for the work before it)."""
    return bool(np.asarray(flag.to_host()).reshape(-1)[0])
