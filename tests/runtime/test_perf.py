"""PerfCounter, timing_region and event_based_timing on OpenCL (events) and NumPy (wall-clock)."""

from __future__ import annotations

import io
import re
import time

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.runtime.cache import program_cache
from netcl.runtime.launch import launch
from netcl.runtime.perf import PerfCounter, event_based_timing, timing_region

N = 4096
SRC = """
__kernel void busy(__global float *x, int iters) {
    int i = get_global_id(0);
    float v = x[i];
    for (int k = 0; k < iters; ++k) v = v * 0.999f + 0.001f;
    x[i] = v;
}
"""


@pytest.fixture
def busy(cl_device):
    handle = program_cache.get_or_compile("test_perf", SRC, cl_device.context)
    kernel = handle.kernel("busy", [None, np.int32])
    x = nc.Tensor.zeros(N, device=cl_device)

    def run(iters: int = 2000) -> cl.Event:
        return launch(kernel, N, None, x, iters)

    run(1).wait()  # PoCL compiles the work-group function on first launch
    return run


def kernel_ms(event: cl.Event) -> float:
    event.wait()
    return (event.profile.end - event.profile.start) * 1e-6


def test_section_measures_the_kernels_inside(cl_device, busy):
    pc = PerfCounter(["busy", "empty"], queue=cl_device)
    events = []
    for _ in range(3):
        with pc.section("busy", nbytes=2 * N * 4):
            events.append(busy())
            events.append(busy())
    with pc.section("empty"):
        pass
    stats = pc.stats()
    assert stats["busy"].calls == 3 and stats["busy"].clocks == {"events"}
    # markers bracket the kernels on an in-order queue: a section can't be shorter than its kernels
    pairs = [kernel_ms(events[i]) + kernel_ms(events[i + 1]) for i in range(0, 6, 2)]
    assert stats["busy"].min_ms >= min(pairs) * 0.999
    assert stats["busy"].max_ms >= max(pairs) * 0.999
    assert stats["busy"].min_ms <= stats["busy"].avg_ms <= stats["busy"].max_ms
    expected_gbps = 3 * 2 * N * 4 / (stats["busy"].total_ms * 1e6)
    assert stats["busy"].gbps == pytest.approx(expected_gbps)
    assert stats["empty"].calls == 1 and stats["empty"].min_ms >= 0

    text = pc.report(stream=None)
    row = next(line for line in text.splitlines() if line.startswith("busy"))
    numbers = re.findall(r"\d+\.\d+", row)
    assert len(numbers) == 4 and float(numbers[1]) == pytest.approx(stats["busy"].avg_ms, abs=1e-3)
    assert "events" in row and "wall-clock" not in text
    out = io.StringIO()
    pc.report(out)
    assert out.getvalue() == text


def test_unknown_section_and_reset(cl_device):
    pc = PerfCounter(["a"], queue=cl_device)
    with pytest.raises(KeyError, match="unknown section 'b'"), pc.section("b"):
        pass
    with pc.section("a"):
        pass
    pc.reset()
    assert pc.stats()["a"].calls == 0
    assert re.search(r"^a\s+0\s+-\s+-\s+-\s+-\s+-$", pc.report(stream=None), re.M)
    free = PerfCounter(queue=cl_device)  # no names: any section
    with free.section("anything"):
        pass
    assert free.stats()["anything"].calls == 1


def test_timing_region_and_event_based_timing_on_opencl(cl_device, busy):
    with timing_region("busy", cl_device.queue, nbytes=N * 4) as region:
        event = busy()
    assert region.clock == "events" and region.elapsed_ms >= kernel_ms(event) * 0.999
    assert region.gbps == pytest.approx(N * 4 / (region.elapsed_ms * 1e6))
    event, ms = event_based_timing(cl_device.queue, busy, 500)
    assert isinstance(event, cl.Event) and ms >= kernel_ms(event) * 0.999


def test_queue_without_profiling_falls_back_to_wall_clock(cl_device, busy):
    queue = cl.CommandQueue(cl_device.context)
    pc = PerfCounter(["x"], queue=queue)
    with pc.section("x"):
        time.sleep(0.002)
    assert pc.stats()["x"].clocks == {"wall-clock"} and pc.stats()["x"].min_ms >= 2.0
    assert "wall-clock" in pc.report(stream=None)


def test_numpy_backend_uses_wall_clock_and_says_so():
    pc = PerfCounter(["matmul"], device="cpu")
    a = np.ones((64, 64))
    for _ in range(2):
        with pc.section("matmul", nbytes=3 * a.nbytes):
            a @ a
            time.sleep(0.001)
    stats = pc.stats()["matmul"]
    assert stats.calls == 2 and stats.clocks == {"wall-clock"} and stats.min_ms >= 1.0
    text = pc.report(stream=None)
    assert "matmul" in text and "wall-clock" in text and "note: wall-clock" in text
    with timing_region("sleep", device="cpu") as region:
        time.sleep(0.001)
    assert region.clock == "wall-clock" and region.elapsed_ms >= 1.0
    result, ms = event_based_timing(nc.get_device("cpu"), lambda: 7)
    assert result == 7 and ms >= 0


def _fresh_source(tag: str) -> str:
    """A kernel no cache has seen (the comment makes its source, hence its keys, unique)."""
    return f"// {tag} {time.time_ns()}\n__kernel void fresh(__global float *x) {{ x[get_global_id(0)] += 1.0f; }}\n"


def test_a_build_inside_a_region_is_excluded_and_counted(cl_device, busy):
    """A program built inside the region is bracketed by markers and subtracted; kernels still count."""
    pc = PerfCounter(["step"], queue=cl_device.queue)
    with pc.section("step"), timing_region("step", cl_device.queue) as region:
        event = busy()
        program_cache.get_or_compile("test_perf_fresh", _fresh_source("events"), cl_device.context)
    assert region.builds == 1 and region.build_ms > 0
    # the kernel's own device time is still inside (builds are excluded, not the work around them)
    assert region.elapsed_ms >= kernel_ms(event) * 0.999
    assert pc.stats()["step"].builds == 1
    assert "program builds happened inside sections (step 1); their time is excluded" in pc.report(stream=None)
    with timing_region("no build", cl_device.queue) as quiet:
        busy()
    assert quiet.builds == 0 and quiet.build_ms == 0


def test_a_build_inside_a_wall_clock_region_is_subtracted(cl_device):
    queue = cl.CommandQueue(cl_device.context)  # no profiling: wall-clock
    with timing_region("build", queue) as region:
        program_cache.get_or_compile("test_perf_fresh", _fresh_source("wall"), cl_device.context)
        time.sleep(0.002)
    assert region.clock == "wall-clock" and region.builds == 1 and region.build_ms > 0
    assert region.elapsed_ms >= 2.0  # the sleep stays; only the build's host time is removed
