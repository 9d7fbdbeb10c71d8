"""What a replay hands back: results that no later replay silently overwrites.

A replay's kernels write into the graph's captured output buffers, so the replay cannot give
those buffers to the caller as they are: the next replay would overwrite them. Instead it hands
out ``ReplayResult`` tensors that alias the buffers, and remembers them (weakly). When the next
replay of the same graph starts, each result that is still referenced is *retired*:

* up to ``snapshot_bytes`` (a scalar loss, metrics, small logits) it is copied, on the device,
  into a buffer of its own before the replay's kernels run, and keeps its value for good;
* larger, it is marked stale: reading it (``to_host``, ``item``, ``.data``, using it in an op)
  raises ``StaleResultError``, naming the replay that overwrote it and how to keep a value.

A result that is dropped before the next replay costs nothing beyond the wrapper, so replay's
per-kernel host cost is unchanged (``benchmarks/bench_replay.py``); keeping results costs one
device copy each (``copy_outputs=True`` copies every result right away).
"""

from __future__ import annotations

import weakref
from typing import Any

import pyopencl as cl

from netcl.core import Tensor
from netcl.runtime.errors import StaleResultError

#: Results of at most this many bytes are copied when a later replay would overwrite them.
SNAPSHOT_BYTES = 1 << 20

_DATA = Tensor.data  # the slot descriptor of Tensor.data, which ReplayResult wraps in a check


class ReplayResult(Tensor):
    """A replay's output: a Tensor aliasing the graph's buffer until the next replay retires it."""

    __slots__ = ("_owner", "_replay", "_stale_by", "_owner_label", "_snapshot_limit")

    def __init__(self, tensor: Tensor, owner: Any, replay: int) -> None:
        # Tensor.__init__ spelled out: this runs once per output per replay
        _DATA.__set__(self, _DATA.__get__(tensor))
        self.shape, self.dtype, self.device = tensor.shape, tensor.dtype, tensor.device
        self.base = self.grad = None
        self._written_at = 0
        #: The graph whose buffer this aliases (None once retired by a copy).
        self._owner = owner
        self._replay = replay
        self._stale_by: int | None = None
        self._owner_label = ""
        self._snapshot_limit = SNAPSHOT_BYTES

    @property  # type: ignore[override]
    def data(self) -> Any:
        if self._stale_by is not None:
            raise StaleResultError(self._stale_message())
        return _DATA.__get__(self)

    @data.setter
    def data(self, value: Any) -> None:
        _DATA.__set__(self, value)

    @property
    def is_stale(self) -> bool:
        """True once a later replay overwrote this result's buffer (reading it raises)."""
        return self._stale_by is not None

    def reshape(self, *shape: int | tuple[int, ...]) -> Tensor:
        """A view sharing this result's buffer; it is retired (copied or made stale) with it."""
        view = Tensor.reshape(self, *shape)
        if self._owner is None:
            return view
        result = ReplayResult(view, self._owner, self._replay)
        result.base = self
        self._owner._live_results.append(weakref.ref(result))
        return result

    def _stale_message(self) -> str:
        return (
            f"this {self.shape} {self.dtype} result of replay #{self._replay} of {self._owner_label} was "
            f"overwritten by replay #{self._stale_by} ({self.nbytes} bytes is more than the graph's "
            f"snapshot_bytes={self._snapshot_limit}, so it was not copied). Keep a value before the next "
            "replay with .item() / .to_host() / .copy(), or replay with copy_outputs=True to get results "
            "that no replay overwrites"
        )

    def __repr__(self) -> str:
        state = "stale" if self._stale_by is not None else ("own buffer" if self._owner is None else "aliasing")
        return f"ReplayResult(shape={self.shape}, dtype={self.dtype}, replay #{self._replay}, {state})"


def hand_out(owner: Any, tensor: Tensor) -> ReplayResult:
    """Wrap ``tensor`` (a graph buffer) as the result of ``owner``'s latest replay and track it."""
    result = ReplayResult(tensor, owner, owner.replays)
    owner._live_results.append(weakref.ref(result))
    return result


def retire(owner: Any, queue: cl.CommandQueue, out_of_order: bool = False) -> None:
    """Before ``owner`` replays again: copy its live small results out, mark large ones stale.

    The copies are enqueued on ``queue`` (the queue of the previous replay), so on an in-order
    queue they run after the replay that wrote the values and before the next one; on an
    out-of-order queue (``out_of_order``) a barrier after them orders the next replay.
    """
    refs, owner._live_results = owner._live_results, []
    live = []
    for ref in refs:
        result = ref()
        if result is not None and result._owner is owner:
            live.append(result)
    if not live:
        return
    limit = owner.snapshot_bytes
    copies: dict[int, Any] = {}
    for result in sorted(live, key=lambda r: r.base is not None):  # bases before their views
        result._owner = None
        if result.nbytes > limit:
            label = repr(owner) if getattr(owner, "label", None) is None else owner.label
            result._stale_by, result._owner_label, result._snapshot_limit = owner.replays + 1, label, limit
            continue
        base = result.base if isinstance(result.base, ReplayResult) else None
        if base is not None and id(base) in copies:
            _DATA.__set__(result, copies[id(base)])
            continue
        source = _DATA.__get__(result)
        fresh = result.device.allocator(result.device, result.nbytes) if result.nbytes else source
        if result.nbytes:
            cl.enqueue_copy(queue, fresh, source, byte_count=result.nbytes)
        _DATA.__set__(result, fresh)
        copies[id(result)] = fresh
    if out_of_order and copies:  # the next replay's first command must wait for the copies
        cl.enqueue_barrier(queue)
