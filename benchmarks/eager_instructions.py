"""Main-thread instructions per eager op, by library: a host cost that neither the machine's load nor PoCL's worker
threads move (``valgrind --tool=callgrind``, which counts instructions, not seconds).

For each op of ``bench_eager.OPS`` asked for (and the raw launches ``raw floor``, ``raw kernel()`` and ``raw least
op``, as ``bench_eager`` makes them), child processes run under callgrind: each warms the op up, then calls it
``--calls`` or ``3 * --calls`` times (no_grad, or with ``--recording`` inside a ``Tape`` a chunk of
``bench_eager.INNER`` calls, whose nodes and outputs are released after it as ``bench_eager``'s samples are) and
waits for the queue, after a first child of ``--calls`` that fills the caches a first process builds. The difference
of the two main threads' instruction counts over the difference of calls is the op's count: start-up and imports
cancel. The counts are split by the shared object that ran them (CPython's interpreter, pyopencl, the OpenCL driver,
the rest: libc's malloc and locks, NumPy). Repeat runs agree within a few percent (the driver's share moves most:
PoCL's enqueue takes another path when its worker sleeps); a count is not a time (an enqueue also pays cache misses
and the wake-up of the worker, which no count shows), so read it beside the bench's medians. Periodic work lands in
the window unevenly: the caching allocator folds its statistics every 4,096 events (two an op), so the default 1,000
calls (a 2,000-call window) hold about the steady rate of folds and 600 calls none.

``python benchmarks/eager_instructions.py [--ops add,relu,...] [--device SPEC] [--calls 1000] [--recording]``
(needs ``valgrind``; one op takes a few minutes: the children start Python under callgrind).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: shared objects -> the column their instructions go to
GROUPS = (("libpython", "python"), ("_cl.", "pyopencl"), ("libpocl", "driver"), ("libnvidia", "driver"))
RAWS = ("raw floor", "raw kernel()", "raw least op")


def child(name: str, calls: int, device_spec: str | None, recording: bool) -> None:
    """Warm ``name`` up, then call it ``calls`` times and wait for the device (the measured process)."""
    import bench_eager

    import netcl.autograd as ag
    import netcl.core as nc

    device = nc.get_device(device_spec)
    sync = device.queue.finish
    if name in RAWS:
        _, samplers = bench_eager.raw_launches(device, 1)
        fn = samplers["raw floor"].launches[name]  # alive with the samplers
        context = nullcontext
    else:
        inputs = bench_eager._netcl_inputs(device, bench_eager._host_inputs(), recording)
        op = bench_eager.OPS[name][0]

        def fn() -> None:
            op(inputs)

        context = ag.Tape if recording else ag.no_grad
    with context():
        for _ in range(20):
            fn()
    sync()
    for start in range(0, calls, bench_eager.INNER):  # a tape (or no_grad) a chunk, as bench_eager samples
        with context():
            for _ in range(min(bench_eager.INNER, calls - start)):
                fn()
    sync()


def _main_thread_counts(path: Path) -> collections.Counter:
    """Instructions of the main thread's callgrind file by column (``GROUPS``, "other" for the rest)."""
    text = subprocess.run(["callgrind_annotate", "--threshold=100", str(path)], capture_output=True, text=True).stdout
    counts: collections.Counter = collections.Counter()
    for line in text.splitlines():
        found = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*\[(.*)\])\s*$", line)
        if found is None:
            continue
        number, where = int(found.group(1).replace(",", "")), found.group(3)
        counts[next((column for key, column in GROUPS if key in where), "other")] += number
    return counts


def measure(name: str, calls: int, device_spec: str | None, recording: bool) -> dict[str, float]:
    """Instructions per call of ``name`` by column, from two callgrind runs of ``calls`` and ``3 * calls`` calls."""
    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (calls, calls, 3 * calls):  # the first fills the caches a first process builds (PoCL's, netcl's)
            out = Path(tmp) / f"cg.{n}"
            command = [sys.executable, __file__, "--child", name, "--calls", str(n)]
            command += ["--device", device_spec] if device_spec else []
            command += ["--recording"] if recording else []
            valgrind = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}"]
            subprocess.run(valgrind + command, check=True, capture_output=True)
            counts.append(_main_thread_counts(Path(f"{out}-01")))
    per_call = {column: (counts[2][column] - counts[1][column]) / (2 * calls) for column in counts[2]}
    per_call["total"] = sum(per_call.values())
    return per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="raw floor,raw kernel(),raw least op,add,relu,matmul 64")
    parser.add_argument("--device", default=None)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--recording", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.calls, args.device, args.recording)
        return
    if shutil.which("valgrind") is None:
        sys.exit("eager_instructions.py needs valgrind (Debian: apt-get install valgrind)")
    import netcl.core as nc

    device = nc.get_device(args.device)  # picked here: under callgrind the default choice's timed probe would differ
    if device.kind != "opencl":
        sys.exit(f"eager_instructions.py measures OpenCL launches; {device!r} is not an OpenCL device")
    columns = ["total", "python", "pyopencl", "driver", "other"]
    mode = "recording" if args.recording else "no_grad"
    print(f"main-thread instructions per call on {device!r} ({mode}), by shared object")
    print(f"{'op':<16}" + "".join(f"{c:>10}" for c in columns))
    for name in args.ops.split(","):
        row = measure(name, args.calls, device.spec, args.recording)
        print(f"{name:<16}" + "".join(f"{row.get(c, 0):>10.0f}" for c in columns), flush=True)


if __name__ == "__main__":
    main()
