"""Where the host time of a cache-hit jit call goes (1K elements, grad off), piece by piece."""

from __future__ import annotations

import cProfile
import pstats

import numpy as np
import pyopencl as cl
from dispatch import chain8_launch
from measure import time_host

import netcl.autograd as ag
from netcl.core import Tensor, get_device
from netcl.runtime.launch import launch


def main() -> None:
    device = get_device()
    setup = chain8_launch(device)
    fused, nodes, kernel, out, bufs = setup.fused, setup.nodes, setup.kernel, setup.out, setup.args
    gsize, local = setup.global_size, setup.local_size
    queue = device.queue

    def raw():
        kernel.set_args(*bufs)
        cl.enqueue_nd_range_kernel(queue, kernel, (gsize,), (local,))

    def via_launch():
        launch(kernel, gsize, local, nodes[0].value, nodes[1].value, nodes[2].value, out, 1024)

    def alloc():
        Tensor.empty((1024,), np.float32, device)

    def call():
        with ag.no_grad():
            fused(*nodes)

    for name, fn in [
        ("raw set_args+enqueue", raw),
        ("launch()", via_launch),
        ("Tensor.empty", alloc),
        ("jit call", call),
    ]:
        print(f"{name:<22} {time_host(fn, 15, 300):7.2f} us")
        queue.finish()
    profiler = cProfile.Profile()
    with ag.no_grad():
        profiler.enable()
        for _ in range(3000):
            fused(*nodes)
        profiler.disable()
    queue.finish()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
