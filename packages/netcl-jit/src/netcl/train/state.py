"""What a Trainer checkpoint holds and how it loads: the model's and optimizer's state as tensors, the
rest (groups, scheduler, scaler, RNG, position, replay state) as JSON; checks that name what differs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.optim.optimizer import Optimizer
from netcl.runtime.ops import random
from netcl.train.checkpoint import CheckpointError


def trainer_state(trainer: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, JSON state) of a Trainer: what ``Trainer.save`` writes."""
    tensors: dict[str, np.ndarray] = {}
    for name, value in _model_state(trainer.model).items():
        tensors[f"model/{name}"] = value.to_host()
    opt_state = trainer.optimizer.state_dict()
    saved_state: dict[str, dict[str, Any]] = {}
    for index, entries in opt_state["state"].items():
        scalars = {}
        for key, value in entries.items():
            if isinstance(value, np.ndarray):
                tensors[f"optimizer/{index}/{key}"] = value
            else:
                scalars[key] = value
        saved_state[str(index)] = scalars
    state = {
        "model_class": type(trainer.model).__name__,
        "optimizer_class": type(trainer.optimizer).__name__,
        "optimizer": {"state": saved_state, "param_groups": opt_state["param_groups"]},
        "scheduler": None if trainer.scheduler is None else _jsonable(trainer.scheduler.state_dict()),
        "scaler": None if trainer.scaler is None else trainer.scaler.state_dict(),
        "rng": random.get_rng_state(),
        "loader_seed": trainer._loader_seed,
        "position": {
            "epoch": trainer.epoch,
            "batch_in_epoch": trainer.batch_in_epoch,
            "global_step": trainer.global_step,
        },
        "signatures": dict(trainer._signatures),
        "graph": None
        if trainer._graph_signature is None
        else {**trainer._graph_info, "signature": trainer._graph_signature, "runs": trainer._graph_runs},
    }
    if trainer._graph is None and trainer._resume_graph is not None:  # resumed, not yet captured again
        state["graph"] = dict(trainer._resume_graph)
    return tensors, state


def load_trainer_state(trainer: Any, tensors: dict[str, np.ndarray], state: dict[str, Any], path: str) -> None:
    """Check a checkpoint's ``tensors`` and ``state`` against the Trainer ``trainer`` (raising before anything
    changes), then load them into its model, optimizer, scheduler, scaler, the global RNG and its position."""
    try:
        model_arrays = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
        opt_arrays = {k[len("optimizer/") :]: v for k, v in tensors.items() if k.startswith("optimizer/")}
        optimizer_state = _optimizer_state(state["optimizer"], opt_arrays)
        position = state["position"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path!r} lacks a part of the Trainer state: {exc!r}") from exc
    own = _model_state(trainer.model)
    missing = sorted(set(own) - set(model_arrays))
    unexpected = sorted(set(model_arrays) - set(own))
    reshaped = sorted(k for k in set(own) & set(model_arrays) if tuple(own[k].shape) != model_arrays[k].shape)
    if missing or unexpected or reshaped:
        parts = [
            f"{what} {keys}"
            for what, keys in (
                ("keys missing from the checkpoint", missing),
                ("keys only in the checkpoint", unexpected),
                ("keys of another shape", reshaped),
            )
            if keys
        ]
        raise KeyError(
            f"Trainer.resume: the checkpoint {path!r} holds another model ({state.get('model_class')}): "
            + "; ".join(parts)
            + "; nothing was loaded"
        )
    _check_optimizer(trainer.optimizer, optimizer_state, state.get("optimizer_class"), path)
    if (state.get("scheduler") is None) != (trainer.scheduler is None):
        raise KeyError(
            f"Trainer.resume: the checkpoint {path!r} has "
            f"{'no' if state.get('scheduler') is None else 'a'} scheduler, this Trainer "
            f"{'has one' if trainer.scheduler is not None else 'has none'}; nothing was loaded"
        )
    if (state.get("scaler") is None) != (trainer.scaler is None):
        raise KeyError(f"Trainer.resume: amp differs between the checkpoint {path!r} and this Trainer")
    # every check passed: load
    trainer.model.load_state_dict(model_arrays)
    trainer.optimizer.load_state_dict(optimizer_state)
    if trainer.scheduler is not None:
        trainer.scheduler.load_state_dict(dict(state["scheduler"]))
        trainer.optimizer.sync_hyperparameters()
    if trainer.scaler is not None:
        trainer.scaler.load_state_dict(state["scaler"])
    random.set_rng_state(state["rng"])
    trainer._loader_seed = trainer._resume_loader_seed = state.get("loader_seed")
    trainer.epoch = int(position["epoch"])
    trainer.batch_in_epoch = int(position["batch_in_epoch"])
    trainer.global_step = int(position["global_step"])
    trainer._signatures = {str(k): int(v) for k, v in state.get("signatures", {}).items()}
    graph = state.get("graph")
    trainer._graph, trainer._resume_graph = None, graph
    trainer._graph_signature = None if graph is None else graph["signature"]


def _model_state(model: Any) -> dict[str, Tensor]:
    return {name: value.value if isinstance(value, Node) else value for name, value in model.state_dict().items()}


def _optimizer_state(saved: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The optimizer state_dict a checkpoint holds (its scalars from JSON, its buffers from tensors)."""
    state: dict[int, dict[str, Any]] = {}
    for index, scalars in saved["state"].items():
        state[int(index)] = dict(scalars)
    for key, array in arrays.items():
        index, name = key.split("/", 1)
        state.setdefault(int(index), {})[name] = array
    return {"state": state, "param_groups": [dict(g) for g in saved["param_groups"]]}


def _check_optimizer(optimizer: Optimizer, saved: Mapping[str, Any], saved_class: Any, path: str) -> None:
    """Raise ``KeyError`` naming what differs between ``optimizer`` and a saved state_dict's layout."""
    problems = []
    if saved_class is not None and saved_class != type(optimizer).__name__:
        problems.append(f"class {saved_class} in the checkpoint, {type(optimizer).__name__} here")
    groups = saved["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        problems.append(f"{len(groups)} parameter groups in the checkpoint, {len(optimizer.param_groups)} here")
    else:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, (mine, theirs) in enumerate(zip(optimizer.param_groups, groups, strict=True)):
            if len(mine["params"]) != len(theirs["params"]):
                problems.append(f"group {i} has {len(theirs['params'])} parameters in the checkpoint, "
                                f"{len(mine['params'])} here")  # fmt: skip
            keys = set(mine) - {"params", "initial_lr"}
            other = set(theirs) - {"params", "initial_lr"}
            if keys != other:
                problems.append(f"group {i} hyperparameter keys differ: {sorted(keys ^ other)}")
        order = [int(i) for g in groups for i in g["params"]]
        if not problems:
            for index, entries in saved["state"].items():
                position = order.index(int(index)) if int(index) in order else None
                if position is None:
                    problems.append(f"state for parameter {index}, which no group lists")
                    continue
                p = params[position]
                for name in optimizer.state_names:
                    value = entries.get(name)
                    if value is not None and tuple(np.shape(value)) != tuple(p.shape):
                        problems.append(f"state {index}/{name}: shape {tuple(np.shape(value))} vs {tuple(p.shape)}")
                unknown = set(entries) - {"step", *optimizer.state_names}
                if unknown:
                    problems.append(f"state {index} has keys {sorted(unknown)} that {type(optimizer).__name__} lacks")
    if problems:
        raise KeyError(
            f"Trainer.resume: the checkpoint {path!r} holds another optimizer: " + "; ".join(problems)
            + "; nothing was loaded"
        )  # fmt: skip


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.generic,)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"Trainer.save: cannot store {type(value).__name__} {value!r} in a checkpoint's JSON state")
