"""Sweep work-items per row and chunk width for the JIT's row kernels (softmax, layer_norm).

Usage: python benchmarks/tune_rows.py [--rows R] [--features C] [--repeats N]. Prints device ms of
the fused softmax and layer_norm forward and forward+backward per (``NETCL_ROW_LOCAL``,
``NETCL_ROW_VW``), next to the float4 copy of the same bytes. The winners become
``netcl.jit.row_source.row_config``'s defaults.
"""

from __future__ import annotations

import argparse
import os

from harness import copy_bandwidth
from measure import rand, time_device

import netcl.autograd as ag
from netcl.core import get_device
from netcl.jit import jit_compile


def _step(fn, nodes, upstream):
    def run():
        for node in nodes:
            node.grad = None
        with ag.Tape() as tape:
            out = fn(*nodes)
        tape.backward(out, grad=upstream)

    return run


def sweep(rows: int, features: int, repeats: int, locals_, widths) -> None:
    device = get_device()
    size = rows * features
    copy, gbps = copy_bandwidth(device, size, repeats)
    print(f"{device!r}: copy of ({rows}, {features}) float32: {copy.median_ms:.3f} ms ({gbps:.0f} GB/s)")
    x = ag.tensor(rand((rows, features), 0), requires_grad=True, device=device)
    w, b = (ag.tensor(rand((features,), s, 0.5, 1.5), requires_grad=True, device=device) for s in (1, 2))
    upstream = ag.tensor(rand((rows, features), 3), device=device).value
    print(f"{'local':>5} {'vw':>3} {'softmax fwd':>12} {'softmax f+b':>12} {'lnorm fwd':>10} {'lnorm f+b':>10}")
    best = (float("inf"), 0, 0)
    for local in locals_:
        for vw in widths:
            os.environ["NETCL_ROW_LOCAL"], os.environ["NETCL_ROW_VW"] = str(local), str(vw)
            softmax = jit_compile(lambda x: ag.softmax(x, -1))
            layer_norm = jit_compile(lambda x, w, b: ag.layer_norm(x, features, w, b))
            cells = []
            for fn, nodes in ((softmax, [x]), (layer_norm, [x, w, b])):
                with ag.no_grad():
                    cells.append(time_device(device, lambda fn=fn, nodes=nodes: fn(*nodes), repeats).median_ms)
                cells.append(time_device(device, _step(fn, nodes, upstream), repeats).median_ms)
            print(f"{local:>5} {vw:>3} {cells[0]:>12.3f} {cells[1]:>12.3f} {cells[2]:>10.3f} {cells[3]:>10.3f}")
            best = min(best, (sum(cells), local, vw))
    print(f"BEST NETCL_ROW_LOCAL={best[1]} NETCL_ROW_VW={best[2]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--local", type=int, nargs="*", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--vw", type=int, nargs="*", default=[1, 4])
    args = parser.parse_args()
    sweep(args.rows, args.features, args.repeats, args.local, args.vw)


if __name__ == "__main__":
    main()
