"""netcl.profiler: what a profile records (names, counts, nesting), its table and its Chrome trace."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.core import profile_hooks
from netcl.jit import jit_compile
from netcl.profiler import SORT_KEYS, export_chrome_trace, profile, record_function
from netcl.runtime import ops
from netcl.runtime.graph import capture_graph
from netcl.runtime.launch import enqueue_copy
from netcl.runtime.ops import gemm_cpu, host_blas


def _names(prof: profile) -> list[str]:
    return [e.name for e in prof.events() if e.kind != "range"]


def _x(device: nc.Device, shape: tuple[int, ...] = (32, 32), seed: int = 0) -> nc.Tensor:
    return nc.Tensor.from_host(device, np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


@pytest.fixture(autouse=True)
def _no_profiler_left() -> None:
    yield
    assert not profile_hooks.ACTIVE, "a test left a profiler active"


def test_eager_op_copies_and_shapes(cl_device: nc.Device) -> None:
    x = _x(cl_device)
    ops.add(x, x).to_host()  # builds outside the profile
    with profile(cl_device, record_shapes=True) as prof:
        y = ops.add(x, x)
        host = y.to_host()
        z = nc.Tensor.from_host(cl_device, np.ones(7, np.float32))
        w = z.copy()
        nc.Tensor.zeros((5,), device=cl_device)
    np.testing.assert_allclose(host, 2 * x.to_host())  # profiling changes no result
    assert _names(prof) == ["netcl_ew", "Memcpy DtoH", "Memcpy HtoD", "Memcpy DtoD", "Memset"]
    events = {e.name: e for e in prof.events()}
    assert events["Memcpy DtoH"].shapes == ((32, 32),)
    assert events["Memcpy HtoD"].shapes == ((7,),)
    assert events["netcl_ew"].global_size is not None and events["netcl_ew"].kind == "kernel"
    for event in prof.events():
        assert event.device_time is not None and event.device_time >= 0
        assert event.host_end >= event.host_start >= 0
    del w


def test_jit_function_matmul_and_device_copy(cl_device: nc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    @jit_compile
    def step(a, b):
        return ag.relu(a * b + 1.0)

    x = _x(cl_device)
    xn = ag.tensor(x.to_host(), device=cl_device)
    step(xn, xn)
    ops.matmul(x, x)
    monkeypatch.setenv(host_blas.ENV_VAR, "0")  # the GEMM kernel, not the host BLAS of CPU devices
    ops.matmul(x, x)
    out = nc.Tensor.empty(x.shape, device=cl_device)
    with profile() as prof:
        for _ in range(3):
            step(xn, xn)
        ops.matmul(x, x)
        enqueue_copy(cl_device.queue, out, x)
    counts = {row.key: row.count for row in prof.key_averages()}
    assert counts["fused_forward"] == 3
    assert counts["Memcpy DtoD"] == 1
    assert sum(n for name, n in counts.items() if "gemm" in name) >= 1
    np.testing.assert_array_equal(out.to_host(), x.to_host())


def test_host_blas_matmul_is_recorded_as_host_work(cl_device: nc.Device, monkeypatch) -> None:
    x = _x(cl_device)
    if not host_blas.applies(cl_device, x, x, x.dtype):
        pytest.skip("this device's float32 matmul is a kernel (covered above)")
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "off")  # (a kernel would run it otherwise)
    with profile(cl_device) as prof:
        ops.matmul(x, x)
    (event,) = [e for e in prof.events() if e.kind != "range"]
    assert (event.name, event.kind) == ("host_matmul", "host")
    assert event.device_time == pytest.approx(event.host_time)


def test_graph_replay(cl_device: nc.Device) -> None:
    x = _x(cl_device)
    graph = capture_graph(None, lambda a: ops.add(ops.mul(a, a), a), x)
    graph.execute(x)
    with profile() as prof:
        graph.execute(x)
        result = graph.execute(x).to_host()
    host = x.to_host().astype(np.float64)
    # two float32 roundings (the product, the sum) of values below 30: at most 2 * 2**-24 * 30 < 4e-6 apart
    np.testing.assert_allclose(result, host * host + host, rtol=0, atol=4e-6)
    rows = {row.key: row for row in prof.key_averages()}
    assert rows["Graph.execute"].count == 2 and rows["Graph.execute"].kind == "range"
    assert rows["netcl_ew"].count == 4
    # a range's device time is that of the commands inside it
    replays = [e for e in prof.events() if e.name == "Graph.execute"]
    inside = [e for e in prof.events() if e.name == "netcl_ew"]
    assert sum(r.device_time for r in replays) == pytest.approx(sum(e.device_time for e in inside))


def test_record_function_nests_and_counts(cl_device: nc.Device) -> None:
    x = _x(cl_device)
    ops.add(x, x)
    with profile() as prof, record_function("outer"):
        ops.add(x, x)
        with record_function("inner"):
            ops.add(x, x)
            ops.add(x, x)
    events = {e.name: e for e in prof.events() if e.kind == "range"}
    kernels = [e for e in prof.events() if e.name == "netcl_ew"]
    assert events["outer"].device_time == pytest.approx(sum(k.device_time for k in kernels))
    assert events["inner"].device_time == pytest.approx(sum(k.device_time for k in kernels[1:]))
    assert events["outer"].host_start <= events["inner"].host_start <= events["inner"].host_end
    assert events["inner"].host_end <= events["outer"].host_end
    assert events["outer"].self_host_time == pytest.approx(
        events["outer"].host_time - kernels[0].host_time - events["inner"].host_time
    )


def test_nothing_recorded_after_exit_and_one_recording_per_profile(cl_device: nc.Device) -> None:
    x = _x(cl_device)
    with profile() as prof:
        ops.add(x, x)
    ops.add(x, x)
    x.to_host()
    with record_function("late"):
        ops.add(x, x)
    assert _names(prof) == ["netcl_ew"]
    with pytest.raises(RuntimeError, match="records once"):
        prof.__enter__()


def test_nested_profiles_each_record_their_window(cl_device: nc.Device) -> None:
    x = _x(cl_device)
    with profile() as outer:
        ops.add(x, x)
        with profile() as inner:
            ops.mul(x, x)
        x.to_host()
    assert _names(outer) == ["netcl_ew", "netcl_ew", "Memcpy DtoH"]
    assert _names(inner) == ["netcl_ew"]


def test_profile_of_the_numpy_backend(cl_device: nc.Device) -> None:
    cpu = nc.get_device("cpu")
    a, x = _x(cpu), _x(cl_device)
    with profile(cpu) as prof:
        with record_function("numpy work"):
            ops.add(a, a)
        ops.add(x, x)  # an OpenCL launch: not on the profiled device
    (event,) = prof.events()
    assert event.name == "numpy work" and event.kind == "range"
    assert event.device_time == event.host_time  # the NumPy backend computes on the host
    assert prof.host_clock


def test_profile_of_one_device_skips_the_others_commands(cl_device: nc.Device) -> None:
    others = [d for d in nc.devices() if d.kind == "opencl" and d is not cl_device]
    usable = []
    for d in others:
        try:
            _x(d).to_host()
            usable.append(d)
        except Exception:  # a device that cannot run here
            continue
    if not usable:
        pytest.skip("one OpenCL device on this machine")
    x, y = _x(cl_device), _x(usable[0])
    with profile(cl_device) as prof:
        y.to_host()
        x.to_host()
    assert [(e.name, e.device) for e in prof.events()] == [("Memcpy DtoH", cl_device.cl_device.name.strip())]


def test_table_contains_names_and_sorts(cl_device: nc.Device) -> None:
    x, big = _x(cl_device), _x(cl_device, (256, 256))
    ops.add(x, x)
    with profile() as prof:
        for _ in range(3):
            ops.add(x, x)
        big.to_host()
    table = prof.key_averages().table(sort_by="count", row_limit=20)
    lines = table.splitlines()
    assert "Name" in lines[1] and "# of Calls" in lines[1] and "Self device" in lines[1]
    rows = [line.split()[0] for line in lines[3:-3]]
    assert rows == ["netcl_ew", "Memcpy"]  # 3 calls before 1
    by_device = prof.key_averages().table(sort_by="device_time")
    averages = prof.key_averages()
    expected = [r.key for r in sorted(averages, key=lambda r: -r.device_time_total)]
    names = [line[: len(expected[0]) + 12].split("  ")[0].strip() for line in by_device.splitlines()[3:-3]]
    assert names == expected
    assert len(prof.key_averages().table(sort_by="count", row_limit=1).splitlines()) == len(lines) - 1
    for key in SORT_KEYS:
        prof.key_averages().table(sort_by=key)


def test_bad_sort_key_names_the_choices(cl_device: nc.Device) -> None:
    with profile() as prof:
        _x(cl_device)
    with pytest.raises(ValueError, match=r"sort_by='gpu_time'.*device_time.*self_device_time_total.*count"):
        prof.key_averages().table(sort_by="gpu_time")


def test_group_by_input_shape(cl_device: nc.Device) -> None:
    small, large = _x(cl_device, (8,)), _x(cl_device, (64,))
    with profile(record_shapes=True) as prof:
        small.to_host()
        large.to_host()
        large.to_host()
    rows = {row.shapes: row.count for row in prof.key_averages()}
    assert rows == {((8,),): 1, ((64,),): 2}
    assert "Input Shapes" in prof.key_averages().table()
    assert [row.count for row in prof.key_averages(group_by_input_shape=False)] == [3]


def test_chrome_trace(cl_device: nc.Device, tmp_path) -> None:
    x = _x(cl_device)
    ops.add(x, x)
    with profile(cl_device) as prof, record_function("step"):
        y = ops.add(x, x)
        y.to_host()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    host = [e for e in complete if e["pid"] < 1 << 24]
    device = [e for e in complete if e["pid"] >= 1 << 24]
    assert [e["name"] for e in host] == ["step", "netcl_ew", "Memcpy DtoH"]
    assert [e["name"] for e in device] == ["netcl_ew", "Memcpy DtoH"]
    for event in complete:
        assert event["ts"] >= 0 and event["dur"] >= 0
    step = host[0]
    for event in host[1:]:  # the range encloses what ran inside it
        assert step["ts"] <= event["ts"] and event["ts"] + event["dur"] <= step["ts"] + step["dur"]
    assert device[0]["ts"] + device[0]["dur"] <= device[1]["ts"]  # in-order queue: the copy after the kernel
    kernel_host = host[1]
    assert device[0]["ts"] + device[0]["dur"] >= kernel_host["ts"]  # it ran after it was enqueued
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["ph"] == "M"}
    assert any(name.startswith("device ") for _, name in names) and any(name.startswith("host") for _, name in names)
    flows = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    assert len(flows) == 2 * len(device)


def test_trace_of_several_profiles(cl_device: nc.Device, tmp_path) -> None:
    x = _x(cl_device)
    ops.add(x, x)
    with profile() as first:
        ops.add(x, x)
    with profile() as second:
        x.to_host()
    path = tmp_path / "merged.json"
    export_chrome_trace([first, second], path)
    host = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X" and e["pid"] < 1 << 24]
    assert [e["name"] for e in host] == ["netcl_ew", "Memcpy DtoH"]
    assert host[0]["ts"] + host[0]["dur"] <= host[1]["ts"]


def test_no_profiler_keeps_the_prepared_fast_path(cl_device: nc.Device) -> None:
    """Without a profile the hook list stays empty, so prepared launches keep their event-free path."""
    x = _x(cl_device)
    ops.add(x, x)
    assert profile_hooks.ACTIVE == []
    with profile():
        assert len(profile_hooks.ACTIVE) == 1
    assert profile_hooks.ACTIVE == []


def test_the_docs_example_runs(cl_device: nc.Device, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/profiling.md's example as written: it prints the table and writes trace.json."""
    page = Path(__file__).resolve().parents[2] / "docs" / "profiling.md"
    (code,) = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    monkeypatch.chdir(tmp_path)
    previous = nc.get_device()
    nc.set_device(cl_device)  # the example runs on the default device
    scope: dict = {}
    try:
        exec(compile(code, str(page), "exec"), scope)
    finally:
        nc.set_device(previous)
    rows = {row.key: row.count for row in scope["prof"].key_averages(group_by_input_shape=False)}
    assert rows["fused_forward"] == 3 and rows["step 0"] == 1 and rows["Memcpy DtoH"] == 3
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
