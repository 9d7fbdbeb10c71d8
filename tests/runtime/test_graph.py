"""Capture and replay: Graph, capture_graph, get_capture."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.runtime import capture as capture_mod
from netcl.runtime.cache import program_cache
from netcl.runtime.capture import capture_graph, get_capture
from netcl.runtime.errors import ReplayError
from netcl.runtime.graph import Graph
from netcl.runtime.launch import enqueue_copy, enqueue_fill, launch
from netcl.runtime.replay_results import ReplayResult

N = 256
SRC = """
__kernel void scale(__global const float *x, __global float *y, float a, int n) {
    int i = get_global_id(0); if (i < n) y[i] = x[i] * a;
}
__kernel void add(__global const float *y, __global const float *b, __global float *z, int n) {
    int i = get_global_id(0); if (i < n) z[i] = y[i] + b[i];
}
__kernel void relu(__global const float *z, __global float *out, int n) {
    int i = get_global_id(0); if (i < n) out[i] = fmax(z[i], 0.0f);
}
"""


@pytest.fixture
def kernels(cl_device: nc.Device) -> dict[str, cl.Kernel]:
    handle = program_cache.get_or_compile("test_graph", SRC, cl_device.context)
    return {
        "scale": handle.kernel("scale", [None, None, np.float32, np.int32]),
        "add": handle.kernel("add", [None, None, None, np.int32]),
        "relu": handle.kernel("relu", [None, None, np.int32]),
    }


def chain(k: dict[str, cl.Kernel], x: nc.Tensor, b: nc.Tensor, a: float = 1.5) -> nc.Tensor:
    """relu(x * a + b) as three kernel launches."""
    y = nc.Tensor.empty(x.shape, device=x.device)
    z = nc.Tensor.empty(x.shape, device=x.device)
    out = nc.Tensor.empty(x.shape, device=x.device)
    launch(k["scale"], N, None, x, y, a, N)
    launch(k["add"], N, None, y, b, z, N)
    launch(k["relu"], N, None, z, out, N)
    return out


def reference(x: np.ndarray, b: np.ndarray, a: float = 1.5) -> np.ndarray:
    return np.maximum(x.astype(np.float64) * a + b, 0.0)


def host(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(N).astype(np.float32)


def test_capture_three_kernels_and_replay_with_new_inputs(cl_device, kernels):
    x, b = nc.tensor(host(0), device=cl_device), nc.tensor(host(1), device=cl_device)
    g = capture_graph(cl_device.queue, chain, kernels, x, b)
    assert [launch.name for launch in g.launches] == ["scale", "add", "relu"]
    assert g.launches[0].global_size == (N,) and g.launches[0].args[2] == np.float32(1.5)
    np.testing.assert_allclose(g.outputs.to_host(), reference(host(0), host(1)), rtol=1e-6, atol=1e-6)

    x2, b2 = nc.tensor(host(2), device=cl_device), nc.tensor(host(3), device=cl_device)
    out = g.execute(x2, b2)
    # float32 multiply-add of O(1) values: a few ulps.
    np.testing.assert_allclose(out.to_host(), reference(host(2), host(3)), rtol=1e-6, atol=1e-6)
    assert g.launches[0].dynamic == {0: 0} and g.launches[1].dynamic == {1: 1} and g.launches[2].dynamic == {}
    # no arguments: replay on the captured inputs
    np.testing.assert_allclose(g.execute().to_host(), reference(host(0), host(1)), rtol=1e-6, atol=1e-6)


def test_context_manager_capture_with_declared_inputs(cl_device, kernels):
    x, b = nc.tensor(host(4), device=cl_device), nc.tensor(host(5), device=cl_device)
    g = Graph()
    assert get_capture() is None
    with g.capture(cl_device.queue, inputs=[x, b]) as active:
        assert active is g and get_capture() is g
        g.outputs = chain(kernels, x, b, a=-2.0)
    assert get_capture() is None and g.state == "captured" and len(g.launches) == 3
    x2 = nc.tensor(host(6), device=cl_device)
    np.testing.assert_allclose(g.execute(x2, b).to_host(), reference(host(6), host(5), -2.0), rtol=1e-6, atol=1e-6)


def test_inputs_declared_after_capture(cl_device, kernels):
    x, b = nc.tensor(host(4), device=cl_device), nc.tensor(host(5), device=cl_device)
    g = Graph()
    with g.capture(cl_device.queue):
        out = chain(kernels, x, b)
    g.set_inputs([b])
    g.outputs = out
    b2 = nc.tensor(host(7), device=cl_device)
    np.testing.assert_allclose(g.execute(b2).to_host(), reference(host(4), host(7)), rtol=1e-6, atol=1e-6)


def test_collected_results_keep_their_values_and_copy_outputs_gives_fresh_ones(cl_device, kernels):
    x, b = nc.tensor(host(0), device=cl_device), nc.tensor(host(1), device=cl_device)
    g = capture_graph(None, chain, kernels, x, b)
    xa, xb = nc.tensor(host(8), device=cl_device), nc.tensor(host(9), device=cl_device)
    first = g.execute(xa, b)
    fresh = g.execute(xa, b, copy_outputs=True)
    second = g.execute(xb, b)
    assert isinstance(first, ReplayResult) and second is not first and fresh is not first
    assert not isinstance(fresh, ReplayResult)
    # the later replays wrote into the graph's buffer, but `first` was copied out before them
    np.testing.assert_allclose(first.to_host(), reference(host(8), host(1)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fresh.to_host(), reference(host(8), host(1)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(second.to_host(), reference(host(9), host(1)), rtol=1e-6, atol=1e-6)
    # g.outputs is the graph's working buffer: it shows the latest replay
    np.testing.assert_allclose(g.outputs.to_host(), reference(host(9), host(1)), rtol=1e-6, atol=1e-6)


def test_mismatched_replay_raises_and_enqueues_nothing(cl_device, kernels, monkeypatch):
    x, b = nc.tensor(host(0), device=cl_device), nc.tensor(host(1), device=cl_device)
    g = capture_graph(cl_device.queue, chain, kernels, x, b)
    g.execute()  # build the plan first, so only replay enqueues are counted below
    cl_device.queue.finish()
    calls = []
    real = cl.enqueue_nd_range_kernel
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", lambda *a, **k: calls.append(a) or real(*a, **k))
    # all steps but the last replay through prepared enqueues (netcl.runtime.enqueue): count those too
    g._plan.calls = [lambda call=call: calls.append(call) or call() for call in g._plan.calls]
    bad = {
        "count": ((x,), "captured with 2 inputs"),
        "size": ((nc.tensor(np.zeros(N // 2, np.float32), device=cl_device), b), "input 0"),
        "shape": ((x, nc.tensor(np.zeros((2, N // 2), np.float32), device=cl_device)), "input 1"),
        "dtype": ((x, nc.tensor(np.zeros(N, np.int32), device=cl_device)), "input 1"),
        "buffer size": ((x, cl.Buffer(cl_device.context, cl.mem_flags.READ_WRITE, 8)), "input 1"),
        "type": ((x, host(1)), "input 1"),
        "device": ((x, nc.tensor(host(1), device="cpu")), "input 1"),
    }
    for what, (args, message) in bad.items():
        with pytest.raises(ReplayError, match=message):
            g.execute(*args)
        assert not calls, f"{what} mismatch enqueued work"
    g.execute(x, b)
    assert len(calls) == 3


def test_eager_launches_of_the_same_kernels_do_not_disturb_replay(cl_device, kernels):
    x, b = nc.tensor(host(0), device=cl_device), nc.tensor(host(1), device=cl_device)
    g = capture_graph(cl_device.queue, chain, kernels, x, b)
    x2 = nc.tensor(host(2), device=cl_device)
    g.execute(x2, b)
    # eager use of the same cl.Kernel objects with other arguments (a different scale too)
    eager = chain(kernels, b, x2, a=-3.0)
    out = g.execute(x2, b)
    np.testing.assert_allclose(out.to_host(), reference(host(2), host(1)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(eager.to_host(), reference(host(1), host(2), -3.0), rtol=1e-6, atol=1e-6)


def test_same_kernel_twice_in_one_graph(cl_device, kernels):
    def twice(x):
        y = nc.Tensor.empty(x.shape, device=x.device)
        z = nc.Tensor.empty(x.shape, device=x.device)
        launch(kernels["scale"], N, None, x, y, 2.0, N)
        launch(kernels["scale"], N, None, y, z, -0.5, N)
        return z

    x = nc.tensor(host(0), device=cl_device)
    g = capture_graph(cl_device.queue, twice, x)
    x2 = nc.tensor(host(1), device=cl_device)
    for _ in range(2):
        np.testing.assert_allclose(g.execute(x2).to_host(), -host(1).astype(np.float64), rtol=1e-6)


def test_copy_and_fill_commands_are_captured(cl_device, kernels):
    def fn(x):
        y = nc.Tensor.empty(x.shape, device=x.device)
        enqueue_copy(x.queue, y, x)
        out = nc.Tensor.empty(x.shape, device=x.device)
        enqueue_fill(x.queue, out, 7.0, np.float32)
        launch(kernels["add"], N // 2, None, y, out, out, N // 2)  # first half: y + 7, second half stays 7
        return out

    x = nc.tensor(host(0), device=cl_device)
    g = capture_graph(cl_device.queue, fn, x)
    assert [s.name for s in g.steps] == ["copy_command", "fill_command", "add"] and len(g.launches) == 1
    x2 = nc.tensor(host(1), device=cl_device)
    for _ in range(2):  # the fill is replayed too, so the in-place add does not accumulate
        got = g.execute(x2).to_host()
        np.testing.assert_allclose(got[: N // 2], host(1)[: N // 2] + 7.0, rtol=1e-6)
        np.testing.assert_array_equal(got[N // 2 :], 7.0)


def test_out_of_order_queue_replays_in_order(cl_device, kernels):
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    if not cl_device.cl_device.queue_properties & props:
        pytest.skip("device has no out-of-order queues")
    queue = cl.CommandQueue(cl_device.context, properties=props)
    x, b = nc.tensor(host(0), device=cl_device), nc.tensor(host(1), device=cl_device)

    def fn(x, b):
        out = nc.Tensor.empty(x.shape, device=x.device)
        y = nc.Tensor.empty(x.shape, device=x.device)
        z = nc.Tensor.empty(x.shape, device=x.device)
        e1 = launch(kernels["scale"], N, None, x, y, 1.5, N, queue=queue)
        e2 = launch(kernels["add"], N, None, y, b, z, N, queue=queue, wait_for=[e1])
        launch(kernels["relu"], N, None, z, out, N, queue=queue, wait_for=[e2]).wait()
        return out

    g = capture_graph(queue, fn, x, b)
    x2 = nc.tensor(host(2), device=cl_device)
    out = g.execute(x2, b, wait=True)
    np.testing.assert_allclose(out.to_host(), reference(host(2), host(1)), rtol=1e-6, atol=1e-6)


def test_captures_do_not_nest_on_one_queue(cl_device, kernels):
    g1, g2 = Graph(), Graph()
    with g1.capture(cl_device.queue), pytest.raises(RuntimeError, match="do not nest"), g2.capture(cl_device.queue):
        pass
    with pytest.raises(ReplayError, match="already captured"), g1.capture(cl_device.queue):
        pass


def test_failed_capture_releases_the_queue(cl_device, kernels):
    g = Graph()
    with pytest.raises(ZeroDivisionError), g.capture(cl_device.queue):
        _ = 1 / 0
    assert g.state == "failed" and not capture_mod.RECORDING
    with pytest.raises(ReplayError, match="failed"):
        g.execute()
    with Graph().capture(cl_device.queue):
        pass


def test_launch_on_another_queue_while_capturing_warns(cl_device, kernels):
    other = cl.CommandQueue(cl_device.context)
    x = nc.tensor(host(0), device=cl_device)
    y = nc.Tensor.empty(x.shape, device=cl_device)
    g = Graph()
    with g.capture(cl_device.queue), pytest.warns(RuntimeWarning, match="NOT part of the captured graph"):
        launch(kernels["scale"], N, None, x, y, 1.0, N, queue=other)
    assert not g.launches


def test_undeclared_python_scalar_cannot_be_captured(cl_device):
    program = cl.Program(cl_device.context, SRC).build()
    kernel = program.scale
    kernel.set_scalar_arg_dtypes([None, None, np.float32, np.int32])  # declared behind netcl's back
    x = nc.tensor(host(0), device=cl_device)
    y = nc.Tensor.empty(x.shape, device=cl_device)
    with pytest.raises(ReplayError, match="argument 2 of kernel 'scale'"), Graph().capture(cl_device.queue):
        launch(kernel, N, None, x, y, 2.0, N)


def test_inputs_sharing_a_buffer_are_rejected(cl_device):
    x = nc.tensor(host(0), device=cl_device)
    with pytest.raises(ReplayError, match="share one buffer"):
        Graph().set_inputs([x, x.reshape(16, 16)])


def test_output_that_is_an_input_follows_the_replay_input(cl_device, kernels):
    def fn(x, b):
        launch(kernels["add"], N, None, x, b, x, N)  # in place into x
        return x.reshape(16, 16)

    x, b = nc.tensor(host(0), device=cl_device), nc.tensor(host(1), device=cl_device)
    g = capture_graph(cl_device.queue, fn, x, b)
    x2 = nc.tensor(host(2), device=cl_device)
    out = g.execute(x2, b)
    assert out.shape == (16, 16) and out.data is x2.data
    np.testing.assert_allclose(out.to_host().ravel(), host(2) + host(1), rtol=1e-6)


def test_numpy_backend_capture_graph_reruns_with_fresh_results():
    cpu = nc.get_device("cpu")

    def fn(x, b, *, a):
        return nc.Tensor(np.maximum(x.data * a + b.data, 0), x.shape, x.dtype, cpu)

    x, b = nc.tensor(host(0), device=cpu), nc.tensor(host(1), device=cpu)
    g = capture_graph(None, fn, x, b, a=1.5)
    assert g.launches == [] and g.state == "captured"
    first = g.execute(nc.tensor(host(2), device=cpu), b)
    fresh = g.execute(nc.tensor(host(2), device=cpu), b, copy_outputs=True)
    second = g.execute(nc.tensor(host(3), device=cpu), b)
    assert len({id(first), id(fresh), id(second), id(g.outputs)}) == 4
    np.testing.assert_allclose(first.to_host(), reference(host(2), host(1)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fresh.to_host(), reference(host(2), host(1)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(second.to_host(), reference(host(3), host(1)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g.outputs.to_host(), reference(host(3), host(1)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ReplayError, match="input 0"):
        g.execute(nc.tensor(np.zeros(3, np.float32), device=cpu), b)
    with pytest.raises(ReplayError, match="captured with 2 inputs"):
        g.execute(b)
    with pytest.raises(ReplayError, match="OpenCL queue"), Graph().capture(cpu):
        pass


def test_capture_graph_warns_when_nothing_was_captured(cl_device):
    x = nc.tensor(host(0), device=cl_device)
    with pytest.warns(RuntimeWarning, match="captured nothing"):
        g = capture_graph(cl_device.queue, lambda t: t, x)
    assert g.execute(x) is x and len(g) == 0
