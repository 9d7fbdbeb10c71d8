"""``Trainer``: the training loop a PyTorch user writes by hand, with graph replay and exact resumption.

A step is ``loss = loss_fn(model(x), target)``, its backward, then (every ``grad_accum_steps``
batches) the optional gradient clipping and the optimizer's step. ``replay="auto"`` captures that
step with ``netcl.jit.fuse_graph`` the second time a batch signature (shapes and dtypes) is seen and
replays it for every later batch of that signature; other signatures (a short last batch) run
eagerly. Losses go into a device-side log (``netcl.runtime.ops.scalar_log``) read once per epoch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from netcl.amp import GradScaler, autocast
from netcl.autograd.engine import Node, Tape, no_grad
from netcl.core import Device, Tensor, get_device
from netcl.jit.graph_fusion import FusedGraph, fuse_graph
from netcl.nn.utils import clip_grad_norm_
from netcl.optim.optimizer import Optimizer
from netcl.runtime.ops import random
from netcl.runtime.ops.layout import copy as device_copy
from netcl.runtime.ops.scalar_log import log_scalar_
from netcl.runtime.ops.upload import write_
from netcl.train import loaders
from netcl.train.callbacks import Callback
from netcl.train.checkpoint import read_checkpoint, write_checkpoint
from netcl.train.progress import Progress
from netcl.train.state import load_trainer_state, trainer_state

REPLAY_MODES = ("auto", "off")


class Trainer:
    """Train ``model`` with ``optimizer`` on ``loss_fn(model(x), target)``; see ``fit``.

    ``scheduler``: an LR scheduler stepped once per epoch. ``amp``: forward under
    ``netcl.amp.autocast`` with a ``GradScaler`` (loss scaling, inf/NaN steps skipped on the device).
    ``grad_accum_steps``: gradients of that many batches are summed (each loss divided by it) before
    one optimizer step (these steps run eagerly). ``clip_grad_norm``: the ``max_norm`` of
    ``netcl.nn.utils.clip_grad_norm_`` applied before every optimizer step. ``replay``: ``"auto"``
    (capture and replay the step, see the module docstring) or ``"off"`` (``False``) for eager steps.
    ``device``: moves the model there (``Module.to``; the optimizer follows). ``progress``: a tqdm
    bar per epoch (None: only when stderr is a terminal). ``log_path``: a JSONL file that gets one
    line per epoch (appended). Under MPI (``netcl.runtime.distributed`` initialized with more than
    one rank) the model is wrapped in ``DistributedDataParallel`` and loaders get a
    ``DistributedSampler``.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Optimizer,
        loss_fn: Callable[[Node, Any], Node],
        scheduler: Any = None,
        amp: bool = False,
        grad_accum_steps: int = 1,
        clip_grad_norm: float | None = None,
        replay: str | bool = "auto",
        device: Device | str | None = None,
        *,
        progress: bool | None = None,
        log_path: str | os.PathLike | None = None,
    ) -> None:
        if not callable(model) or not hasattr(model, "parameters"):
            raise TypeError(f"Trainer: model must be a Module (callable with parameters()), got {type(model).__name__}")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"Trainer: optimizer must be a netcl.optim Optimizer, got {type(optimizer).__name__}")
        if not callable(loss_fn):
            raise TypeError(f"Trainer: loss_fn must be callable (output, target) -> loss Node, got {loss_fn!r}")
        if scheduler is not None and getattr(scheduler, "optimizer", optimizer) is not optimizer:
            raise ValueError("Trainer: the scheduler steps another optimizer than the one given")
        if not isinstance(amp, bool):
            raise TypeError(f"Trainer: amp must be a bool, got {amp!r}")
        if isinstance(grad_accum_steps, bool) or not isinstance(grad_accum_steps, int) or grad_accum_steps < 1:
            raise ValueError(f"Trainer: grad_accum_steps must be an int >= 1, got {grad_accum_steps!r}")
        if clip_grad_norm is not None and (
            isinstance(clip_grad_norm, bool) or not isinstance(clip_grad_norm, (int, float)) or not clip_grad_norm > 0
        ):
            raise ValueError(f"Trainer: clip_grad_norm must be a number > 0 or None, got {clip_grad_norm!r}")
        if replay is True:
            replay = "auto"
        elif replay is False:
            replay = "off"
        if replay not in REPLAY_MODES:
            raise ValueError(f"Trainer: replay must be one of {REPLAY_MODES} (or a bool), got {replay!r}")
        if device is not None:
            model.to(device)
        params = list(model.parameters())
        if not params:
            raise ValueError("Trainer: the model has no parameters to train")
        self.device: Device = params[0].device if device is None else get_device(device)
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.scheduler = scheduler
        self.amp = amp
        self.scaler: GradScaler | None = GradScaler(capturable=True) if amp else None
        self.grad_accum_steps = grad_accum_steps
        self.clip_grad_norm = None if clip_grad_norm is None else float(clip_grad_norm)
        self.replay = replay
        self.progress = progress
        self.log_path = None if log_path is None else os.fspath(log_path)
        self.network = loaders.wrap_distributed(model)
        #: epochs completed; the next ``fit`` epoch is this one
        self.epoch = 0
        #: batches of the current epoch already trained (non-zero only mid-epoch, e.g. in a step callback)
        self.batch_in_epoch = 0
        #: optimizer steps taken
        self.global_step = 0
        #: the last step's values for callbacks: {"epoch", "batch", "step"}
        self.last_step: dict[str, int] = {}
        #: set by a callback to end training: the current epoch ends after this step (its scheduler step,
        #: validation and epoch callbacks run, and it counts as complete), then ``fit`` returns
        self.should_stop = False
        self._signatures: dict[str, int] = {}
        self._graph: FusedGraph | None = None
        self._graph_signature: str | None = None
        self._graph_runs = 0
        self._graph_info: dict[str, Any] = {}
        self._resume_graph: dict[str, Any] | None = None
        self._loader_seed: int | None = None
        self._resume_loader_seed: int | None = None
        self._log: Tensor | None = None
        self._position: Tensor | None = None
        self._ones = Tensor.from_host(self.device, np.ones(1, np.float32))
        self._divisor: Tensor | None = None

    # ---- training ----------------------------------------------------------------------------------
    def fit(
        self,
        train_loader: Iterable[Any],
        epochs: int,
        val_loader: Iterable[Any] | None = None,
        metrics: Mapping[str, Callable[[Node, Any], Any]] | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> dict[str, list[float]]:
        """Train until ``epochs`` epochs are complete, counted from the start of training (a resumed
        Trainer continues where its checkpoint stopped; nothing runs when they are already done).

        ``train_loader``: a ``netcl.data.DataLoader`` (or any re-iterable of ``(input, target)``
        batches with ``len`` and ``set_epoch``); each epoch calls ``set_epoch(epoch)`` first, so the
        shuffle is a function of the loader's seed and the epoch. ``val_loader`` / ``metrics``
        (name -> ``metric(output, target)``, a batch mean): evaluated after every epoch. Callbacks
        (``netcl.train.Callback``) see every step and epoch. Returns the history of this call:
        ``"loss"`` holds one float per optimizer step (read from the device once per epoch),
        ``"val_loss"`` and each metric one float per epoch.
        """
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ValueError(f"fit: epochs must be an int >= 0, got {epochs!r}")
        loaders.check_loader(train_loader, "train_loader")
        metrics = dict(metrics or {})
        if val_loader is None and metrics:
            raise ValueError("fit: metrics are computed on val_loader; pass one")
        for name, fn in metrics.items():
            if not callable(fn):
                raise TypeError(f"fit: metric {name!r} must be callable (output, target) -> value")
        callbacks = list(callbacks)
        for cb in callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"fit: callbacks must be netcl.train.Callback instances, got {type(cb).__name__}")
        self._prepare_loader(train_loader)
        history: dict[str, list[float]] = {"loss": []}
        if val_loader is not None:
            history["val_loss"] = []
            for name in metrics:
                history[name] = []
        self.should_stop = False
        for cb in callbacks:
            cb.on_fit_start(self)
        while self.epoch < epochs and not self.should_stop:
            losses = self._train_epoch(train_loader, epochs, callbacks)
            history["loss"].extend(losses)
            self.epoch += 1
            self.batch_in_epoch = 0
            if self.scheduler is not None:
                self.scheduler.step()
            logs: dict[str, float] = {
                "epoch": self.epoch - 1,
                "step": self.global_step,
                "loss": float(np.mean(losses)) if losses else math.nan,
                "lr": float(self.optimizer.param_groups[0]["lr"]),
            }
            if val_loader is not None:
                results = self.evaluate(val_loader, metrics)
                history["val_loss"].append(results["loss"])
                logs["val_loss"] = results["loss"]
                for name in metrics:
                    history[name].append(results[name])
                    logs[name] = results[name]
            self._write_log_line(logs)
            for cb in callbacks:
                cb.on_epoch_end(self, logs)
        for cb in callbacks:
            cb.on_fit_end(self, history)
        return history

    def _train_epoch(self, loader: Any, epochs: int, callbacks: list[Callback]) -> list[float]:
        epoch, skip = self.epoch, self.batch_in_epoch
        loader.set_epoch(epoch)
        total = len(loader)
        self._start_log(total)
        self.network.train()
        bar = Progress(self.progress, total, skip, f"epoch {epoch + 1}/{epochs}")
        iterator = iter(loader)
        try:
            for index, batch in enumerate(iterator):
                if index < skip:  # resumed mid-epoch: the same order, the trained batches passed over
                    continue
                x, target = loaders.split_batch(batch)
                self._train_batch(x, target, index, total)
                self.batch_in_epoch = index + 1
                bar.step(loaders.batch_size(x))
                self.last_step = {"epoch": epoch, "batch": index, "step": self.global_step}
                for cb in callbacks:
                    cb.on_step_end(self, self.last_step)
                if self.should_stop:
                    break
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()
        losses = self._read_log()
        bar.close(losses[-1] if losses else None)
        return losses

    def _train_batch(self, x: Any, target: Any, index: int, total: int) -> None:
        k = self.grad_accum_steps
        signature = loaders.signature(x, target)
        seen = self._signatures.get(signature, 0)
        self._signatures[signature] = seen + 1
        if k > 1:
            group_start = index - index % k
            group = min(k, total - group_start)
            last = index - group_start == group - 1
            self._eager_step(x, target, 1.0 / group, first=index == group_start, last=last)
            return
        if self.replay == "auto" and self._graph is not None and signature == self._graph_signature:
            self._replay_step(x, target)
        elif self.replay == "auto" and self._graph is None and seen >= 1:
            if self._graph_signature is None or self._graph_signature == signature:
                self._capture_step(x, target, signature)
            else:
                self._eager_step(x, target, 1.0, first=True, last=True)
        else:
            self._eager_step(x, target, 1.0, first=True, last=True)

    def _autocast(self) -> Any:
        return autocast() if self.amp else contextlib.nullcontext()

    def _eager_step(self, x: Any, target: Any, weight: float, first: bool, last: bool) -> None:
        if first and self._graph is not None:  # a replay left its gradients in place: start from none
            self.optimizer.zero_grad()
        with Tape() as tape:
            with self._autocast():
                loss = self.loss_fn(self.network(x), target)
            backward = loss if self.grad_accum_steps == 1 else loss * (1.0 / self.grad_accum_steps)
            if self.scaler is not None:
                backward = self.scaler.scale_loss(backward)
        tape.backward(backward)
        log_scalar_(self._log, self._position, loss.value, self._ones, weight, advance=last)
        if last:
            self._update()
            self.optimizer.zero_grad()
            self.global_step += 1

    def _update(self) -> None:
        """Clip (optional), then the optimizer's step (through the scaler under amp)."""
        if self.scaler is not None:
            if self.clip_grad_norm is not None:
                self.scaler.unscale_(self.optimizer)
                clip_grad_norm_(self.optimizer_params(), self.clip_grad_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            if self.clip_grad_norm is not None:
                clip_grad_norm_(self.optimizer_params(), self.clip_grad_norm)
            self.optimizer.step()

    def optimizer_params(self) -> list[Node]:
        """Every parameter of the optimizer's groups, in order."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # ---- replay ------------------------------------------------------------------------------------
    def _graph_loss(self, output: Node, target: Node) -> Node:
        loss = self.loss_fn(output, target)
        return self.scaler.scale_loss(loss) if self.scaler is not None else loss

    def _graph_update(self) -> None:
        if self.scaler is not None:  # the scale this step's loss was multiplied by, before update() moves it
            self._divisor = device_copy(self.scaler._state(self.device)[0])
        self._update()

    def _capture_step(self, x: Any, target: Any, signature: str) -> None:
        """Capture the step (it runs once) with ``fuse_graph``, so that a resumed run draws what the
        uninterrupted one drew: on OpenCL the capture after a resume takes the original capture's
        dropout seeds and device counters at its next replay's value; on the NumPy backend (where each
        call draws fresh seeds and the capture's trace draws as many again) the generator is rewound
        by the trace's draws, so the capture's own step takes the seeds a replay would have taken."""
        resume, current = self._resume_graph, random.get_rng_state()
        start = 0
        if resume is not None and self.device.kind == "opencl":
            random.set_rng_state(resume["rng"])
            start = int(resume["runs"])
        elif resume is not None:
            trace_draws = int(resume["capture_draws"]) - int(resume.get("step_draws", resume["capture_draws"] // 2))
            random.set_rng_state({"seed": current["seed"], "calls": max(current["calls"] - trace_draws, 0)})
        before = random.get_rng_state()
        with random.counters_start_at(start % 2**32), self._autocast():
            fused = fuse_graph(
                self.network, x, target, self._graph_loss, optimizer_step=self._graph_update, after_step=self._log_loss
            )
        draws = random.get_rng_state()["calls"] - before["calls"]
        if resume is not None and self.device.kind == "opencl":
            random.set_rng_state(current)
        self._graph, self._graph_signature, self._resume_graph = fused, signature, None
        self._graph_runs = start + 1
        self._graph_info = dict(resume) if resume is not None else {"rng": before, "capture_draws": draws}
        self.global_step += 1

    def _replay_step(self, x: Any, target: Any) -> None:
        assert self._graph is not None
        # its loss lands in the device-side log (after_step, captured); under amp the graph computes with the
        # capture's autocast (on the NumPy backend, where it runs the jit-compiled step again, it restores it)
        if "step_draws" in self._graph_info:
            self._graph.execute(x, target)
        else:  # the first replay: how many seeds a replayed step draws (a NumPy-backend resume needs it)
            before = random.get_rng_state()["calls"]
            self._graph.execute(x, target)
            self._graph_info["step_draws"] = random.get_rng_state()["calls"] - before
        self._graph_runs += 1
        self.global_step += 1

    def _log_loss(self, loss: Node) -> None:
        """``after_step`` of the captured step: append its (unscaled) loss to the device-side log."""
        divisor = self._divisor if self.scaler is not None and self._divisor is not None else self._ones
        log_scalar_(self._log, self._position, loss.value, divisor, 1.0, advance=True)

    # ---- the loss log --------------------------------------------------------------------------------
    def _start_log(self, steps: int) -> None:
        """Zero the log (in place: a captured step appends to these buffers) for an epoch of ``steps``."""
        if self._log is None or self._log.shape[0] < max(steps, 1):
            if self._graph is not None:  # the captured step appends to the old buffers: capture again
                self._graph, self._graph_signature = None, None
            self._log = Tensor.zeros((max(steps, 1),), np.float32, self.device)
            self._position = Tensor.zeros((1,), np.int32, self.device)
        else:
            write_(self._log, np.zeros(self._log.shape, np.float32))
            write_(self._position, np.zeros(1, np.int32))

    def _read_log(self) -> list[float]:
        assert self._log is not None and self._position is not None
        count = int(np.asarray(self._position.to_host()).reshape(-1)[0])
        if count > self._log.shape[0]:
            raise RuntimeError(
                f"Trainer: {count} steps were logged into a loss log sized {self._log.shape[0]} by len(loader): "
                "the loader yielded more batches than its len() says"
            )
        return [float(v) for v in self._log.to_host()[:count]]

    # ---- evaluation ----------------------------------------------------------------------------------
    def evaluate(self, loader: Iterable[Any], metrics: Mapping[str, Callable[[Node, Any], Any]] | None = None) -> dict:
        """Mean loss and metrics over ``loader`` (eval mode, no gradients), weighted by batch size:
        ``{"loss": float, name: float, ...}``. Device values are summed on the device and read once."""
        metrics = dict(metrics or {})
        names = ["loss", *metrics]
        sums = Tensor.zeros((len(names),), np.float32, self.device)
        slots = [Tensor.from_host(self.device, np.asarray([i], np.int32)) for i in range(len(names))]
        host = dict.fromkeys(names, 0.0)
        count = 0
        was_training = getattr(self.model, "training", True)
        self.network.eval()
        try:
            with no_grad(), self._autocast():
                for batch in loader:
                    x, target = loaders.split_batch(batch)
                    n = loaders.batch_size(x)
                    output = self.network(x)
                    values = {"loss": self.loss_fn(output, target)}
                    values.update({name: fn(output, target) for name, fn in metrics.items()})
                    for slot, name in enumerate(names):
                        value = values[name]
                        if isinstance(value, Node):
                            value = value.value
                        if isinstance(value, Tensor):
                            log_scalar_(sums, slots[slot], value, self._ones, float(n), advance=False)
                        else:
                            host[name] += float(value) * n
                    count += n
        finally:
            self.network.train(was_training)
        if count == 0:
            raise ValueError("evaluate: the loader yielded no batches")
        device_sums = sums.to_host()
        return {name: (float(device_sums[i]) + host[name]) / count for i, name in enumerate(names)}

    # ---- logging -------------------------------------------------------------------------------------
    def _write_log_line(self, logs: Mapping[str, float]) -> None:
        if self.log_path is None:
            return
        from netcl.runtime.distributed import get_rank, is_initialized

        if is_initialized() and get_rank() != 0:
            return
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({**logs, "time": time.time()}) + "\n")

    # ---- loaders -------------------------------------------------------------------------------------
    def _prepare_loader(self, loader: Any) -> None:
        """Shard the loader under MPI; give it the checkpoint's shuffle seed at the first ``fit`` after a
        resume; remember its seed for the next checkpoint."""
        loaders.shard(loader)
        if self._resume_loader_seed is not None:
            loaders.set_seed(loader, self._resume_loader_seed)
            self._resume_loader_seed = None
        self._loader_seed = loaders.get_seed(loader)

    # ---- checkpoints ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write a checkpoint to ``path`` atomically (a temporary file, then ``os.replace``): the model,
        the optimizer (state and groups), the scheduler, the GradScaler, the global Philox generator,
        the loader's shuffle seed and the position (epoch, batch, step, replay state). Under MPI only
        rank 0 writes."""
        tensors, state = self._state()
        from netcl.runtime.distributed import get_rank, is_initialized

        if is_initialized() and get_rank() != 0:
            return
        write_checkpoint(path, tensors, state)

    def _state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return trainer_state(self)

    @classmethod
    def resume(
        cls, path: str | os.PathLike, model: Any, optimizer: Optimizer, loss_fn: Callable[..., Node], **options: Any
    ) -> Trainer:
        """A Trainer (``options`` as for the constructor) whose model, optimizer, scheduler, scaler,
        RNG and position are those of the checkpoint at ``path``: its ``fit`` continues where the
        checkpoint stopped, bit-identical to the uninterrupted run.

        Checked before anything changes: ``CheckpointError`` for a missing, torn or corrupt file;
        ``KeyError`` naming the differing keys when the model's state dict or the optimizer's layout
        (class, groups, state buffers) differ from the checkpoint's; ``ShapeError`` for a shape.
        """
        tensors, state = read_checkpoint(path)
        trainer = cls(model, optimizer, loss_fn, **options)
        trainer._load(tensors, state, os.fspath(path))
        return trainer

    def _load(self, tensors: dict[str, np.ndarray], state: dict[str, Any], path: str) -> None:
        load_trainer_state(self, tensors, state, path)
