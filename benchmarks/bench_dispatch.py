"""pytest-benchmark: host costs. A cache-hit jit call vs a raw pyopencl launch of its kernel (1K
elements), Graph replay vs eager launches per kernel, and cold vs warm-disk-cache compiles."""

from __future__ import annotations

import pytest
from dispatch import cold_vs_warm_compile, jit_vs_raw_launch, replay_vs_enqueue

from netcl.core import get_device


@pytest.fixture
def cl_device():
    device = get_device()
    if device.kind != "opencl":
        pytest.skip("host launch costs are an OpenCL measurement")
    return device


def test_jit_call_vs_raw_launch(benchmark, cl_device):
    result = benchmark.pedantic(lambda: jit_vs_raw_launch(cl_device, repeats=5), rounds=1, iterations=1)
    benchmark.extra_info.update(result)


def test_replay_vs_eager_launches(benchmark, cl_device):
    result = benchmark.pedantic(lambda: replay_vs_enqueue(cl_device, repeats=5), rounds=1, iterations=1)
    benchmark.extra_info.update(result)


def test_cold_vs_warm_compile(benchmark):
    result = benchmark.pedantic(lambda: cold_vs_warm_compile(get_device()), rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    assert result["warm_builds"] == 0
