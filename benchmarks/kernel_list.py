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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cases  # noqa: F401  (registers the workloads)
from cases import WORKLOADS
from measure import launches

from netcl.core import get_device


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
            rows = launches(device, fn) or []
            print(f"{variant} {mode}: {len(rows)} launches, {sum(r.ms for r in rows):.3f} ms")
            for r in rows:
                print(f"  {r.name:28s} global {r.global_size!s:22s} local {r.local_size!s:14s} {r.ms:8.3f} ms")


if __name__ == "__main__":
    main()
