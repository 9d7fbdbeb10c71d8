"""pytest-benchmark: host costs. A cache-hit jit call vs a raw pyopencl launch of its kernel (1K
elements; ``jit_call_us``, ``raw_launch_us``, ``ratio``), Graph replay vs eager launches per kernel
(``replay_us_per_kernel``), the candidate enqueue paths, an optimizer step multi-tensor vs one
kernel per parameter, and cold vs warm-disk-cache compiles. ``hatch run bench --workload launch``
prints the same numbers as one table (``launch_cost.py``)."""

from __future__ import annotations

import pytest
from dispatch import cold_vs_warm_compile, jit_vs_raw_launch, replay_vs_enqueue
from enqueue_paths import enqueue_paths
from launch_cost import optimizer_steps, thread_times

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


def test_jit_call_vs_raw_launch_thread_time(benchmark, cl_device):
    result = benchmark.pedantic(lambda: thread_times(cl_device), rounds=1, iterations=1)
    benchmark.extra_info.update(result)


def test_enqueue_paths(benchmark, cl_device):
    result = benchmark.pedantic(lambda: enqueue_paths(cl_device), rounds=1, iterations=1)
    benchmark.extra_info.update(result)


def test_optimizer_step_multi_tensor_vs_per_parameter(benchmark, cl_device):
    result = benchmark.pedantic(lambda: optimizer_steps(cl_device), rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    assert result["sgd_multi_bit_identical"] == 1.0 and result["adam_multi_bit_identical"] == 1.0


def test_replay_vs_eager_launches(benchmark, cl_device):
    result = benchmark.pedantic(lambda: replay_vs_enqueue(cl_device, repeats=5), rounds=1, iterations=1)
    benchmark.extra_info.update(result)


def test_cold_vs_warm_compile(benchmark):
    result = benchmark.pedantic(lambda: cold_vs_warm_compile(get_device()), rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    assert result["warm_builds"] == 0
