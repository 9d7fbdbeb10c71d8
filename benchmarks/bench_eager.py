"""The ``eager`` workload: host microseconds per eager op, against a raw pyopencl launch and torch eager,
and the eager training steps of the ``train`` workload.

1. **Per-op host cost.** A dozen ops on small tensors (32x32 float32, matmul 64x64), so the host's
   work per call, not the device's, is what the loop measures: the median over repeats of the wall
   time of ``INNER`` back-to-back calls divided by ``INNER``, the queue drained between repeats
   (outside the timed region). netcl's, torch's and the raw floor's samples of an op are taken in turn, and
   each ratio is the median of its turns' own ratios, so a drift of a shared host's speed cancels. Columns:

   - ``no_grad`` / ``recording``: netcl under ``ag.no_grad()``, and inside a ``Tape`` with inputs
     that require grad (the op builds its graph node);
   - ``calls``: Python function calls per op (``cProfile``'s count, no_grad), a measure that the
     machine's load does not move;
   - ``torch`` / ``torch rec``: the same op in torch eager (CUDA when available, else CPU), with and
     without ``requires_grad`` inputs, when torch is importable;
   - raw launches of a prepared 1K-element add kernel (its arguments set once): ``raw kernel()``
     (pyopencl's documented call ``kernel(queue, global, local, *args)``, which sets the arguments each call),
     ``raw enqueue`` (pyopencl's ``_cl.enqueue_nd_range_kernel``, which returns an event), ``raw set+enqueue``
     (``kernel.set_args`` each call), ``raw least op`` (``least_op.py``: the least a Python op can do, a
     launch found by signature, a pooled output in a result object, one argument set, the floor's enqueue)
     and ``raw floor``: ``netcl.runtime.enqueue.enqueuer``, the cheapest enqueue on this platform and the one
     netcl's prepared launches make (no event on NVIDIA, where pyopencl's eventful call on a profiling queue
     costs about twice as much; pyopencl's call elsewhere).
     ``x raw`` is no_grad over ``raw floor``, ``x kernel()`` no_grad over ``raw kernel()`` (pyopencl's launch of a
     prepared kernel with its arguments, as an eager op must pass its new output each call). On PoCL the floor is a
     back-to-back enqueue: an enqueue that follows ~1 us of other host work costs ~1.8x as much (PoCL's worker has
     gone idle; benchmarks/RESULTS.md, "Eager host cost, thirtieth session").

   The issue's targets: netcl <= 1.5x torch eager on a GPU, <= 2x a raw launch on PoCL.
2. **Eager training steps**: ms per step of the MLP and the digits CNN of the ``train`` workload
   (``bench_train.py``) and the ``gpt_block`` step of the ``transformer`` workload (quick size off a
   GPU), eager and replayed, with torch eager as the peer.

Run alone (``python benchmarks/bench_eager.py [--quick] [--device SPEC] [--no-peers]``) or as
``hatch run bench --workload eager``.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from least_op import make_least_op
from measure import paired_ratio, standalone_parser, write_results

import netcl.autograd as ag
import netcl.core as nc
from netcl.runtime.enqueue import enqueuer

SIDE, MM = 32, 64  # 32x32 = 1K elements; the matmul is 64x64 @ 64x64
INNER = 200
WIDTH = 16

#: name -> (netcl op of the inputs dict, torch op of the inputs dict)
OPS: dict[str, tuple[Callable[[dict], object], Callable[[dict], object]]] = {
    "add": (lambda t: ag.add(t["x"], t["y"]), lambda t: t["x"] + t["y"]),
    "add y.T": (lambda t: ag.add(t["x"], t["y"].T), lambda t: t["x"] + t["y"].t()),
    "mul scalar": (lambda t: ag.mul(t["x"], 2.0), lambda t: t["x"] * 2.0),
    "relu": (lambda t: ag.relu(t["x"]), lambda t: t["torch"].relu(t["x"])),
    "exp": (lambda t: ag.exp(t["x"]), lambda t: t["torch"].exp(t["x"])),
    "sum axis 1": (lambda t: ag.sum(t["x"], axis=1), lambda t: t["x"].sum(1)),
    "mean": (lambda t: ag.mean(t["x"]), lambda t: t["x"].mean()),
    "max axis 1": (lambda t: ag.max(t["x"], axis=1), lambda t: t["x"].amax(1)),
    "matmul 64": (lambda t: ag.matmul(t["a"], t["b"]), lambda t: t["a"] @ t["b"]),
    "matmul 64 b.T": (lambda t: ag.matmul(t["a"], t["b"].T), lambda t: t["a"] @ t["b"].t()),
    "softmax": (lambda t: ag.softmax(t["x"], axis=-1), lambda t: t["x"].softmax(-1)),
    "index_select": (lambda t: ag.index_select(t["x"], 0, t["idx"]), lambda t: t["x"].index_select(0, t["idx"])),
    "gather": (lambda t: ag.gather(t["x"], 1, t["gidx"]), lambda t: t["x"].gather(1, t["gidx"])),
    "reshape": (lambda t: ag.reshape(t["x"], (SIDE * SIDE,)), lambda t: t["x"].reshape(SIDE * SIDE)),
    "transpose": (lambda t: ag.transpose(t["x"]), lambda t: t["x"].t()),
    "getitem": (lambda t: t["x"][2:10], lambda t: t["x"][2:10]),
}


def _sampler(
    fn: Callable[[], object], sync: Callable[[], None], context: Callable[[], Any] = nullcontext
) -> Callable[[], float]:
    """A function that takes one sample: host microseconds per call over ``INNER`` calls of ``fn`` inside one
    ``context()``, then ``sync`` (outside the timed region). A recording sample gets a tape of its own: the nodes
    (and their output blocks) of one sample are released before the next, as a training step's are. ``fn`` is
    warmed up first."""
    for _ in range(2):
        with context():
            for _ in range(5):
                fn()
    sync()

    def sample() -> float:
        with context():
            start = time.perf_counter()
            for _ in range(INNER):
                fn()
            elapsed = (time.perf_counter() - start) / INNER * 1e6
        sync()
        return elapsed

    return sample


def _host_us(
    fn: Callable[[], object], sync: Callable[[], None], repeats: int, context: Callable[[], Any] = nullcontext
) -> float:
    """Median host microseconds per call of ``fn`` over ``repeats`` samples (``_sampler``)."""
    sample = _sampler(fn, sync, context)
    return statistics.median(sample() for _ in range(repeats))


def _calls_per_op(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    """Python function calls (C functions included) per call of ``fn``, by ``cProfile``."""
    fn()
    sync()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(INNER):
        fn()
    profiler.disable()
    sync()
    return pstats.Stats(profiler).total_calls / INNER


def _host_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((SIDE, SIDE)).astype(np.float32),
        "y": rng.standard_normal((SIDE, SIDE)).astype(np.float32),
        "a": rng.standard_normal((MM, MM)).astype(np.float32),
        "b": rng.standard_normal((MM, MM)).astype(np.float32),
        "idx": rng.integers(0, SIDE, 16).astype(np.int32),
        "gidx": rng.integers(0, SIDE, (SIDE, 4)).astype(np.int32),
    }


def _netcl_inputs(device, host: dict[str, np.ndarray], grad: bool) -> dict:
    out = {}
    for name, value in host.items():
        if value.dtype.kind == "f":
            out[name] = ag.tensor(value, device=device, requires_grad=grad)
        else:
            out[name] = ag.tensor(value, device=device, dtype=np.int32)
    return out


def raw_launches(device, repeats: int) -> tuple[dict[str, float], dict[str, Callable[[], float]]]:
    """Host us per raw pyopencl launch of a prepared 1K-element add kernel, and the samplers of ``raw floor`` and
    ``raw kernel()`` (which ``op_rows`` samples again in turn with each op; the floor's sampler carries the raw
    launches themselves as ``launches``, by row name); OpenCL devices only (else nothing)."""
    if device.kind != "opencl":
        return {}, {}
    import pyopencl as cl
    import pyopencl._cl as _cl

    program = cl.Program(
        device.context,
        "__kernel void add(__global const float *a, __global const float *b, __global float *c)"
        "{ size_t i = get_global_id(0); c[i] = a[i] + b[i]; }",
    ).build()
    kernel = cl.Kernel(program, "add")
    n = SIDE * SIDE
    flags = cl.mem_flags.READ_WRITE
    a, b, c = (cl.Buffer(device.context, flags, size=4 * n) for _ in range(3))
    queue = device.queue
    kernel.set_args(a, b, c)

    def enqueue() -> None:
        _cl.enqueue_nd_range_kernel(queue, kernel, (n,), (256,), None, None, False, False)

    def set_and_enqueue() -> None:
        kernel.set_args(a, b, c)
        _cl.enqueue_nd_range_kernel(queue, kernel, (n,), (256,), None, None, False, False)

    def kernel_call() -> None:
        kernel(queue, (n,), (256,), a, b, c)

    floor, _ = enqueuer(queue, kernel, (n,), (256,))  # what netcl's prepared launches call on this platform
    samplers = {
        "raw kernel()": _sampler(kernel_call, queue.finish),
        "raw floor": _sampler(floor, queue.finish),
    }
    samplers["raw floor"].keep = (program, kernel, a, b, c)  # type: ignore[attr-defined]  # alive with the samplers
    least = make_least_op(kernel, floor, (a, b), lambda: cl.Buffer(device.context, flags, size=4 * n), n)
    #: the raw launches by row name, for ``eager_instructions`` to count
    samplers["raw floor"].launches = {  # type: ignore[attr-defined]
        "raw floor": floor,
        "raw kernel()": kernel_call,
        "raw least op": least,
    }
    raw = {
        "raw kernel()": statistics.median(samplers["raw kernel()"]() for _ in range(repeats)),
        "raw enqueue": _host_us(enqueue, queue.finish, repeats),
        "raw set+enqueue": _host_us(set_and_enqueue, queue.finish, repeats),
        "raw least op": _host_us(least, queue.finish, repeats),
        "raw floor": statistics.median(samplers["raw floor"]() for _ in range(repeats)),
    }
    kernel.set_args(a, b, c)  # the least op left one of its outputs set
    return raw, samplers


def _torch_inputs(torch, grad: bool) -> dict:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict = {"torch": torch}
    for name, value in _host_inputs().items():
        tensor = torch.from_numpy(value).to(dev)
        if value.dtype.kind == "i":
            tensor = tensor.long()
        elif grad:
            tensor.requires_grad_(True)
        out[name] = tensor
    return out


def op_rows(device, repeats: int, torch, raws: dict[str, Callable[[], float]]) -> dict[str, dict[str, float]]:
    """Per op: host us per call of netcl under no_grad and while recording, of torch eager (CUDA when available)
    without and with ``requires_grad`` inputs, and calls per op (no_grad); each column the median of ``repeats``
    samples taken in turn with the others (netcl, torch, raw floor, netcl, ...), each ratio the median of its
    turns' own ratios (``measure.paired_ratio``)."""
    sync = device.queue.finish if device.kind == "opencl" else (lambda: None)
    host = _host_inputs()
    plain, tracked = _netcl_inputs(device, host, False), _netcl_inputs(device, host, True)
    if torch is not None:
        torch_sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        torch_plain, torch_tracked = _torch_inputs(torch, False), _torch_inputs(torch, True)
    rows: dict[str, dict[str, float]] = {}
    for name, (op, torch_op) in OPS.items():
        samplers = {
            "no_grad": _sampler(lambda op=op: op(plain), sync, ag.no_grad),
            "recording": _sampler(lambda op=op: op(tracked), sync, ag.Tape),
        }
        if torch is not None:
            samplers["torch"] = _sampler(lambda op=torch_op: op(torch_plain), torch_sync, torch.no_grad)
            samplers["torch rec"] = _sampler(lambda op=torch_op: op(torch_tracked), torch_sync)
        samplers.update(raws)
        samples: dict[str, list[float]] = {column: [] for column in samplers}
        for _ in range(repeats):
            for column, sample in samplers.items():
                samples[column].append(sample())
        row = {column: statistics.median(values) for column, values in samples.items() if column not in raws}
        with ag.no_grad():
            row["calls"] = _calls_per_op(lambda op=op: op(plain), sync)
        if torch is not None:
            row["x torch"] = paired_ratio(samples["no_grad"], samples["torch"])
            row["x torch rec"] = paired_ratio(samples["recording"], samples["torch rec"])
        if raws:
            row["x raw"] = paired_ratio(samples["no_grad"], samples["raw floor"])
            row["x kernel()"] = paired_ratio(samples["no_grad"], samples["raw kernel()"])
        rows[name] = row
    return rows


def op_table(device, repeats: int, torch) -> dict:
    raw, raws = raw_launches(device, repeats)
    rows = op_rows(device, repeats, torch, raws)
    columns = ["no_grad", "recording", "calls"]
    if torch is not None:
        columns += ["torch", "torch rec", "x torch", "x torch rec"]
    if raws:
        columns += ["x raw", "x kernel()"]
    for name, us in raw.items():
        print(f"{name:<{WIDTH}}{us:>10.2f} us per launch (prepared 1K-element add kernel)")
    header = f"{'op':<{WIDTH}}" + "".join(f"{c:>13}" for c in columns)
    print(header)
    print("-" * len(header))
    for name, values in rows.items():
        cells = "".join(
            f"{values[c]:>13.2f}" if c.startswith("x ") else f"{values[c]:>13.1f}" for c in columns if c in values
        )
        print(f"{name:<{WIDTH}}{cells}", flush=True)
    return {"raw_launch_us": raw, "ops_us": rows}


def train_steps(device, quick: bool, repeats: int, torch) -> list[dict]:
    """The MLP and digits CNN steps of the train workload and the gpt_block step, eager vs torch eager."""
    import bench_train
    import bench_transformer

    rng = np.random.default_rng(0)
    rows = []
    print(f"\neager training steps, ms per step (batch {bench_train.BATCH})")
    for row in bench_train.workloads(device, quick):
        if row["amp"] or not row["name"].startswith(("mlp", "digits")):
            continue
        shape = row["shape"]
        x_host = rng.normal(size=shape).astype(np.float32)
        y_host = rng.integers(0, 10, shape[0]).astype(np.int32)
        times, _ = bench_train.netcl_variants(device, row, x_host, y_host, repeats)
        if torch is not None:
            times.update(bench_train.torch_variants(torch, row, x_host, y_host, repeats))
        _print_step(row["name"], times)
        rows.append({"workload": row["name"], "ms_per_step": times})
    gpu = device.kind == "opencl" and bench_train._is_gpu(device)
    config = bench_transformer.GPT_FULL if gpu and not quick else bench_transformer.GPT_QUICK
    times = bench_transformer.netcl_gpt_step(device, config, repeats)
    if torch is not None:
        times.update(bench_transformer.torch_gpt_step(torch, config, repeats))
    _print_step(f"gpt_block {config}", times)
    rows.append({"workload": "gpt_block", "config": list(config), "ms_per_step": times})
    return rows


def _print_step(name: str, times: dict[str, float]) -> None:
    for variant, ms in times.items():
        print(f"{name:<40}{variant:<20}{ms:>10.3f}", flush=True)
    if "torch eager" in times:
        print(f"{'':<40}netcl eager / torch eager: {times['netcl eager'] / times['torch eager']:.2f}x")


def run(device_spec: str | None = None, quick: bool = False, repeats: int | None = None, peers: bool = True) -> dict:
    device = nc.get_device(device_spec)
    repeats = repeats or (7 if quick else 21)
    torch = None
    if peers:
        try:
            import torch
        except Exception:
            torch = None
    peer = "none" if torch is None else f"torch {torch.__version__} on {'CUDA' if torch.cuda.is_available() else 'CPU'}"
    print(f"eager: host us per op on {device!r} (peer: {peer}); {INNER} calls per sample, median of {repeats}")
    results: dict = {"device": repr(device), "peer": peer}
    results.update(op_table(device, repeats, torch))
    results["train_steps"] = train_steps(device, quick, max(3, repeats // 3), torch)
    return results


def main() -> None:
    args = standalone_parser(__doc__).parse_args()
    write_results(run(args.device, args.quick, args.repeats, not args.no_peers), args.json_path)


if __name__ == "__main__":
    main()
