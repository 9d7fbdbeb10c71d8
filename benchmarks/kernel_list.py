"""Every kernel launch of one call of a bench workload's variants, with its sizes and device time.

``python benchmarks/kernel_list.py mlp_block [--size N] [--variants "netcl fused" "netcl unfused"]``:
one line per launch (kernel name, global and local size, device ms) for fwd and fwd+bwd, to find
which launch of a variant costs more than its counterpart in another (the bench's per-kernel
summary adds launches of one name together).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cases  # noqa: F401  (registers the workloads)
from cases import WORKLOADS

from netcl.core import get_device


def launches(device, fn) -> list[tuple[str, tuple, tuple, float]]:
    """(name, global size, local size, device ms) of each launch of one ``fn()`` call, after a warm call."""
    fn()
    device.queue.finish()
    original = cl.enqueue_nd_range_kernel
    seen: list[tuple[str, tuple, tuple, cl.Event]] = []

    def recording(queue, kernel, global_size, local_size, *args, **kwargs):
        event = original(queue, kernel, global_size, local_size, *args, **kwargs)
        seen.append((kernel.function_name, tuple(global_size), tuple(local_size or ()), event))
        return event

    cl.enqueue_nd_range_kernel = recording
    try:
        fn()
    finally:
        cl.enqueue_nd_range_kernel = original
    device.queue.finish()
    return [(n, g, lsz, (e.profile.end - e.profile.start) * 1e-6) for n, g, lsz, e in seen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload")
    parser.add_argument("--size", type=int, default=1 << 24)
    parser.add_argument("--device", default=None)
    parser.add_argument("--variants", nargs="+", default=["netcl fused", "netcl unfused"])
    args = parser.parse_args()
    device = get_device(args.device)
    case = WORKLOADS[args.workload](device, args.size)
    for variant in args.variants:
        for mode, fn in case.runners[variant].items():
            rows = launches(device, fn)
            print(f"{variant} {mode}: {len(rows)} launches, {sum(r[3] for r in rows):.3f} ms")
            for name, gsize, lsize, ms in rows:
                print(f"  {name:28s} global {str(gsize):22s} local {str(lsize):14s} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
