"""One MPI rank of the distributed tests: ``worker.py CASE DEVICE OUTDIR`` (run under mpiexec).

Each case writes ``OUTDIR/rank{r}.pkl``: a dict of results (NumPy arrays, messages) that the
pytest side compares across ranks and against float64 / single-process references.
"""

from __future__ import annotations

import itertools
import pickle
import sys
from pathlib import Path

import numpy as np

import netcl.autograd as ag
from netcl.core import Tensor
from netcl.nn.parallel import DistributedDataParallel
from netcl.runtime import distributed as dist
from netcl.runtime import ops as R

SIZES = (1, 5, 1000, 4099)


def rank_data(rank: int, size: int, dtype=np.float32) -> np.ndarray:
    """What rank ``rank`` contributes (the test regenerates it for the reference)."""
    return np.random.default_rng(1000 * rank + size).normal(size=size).astype(dtype)


class MLP:
    """A 6-8-3 MLP with one buffer; ``seed`` differs per rank so DDP's broadcast matters."""

    def __init__(self, device, seed: int, hidden: int = 8) -> None:
        rng = np.random.default_rng(seed)
        shapes = {"fc1.weight": (6, hidden), "fc1.bias": (1, hidden), "fc2.weight": (hidden, 3), "fc2.bias": (1, 3)}
        self.named = [
            (k, ag.tensor(rng.normal(0, 0.5, s).astype(np.float32), requires_grad=True, device=device))
            for k, s in shapes.items()
        ]
        self.running = Tensor.from_host(device, np.full(3, float(seed), np.float32))

    def named_parameters(self):
        return iter(self.named)

    def parameters(self):
        return (p for _, p in self.named)

    def named_buffers(self):
        return iter([("running", self.running)])

    def __call__(self, x):
        w1, b1, w2, b2 = (p for _, p in self.named[:4])
        return ag.relu(x @ w1 + b1) @ w2 + b2


def batch(device, step: int, n: int = 8):
    rng = np.random.default_rng(77 + step)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def grads_of(model, x, y, device):
    with ag.Tape():
        loss = ag.cross_entropy(model(ag.tensor(x, device=device)), ag.tensor(y, device=device))
        loss.backward()
    return [p.grad.to_host() for p in model.parameters()]


def error_of(fn) -> str:
    try:
        fn()
    except Exception as exc:  # the tests check the type name and message
        return f"{type(exc).__name__}: {exc}"
    return "no error"


# ---- cases -------------------------------------------------------------------------------------------
def case_collectives(info, device) -> dict:
    out: dict = {}
    for size in SIZES:
        for op in ("sum", "mean"):
            t = Tensor.from_host(device, rank_data(info.rank, size))
            dist.all_reduce(t, op)
            out[f"{op}{size}"] = t.to_host()
    ints = Tensor.from_host(device, np.arange(10, dtype=np.int32) * (info.rank + 1))
    out["int_sum"] = dist.all_reduce(ints).to_host()
    a = Tensor.from_host(device, rank_data(info.rank, 300))
    b = Tensor.from_host(device, rank_data(info.rank, 301))
    wa, wb = dist.all_reduce_async(a), dist.all_reduce_async(b, "mean")
    wb.wait()
    wa.wait()
    out["async_a"], out["async_b"] = a.to_host(), b.to_host()
    ins = [Tensor.from_host(device, rank_data(info.rank, n)) for n in (3, 4)]
    outs = [Tensor.empty(t.shape, t.dtype, device) for t in ins]
    dist.all_reduce_coalesced_async(ins, "sum", outs).wait()
    out["coalesced"] = [t.to_host() for t in outs]
    out["coalesced_inputs_kept"] = [t.to_host() for t in ins]
    c = Tensor.from_host(device, np.full((2, 3), info.rank + 5.0, np.float32))
    out["broadcast"] = dist.broadcast(c, root=1).to_host()
    out["all_gather"] = dist.all_gather(Tensor.from_host(device, np.full(4, info.rank, np.int32))).to_host()
    out["objects"] = dist.all_gather_object({"rank": info.rank})
    out["broadcast_object"] = dist.broadcast_object(f"from {info.rank}", root=1)
    dist.barrier()
    t = Tensor.from_host(device, np.ones(3, np.float32))
    out["errors"] = {
        "op": error_of(lambda: dist.all_reduce(t, "max")),
        "int_mean": error_of(lambda: dist.all_reduce(ints, "mean")),
        "root": error_of(lambda: dist.broadcast(t, root=2)),
        "type": error_of(lambda: dist.all_reduce(np.ones(3))),
    }
    if device.kind == "opencl":  # a captured all-reduce replays
        from netcl.runtime.graph import Graph

        x = Tensor.from_host(device, rank_data(info.rank, 6))
        g = Graph()
        with g.capture(device.queue):
            R.add_(x, 1.0)
            dist.all_reduce(x)
        out["captured"] = x.to_host()
        import pyopencl as cl

        cl.enqueue_copy(device.queue, x.data, rank_data(info.rank, 6) * 2, is_blocking=True)
        g.execute(wait=True)
        out["replayed"] = x.to_host()
    dist.barrier()
    return out


def case_ddp(info, device) -> dict:
    out: dict = {}
    model = MLP(device, seed=10 + info.rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4)  # ~100 bytes: several buckets
    out["params_after_init"] = [p.to_host() for p in model.parameters()]
    out["buffer_after_init"] = model.running.to_host()
    out["buckets"] = len(ddp.buckets)
    x, y = batch(device, 0, 16)
    shard = slice(8 * info.rank, 8 * info.rank + 8)
    with ag.Tape():
        loss = ag.cross_entropy(ddp(ag.tensor(x[shard], device=device)), ag.tensor(y[shard], device=device))
        loss.backward()
    out["grads"] = [p.grad.to_host() for p in model.parameters()]
    out["started_during_backward"] = ddp.stats.started_during_backward
    # the single-process reference on the whole batch, from the same (broadcast) parameters
    reference = MLP(device, seed=0)
    for (_, p), (_, q) in zip(reference.named, model.named, strict=True):
        p.value = Tensor.from_host(device, q.to_host())
    out["reference_grads"] = grads_of(reference, x, y, device)
    # a second backward accumulates: mean(g1) + mean(g2)
    with ag.Tape():
        loss = ag.cross_entropy(ddp(ag.tensor(x[shard], device=device)), ag.tensor(y[shard], device=device))
        loss.backward()
    out["accumulated"] = [p.grad.to_host() for p in model.parameters()]
    # no_sync keeps gradients local; sync_gradients averages them afterwards
    for p in model.parameters():
        p.grad = p.value.grad = None
    with ddp.no_sync(), ag.Tape():
        loss = ag.cross_entropy(ddp(ag.tensor(x[shard], device=device)), ag.tensor(y[shard], device=device))
        loss.backward()
    out["local_grads"] = [p.grad.to_host() for p in model.parameters()]
    ddp.sync_gradients()
    out["synced_grads"] = [p.grad.to_host() for p in model.parameters()]
    out["fuse_graph"] = fuse_graph_run(info, device)
    return out


def fuse_graph_run(info, device) -> dict:
    """fuse_graph (captured + replayed on OpenCL) of a DDP step with netcl.optim's SGD (momentum) and
    Adam, vs the same steps eagerly."""
    from netcl.jit import fuse_graph
    from netcl.optim import SGD, Adam

    results = {}
    for name in ("sgd", "adam"):
        for mode in ("replay", "eager"):
            model = MLP(device, seed=20 + info.rank)
            ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4)
            params = list(model.parameters())
            opt = SGD(params, lr=0.1, momentum=0.9) if name == "sgd" else Adam(params, lr=0.01)
            shard = slice(8 * info.rank, 8 * info.rank + 8)
            xs = [batch(device, s, 16) for s in range(4)]
            if mode == "replay":
                x0, y0 = xs[0]
                fused = fuse_graph(
                    ddp,
                    ag.tensor(x0[shard], device=device),
                    ag.tensor(y0[shard], device=device),
                    ag.cross_entropy,
                    params=params,
                    optimizer_step=opt.step,
                )
                for x, y in xs[1:]:
                    fused.execute(ag.tensor(x[shard], device=device), ag.tensor(y[shard], device=device))
                steps = fused.graph.steps if fused.graph is not None else []
                results[f"{name}_recorded"] = [s.name for s in steps if s.name.startswith("all_reduce")]
                launches = fused.graph.launches if fused.graph is not None else []
                results[f"{name}_peer_kernels"] = [s.name for s in launches if s.name.startswith("netcl_peer")]
                results["path"] = ddp.all_reduce_path
            else:
                for x, y in xs:
                    opt.zero_grad()
                    with ag.Tape():
                        logits = ddp(ag.tensor(x[shard], device=device))
                        loss = ag.cross_entropy(logits, ag.tensor(y[shard], device=device))
                        loss.backward()
                    opt.step()
            ddp.remove_hooks()
            results[f"{name}_{mode}"] = [p.to_host() for p in params]
    return results


def case_mismatch(info, device) -> dict:
    model = MLP(device, seed=1, hidden=8 if info.rank == 0 else 9)
    return {"error": error_of(lambda: DistributedDataParallel(model))}


def case_dead(info, device) -> dict:
    if info.rank == 1:
        sys.exit(0)  # leaves without joining the all-reduce
    t = Tensor.from_host(device, np.ones(4, np.float32))
    return {"error": error_of(lambda: dist.all_reduce(t)), "after": error_of(lambda: dist.barrier())}


def case_single(info, device) -> dict:
    model = MLP(device, seed=3)
    before = [p.to_host() for p in model.parameters()]
    ddp = DistributedDataParallel(model)
    x, y = batch(device, 0)
    with ag.Tape():
        ag.cross_entropy(ddp(ag.tensor(x, device=device)), ag.tensor(y, device=device)).backward()
    t = Tensor.from_host(device, np.arange(4, dtype=np.float32))
    return {
        "world_size": info.world_size,
        "params": [p.to_host() for p in model.parameters()],
        "before": before,
        "grads": [p.grad.to_host() for p in model.parameters()],
        "reference_grads": grads_of(MLP(device, seed=3), x, y, device),
        "all_reduce": dist.all_reduce(t, "mean").to_host(),
        "all_gather": dist.all_gather(t).to_host(),
    }


# ---- choices that agree ---------------------------------------------------------------------------
def _gemm_key(m: int, n: int, k: int) -> str:
    from netcl.runtime import tune

    return tune.shape_class("portable", m, n, k, False, "NN", "<f4")


def _product(device, m: int, n: int, k: int) -> np.ndarray:
    """The same operands on every rank (seeded by the shape), multiplied by the portable GEMM."""
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    a = Tensor.from_host(device, rng.uniform(-1, 1, (m, k)).astype(np.float32))
    b = Tensor.from_host(device, rng.uniform(-1, 1, (k, n)).astype(np.float32))
    return R.matmul(a, b).to_host()


def case_tune_agree(info, device) -> dict:
    """The tile search on (NETCL_TUNE=1, host BLAS off so PoCL runs the portable GEMM). The search is
    replaced by a deterministic stand-in whose winner depends on the rank, as a clock's can: without
    the choice authority the ranks would pick different tiles."""
    import os
    import warnings

    from netcl.runtime import determinism, tune
    from netcl.runtime.tune import agree

    os.environ["NETCL_TUNE"], os.environ["NETCL_HOST_BLAS"] = "1", "0"
    outdir = Path(sys.argv[3])
    tune.store_path = lambda device: outdir / f"tune{info.rank}.json"  # a fresh store per rank
    searched: list[str] = []

    def rank_dependent_search(device, candidates, trial, **kwargs):
        pick = candidates[(3 + 5 * info.rank) % len(candidates)]
        searched.append(str(pick))
        trial(pick)  # the config builds and runs, as in a real search
        return pick, 1.0

    tune.search = rank_dependent_search
    first = _gemm_key(64, 40, 48)
    if info.rank == 1:  # a winner stored by an earlier single-process run on rank 1 only
        tune._table(device)[first] = {"wgm": 8, "wgn": 8, "tm": 1, "tn": 1, "bk": 8, "va": 1, "vb": 1, "lv": 1}
    out: dict = {"products": [_product(device, 64, 40, 48), _product(device, 20, 130, 70)]}
    out["agreed"] = {k: dict(v) for (_, k), v in agree._AGREED.items()}
    out["searched"] = list(searched)
    out["stored"] = tune.store_path(device).exists()
    with tune.local_choices():  # rank-local: each rank's own search
        _product(device, 8, 8, 300)
    local_key = _gemm_key(8, 8, 300)
    out["local"] = tune.lookup(device, local_key)
    out["local_agreed"] = any(k == local_key for _, k in agree._AGREED)
    with tune.local_choices():  # an agreed key keeps its agreed config (not rank 1's stored winner)
        out["local_reuses"] = tune.select(device, first, [], None, lambda c: None, dict, dict)
    # ranks that reach different shapes: an error on both, naming both keys
    shape = (16, 16, 16) if info.rank == 0 else (16, 16, 600)
    out["mismatch"] = error_of(lambda: _product(device, *shape))
    # deterministic algorithms: the documented default, no search, no exchange
    before = len(searched)
    determinism.use_deterministic_algorithms(True)
    try:
        out["deterministic"] = _product(device, 100, 3, 5)
        out["det_key_agreed"] = any(k == _gemm_key(100, 3, 5) for _, k in agree._AGREED)
        out["det_searched"] = len(searched) - before
        out["forced"] = error_of(
            lambda: tune.select(device, "forced", [1, 2], 1, lambda c: None, lambda c: {"c": c}, lambda d: d["c"], True)
        )
        determinism.use_deterministic_algorithms(True, warn_only=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["forced_warn_only"] = tune.select(
                device, "forced", [1, 2], 1, lambda c: None, lambda c: {"c": c}, lambda d: d["c"], True
            )
        out["warnings"] = [str(w.message) for w in caught]
    finally:
        determinism.use_deterministic_algorithms(False)
    dist.barrier()
    return out


# ---- overlapped all-reduce --------------------------------------------------------------------------
def case_ddp_overlap(info, device) -> dict:
    """Overlapped DDP (tiny buckets and 40-byte pipeline chunks: many of each) vs the inline path vs one
    process, over two steps with SGD."""
    from netcl.optim import SGD

    out: dict = {}
    x, y = batch(device, 3, 16)
    shard = slice(8 * info.rank, 8 * info.rank + 8)
    for name, kwargs in (
        ("overlap", {"overlap": True, "pipeline_chunk_mb": 40 / 2**20}),
        ("inline", {"overlap": False}),
    ):
        model = MLP(device, seed=30 + info.rank, hidden=24)
        ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4, **kwargs)
        opt = SGD(list(model.parameters()), lr=0.1)
        grads = []
        for _ in range(2):
            opt.zero_grad()
            with ag.Tape():
                loss = ag.cross_entropy(ddp(ag.tensor(x[shard], device=device)), ag.tensor(y[shard], device=device))
                loss.backward()
            grads.append([p.grad.to_host() for p in model.parameters()])
            opt.step()
        out[name] = {
            "grads": grads,
            "params": [p.to_host() for p in model.parameters()],
            "buckets": len(ddp.buckets),
            "overlapped": ddp.stats.overlapped,
            "started_during_backward": ddp.stats.started_during_backward,
            "all_reduce_path": ddp.all_reduce_path,
        }
        ddp.remove_hooks()
    # one process on the whole batch from the same broadcast start (rank 0's seed)
    reference = MLP(device, seed=30, hidden=24)
    out["reference_grads"] = grads_of(reference, x, y, device)
    return out


def case_ddp_dead(info, device) -> dict:
    """Rank 1 leaves after DDP's construction: rank 0's overlapped backward must time out, not hang."""
    model = MLP(device, seed=5)
    ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4)
    x, y = batch(device, 0)

    def step(net):
        with ag.Tape():
            ag.cross_entropy(net(ag.tensor(x, device=device)), ag.tensor(y, device=device)).backward()

    # both ranks first agree the tuned choices (GEMM tiles on a GPU: agreed even with tuning off) of a backward that
    # writes new gradients and of one that adds into them (a product with an addend epilogue searches under a key
    # of its own), so what rank 0 then waits for alone is the overlapped exchange
    step(model)
    step(model)
    if info.rank == 1:
        sys.exit(0)

    return {"error": error_of(lambda: step(ddp)), "after": error_of(lambda: dist.barrier())}


def case_direct_required(info, device) -> dict:
    """NETCL_DEVICE_DIRECT=1 (set by the test) where the path cannot run: the same error on every rank."""
    from netcl.runtime.distributed import device_direct

    return {
        "probe": device_direct.probe(device).reason,
        "error": error_of(lambda: DistributedDataParallel(MLP(device, seed=1), bucket_cap_mb=1e-4)),
    }


def case_ddp_coalesced_dtypes(info, device) -> dict:
    """DDP's one exchange per dtype at the end of the backward (the path the device-direct reducer takes),
    run here through the MPI reducer (same ``submit``) on float32 and float64 parameters, against the
    inline path: gradients and counters."""
    out: dict = {}
    x, y = batch(device, 5)
    for name, coalesce in (("coalesced", True), ("inline", False)):
        model = MLP(device, seed=40 + info.rank)
        extra = np.random.default_rng(3 + info.rank).normal(size=(3,))  # float64
        model.named.append(("extra", ag.tensor(extra, requires_grad=True, device=device, dtype=np.float64)))
        ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4, overlap=coalesce)
        ddp._coalesce = coalesce
        scale = model.named[-1][1]
        with ag.Tape():
            logits = ddp(ag.tensor(x, device=device))
            loss = ag.cross_entropy(logits, ag.tensor(y, device=device)) + ag.sum(scale * scale)
            loss.backward()
        out[name] = {
            "grads": [p.grad.to_host() for p in model.parameters()],
            "buckets": len(ddp.buckets),
            "overlapped": ddp.stats.overlapped,
            "started_during_backward": ddp.stats.started_during_backward,
        }
        ddp.remove_hooks()
    return out


def case_direct_deterministic(info, device) -> dict:
    """Under use_deterministic_algorithms(True) the device-direct path is never taken (with NETCL_DEVICE_DIRECT=1:
    an error)."""
    from netcl.runtime import determinism

    determinism.use_deterministic_algorithms(True)
    try:
        return {"error": error_of(lambda: DistributedDataParallel(MLP(device, seed=1), bucket_cap_mb=1e-4))}
    finally:
        determinism.use_deterministic_algorithms(False)


# ---- peer all-reduce ------------------------------------------------------------------------------
def case_ddp_peer(info, device) -> dict:
    """DDP on the peer path against the inline MPI path, over five SGD steps (both slots of a window used
    twice) of float32 weights and a float16 and a float64 parameter (a window each): gradients and params."""
    from netcl.optim import SGD

    out: dict = {}
    x, y = batch(device, 4, 24)
    shard = slice(8 * info.rank, 8 * info.rank + 8)
    for name, overlap in (("peer", True), ("inline", False)):
        model = MLP(device, seed=50 + info.rank, hidden=24)
        rng = np.random.default_rng(9 + info.rank)
        for key, dtype in (("half", np.float16), ("double", np.float64)):
            value = rng.normal(size=(5,)).astype(dtype)
            model.named.append((key, ag.tensor(value, requires_grad=True, device=device, dtype=dtype)))
        ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4, overlap=overlap)
        opt = SGD([p for _, p in model.named[:4]], lr=0.1)  # float16 is storage-only on NVIDIA's OpenCL
        grads, holders = [], []

        def backward(ids: slice, ddp=ddp, model=model) -> None:
            with ag.Tape():
                logits = ddp(ag.tensor(x[ids], device=device))
                half, double = model.named[4][1], model.named[5][1]
                loss = ag.cross_entropy(logits, ag.tensor(y[ids], device=device))
                loss = loss + ag.sum(half * half) + ag.sum(double * double)
                loss.backward()

        for step in range(7):
            # steps 0-4 start from no gradients (the SGD parameters'), 5-6 from zeroed ones, and step 6 accumulates a
            # local (no_sync) backward of another shard first
            opt.zero_grad(set_to_none=step < 5)
            if step == 6:
                with ddp.no_sync():
                    backward(slice(16 + 4 * info.rank, 20 + 4 * info.rank))
            backward(shard)
            grads.append([p.grad.to_host() for p in model.parameters()])
            holders.append([p.grad for p in model.parameters()])
            opt.step()
        out[name] = {
            "grads": grads,
            "params": [p.to_host() for p in model.parameters()],
            "path": ddp.all_reduce_path,
            # per step after the first, per parameter: whether its averaged grad is the step before's tensor
            "grads_kept": [[a is b for a, b in zip(h0, h1, strict=True)] for h0, h1 in itertools.pairwise(holders)],
        }
        ddp.remove_hooks()
    return out


def case_peer_replay(info, device) -> dict:
    """fuse_graph of a DDP step on the peer path: the exchange's kernels in the graph, replayed."""
    return fuse_graph_run(info, device)


def case_peer_dead(info, device) -> dict:
    """Rank 1 leaves after a first synchronized step: rank 0's next exchange times out on the device and
    its next host read raises."""
    model = MLP(device, seed=5)
    ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4)
    x, y = batch(device, 0)

    def step():
        with ag.Tape():
            ag.cross_entropy(ddp(ag.tensor(x, device=device)), ag.tensor(y, device=device)).backward()
        return [p.grad.to_host() for p in model.parameters()]

    first = step()
    if info.rank == 1:
        sys.exit(0)
    return {"path": ddp.all_reduce_path, "first": first, "error": error_of(step), "after": error_of(dist.barrier)}


def case_peer_window_fails(info, device) -> dict:
    """The peer path's setup failing on one rank (no NVIDIA GPU needed: the device checks, the exported memory
    and the import (a plain buffer) are stand-ins; the descriptors go over the real sockets): every rank gets the
    same error,
    none waits forever. ``PEER_FAILURE`` (set by the test) says where: "allocate" on rank 1 or "import" on
    rank 0."""
    import os

    import pyopencl as cl

    from netcl.runtime.distributed import peer

    class Memory:  # an exported allocation: a descriptor to hand over
        nbytes = 1 << 16

        def __init__(self) -> None:
            self.fd = os.open(os.devnull, os.O_RDONLY)

        def free(self) -> None:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1

    failure = os.environ["PEER_FAILURE"]
    received = []

    def allocate(self) -> None:
        if failure == "allocate" and self.rank == 1:
            raise OSError("no memory to export here")
        self.memory = Memory()

    def import_memory(device, fd, nbytes):
        received.append(os.path.exists(f"/proc/self/fd/{fd}"))
        if failure == "import" and info.rank == 0:
            raise cl.Error("import refused")
        os.close(fd)
        return cl.Buffer(device.context, cl.mem_flags.READ_WRITE, nbytes)

    peer.applicable = lambda device: None
    peer.nvidia_pci = lambda device: (0, 0, info.rank)  # a GPU of its own
    peer.Window._allocate = allocate
    peer.import_memory = import_memory
    error = error_of(lambda: DistributedDataParallel(MLP(device, seed=1), bucket_cap_mb=1e-4))
    return {"error": error, "received": received, "after": error_of(dist.barrier)}


def case_peer_required(info, device) -> dict:
    """NETCL_PEER_ALLREDUCE=1 (set by the test) where the path cannot run: the same error on every rank."""
    return {"error": error_of(lambda: DistributedDataParallel(MLP(device, seed=1), bucket_cap_mb=1e-4))}


def case_bucket_mismatch(info, device) -> dict:
    model = MLP(device, seed=1)
    return {"error": error_of(lambda: DistributedDataParallel(model, bucket_cap_mb=1e-4 if info.rank == 0 else 25))}


def case_tune_alone(info, device) -> dict:
    """Rank 0 reaches a tuned choice alone (rank 1 waits at a barrier): a timeout naming the choice."""
    import os

    os.environ["NETCL_TUNE"], os.environ["NETCL_HOST_BLAS"] = "0", "0"
    if info.rank == 0:
        return {"error": error_of(lambda: _product(device, 12, 12, 12)), "after": error_of(dist.barrier)}
    return {"error": error_of(dist.barrier)}


def case_bench_rows(info, device) -> dict:
    """``benchmarks/bench_distributed.py``'s row of the MLP at a tiny size (1 step a repeat, 3 repeats)."""
    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(root / "benchmarks"), str(root / "examples")]
    import bench_distributed

    return bench_distributed.bench_model("mlp", 4, device, steps=1, repeats=3, bucket_mb=25.0)


def main() -> None:
    case, spec, outdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    info = dist.init(device=None if spec == "auto" else spec)  # "auto": one GPU per rank where there are several
    result = globals()[f"case_{case}"](info, info.device)
    with open(outdir / f"rank{info.rank}.pkl", "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main()
