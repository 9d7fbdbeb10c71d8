"""``Optimizer``: parameter groups, per-parameter state and the device-side step bookkeeping.

The updates are fused in-place kernels (``netcl.runtime.ops.optim_kernels``): SGD and Adam/AdamW
update all parameters of a group and dtype with one multi-tensor launch per 16 or 32 of them (as the
device's kernel arguments have room: ``optim_kernels.update_arity``). What an update reads that changes
from step to step lives on the device: every group's hyperparameters in a small float32 buffer (rewritten
from ``param_groups`` whenever a value changed: at ``step()``, when an LR scheduler steps, and before each
replay of a captured step) and one int32 step count per parameter, advanced by a launch after the updates.
So a step captured in a ``CompiledGraph`` / ``fuse_graph`` replays like eager steps: Adam's bias correction and SGD's
first momentum step follow the replays, and a new learning rate, from a scheduler or written into
``param_groups`` by hand, reaches the next replay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from netcl.autograd.engine import Node
from netcl.core import Device, DeviceError, Tensor
from netcl.runtime.capture import record_host_step
from netcl.runtime.ops import pointwise
from netcl.runtime.ops.optim_kernels import count_steps_
from netcl.runtime.ops.upload import write_


def by_dtype(batch: list[tuple[Node, Tensor, dict[str, Any], int]]) -> list[list[tuple[Node, Tensor, dict, int]]]:
    """``batch`` split by parameter dtype (a multi-tensor launch updates one dtype), order kept."""
    buckets: dict[Any, list[tuple[Node, Tensor, dict, int]]] = {}
    for item in batch:
        buckets.setdefault(item[0].value.dtype, []).append(item)
    return list(buckets.values())


def non_negative(owner: str, group: dict[str, Any], names: tuple[str, ...]) -> None:
    """A ValueError naming ``owner`` and the first of ``names`` in ``group`` that is not a number >= 0."""
    for name in names:
        value = group[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{owner}: {name} must be a number >= 0, got {value!r}")


def clear_grad(param: Node, set_to_none: bool = True) -> None:
    """Drop ``param``'s gradient (None), or make it zeros with ``set_to_none=False``."""
    if set_to_none or param.grad is None:
        param.grad, param._grad_owned = None, False
    elif param._grad_owned:
        pointwise.fill_(param.grad, 0.0)
    else:  # the buffer may be shared with another node: give this parameter its own zeros
        param.grad, param._grad_owned = Tensor.zeros(param.grad.shape, param.grad.dtype, param.grad.device), True
    param.value.grad = param.grad


class Optimizer:
    """Base class: ``params`` is an iterable of Parameters (leaf Nodes) or of dicts (parameter groups
    with their own hyperparameters, e.g. ``[{"params": a}, {"params": b, "lr": 1e-3}]``)."""

    #: Names of the hyperparameters the update kernel reads from a group's device buffer, in order.
    hyper_names: tuple[str, ...] = ()
    #: Whether the updates honour ``skip_flag`` (``step(skip_if=...)``): SGD, Adam and AdamW do.
    skips_on_device: bool = False

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        #: per-parameter state (buffers), keyed by the Parameter object
        self.state: dict[Node, dict[str, Any]] = {}
        self._index: dict[Node, int] = {}
        self._device: Device | None = None
        self._steps: Tensor | None = None
        self._hyper: list[tuple[tuple[float, ...], Tensor] | None] = []
        #: during ``step(skip_if=flag)``: the flag the update kernels read (None otherwise)
        self.skip_flag: Tensor | None = None
        self._masks: dict[tuple[bool, ...], Tensor] = {}
        items = list(params) if not isinstance(params, (Node, Tensor)) else None
        if items is None:
            raise TypeError("optimizer params must be an iterable of Parameters or dicts, got a single tensor")
        if not items:
            raise ValueError("optimizer got an empty parameter list")
        groups = items if isinstance(items[0], Mapping) else [{"params": items}]
        for group in groups:
            self.add_param_group(group)

    # ---- parameter groups ----------------------------------------------------------------------
    def add_param_group(self, group: Mapping[str, Any]) -> None:
        """Add a group: ``{"params": [...], **hyperparameters}`` (missing ones take the defaults)."""
        if not isinstance(group, Mapping) or "params" not in group:
            raise TypeError(f"a parameter group must be a dict with a 'params' entry, got {group!r}")
        params = group["params"]
        params = [params] if isinstance(params, Node) else list(params)
        for i, p in enumerate(params):
            if not isinstance(p, Node):
                raise TypeError(f"parameter {i} of group {len(self.param_groups)} is a {type(p).__name__}, not a Node")
            if not p.is_leaf:  # a frozen leaf (requires_grad False) is accepted and skipped while it has no grad
                raise ValueError(
                    f"parameter {i} of group {len(self.param_groups)} must be a leaf (a Parameter), not an op's result"
                )
            if p in self._index:
                raise ValueError("a parameter appears in more than one parameter group (or twice in one)")
            if self._device is None:
                self._device = p.device
            elif p.device is not self._device:
                raise DeviceError(f"optimizer parameters live on two devices: {self._device!r} and {p.device!r}")
            self._index[p] = len(self._index)
        unknown = set(group) - set(self.defaults) - {"params", "initial_lr"}
        if unknown:
            raise TypeError(f"unknown hyperparameter(s) {sorted(unknown)} for {type(self).__name__}")
        full = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}, "params": params}
        self.check_hyperparameters(full)
        self.param_groups.append(full)
        self._hyper.append(None)
        self._grow_steps()

    def check_hyperparameters(self, group: dict[str, Any]) -> None:
        """Raise ``ValueError`` naming a bad hyperparameter (subclasses)."""

    def _grow_steps(self) -> None:
        old = self._steps.to_host() if self._steps is not None else np.zeros(0, np.int32)
        counts = np.zeros(len(self._index), np.int32)
        counts[: old.size] = old
        self._steps = Tensor.from_host(self._device, counts)
        self._masks.clear()

    # ---- device-side hyperparameters and step counts -----------------------------------------------
    def hyper_values(self, group: dict[str, Any]) -> tuple[float, ...]:
        """The group's hyperparameters in ``hyper_names`` order, as floats (subclasses may map names)."""
        return tuple(float(group[name]) for name in self.hyper_names)

    def sync_hyperparameters(self) -> None:
        """Upload every group's hyperparameters that changed since the last upload (a host copy, never
        captured: a replayed step reads the buffer and sees the new values)."""
        for group in self.param_groups:  # every group checked before any upload: a bad value changes nothing
            self.check_hyperparameters(group)
        for i, group in enumerate(self.param_groups):
            values = self.hyper_values(group)
            current = self._hyper[i]
            if current is None:
                self._hyper[i] = (values, Tensor.from_host(self._device, np.asarray(values, np.float32)))
            elif current[0] != values:
                write_(current[1], np.asarray(values, np.float32))
                self._hyper[i] = (values, current[1])

    def group_hyper(self, group_index: int) -> Tensor:
        entry = self._hyper[group_index]
        assert entry is not None, "sync_hyperparameters() runs before the updates"
        return entry[1]

    @property
    def steps(self) -> Tensor:
        """The per-parameter step counts (int32, on the parameters' device)."""
        assert self._steps is not None
        return self._steps

    def _count(self, updated: tuple[bool, ...]) -> None:
        mask = self._masks.get(updated)
        if mask is None:
            mask = self._masks[updated] = Tensor.from_host(self._device, np.asarray(updated, np.uint8))
        count_steps_(self.steps, mask, self.skip_flag)

    # ---- stepping ------------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None, *, skip_if: Tensor | None = None) -> Any:
        """Update every parameter that has a gradient, then advance their step counts.

        The parameters of a group that have a gradient go to ``update_many`` together: SGD and
        Adam/AdamW update them with multi-tensor kernels (one launch per dtype and up to
        ``optim_kernels.update_arity`` parameters), a parameter's bits the same in any launch. ``skip_if``: one
        int32 on the device (``GradScaler``'s inf/NaN flag); where it is non-zero the kernels change
        nothing, parameters, state and step counts alike, with no host read (``skips_on_device``
        optimizers only; torch's fused optimizers take ``found_inf`` alike).
        """
        if skip_if is not None and not self.skips_on_device:
            raise TypeError(f"{type(self).__name__}.step: skip_if needs an optimizer whose kernels read it")
        loss = closure() if closure is not None else None
        self.skip_flag = skip_if
        try:
            self._step()
        finally:
            self.skip_flag = None
        return loss

    def follow_parameters(self) -> None:
        """Move the optimizer's device state (step counts, hyperparameters, per-parameter buffers) to the
        parameters' device when ``Module.to`` moved them (in place) after the optimizer was built, as a
        torch optimizer keeps working; raises ``DeviceError`` if the parameters now live on two devices."""
        params = [p for g in self.param_groups for p in g["params"]]
        device = params[0].device
        if device is self._device:
            return
        for i, p in enumerate(params):
            if p.device is not device:
                raise DeviceError(f"optimizer parameters live on two devices: {device!r} and {p.device!r} (param {i})")
        self._device = device
        self._steps = self.steps.to(device)
        self._hyper = [None if h is None else (h[0], h[1].to(device)) for h in self._hyper]
        self._masks.clear()
        for entries in self.state.values():
            for name, value in entries.items():
                if isinstance(value, Tensor):
                    entries[name] = value.to(device)

    def _step(self) -> None:
        self.follow_parameters()
        self.sync_hyperparameters()
        if self._device.kind == "opencl":  # a captured step uploads what changed before each replay
            record_host_step(self._device.queue, self.sync_hyperparameters)
        updated = [False] * len(self._index)
        for group_index, group in enumerate(self.param_groups):
            batch: list[tuple[Node, Tensor, dict[str, Any], int]] = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                index = self._index[p]
                if p.grad.shape != p.shape or p.grad.device is not p.device:
                    raise ValueError(f"parameter {index}: gradient {p.grad.shape} on {p.grad.device!r} does not match")
                batch.append((p, p.grad, self.state.setdefault(p, {}), index))
                updated[index] = True
            if batch:
                self.update_many(batch, group, self.group_hyper(group_index))
        if any(updated):
            self._count(tuple(updated))

    def update_many(
        self, batch: list[tuple[Node, Tensor, dict[str, Any], int]], group: dict[str, Any], hyper: Tensor
    ) -> None:
        """Update each (param, grad, state, index) of one group; by default one ``update`` each."""
        for param, grad, state, index in batch:
            self.update(param, grad, state, group, index, hyper)

    def update(
        self, param: Node, grad: Tensor, state: dict[str, Any], group: dict[str, Any], index: int, hyper: Tensor
    ) -> None:
        raise NotImplementedError

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of every parameter (None, or zeros with ``set_to_none=False``)."""
        for group in self.param_groups:
            for p in group["params"]:
                clear_grad(p, set_to_none)

    # ---- state dicts ---------------------------------------------------------------------------
    #: names of the per-parameter state buffers (saved and loaded by state_dict)
    state_names: tuple[str, ...] = ()

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's layout: ``{"state": {index: {"step": float, name: array}}, "param_groups": [...]}``
        with NumPy copies of the buffers and parameters referred to by their index."""
        counts = self.steps.to_host()
        state: dict[int, dict[str, Any]] = {}
        for p, entries in self.state.items():
            index = self._index[p]
            saved: dict[str, Any] = {"step": float(counts[index])}
            for name in self.state_names:
                if entries.get(name) is not None:
                    saved[name] = entries[name].to_host()
            state[index] = saved
        groups = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": [self._index[p] for p in g["params"]]}
            for g in self.param_groups
        ]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned (group sizes and buffer shapes must match); checked first."""
        if not isinstance(state_dict, Mapping) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("optimizer state_dict must be a dict with 'state' and 'param_groups'")
        groups = list(state_dict["param_groups"])
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(groups)} parameter groups, this optimizer {len(self.param_groups)}")
        order = [p for g in self.param_groups for p in g["params"]]
        saved_order = [int(i) for g in groups for i in g["params"]]
        for mine, theirs in zip(self.param_groups, groups, strict=True):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError(
                    f"a parameter group has {len(theirs['params'])} parameters in the state_dict and "
                    f"{len(mine['params'])} here"
                )
        by_saved = dict(zip(saved_order, order, strict=True))
        staged: list[tuple[Node, dict[str, np.ndarray], int]] = []
        for key, entries in dict(state_dict["state"]).items():
            p = by_saved.get(int(key))
            if p is None:
                raise ValueError(f"state_dict has state for parameter {key}, which no group lists")
            arrays = {}
            for name in self.state_names:
                if name in entries:
                    host = _host(entries[name])
                    if host.shape != p.shape:
                        raise ValueError(
                            f"state {name!r} of parameter {key} has shape {host.shape}, expected {p.shape}"
                        )
                    arrays[name] = host
            staged.append((p, arrays, int(float(_host(entries.get("step", 0))))))
        counts = np.zeros(len(self._index), np.int32)
        loaded = {p: arrays for p, arrays, _ in staged}
        for p, _, step in staged:
            counts[self._index[p]] = step
        self.state = {p: self._loaded_state(p, loaded.get(p, {})) for p in order if p in self.state or p in loaded}
        write_(self.steps, counts)
        for mine, theirs in zip(self.param_groups, groups, strict=True):
            mine.update({k: v for k, v in theirs.items() if k != "params"})
        self.sync_hyperparameters()

    def _loaded_state(self, p: Node, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        """``p``'s state after ``load_state_dict``: each loaded array written into the buffer ``p`` already has
        (a captured step's update kernels keep reading that buffer, so a replay continues from what was
        loaded), a new buffer where it has none, and a buffer the state_dict lacks zeroed (fresh state, which
        the step count 0 also says)."""
        state = {}
        for name, buffer in self.state.get(p, {}).items():
            if not isinstance(buffer, Tensor):
                continue
            if name in arrays:
                write_(buffer, arrays[name])
            else:
                pointwise.fill_(buffer, 0.0)
            state[name] = buffer
        for name, array in arrays.items():
            if name not in state:
                state[name] = Tensor.from_host(p.device, array, p.dtype)
        return state

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines.extend(f"    {k}: {v}" for k, v in sorted(group.items()) if k != "params")
        return "\n".join([*lines, ")"])


def _host(value: Any) -> np.ndarray:
    if isinstance(value, Node):
        value = value.value
    if isinstance(value, Tensor):
        return value.to_host()
    detach = getattr(value, "detach", None)
    if callable(detach) and hasattr(value, "cpu"):
        value = detach().cpu().numpy()
    return np.asarray(value)
