"""``DistributedDataParallel``: data parallelism over MPI ranks, one device per rank.

Construction: a handshake checks that every rank has the same parameters and buffers (names,
shapes, dtypes; a mismatch raises the same clear error on every rank), then rank 0's values are
broadcast to all. Backward: each parameter's grad-ready hook (``Node.register_grad_ready_hook``)
drops its gradient into a bucket (~25 MB, parameters in reverse registration order, which is
roughly the order backward finishes them); a full bucket starts a deterministic all-reduce (mean)
at once, while the rest of the backward is still running. By default (``overlap=True``) the bucket
goes to the DDP's own thread and OpenCL queue (``netcl.runtime.distributed.overlap``): its copies
wait on the event that marks its gradients complete, not on the queue, and it is pipelined in
chunks (device -> pinned host -> MPI -> device) beside the backward; ``overlap=False`` runs the
non-blocking ``all_reduce_coalesced_async`` that later hooks advance. Both give the same bits. Where
the ranks own the NVIDIA GPUs of one host (``netcl.runtime.distributed.peer``: ``NETCL_PEER_ALLREDUCE``),
each dtype's buckets are one exchange at the end of the backward whose kernels read every rank's
gradients over the GPUs' peer links, all on the device's queue (no host wait; the same bits as the MPI
path); there, as in torch, a parameter's ``grad`` kept from the step before's exchange
(``zero_grad(set_to_none=False)``) takes the averaged gradient in place (no allocation a step). Else, where every
rank has an NVIDIA GPU that shares memory with CUDA (``netcl.runtime.distributed.device_direct``:
``NETCL_DEVICE_DIRECT``), the buckets are all-reduced by NCCL on the device instead, all in one
exchange when the backward ends (identical bits on every rank, not necessarily the host-staged
path's; one exchange because each switch between the GPU's OpenCL and CUDA contexts pauses it). At
the end of the backward (``queue_callback``) the remaining buckets are started, all are waited for
(bounded by ``NETCL_DIST_TIMEOUT``), and each parameter's ``grad`` becomes its averaged gradient,
bit-identical on every rank, so any optimizer then takes identical steps. The handshake also
compares the bucket layout (and ``overlap``) across ranks and names the first parameter placed
differently.

Graph replay (``CompiledGraph``, ``fuse_graph`` on OpenCL): while a step is captured the
all-reduces run blocking, bucket by bucket, and each is recorded as a command of the graph, so
every replay all-reduces the gradients again at the same points (without overlap); the
optimizer's captured update then reads the averaged gradients. On the peer path the exchange's
launches are recorded as they are (their tickets live in the windows), so a replay exchanges
through the windows again with no host step at all. On the NumPy backend
``fuse_graph`` runs the step eagerly and the hooks work as in eager mode.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, queue_callback
from netcl.core import Tensor
from netcl.runtime import capture
from netcl.runtime import distributed as dist
from netcl.runtime.distributed import DistributedError, device_direct, peer
from netcl.runtime.distributed.device_direct import DeviceDirectReducer
from netcl.runtime.distributed.overlap import OverlapReducer, threads_supported
from netcl.runtime.distributed.peer import PeerReducer

log = logging.getLogger("netcl.distributed")
DEFAULT_BUCKET_MB = 25.0
#: The first bucket (the last parameters, whose gradients backward finishes first) is capped at
#: 1 MB, as in torch: its all-reduce starts early in the backward instead of waiting for 25 MB.
FIRST_BUCKET_MB = 1.0
#: Chunks of the overlapped all-reduce's pipeline (device -> pinned host -> MPI -> device).
DEFAULT_CHUNK_MB = 4.0


@dataclass
class _Bucket:
    index: int
    params: list[int]  #: indices into DistributedDataParallel.params
    nbytes: int


@dataclass
class _Round:
    """The state of one backward's gradient synchronization."""

    grads: dict[int, Tensor] = field(default_factory=dict)
    #: parameters whose ``grad`` was their kept exchange output when the round began (``_peer_outputs``)
    kept: set[int] = field(default_factory=set)
    remaining: dict[int, int] = field(default_factory=dict)  #: bucket -> gradients still missing
    works: dict[int, Any] = field(default_factory=dict)  #: bucket -> work in flight
    outputs: dict[int, list[Tensor]] = field(default_factory=dict)
    first_launch: float | None = None
    started_in_hooks: int = 0
    overlapped: int = 0


@dataclass
class SyncStats:
    """Timings of the last synchronized backward (seconds, ``time.perf_counter``)."""

    buckets: int = 0
    bytes: int = 0
    #: buckets started from a hook, during the backward (the rest started at its end)
    started_during_backward: int = 0
    #: from the first bucket's start to the last bucket's completion
    comm_span_s: float = 0.0
    #: time the end-of-backward callback spent waiting for communication (not overlapped)
    exposed_wait_s: float = 0.0
    steps: int = 0
    #: buckets all-reduced on the overlap thread (the rest: inline, or recorded in a captured graph)
    overlapped: int = 0


class DistributedDataParallel:
    """Wrap ``module`` (``parameters()`` / ``named_parameters()`` of leaf Nodes) for data-parallel training.

    Each rank runs the same model on its own shard of every batch; after ``loss.backward()``
    every parameter's ``grad`` is the mean over ranks (what one process would get from the mean
    loss over the concatenated batch). Calls, attribute reads and ``state_dict()`` go to the
    wrapped module (keys are not prefixed with ``module.``). ``bucket_cap_mb`` sizes the buckets;
    ``broadcast_buffers`` also copies rank 0's buffers (e.g. BatchNorm running stats) at
    construction. ``overlap`` all-reduces buckets on a thread of their own, pipelined in chunks of
    ``pipeline_chunk_mb`` (needs ``MPI_THREAD_MULTIPLE``; without it, a warning and the inline path).
    Needs ``netcl.runtime.distributed.init()`` (called here if it was not).

    Every rank must run the same backward: the same parameters get gradients in the same order
    (buckets start in that order, and collectives must match across ranks). A parameter no
    backward reaches contributes its current ``grad`` (or zeros) when the backward ends, and then
    holds the averaged result like the others, so ranks stay identical; a parameter reached on
    some ranks only (data-dependent branches) is not supported. ``no_sync()`` must enclose the
    backward, not just the forward.
    """

    def __init__(
        self,
        module: Any,
        bucket_cap_mb: float = DEFAULT_BUCKET_MB,
        broadcast_buffers: bool = True,
        overlap: bool = True,
        pipeline_chunk_mb: float = DEFAULT_CHUNK_MB,
    ) -> None:
        if not (isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0):
            raise ValueError(f"bucket_cap_mb must be a number > 0, got {bucket_cap_mb!r}")
        if not isinstance(overlap, bool):
            raise TypeError(f"overlap must be a bool, got {type(overlap).__name__}")
        if not (isinstance(pipeline_chunk_mb, (int, float)) and pipeline_chunk_mb > 0):
            raise ValueError(f"pipeline_chunk_mb must be a number > 0, got {pipeline_chunk_mb!r}")
        named = _named_parameters(module)  # bad modules fail before MPI starts
        self.module = module
        self.info = dist.init()  # the existing group, or a new one
        buffers = _named_buffers(module) if broadcast_buffers else []
        self._handshake(named, buffers)
        self.params: list[Node] = [p for _, p in named if p.requires_grad]
        self.param_names = [n for n, p in named if p.requires_grad]
        self._broadcast_state([p.value for _, p in named], [b for _, b in buffers])
        cap = int(bucket_cap_mb * 1024 * 1024)
        self.buckets = _make_buckets(self.params, cap, min(cap, int(FIRST_BUCKET_MB * 1024 * 1024)))
        self._bucket_of: dict[int, int] = {}
        for bucket in self.buckets:
            for i in bucket.params:
                self._bucket_of[i] = bucket.index
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._check_buckets(overlap)
        self._reducer: PeerReducer | OverlapReducer | DeviceDirectReducer | None = None
        #: peer and device-direct: every bucket in one exchange per dtype at the end of the backward. Peer:
        #: the fewest launches (the step's host time is the cost); device-direct: NVIDIA's OpenCL and NCCL run
        #: in two CUDA contexts, and each switch between them costs the GPU a fixed pause (benchmarks/RESULTS.md,
        #: "device-direct all-reduce"): one exchange per step switches twice.
        self._coalesce = False
        if overlap and self.info.world_size > 1:
            if peer.agree(self.params[0].device):  # collective: the same answer on every rank
                self._reducer = PeerReducer(self.params[0].device)
                self._coalesce = True
            elif device_direct.agree(self.params[0].device):
                self._reducer = DeviceDirectReducer(self.params[0].device)
                self._coalesce = True
            elif threads_supported():
                chunk = max(1, int(pipeline_chunk_mb * 1024 * 1024))
                self._reducer = OverlapReducer(self.params[0].device, chunk)
            else:  # the same on every rank: one MPI library
                log.warning("netcl DDP: MPI lacks MPI_THREAD_MULTIPLE; buckets are all-reduced without a thread")
        #: the peer path's last output by parameter index (``_peer_outputs``)
        self._kept_outputs: dict[int, Tensor] = {}
        self._round: _Round | None = None
        self._sync = True
        self.stats = SyncStats()
        self._handles = [p.register_grad_ready_hook(self._on_grad_ready) for p in self.params]

    @property
    def all_reduce_path(self) -> str:
        """How buckets are all-reduced: "peer" (kernels read every rank's window over the GPUs' peer links),
        "device-direct" (NCCL on memory OpenCL shares with CUDA), "overlapped" (MPI on a thread of its own,
        host-staged in chunks) or "inline" (MPI on the caller's thread: one rank, ``overlap=False``, or an MPI
        without ``MPI_THREAD_MULTIPLE``)."""
        if isinstance(self._reducer, PeerReducer):
            return "peer"
        if isinstance(self._reducer, DeviceDirectReducer):
            return "device-direct"
        return "inline" if self._reducer is None else "overlapped"

    # ---- construction ---------------------------------------------------------------------------
    def _handshake(self, named: list[tuple[str, Node]], buffers: list[tuple[str, Tensor]]) -> None:
        devices = {p.device for _, p in named} | {b.device for _, b in buffers}
        if len(devices) > 1:
            raise DistributedError(
                "DistributedDataParallel needs the whole model on one device per rank, found "
                + ", ".join(sorted(d.spec for d in devices))
            )
        mine = [("parameter", n, tuple(p.shape), str(p.dtype), bool(p.requires_grad)) for n, p in named]
        mine += [("buffer", n, tuple(b.shape), str(b.dtype), False) for n, b in buffers]
        everyone = dist.all_gather_object(mine)
        reference = everyone[0]
        for rank, entries in enumerate(everyone[1:], start=1):
            problem = _first_difference(reference, entries)
            if problem is not None:
                raise DistributedError(
                    f"DistributedDataParallel: the model on rank {rank} differs from rank 0's: {problem}; "
                    "every rank must build the same model (same parameters, shapes and dtypes, in the same order)"
                )

    def _check_buckets(self, overlap: bool) -> None:
        """Every rank must cut the same buckets in the same order (and choose the same path), or
        their all-reduces would pair different gradients: an error naming the first parameter placed
        differently (``bucket_cap_mb`` differing across ranks, say)."""
        mine = (overlap, [[self.param_names[i] for i in b.params] for b in self.buckets])
        everyone = dist.all_gather_object(mine)
        ref_overlap, reference = everyone[0]
        where = {name: k for k, names in enumerate(reference) for name in names}
        for rank, (other_overlap, buckets) in enumerate(everyone[1:], start=1):
            for k, names in enumerate(buckets):
                for position, name in enumerate(names):
                    ref_names = reference[k] if k < len(reference) else []
                    if position >= len(ref_names) or ref_names[position] != name:
                        raise DistributedError(
                            f"DistributedDataParallel: rank {rank} puts parameter {name!r} in bucket {k} (position "
                            f"{position}), rank 0 in bucket {where.get(name)}; every rank must pass the same "
                            "bucket_cap_mb so that buckets pair the same gradients"
                        )
            if len(buckets) != len(reference):
                raise DistributedError(
                    f"DistributedDataParallel: rank {rank} has {len(buckets)} buckets, rank 0 has {len(reference)}; "
                    "every rank must pass the same bucket_cap_mb"
                )
            if other_overlap != ref_overlap:
                raise DistributedError(
                    f"DistributedDataParallel: overlap={other_overlap} on rank {rank} but {ref_overlap} on rank 0; "
                    "every rank must pass the same overlap"
                )

    def _broadcast_state(self, values: list[Tensor], buffers: list[Tensor]) -> None:
        for tensor in [*values, *buffers]:
            dist.broadcast(tensor, root=0)

    # ---- forward ---------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._round = None  # a backward that raised left its round behind
        return self.module(*args, **kwargs)

    forward = __call__

    def __getattr__(self, name: str) -> Any:
        if name == "module":  # not yet set: construction failed
            raise AttributeError(name)
        return getattr(self.module, name)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside accumulate gradients locally, without communication (as torch's)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    # ---- backward hooks ----------------------------------------------------------------------------
    def _on_grad_ready(self, node: Node, grad: Tensor) -> None:
        if not self._sync or self.info.world_size == 1:
            return
        state = self._round
        if state is None:
            state = self._round = _Round(remaining={b.index: len(b.params) for b in self.buckets})
        queue_callback(self._finish)  # once per backward (queue_callback dedupes)
        index = self._index[id(node)]
        if index in state.grads:
            return
        state.grads[index] = grad
        if node.grad is not None and node.grad is self._kept_outputs.get(index):  # (the engine replaces it later)
            state.kept.add(index)
        if self._coalesce:  # one exchange at the end of the backward (see _coalesce)
            return
        bucket = self._bucket_of[index]
        state.remaining[bucket] -= 1
        if state.remaining[bucket] == 0:
            self._launch(state, self.buckets[bucket])
            state.started_in_hooks += 1
        if state.works:
            dist.progress()  # move the buckets in flight along while the backward goes on

    def _inputs(self, state: _Round, bucket: _Bucket) -> list[Tensor]:
        inputs = [state.grads.get(i) for i in bucket.params]
        for k, i in enumerate(bucket.params):
            if inputs[k] is None:  # not reached by this backward: its accumulated grad, or zeros
                p = self.params[i]
                inputs[k] = p.grad if p.grad is not None else Tensor.zeros(p.shape, p.dtype, p.device)
        return inputs

    def _launch(self, state: _Round, bucket: _Bucket) -> None:
        inputs = self._inputs(state, bucket)
        outputs = [Tensor.empty(t.shape, t.dtype, t.device) for t in inputs]
        if state.first_launch is None:
            state.first_launch = time.perf_counter()
        device = inputs[0].device
        recording = device.kind == "opencl" and capture.is_recording(device.queue)
        if self._reducer is not None and not recording:
            state.works[bucket.index] = self._reducer.submit(inputs, outputs, "mean")
            state.overlapped += 1
        else:  # a captured step records its all-reduces as graph commands (run inline, blocking)
            state.works[bucket.index] = dist.all_reduce_coalesced_async(inputs, "mean", outputs)
        state.outputs[bucket.index] = outputs

    def _launch_coalesced(self, state: _Round) -> None:
        """The buckets not started yet as one exchange per dtype (``_coalesce``: the peer and device-direct
        reducers; a dtype the peer reducer does not take goes through the MPI path)."""
        waiting = [b for b in self.buckets if b.index not in state.works]
        if not waiting:
            return
        device = self.params[0].device
        peer_path = isinstance(self._reducer, PeerReducer)
        if device.kind == "opencl" and capture.is_recording(device.queue) and not peer_path:
            for bucket in waiting:  # captured: recorded bucket by bucket, as on the MPI path
                self._launch(state, bucket)
            return
        state.first_launch = state.first_launch or time.perf_counter()
        by_dtype: dict[np.dtype, list[tuple[_Bucket, list[Tensor]]]] = {}
        for bucket in waiting:  # a bucket holds one dtype
            inputs = self._inputs(state, bucket)
            by_dtype.setdefault(inputs[0].dtype, []).append((bucket, inputs))
        for dtype, group in by_dtype.items():
            through_windows = peer_path and self._reducer.supports(dtype)
            outputs = self._peer_outputs(state, group) if through_windows else self._fresh_outputs(group)
            flat_in, flat_out = [t for _, inputs in group for t in inputs], [t for out in outputs for t in out]
            if peer_path and not through_windows:
                work = dist.all_reduce_coalesced_async(flat_in, "mean", flat_out)  # e.g. bfloat16: the MPI path
            else:
                work = self._reducer.submit(flat_in, flat_out, "mean")
            for (bucket, _), out in zip(group, outputs, strict=True):
                state.works[bucket.index], state.outputs[bucket.index] = work, out
                state.overlapped += 1

    @staticmethod
    def _fresh_outputs(group: list[tuple[_Bucket, list[Tensor]]]) -> list[list[Tensor]]:
        return [[Tensor.empty(t.shape, t.dtype, t.device) for t in inputs] for _, inputs in group]

    def _peer_outputs(self, state: _Round, group: list[tuple[_Bucket, list[Tensor]]]) -> list[list[Tensor]]:
        """The peer exchange's outputs: a parameter whose ``grad`` was its last exchange's output when the round
        began (zeroed with ``set_to_none=False``, or not zeroed) gets that tensor again, written in place, as a
        torch parameter's ``grad``; otherwise (after ``zero_grad(set_to_none=True)``, a ``grad`` set by hand, or a
        ``no_sync`` backward, which sums into a new tensor) a new tensor. An input may be its own output
        (``sync_gradients``, a parameter no backward reached): the exchange copies its inputs into the window
        before it writes any output."""
        kept, outputs = self._kept_outputs, []
        for bucket, inputs in group:
            row = []
            for i, t in zip(bucket.params, inputs, strict=True):
                out = kept.get(i)
                grad_was_out = i in state.kept if i in state.grads else self.params[i].grad is out
                if out is None or not grad_was_out:
                    out = kept[i] = Tensor.empty(t.shape, t.dtype, t.device)
                row.append(out)
            outputs.append(row)
        return outputs

    def _finish(self) -> None:
        state, self._round = self._round, None
        if state is None:
            return
        started = time.perf_counter()
        if self._coalesce:
            self._launch_coalesced(state)
        for bucket in self.buckets:
            if bucket.index not in state.works:
                self._launch(state, bucket)
        for bucket in self.buckets:
            state.works[bucket.index].wait()
        done = time.perf_counter()
        for bucket in self.buckets:
            for i, out in zip(bucket.params, state.outputs[bucket.index], strict=True):
                p = self.params[i]
                p.grad, p._grad_owned, p.value.grad = out, True, out
        s = self.stats
        s.buckets, s.bytes, s.steps = len(self.buckets), sum(b.nbytes for b in self.buckets), s.steps + 1
        s.started_during_backward = state.started_in_hooks
        s.overlapped = state.overlapped
        s.exposed_wait_s = done - started
        s.comm_span_s = done - (state.first_launch or started)

    def sync_gradients(self) -> None:
        """All-reduce (mean) every parameter's current ``grad`` now, blocking (e.g. after ``no_sync``)."""
        if self.info.world_size == 1:
            return
        state = _Round(remaining={b.index: 0 for b in self.buckets})
        if not self._coalesce:  # else _finish starts them as one exchange
            for bucket in self.buckets:
                self._launch(state, bucket)
        self._round = state
        self._finish()

    def remove_hooks(self) -> None:
        """Detach from the parameters (the module trains locally afterwards)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._reducer is not None:
            self._reducer.close()
            self._reducer = None

    def __repr__(self) -> str:
        return (
            f"DistributedDataParallel(rank={self.info.rank}/{self.info.world_size}, {len(self.params)} params in "
            f"{len(self.buckets)} buckets, module={self.module!r})"
        )


# ---- helpers -------------------------------------------------------------------------------------
def _named_parameters(module: Any) -> list[tuple[str, Node]]:
    getter = getattr(module, "named_parameters", None)
    if callable(getter):
        named = list(getter())
    else:
        params = getattr(module, "parameters", None)
        if not callable(params):
            raise TypeError(f"module must have parameters() or named_parameters(), got {type(module).__name__}")
        named = [(f"param{i}", p) for i, p in enumerate(params())]
    for name, p in named:
        if not isinstance(p, Node):
            raise TypeError(f"parameter {name!r} is a {type(p).__name__}; parameters must be netcl Nodes")
        if p.grad_fn is not None:
            raise ValueError(f"parameter {name!r} is not a leaf (op {p.op_name!r}); parameters must be leaf Nodes")
    if not named:
        raise ValueError(f"module {type(module).__name__} has no parameters to synchronize")
    return named


def _named_buffers(module: Any) -> list[tuple[str, Tensor]]:
    getter = getattr(module, "named_buffers", None)
    if not callable(getter):
        return []
    result = []
    for name, b in getter():
        b = getattr(b, "value", b)
        if isinstance(b, Tensor):
            result.append((name, b))
    return result


def _first_difference(reference: list[tuple], entries: list[tuple]) -> str | None:
    for ref, got in zip(reference, entries, strict=False):
        if ref != got:
            kind, name, shape, dtype, grad = got
            rkind, rname, rshape, rdtype, rgrad = ref
            if (kind, name) != (rkind, rname):
                return f"{rkind} {rname!r} on rank 0 is {kind} {name!r} here"
            what = "requires_grad" if (shape, dtype) == (rshape, rdtype) else "shape/dtype"
            return (
                f"{kind} {name!r} has {what} {shape} {dtype} requires_grad={grad}, "
                f"rank 0 has {rshape} {rdtype} requires_grad={rgrad}"
            )
    if len(reference) != len(entries):
        return f"{len(entries)} parameters and buffers, rank 0 has {len(reference)}"
    return None


def _make_buckets(params: list[Node], cap_bytes: int, first_cap_bytes: int) -> list[_Bucket]:
    """Buckets of at most ``cap_bytes`` (the first: ``first_cap_bytes``; a larger parameter gets its
    own), one dtype each, filled in reverse parameter order (the order backward tends to finish
    gradients)."""
    buckets: list[_Bucket] = []
    open_by_dtype: dict[np.dtype, _Bucket] = {}
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.size * p.dtype.itemsize
        bucket = open_by_dtype.get(p.dtype)
        limit = first_cap_bytes if bucket is not None and bucket.index == 0 else cap_bytes
        if bucket is None or (bucket.params and bucket.nbytes + nbytes > limit):
            bucket = _Bucket(len(buckets), [], 0)
            buckets.append(bucket)
            open_by_dtype[p.dtype] = bucket
        bucket.params.append(i)
        bucket.nbytes += nbytes
    return buckets
