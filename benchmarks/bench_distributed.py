"""Data-parallel scaling: samples/s of the digits CNN, the MLP 784-512-512-10 and the GPT block step on N ranks.

Run ``mpiexec -n 2 python benchmarks/bench_distributed.py`` (or ``-n 1``); on a 2-GPU host each
rank takes its own GPU. Weak scaling: the batch per rank is fixed, so N ranks process N times the
images per step. Per model it times:

- ``1 rank``: rank 0 alone (the others wait at a barrier) runs forward + backward + SGD step
  without communication: the 1-device baseline, measured in the same run; and every rank alone in
  turn (``slowest alone``: the slowest of them), since the processes of one host can run the same
  host-bound eager step at different speeds (benchmarks/RESULTS.md, "Data parallel on 2 x H200");
- ``local``: every rank at once runs that step under ``no_sync()``: what contention for the
  shared host (CPU, PCIe, memory) costs before any communication;
- ``DDP``: the same step with gradients averaged by DistributedDataParallel (buckets all-reduced
  during the backward; by default on DDP's overlap thread, pipelined in chunks: ``--no-overlap``
  measures the inline path instead);
- ``all-reduce``: ``sync_gradients()`` alone (every gradient, blocking, staging included): the
  communication a step needs when nothing overlaps it;
- on OpenCL, the same step captured with ``fuse_graph`` and replayed: rank 0 alone without
  communication, and every rank with the all-reduce in the graph (replayed efficiency).

Each repeat times them in turn (the eager steps are host-bound and a shared host's speed drifts);
printed by rank 0, a table: ms per step (slowest rank, median of repeats), images/s over all
ranks, scaling efficiency = images/s / (N x the 1-rank images/s), the same against the slowest rank alone
(``vs slowest``) and against the local step (``vs local`` = local / DDP: what the communication costs once
every rank runs); the efficiencies are medians of each repeat's own ratio (``paired_ratio``: a drift between
repeats cancels), the share of the DDP step that the blocking all-reduce would take (comm share), the exposed
share ((DDP - local) / DDP) and the overlap (1 - exposed / all-reduce: how much of the communication the backward
hid).
``--json`` writes the rows. The GPT block is the reference workload ``gpt_block`` (docs/architecture.md; its
"images" are sequences).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from bench_train import mlp  # MLP 784-512-512-10, the train workload's
from measure import paired_ratio
from train_digits_cnn import digits_cnn  # the model of examples/train_digits_cnn.py

import netcl.autograd as ag
from netcl import nn
from netcl.jit import fuse_graph
from netcl.nn.parallel import DistributedDataParallel
from netcl.optim import SGD, AdamW
from netcl.runtime import distributed as dist

GPT = {"vocab": 1024, "d": 512, "heads": 8, "seq": 256}


class GptBlock(nn.Module):
    """``gpt_block`` (the reference workload, docs/architecture.md): embedding, pre-norm causal attention
    (8 heads), GELU MLP (4x), LM head;
    ``forward(ids (B, S) int32)`` -> logits (B * S, vocab)."""

    def __init__(self, device, vocab: int, d: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d, device=device), nn.Embedding(seq, d, device=device)
        self.ln1, self.ln2, self.ln_f = (nn.LayerNorm(d, device=device) for _ in range(3))
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True, device=device)
        self.fc1, self.act, self.fc2 = (
            nn.Linear(d, 4 * d, device=device),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * d, d, device=device),
        )
        self.head = nn.Linear(d, vocab, device=device)
        self.vocab = vocab
        self.positions = ag.tensor(np.arange(seq, dtype=np.int32), device=device)
        self.causal = ag.tensor(np.triu(np.ones((seq, seq), bool), 1), device=device)

    def forward(self, ids):
        h = self.tok(ids) + self.pos(self.positions)
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False, attn_mask=self.causal, is_causal=True)[0]
        h = h + self.fc2(self.act(self.fc1(self.ln2(h))))
        logits = self.head(self.ln_f(h))
        return ag.reshape(logits, (-1, self.vocab))


def gpt(device):
    return GptBlock(device, **GPT)


MODELS = {"cnn": (digits_cnn, (1, 8, 8)), "mlp": (mlp, (784,)), "gpt": (gpt, None)}


def finish(device) -> None:
    if device.kind == "opencl":
        device.queue.finish()


def timed(fn, device, steps: int, repeats: int, alone: bool = False) -> float:
    """Seconds per call: median over ``repeats`` of ``steps`` calls, slowest rank (``alone``: this rank)."""
    samples = []
    for _ in range(repeats):
        if not alone:
            dist.barrier()
        finish(device)
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        finish(device)
        samples.append((time.perf_counter() - start) / steps)
    median = statistics.median(samples)
    return median if alone else max(dist.all_gather_object(median))


def bench_model(
    name: str, batch: int, device, steps: int, repeats: int, bucket_mb: float, overlap: bool = True
) -> dict:
    info = dist.init()
    build, sample_shape = MODELS[name]
    ag.manual_seed(0)
    model = build(device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb, overlap=overlap)
    rng = np.random.default_rng(info.rank)
    if name == "gpt":  # next-token targets over (batch, seq) ids; AdamW as in the gpt_block workload
        opt = AdamW(list(model.parameters()), lr=1e-4)
        ids = rng.integers(0, GPT["vocab"], (batch, GPT["seq"] + 1)).astype(np.int32)
        x = ag.tensor(ids[:, :-1], device=device)
        y = ag.tensor(ids[:, 1:].reshape(-1), device=device)
    else:
        opt = SGD(list(model.parameters()), lr=1e-3, momentum=0.9)
        x = ag.tensor(rng.uniform(0, 1, (batch, *sample_shape)).astype(np.float32), device=device)
        y = ag.tensor(rng.integers(0, 10, batch).astype(np.int32), device=device)

    def step(sync: bool) -> None:
        with nullcontext() if sync else ddp.no_sync():  # no_sync must cover the backward
            with ag.Tape() as tape:
                loss = ag.cross_entropy(ddp(x), y)
            tape.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=False)

    for _ in range(3):  # warm-up: programs built, pools filled, both paths once
        step(True)
        step(False)
    # each repeat times them in turn: a drift of the shared host's speed moves them alike
    rounds: dict[str, list[float]] = {"single": [], "slowest": [], "local": [], "ddp": [], "comm": []}
    for _ in range(repeats):
        alone = []
        for r in range(info.world_size):  # each rank alone in turn, the others waiting in the broadcast
            mine = timed(lambda: step(False), device, steps, 1, alone=True) if info.rank == r else None
            alone.append(dist.broadcast_object(mine, root=r))
        rounds["single"].append(alone[0])
        rounds["slowest"].append(max(alone))
        rounds["local"].append(timed(lambda: step(False), device, steps, 1))
        rounds["ddp"].append(timed(lambda: step(True), device, steps, 1))
        rounds["comm"].append(timed(ddp.sync_gradients, device, steps, 1) if info.world_size > 1 else 0.0)
    t_single, t_local, t_ddp, t_comm = (statistics.median(rounds[k]) for k in ("single", "local", "ddp", "comm"))
    efficiency, vs_slowest, vs_local = (paired_ratio(rounds[k], rounds["ddp"]) for k in ("single", "slowest", "local"))
    replay = replayed(ddp, model, opt, x, y, device, steps, repeats) if device.kind == "opencl" else None
    path = ddp.all_reduce_path
    ddp.remove_hooks()
    n = info.world_size
    exposed = max(t_ddp - t_local, 0.0)
    return {
        "model": name,
        "ranks": n,
        "batch_per_rank": batch,
        "parameters": sum(p.size for p in model.parameters()),
        "buckets": len(ddp.buckets),
        "overlapped_buckets": ddp.stats.overlapped,
        "all_reduce_path": path,
        "one_rank_ms": t_single * 1e3,
        "slowest_alone_ms": statistics.median(rounds["slowest"]) * 1e3,
        "local_ms": t_local * 1e3,
        "ddp_ms": t_ddp * 1e3,
        "allreduce_ms": t_comm * 1e3,
        "images_per_s": n * batch / t_ddp,
        "one_rank_images_per_s": batch / t_single,
        "scaling_efficiency": efficiency,
        "efficiency_vs_slowest_alone": vs_slowest,
        "efficiency_vs_local": vs_local,
        "comm_share": t_comm / t_ddp,
        "exposed_share": exposed / t_ddp,
        "overlap": 1.0 - min(exposed / t_comm, 1.0) if t_comm > 0 else None,
        "device": str(device),
        "replay_one_rank_ms": replay[0] * 1e3 if replay else None,
        "replay_ddp_ms": replay[1] * 1e3 if replay else None,
        "replay_efficiency": replay[2] if replay else None,
    }


def replayed(ddp, model, opt, x, y, device, steps: int, repeats: int) -> tuple[float, float, float]:
    """Seconds per replayed step (``fuse_graph``): rank 0 alone without communication, and every rank with
    DDP's all-reduce in the graph (recorded host all-reduces on the MPI paths, the exchange's kernels on
    the peer path), each repeat timing both in turn; and the efficiency (``paired_ratio``)."""
    params = list(model.parameters())
    with ddp.no_sync():  # captured without the hooks: the local step
        local = fuse_graph(model, x, y, ag.cross_entropy, params=params, optimizer_step=opt.step)
    synced = fuse_graph(ddp, x, y, ag.cross_entropy, params=params, optimizer_step=opt.step)
    for _ in range(3):
        local.execute(x, y)
        synced.execute(x, y)
    rounds: dict[str, list[float]] = {"single": [], "ddp": []}
    for _ in range(repeats):
        single = timed(lambda: local.execute(x, y), device, steps, 1, alone=True) if dist.get_rank() == 0 else None
        rounds["single"].append(dist.broadcast_object(single))
        rounds["ddp"].append(timed(lambda: synced.execute(x, y), device, steps, 1))
    return (
        statistics.median(rounds["single"]),
        statistics.median(rounds["ddp"]),
        paired_ratio(rounds["single"], rounds["ddp"]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="device of every rank (default: a GPU per rank, else default)")
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp", "gpt"], choices=sorted(MODELS))
    parser.add_argument("--cnn-batch", type=int, default=256, help="CNN images per rank per step")
    parser.add_argument("--mlp-batch", type=int, default=128, help="MLP images per rank per step")
    parser.add_argument("--gpt-batch", type=int, default=8, help="GPT block sequences per rank per step")
    parser.add_argument("--gpt-seq", type=int, default=GPT["seq"], help="GPT block sequence length")
    parser.add_argument(
        "--no-overlap", dest="overlap", action="store_false", help="all-reduce buckets inline (no overlap thread)"
    )
    parser.add_argument("--steps", type=int, default=20, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size in MB")
    parser.add_argument("--json", dest="json_path", default=None, help="rank 0 writes the rows here")
    args = parser.parse_args()
    GPT["seq"] = args.gpt_seq
    info = dist.init(device=args.device)
    rows = []
    for name in args.models:
        batch = {"cnn": args.cnn_batch, "mlp": args.mlp_batch, "gpt": args.gpt_batch}[name]
        rows.append(bench_model(name, batch, info.device, args.steps, args.repeats, args.bucket_mb, args.overlap))
    if info.rank != 0:
        return
    path = (
        {
            "peer": "peer (kernels read every rank's window over the GPUs' peer links, no host wait)",
            "device-direct": "device-direct (NCCL on memory OpenCL shares with CUDA, own thread)",
            "overlapped": "overlapped host-staged MPI (own thread and queue, chunked)",
        }.get(rows[0]["all_reduce_path"], "inline")
        if rows
        else "-"
    )
    print(f"{info.world_size} rank(s); rank 0 on {info.device}; weak scaling (fixed batch per rank); all-reduce {path}")
    header = (
        f"{'model':>5} {'ranks':>5} {'batch/rank':>10} {'1-rank ms':>9} {'local ms':>9} {'DDP ms':>8} "
        f"{'all-reduce ms':>13} {'images/s':>10} {'efficiency':>10} {'vs slowest':>10} {'vs local':>8} "
        f"{'comm share':>10} {'exposed':>8} "
        f"{'overlap':>8}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['model']:>5} {r['ranks']:>5} {r['batch_per_rank']:>10} {r['one_rank_ms']:>9.2f} {r['local_ms']:>9.2f} "
            f"{r['ddp_ms']:>8.2f} "
            f"{r['allreduce_ms']:>13.2f} {r['images_per_s']:>10.0f} {r['scaling_efficiency']:>10.1%} "
            f"{r['efficiency_vs_slowest_alone']:>10.1%} {r['efficiency_vs_local']:>8.1%} "
            f"{r['comm_share']:>10.1%} {r['exposed_share']:>8.1%} "
            + (f"{r['overlap']:>8.1%}" if r["overlap"] is not None else f"{'-':>8}")
        )
    replays = [r for r in rows if r["replay_efficiency"] is not None]
    if replays:
        print(f"replayed steps (fuse_graph): {'model':>5} {'1-rank ms':>9} {'DDP ms':>8} {'efficiency':>10}")
        for r in replays:
            print(
                f"{'':>29}{r['model']:>5} {r['replay_one_rank_ms']:>9.3f} {r['replay_ddp_ms']:>8.3f} "
                f"{r['replay_efficiency']:>10.1%}"
            )
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
