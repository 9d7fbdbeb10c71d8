"""Concurrency: threads running jitted functions with their own tapes; processes sharing a disk cache.

* 8 threads, released together by a barrier, each compile (one shared ``JitFunction``, a
  different signature per thread, so traces and kernel builds race) and run forward and
  backward on their own ``Tape`` several times. Every result must equal the single-threaded
  un-fused result of the same inputs (float32, 2e-5 relative: fused and un-fused kernels round
  differently by a few ulps over 8 ops), repeated iterations must give identical bits, and a
  thread's tape must hold only that thread's nodes.
* Two processes build the same kernels into one empty ``NETCL_CACHE_DIR`` at the same moment
  (released by a go-file after both are ready); the directory must then hold only complete,
  checksummed entries and no temporary files, and a third process must find every program
  there: ``program_cache.stats().builds == 0``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.jit import jit_compile, workloads
from netcl.runtime import native
from netcl.runtime.disk_cache import DiskCache

THREADS = 8
ITERATIONS = 3
RTOL, ATOL = 2e-5, 1e-6


def _job(t: int) -> tuple[str, list[tuple[int, ...]]]:
    """Thread ``t``'s workload and shapes: distinct per thread, odd sizes (vector tails)."""
    if t % 2 == 0:
        n = 97 + 8 * t
        return "chain8", [(n,), (n,), (n,)]
    return "bias_gelu", [(3 + t, 17), (1, 17)]


def _inputs(t: int, shapes):
    rng = np.random.default_rng(100 + t)
    arrays = [rng.uniform(-2, 2, size=s).astype(np.float32) for s in shapes]
    upstream = rng.uniform(-1, 1, size=np.broadcast_shapes(*shapes)).astype(np.float32)
    return arrays, upstream


def _forward_backward(fn, arrays, upstream, device):
    nodes = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
    with ag.Tape() as tape:
        out = fn(*nodes)
    recorded = list(tape.nodes)
    tape.backward(out, grad=upstream)
    return out.to_host(), [n.grad.to_host() for n in nodes], recorded, nodes, out


def test_threads_run_jitted_functions_with_their_own_tapes(device):
    jitted = {name: jit_compile(getattr(workloads, name)) for name in ("chain8", "bias_gelu")}
    expected = {}
    for t in range(THREADS):
        name, shapes = _job(t)
        arrays, upstream = _inputs(t, shapes)
        out, grads, _, _, _ = _forward_backward(getattr(workloads, name), arrays, upstream, device)
        expected[t] = (out, grads)
        np.testing.assert_allclose(out, getattr(workloads, f"{name}_reference")(*arrays), rtol=1e-5, atol=1e-6)

    barrier = threading.Barrier(THREADS)
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            name, shapes = _job(t)
            arrays, upstream = _inputs(t, shapes)
            barrier.wait(timeout=60)
            runs = []
            for _ in range(ITERATIONS):
                out, grads, recorded, _, result = _forward_backward(jitted[name], arrays, upstream, device)
                # only this thread's values were recorded: each is the output or made from its inputs
                own_shapes = {tuple(np.broadcast_shapes(*shapes)), *shapes}
                assert recorded and all(tuple(n.shape) in own_shapes for n in recorded)
                assert result in recorded
                runs.append((out, grads))
            results[t] = runs
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    if errors:
        raise errors[0]
    assert sorted(results) == list(range(THREADS))
    for t, runs in results.items():
        out, grads = expected[t]
        for run_out, run_grads in runs:
            np.testing.assert_allclose(run_out, out, rtol=RTOL, atol=ATOL, err_msg=f"thread {t} forward")
            for got, want in zip(run_grads, grads, strict=True):
                np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"thread {t} gradient")
            np.testing.assert_array_equal(run_out, runs[0][0])  # deterministic across iterations
            for got, first in zip(run_grads, runs[0][1], strict=True):
                np.testing.assert_array_equal(got, first)
    for name, fn in jitted.items():
        info = fn.cache_info()
        assert info["entries"] == THREADS // 2 and info["fallbacks"] == 0, (name, info)
        assert info["misses"] == THREADS // 2  # every signature traced exactly once


CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    ready, go = Path(sys.argv[1]), Path(sys.argv[2])
    import numpy as np
    import netcl.autograd as ag
    from netcl.jit import jit_compile, workloads
    from netcl.runtime import ops as R
    from netcl.runtime.cache import program_cache

    ready.touch()
    deadline = time.time() + 120
    while not go.exists() and time.time() < deadline:
        time.sleep(0.005)
    results = {}
    rng = np.random.default_rng(7)
    for name, shapes in (("chain8", [(1001,)] * 3), ("bias_gelu", [(33, 65), (1, 65)])):
        fn = jit_compile(getattr(workloads, name))
        nodes = [ag.tensor(rng.uniform(-2, 2, s).astype(np.float32), requires_grad=True) for s in shapes]
        with ag.Tape() as tape:
            out = fn(*nodes)
        tape.backward(out, grad=np.ones(out.shape, np.float32))
        results[name] = [out.to_host().tolist()] + [n.grad.to_host().tolist() for n in nodes]
    x = ag.tensor(rng.uniform(-1, 1, (16, 8)).astype(np.float32))
    results["eager"] = R.sum(R.tanh(R.matmul(x.value, R.transpose(x.value))), (1,), False).to_host().tolist()
    stats = program_cache.stats()
    print(json.dumps({"builds": stats.builds, "disk_hits": stats.disk_hits, "results": results}))
    """
)


def _spawn(script: Path, cache: Path, tag: str, tmp: Path, go: Path) -> tuple[subprocess.Popen, Path]:
    env = dict(os.environ, NETCL_CACHE_DIR=str(cache), NETCL_CACHE="1", NETCL_DEVICE="opencl")
    ready = tmp / f"ready-{tag}"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ready), str(go)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, ready


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_fill_one_disk_cache_and_a_third_reads_it(cl_device, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    procs = [_spawn(script, cache, tag, tmp_path, go) for tag in ("a", "b")]
    deadline = time.time() + 120
    while not all(ready.exists() for _, ready in procs) and time.time() < deadline:
        time.sleep(0.01)
    go.touch()  # both processes start building at the same moment
    first, second = (_finish(proc) for proc, _ in procs)
    assert first["results"] == second["results"]
    assert first["builds"] + first["disk_hits"] == second["builds"] + second["disk_hits"]
    programs = first["builds"] + first["disk_hits"]
    assert programs >= 6

    files = sorted(cache.rglob("*"))
    # device facts sit at the top (vector-width.json: which vector width the CPU compiler takes)
    facts = [f.name for f in files if f.is_file() and f.parent == cache]
    assert set(facts) <= {"vector-width.json", "engine-choice.json"}, facts
    # the compiled launch (netcl.runtime.native), built by both processes at once: one whole file, no build left over
    built = [f for f in files if cache / "native" in f.parents]
    expected = [] if native.launcher() is None else [native.SOURCE.stem]
    assert [f.name.split("-")[0].lstrip("_") for f in built if f.is_file()] == expected, built
    assert not [f for f in built if f.name.startswith(".build-")], "a native build left behind"
    entries = [f for f in files if f.is_file() and f.parent != cache and cache / "native" not in f.parents]
    assert not [f for f in entries if f.name.startswith(".tmp-")], "temporary files left behind"
    assert all(f.suffix == ".bin" and f.parent.name == f.name[:2] for f in entries)
    assert len(entries) == programs
    disk = DiskCache()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NETCL_CACHE_DIR", str(cache))
        for entry in entries:
            assert disk.load(entry.stem) is not None, f"{entry} is not a complete, checksummed entry"
    assert disk.corrupt == 0

    third = _spawn(script, cache, "c", tmp_path, go)[0]
    result = _finish(third)
    assert result["builds"] == 0
    assert result["disk_hits"] == programs
    assert result["results"] == first["results"]
