"""Autoregressive decoding with a key/value cache: ``Decoder`` and ``generate``.

A model takes part by providing (the decoding protocol):

* ``max_len``: the most positions a sequence may have (caches are sized for it);
* ``new_caches(batch)``: fresh per-layer caches (e.g. a list of ``netcl.nn.KVCache``);
* ``decode(ids, pos, caches)``: logits ``(batch, vocab)`` for token ids ``(batch, 1)`` (int32) at
  position ``pos`` (a ``netcl.runtime.Variable``), after writing that position's keys and values
  into ``caches``. It must launch its work through netcl ops and pass ``pos`` to the kernels that
  need it (``KVCache.update`` / ``attend``, ``kv_cache.rows_at``), never read its value on the host.

``Decoder(model, batch, replay=True)`` runs one position per ``step``: eagerly, or (``replay``) by
capturing the first step once as a ``netcl.runtime.Graph`` and replaying it for every later
position with ``pos`` rebound; the token ids are the graph's input. Both give the same logits (the
same kernels run on the same buffers). The prompt is fed one token per step, so a step is the only
thing ever captured. On the NumPy backend a replay re-runs the step.

Every step also stores the argmax of its logits (ties to the lowest id, the first NaN) on the device
(``ops.argmax_into``): into the step's input ``ids`` and into ``next_ids[:, pos]``. Greedy decoding
(``temperature == 0``) feeds that back: the input buffer already holds the next token, so nothing is
read back until the end (one read of ``next_ids``) and the host never waits on a step. Other
temperatures sample on the host from each step's logits: they are divided by ``temperature``, cut to
the ``top_k`` largest when given, and one token per row is drawn from their softmax with
``numpy.random.default_rng(seed)``; ``temperature == 0`` in ``sample`` is the same argmax.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.autograd.engine import Node
from netcl.autograd.grad_mode import no_grad
from netcl.core import Device, Tensor, get_device
from netcl.core.dtypes import int32
from netcl.runtime.graph import Graph, capture_graph
from netcl.runtime.ops import argmax_into
from netcl.runtime.variable import Variable


def _tensor(x: Any) -> Tensor:
    return x.value if isinstance(x, Node) else x


def _int(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"generate: {name} must be an int >= {low}, got {value!r}")
    return int(value)


def check_prompt(prompt_ids: Any, max_new_tokens: Any, max_len: int) -> np.ndarray:
    """The prompt as an int64 ``(batch, P)`` array; ValueError naming the argument when it cannot be decoded."""
    prompt = np.asarray(prompt_ids)
    if prompt.ndim == 1:
        prompt = prompt[None, :]
    if prompt.ndim != 2 or prompt.shape[0] < 1 or prompt.shape[1] < 1 or prompt.dtype.kind not in "iu":
        raise ValueError(
            f"generate: prompt_ids must be a non-empty (batch, P) or (P,) array of ints, got shape {prompt.shape} "
            f"dtype {prompt.dtype}"
        )
    new = _int(max_new_tokens, "max_new_tokens", 0)
    if prompt.shape[1] + new > max_len:
        raise ValueError(
            f"generate: max_new_tokens={new} with a prompt of {prompt.shape[1]} tokens needs "
            f"{prompt.shape[1] + new} positions; the model's max_len is {max_len} "
            f"(at most {max_len - prompt.shape[1]} new tokens for this prompt)"
        )
    return prompt.astype(np.int64)


def sample(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator) -> np.ndarray:
    """One token id per row of ``logits`` ``(batch, vocab)`` (see the module doc for the rule)."""
    logits = np.asarray(logits, np.float64)
    if temperature == 0:
        return logits.argmax(axis=-1)
    scaled = logits / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = np.partition(scaled, -top_k, axis=-1)[:, -top_k][:, None]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    scaled -= scaled.max(axis=-1, keepdims=True)
    p = np.exp(scaled)
    p /= p.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(p.shape[-1], p=row) for row in p])


class Decoder:
    """Runs ``model.decode`` one position at a time for ``batch`` sequences (see the module doc).

    ``device`` defaults to ``model.device`` when the model has one. ``replay=False`` runs every
    step eagerly. ``graph`` is the captured step (None until the first replayed step; captured
    exactly once per Decoder), ``captures`` counts captures. ``ids`` ``(batch, 1)`` int32 is greedy
    decoding's input buffer, ``next_ids`` ``(batch, max_len)`` int32 the argmax after each position.
    """

    def __init__(self, model: Any, batch: int = 1, replay: bool = True, device: Device | str | None = None) -> None:
        for attr in ("max_len", "new_caches", "decode"):
            if not hasattr(model, attr):
                raise TypeError(f"Decoder: the model has no {attr!r}; see netcl.nn.generation for the protocol")
        self.model = model
        self.batch = _int(batch, "batch", 1)
        self.replay = bool(replay)
        self.device = get_device(device if device is not None else getattr(model, "device", None))
        self.max_len = int(model.max_len)
        self.pos = Variable("pos", self.max_len - 1)
        self.caches = model.new_caches(self.batch)
        self.ids = Tensor.zeros((self.batch, 1), int32, self.device)
        self.next_ids = Tensor.zeros((self.batch, self.max_len), int32, self.device)
        self.graph: Graph | None = None
        self.captures = 0

    def _run(self, ids: Tensor, pos: Variable) -> Tensor:
        with no_grad():
            logits = _tensor(self.model.decode(ids, pos, self.caches))
        argmax_into(logits, ids, self.next_ids, pos)
        return logits

    def _launch(self, ids: Tensor, pos: int) -> Tensor:
        """Enqueue the step at ``pos`` on ``ids`` (eagerly or replayed); its logits, not read."""
        self.pos.bind(pos)  # ValueError naming "pos" outside [0, max_len - 1], before any launch
        if not self.replay:
            return self._run(ids, self.pos)
        if self.graph is None:
            self.graph = capture_graph(self.device, self._run, ids, self.pos)
            self.captures += 1
            return _tensor(self.graph.outputs)
        return self.graph.execute(ids)

    def step(self, tokens: Any, pos: int) -> np.ndarray:
        """Logits ``(batch, vocab)`` (float32 host array) for ``tokens`` ``(batch,)`` at position ``pos``."""
        ids_host = np.asarray(tokens, np.int32).reshape(self.batch, 1)
        self.pos.check(pos)
        return self._launch(Tensor.from_host(self.device, ids_host, np.int32), pos).to_host()

    def _greedy(self, prompt: np.ndarray, max_new_tokens: int) -> np.ndarray:
        """``generate`` at temperature 0: each step's argmax stays in ``ids`` for the next step."""
        length = prompt.shape[1]
        for pos in range(length):
            self.ids = Tensor.from_host(self.device, prompt[:, pos : pos + 1].astype(np.int32), np.int32)
            self._launch(self.ids, pos)
        for pos in range(length, length + max_new_tokens - 1):
            self._launch(self.ids, pos)
        new = self.next_ids.to_host()[:, length - 1 : length - 1 + max_new_tokens]
        return np.concatenate([prompt, new.astype(np.int64)], axis=1)

    def generate(
        self,
        prompt_ids: Any,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> np.ndarray:
        """``(batch, P + max_new_tokens)`` token ids: the prompt, then the sampled continuation."""
        prompt = check_prompt(prompt_ids, max_new_tokens, self.max_len)
        if prompt.shape[0] != self.batch:
            raise ValueError(f"generate: prompt_ids has {prompt.shape[0]} rows; this Decoder decodes {self.batch}")
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
            raise ValueError(f"generate: temperature must be a number >= 0, got {temperature!r}")
        if top_k is not None:
            top_k = _int(top_k, "top_k", 1)
        if temperature == 0:
            return self._greedy(prompt, int(max_new_tokens)) if max_new_tokens else prompt
        rng = np.random.default_rng(seed)
        out = [prompt[:, i] for i in range(prompt.shape[1])]
        logits = None
        for pos in range(prompt.shape[1]):
            logits = self.step(prompt[:, pos], pos)
        for _ in range(int(max_new_tokens)):
            token = sample(logits, float(temperature), top_k, rng)
            out.append(token)
            if len(out) < prompt.shape[1] + max_new_tokens:
                logits = self.step(token, len(out) - 1)
        return np.stack(out, axis=1)


def generate(
    model: Any,
    prompt_ids: Any,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    replay: bool = True,
    device: Device | str | None = None,
) -> np.ndarray:
    """Continue ``prompt_ids`` ``(batch, P)`` (or ``(P,)``) by ``max_new_tokens`` tokens with ``model``'s cache.

    Returns ``(batch, P + max_new_tokens)`` int64 ids. ``replay`` captures one decode step and
    replays it for every position (``Decoder``). A prompt plus ``max_new_tokens`` longer than
    ``model.max_len`` raises ValueError naming ``max_new_tokens`` before any launch.
    """
    prompt = check_prompt(prompt_ids, max_new_tokens, int(model.max_len))
    decoder = Decoder(model, prompt.shape[0], replay=replay, device=device)
    return decoder.generate(prompt, max_new_tokens, temperature, top_k, seed)


__all__ = ["Decoder", "check_prompt", "generate", "sample"]
