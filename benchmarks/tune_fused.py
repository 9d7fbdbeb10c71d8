"""Sweep elements per work-item and local size for fused kernels on one device.

Usage: python benchmarks/tune_fused.py [--size N] [--repeats R]. Prints device ms for the
chain8 forward and backward and the bias_gelu forward per (vector width, local size), next to
the float4 copy of the same bytes. The winners become netcl.jit.tuning's defaults.
"""

from __future__ import annotations

import argparse
import os

from harness import copy_bandwidth
from measure import rand, time_device

import netcl.autograd as ag
from netcl.core import get_device
from netcl.jit import jit_compile, workloads


def sweep(size: int, repeats: int, widths, locals_, items) -> None:
    device = get_device()
    _, copy_gbps = copy_bandwidth(device, size, repeats)
    print(f"{device!r}: copy {copy_gbps:.0f} GB/s; chain8 fwd at copy speed = {16 * size / copy_gbps / 1e6:.3f} ms")
    chain = [ag.tensor(rand((size,), s), requires_grad=True, device=device) for s in range(3)]
    upstream = ag.tensor(rand((size,), 9), device=device).value
    features = 1024
    gelu_in = [
        ag.tensor(rand((size // features, features), 0), device=device),
        ag.tensor(rand((1, features), 1), device=device),
    ]
    print(f"{'width':>5} {'local':>5} {'items':>5} {'chain8 fwd':>11} {'chain8 f+b':>11} {'bias_gelu':>10}")
    configs = [(w, loc, i) for w in widths for loc in locals_ for i in items]
    for width, local, item in configs:
        if local <= device.cl_device.max_work_group_size:
            os.environ["NETCL_JIT_VECTOR"], os.environ["NETCL_JIT_LOCAL"] = str(width), str(local)
            os.environ["NETCL_JIT_ITEMS"] = str(item)
            chain8, gelu = jit_compile(workloads.chain8), jit_compile(workloads.bias_gelu)

            def forward(chain8=chain8):
                with ag.no_grad():
                    chain8(*chain)

            def both(chain8=chain8):
                for node in chain:
                    node.grad = node.value.grad = None
                with ag.Tape() as tape:
                    out = chain8(*chain)
                tape.backward(out, grad=upstream)

            def gelu_forward(gelu=gelu):
                with ag.no_grad():
                    gelu(*gelu_in)

            try:
                f = time_device(device, forward, repeats).median_ms
                fb = time_device(device, both, repeats).median_ms
                g = time_device(device, gelu_forward, repeats).median_ms
            except Exception as exc:  # e.g. OUT_OF_RESOURCES for wide vectors
                print(f"{width:>5} {local:>5} {item:>5}  failed: {exc}")
                continue
            print(f"{width:>5} {local:>5} {item:>5} {f:>11.3f} {fb:>11.3f} {g:>10.3f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1 << 26)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--widths", default="1,2,4,8,16")
    parser.add_argument("--locals", default="64,128,256,512,1024")
    parser.add_argument("--items", default="1")
    args = parser.parse_args()

    def ints(text):
        return tuple(int(v) for v in text.split(","))

    sweep(args.size, args.repeats, ints(args.widths), ints(args.locals), ints(args.items))
