"""netcl.runtime.Variable: a bound integer kernel argument, read at launch, rebound per graph replay."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import Graph, Variable
from netcl.runtime.cache import program_cache
from netcl.runtime.capture import capture_graph
from netcl.runtime.errors import ReplayError
from netcl.runtime.launch import launch

N = 16
SRC = """
__kernel void stamp(__global float *out, int pos, float value) {
    /* out[pos] = value: writes one element at a bound position */
    if (get_global_id(0) == 0) out[pos] = value;
}
__kernel void prefix_sum(__global const float *x, __global float *out, int last) {
    /* out[0] = sum of x[0..last] */
    if (get_global_id(0) == 0) { float s = 0; for (int j = 0; j <= last; ++j) s += x[j]; out[0] = s; }
}
"""


@pytest.fixture
def kernels(cl_device: nc.Device):
    handle = program_cache.get_or_compile("test_variable", SRC, cl_device.context)
    return handle.kernel("stamp", [None, np.int32, np.float32]), handle.kernel("prefix_sum", [None, None, np.int32])


def test_bind_checks_the_range_and_names_the_variable():
    pos = Variable("pos", max_value=9, value=3)
    assert (pos.value, int(pos), pos.max_value) == (3, 3, 9)
    assert pos.bind(9) is pos and pos.value == 9
    assert pos.bind(np.int64(0)).value == 0
    with pytest.raises(ValueError, match=r"Variable 'pos': value 10 is outside \[0, 9\]"):
        pos.bind(10)
    with pytest.raises(ValueError, match=r"Variable 'pos': value -1 is outside \[0, 9\]"):
        pos.bind(-1)
    assert pos.value == 0  # a refused binding changes nothing
    with pytest.raises(TypeError, match="Variable 'pos': value must be an int, got float"):
        pos.bind(1.0)
    with pytest.raises(TypeError, match="got bool"):
        pos.bind(True)


def test_construction_errors():
    with pytest.raises(ValueError, match=r"Variable 'n': value 5 is outside \[0, 4\]"):
        Variable("n", 4, value=5)
    with pytest.raises(ValueError, match="max_value must be in"):
        Variable("n", -1)
    with pytest.raises(ValueError, match="max_value must be in"):
        Variable("n", 2**31)
    with pytest.raises(TypeError, match="non-empty str"):
        Variable("", 3)


def test_eager_launch_passes_the_current_value(cl_device, kernels):
    stamp, _ = kernels
    out = nc.Tensor.zeros((N,), device=cl_device)
    pos = Variable("pos", N - 1)
    for p, value in ((2, 1.0), (7, 2.0)):
        pos.bind(p)
        launch(stamp, 1, 1, out, pos, value)
    expected = np.zeros(N, np.float32)
    expected[[2, 7]] = [1.0, 2.0]
    np.testing.assert_array_equal(out.to_host(), expected)


def test_one_capture_replays_at_every_bound_value(cl_device, kernels):
    stamp, prefix_sum = kernels
    x = nc.Tensor.from_host(cl_device, np.arange(1, N + 1, dtype=np.float32))
    out = nc.Tensor.zeros((N,), device=cl_device)
    total = nc.Tensor.zeros((1,), device=cl_device)
    pos = Variable("pos", N - 1, value=0)
    g = Graph()
    with g.capture(cl_device.queue):
        launch(stamp, 1, 1, out, pos, np.float32(5.0))
        launch(prefix_sum, 1, 1, x, total, pos)
    assert g.variables == {"pos": pos}
    steps = len(g.steps)
    for p in (3, 11, 15, 0):
        if p % 2:
            g.execute(bindings={"pos": p})
        else:
            pos.bind(p)
            g.execute()
        assert total.to_host()[0] == sum(range(1, p + 2))  # x[0..p] = 1..p+1
    assert len(g.steps) == steps and g.replays == 4  # replays, never a new capture
    expected = np.zeros(N, np.float32)
    expected[[0, 3, 11, 15]] = 5.0
    np.testing.assert_array_equal(out.to_host(), expected)


def test_bad_bindings_raise_before_any_launch(cl_device, kernels):
    stamp, _ = kernels
    out = nc.Tensor.zeros((N,), device=cl_device)
    pos = Variable("pos", N - 1)
    g = Graph()
    with g.capture(cl_device.queue):
        launch(stamp, 1, 1, out, pos, np.float32(1.0))
    out_before = out.to_host()
    with pytest.raises(ValueError, match=r"Variable 'pos': value 16 is outside \[0, 15\]"):
        g.execute(bindings={"pos": N})
    with pytest.raises(ReplayError, match=r"no Variable named 'length'; its variables: \['pos'\]"):
        g.execute(bindings={"length": 1})
    with pytest.raises(ReplayError, match="no Variable named 'length'"):  # checked before 'pos' is bound
        g.execute(bindings={"pos": 4, "length": 1})
    assert g.replays == 0 and pos.value == 0
    np.testing.assert_array_equal(out.to_host(), out_before)


def test_two_variables_of_one_name_in_one_capture_are_refused(cl_device, kernels):
    stamp, _ = kernels
    out = nc.Tensor.zeros((N,), device=cl_device)
    g = Graph()
    with pytest.raises(ReplayError, match="two different Variables named 'pos'"), g.capture(cl_device.queue):
        launch(stamp, 1, 1, out, Variable("pos", 3), np.float32(1.0))
        launch(stamp, 1, 1, out, Variable("pos", 3), np.float32(1.0))


def test_numpy_backend_graph_rebinds_by_name():
    cpu = nc.get_device("cpu")
    table = nc.Tensor(np.arange(10, dtype=np.float32) * 2, (10,), np.dtype(np.float32), cpu)
    pos = Variable("pos", 9)

    def pick(t, p):
        return nc.Tensor(t.data[p.value : p.value + 1].copy(), (1,), t.dtype, t.device)

    g = capture_graph(None, pick, table, pos)
    assert g.variables == {"pos": pos}
    assert g.execute(table, bindings={"pos": 7}).to_host()[0] == 14.0
    with pytest.raises(ValueError, match="Variable 'pos'"):
        g.execute(table, bindings={"pos": 10})
