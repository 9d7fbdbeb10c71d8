"""PreparedLaunch and netcl.runtime.enqueue: the hot-path launch (private kernel, static args set
once, per-call args, the pyopencl or direct ctypes enqueue), its capture, and its errors."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.runtime import enqueue, native
from netcl.runtime.cache import program_cache
from netcl.runtime.errors import LaunchError
from netcl.runtime.graph import Graph
from netcl.runtime.launch import PreparedLaunch, launch

N = 300
SRC = """
__kernel void axpb(__global const float *x, __global float *y, float a, float b, int n) {
    int i = get_global_id(0); if (i < n) y[i] = a * x[i] + b;
}
"""
DIRECT = [False, pytest.param(True, id="direct")]


@pytest.fixture(autouse=True, params=["python", "compiled"])
def calls(request, monkeypatch):
    """Every test runs with the generated Python call and with the compiled ``native`` launcher."""
    monkeypatch.setenv(native.ENV_VAR, "1" if request.param == "compiled" else "0")
    if request.param == "compiled" and native.launcher() is None:
        pytest.skip(f"no compiled launch here: {native.unavailable()}")
    return request.param


@pytest.fixture
def kernel(cl_device):
    handle = program_cache.get_or_compile("test_prepared_launch", SRC, cl_device.context)
    return handle.kernel("axpb", [None, None, np.float32, np.float32, np.int32])


def host(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(N).astype(np.float32)


def reference(x: np.ndarray, a: float, b: float) -> np.ndarray:
    # one float32 multiply and add (an fma at most): a few ulps of float64
    return np.float32(a) * x.astype(np.float64) + np.float32(b)


@pytest.mark.parametrize("direct", DIRECT)
def test_enqueuer_runs_a_kernel_whose_arguments_are_set(cl_device, kernel, direct):
    x = nc.tensor(host(0), device=cl_device)
    y = nc.Tensor.empty((N,), device=cl_device)
    private = cl.Kernel(kernel.program, "axpb")
    private.set_args(x.data, y.data, np.float32(2.0), np.float32(-1.0), np.int32(N))
    call, returns_status = enqueue.enqueuer(cl_device.queue, private, (320,), (64,), direct=direct)
    assert returns_status == (direct and enqueue.direct_function() is not None)
    result = call()
    if returns_status:
        assert result == 0
    np.testing.assert_allclose(y.to_host(), reference(host(0), 2.0, -1.0), rtol=1e-6, atol=1e-6)


def test_failed_direct_enqueue_names_the_kernel(cl_device, kernel):
    if enqueue.direct_function() is None:
        pytest.skip("the OpenCL loader cannot be called directly here")
    private = cl.Kernel(kernel.program, "axpb")  # no arguments set: the driver refuses the enqueue
    call, returns_status = enqueue.enqueuer(cl_device.queue, private, (320,), (64,), direct=True)
    status = call()
    assert returns_status and status != 0
    with pytest.raises(LaunchError, match=r"axpb.*status"):
        enqueue.raise_status(status, private)


@pytest.mark.parametrize("direct", DIRECT)
def test_prepared_launch_sets_static_once_and_dynamic_per_call(cl_device, kernel, monkeypatch, direct):
    monkeypatch.setenv(enqueue.ENV_VAR, "1" if direct else "0")
    prepared = PreparedLaunch(
        kernel, N, None, {3: np.float32(0.5), 4: np.int32(N)}, [(0, None), (1, None), (2, np.float32)]
    )
    assert prepared.kernel is not kernel and prepared.global_size == (N,)
    ys = []
    for seed, a in ((0, 2.0), (1, -3.0), (2, 0.25)):
        x = nc.tensor(host(seed), device=cl_device)
        y = nc.Tensor.empty((N,), device=cl_device)
        prepared.call(x.data, y.data, a)
        # eager launches of the shared kernel with other arguments do not disturb the prepared one
        launch(kernel, N, None, x, nc.Tensor.empty((N,), device=cl_device), 9.0, 9.0, N)
        ys.append((y, seed, a))
    for y, seed, a in ys:
        np.testing.assert_allclose(y.to_host(), reference(host(seed), a, 0.5), rtol=1e-6, atol=1e-6)


def test_prepared_launch_is_recorded_by_a_capture(cl_device, kernel):
    prepared = PreparedLaunch(
        kernel, N, None, {3: np.float32(1.0), 4: np.int32(N)}, [(0, None), (1, None), (2, np.float32)]
    )
    x, y = nc.tensor(host(0), device=cl_device), nc.Tensor.empty((N,), device=cl_device)
    graph = Graph()
    with graph.capture(cl_device.queue, inputs=[x]):
        prepared.call(x.data, y.data, 3.0)
    assert [s.name for s in graph.launches] == ["axpb"] and graph.launches[0].args[2] == np.float32(3.0)
    graph.outputs = y
    out = graph.execute(nc.tensor(host(5), device=cl_device))
    np.testing.assert_allclose(out.to_host(), reference(host(5), 3.0, 1.0), rtol=1e-6, atol=1e-6)


def test_prepared_launch_with_every_argument_bound(cl_device, kernel):
    """No per-call arguments (the peer all-reduce's meet): the eager call and the captured one both run."""
    x, y = nc.tensor(host(1), device=cl_device), nc.Tensor.empty((N,), device=cl_device)
    prepared = PreparedLaunch.binding(kernel, N, None, {0: x, 1: y, 2: 2.0, 3: 0.5, 4: N})
    prepared.call()
    np.testing.assert_allclose(y.to_host(), reference(host(1), 2.0, 0.5), rtol=1e-6, atol=1e-6)
    graph = Graph()
    with graph.capture(cl_device.queue, inputs=[x]):
        prepared.call()
    assert [s.name for s in graph.launches] == ["axpb"]


def test_prepared_launch_bad_inputs(cl_device, kernel):
    static = {3: np.float32(1.0), 4: np.int32(N)}
    with pytest.raises(LaunchError, match="static and dynamic must name each index once"):
        PreparedLaunch(kernel, N, None, static, [(0, None), (2, np.float32)])
    with pytest.raises(LaunchError, match="divide"):
        PreparedLaunch(kernel, N, 64, static, [(0, None), (1, None), (2, np.float32)])
    prepared = PreparedLaunch(kernel, N, None, static, [(0, None), (1, None), (2, np.float32)])
    with pytest.raises(LaunchError, match="cannot set arguments of kernel 'axpb'"):
        prepared.call("not a buffer", nc.Tensor.empty((N,), device=cl_device).data, 1.0)
    assert prepared._lock.acquire(blocking=False), "a failed call left its launch locked"
    prepared._lock.release()
    with pytest.raises(LaunchError, match="cannot set arguments of kernel 'axpb'"):
        prepared.call(nc.Tensor.empty((N,), device=cl_device).data, nc.Tensor.empty((N,), device=cl_device).data, "x")
    assert prepared._lock.acquire(blocking=False), "a failed call left its launch locked"
    prepared._lock.release()
    with pytest.raises(TypeError):
        prepared.call(nc.Tensor.empty((N,), device=cl_device).data)  # one of three per-call arguments


PACK_SRC = """
__kernel void pack(__global float *f_out, __global int *i_out, __global uint *u_out, __global long *l_out,
                   float f, int i, uint u, long l) {
    f_out[0] = f; i_out[0] = i; u_out[0] = u; l_out[0] = l;
}
"""
PACKED = [
    (1e40, 2**31 - 1, 2**32 - 1, 2**63 - 1),
    (-1e40, -(2**31), 0, -(2**63)),
    (float("nan"), 0, 1, -1),
    (1e-50, -1, 2**31, 2**40),
    (-0.0, 7, 7, 7),
    (3.4028235677973366e38 * (1 + 2**-25), 1, 2, 3),
]


@pytest.mark.parametrize("values", PACKED)
def test_plain_python_scalars_are_packed_as_pyopencl_packs_them(cl_device, values):
    """Python floats and in-range ints as per-call scalars: float32 of a float (inf past the range, signed zero and
    NaN kept), the int itself; the same bits from the compiled call as from pyopencl's packing."""
    handle = program_cache.get_or_compile("test_prepared_launch_pack", PACK_SRC, cl_device.context)
    types = [None, None, None, None, np.float32, np.int32, np.uint32, np.int64]
    prepared = PreparedLaunch(handle.kernel("pack", types), 1, None, {}, list(enumerate(types)))
    kinds = (np.float32, np.int32, np.uint32, np.int64)
    outs = [cl.Buffer(cl_device.context, cl.mem_flags.READ_WRITE, size=8) for _ in kinds]
    prepared.call(*outs, *values)
    read = [np.empty(1, kind) for kind in kinds]
    for host_copy, buffer in zip(read, outs, strict=True):
        cl.enqueue_copy(cl_device.queue, host_copy, buffer)
    single, int32, uint32, int64 = (r[0] for r in read)
    with np.errstate(over="ignore"):
        expected = np.float32(values[0])
    same_bits = np.float32(single).view(np.uint32) == expected.view(np.uint32)
    assert same_bits or (np.isnan(single) and np.isnan(expected))
    assert (int(int32), int(uint32), int(int64)) == values[1:]


@pytest.mark.parametrize("bad", [(0.0, 2**31, 0, 0), (0.0, 0, -1, 0), (0.0, 0, 0, 2**63), ("x", 0, 0, 0)])
def test_scalars_out_of_their_type_raise_and_set_nothing(cl_device, bad):
    handle = program_cache.get_or_compile("test_prepared_launch_pack", PACK_SRC, cl_device.context)
    types = [None, None, None, None, np.float32, np.int32, np.uint32, np.int64]
    prepared = PreparedLaunch(handle.kernel("pack", types), 1, None, {}, list(enumerate(types)))
    outs = [cl.Buffer(cl_device.context, cl.mem_flags.READ_WRITE, size=8) for _ in range(4)]
    with pytest.raises(LaunchError, match="cannot set arguments of kernel 'pack'"):
        prepared.call(*outs, *bad)
    assert prepared._lock.acquire(blocking=False), "a failed call left its launch locked"
    prepared._lock.release()


def test_prepared_launch_takes_buffers_made_outside_the_pool(cl_device, kernel):
    """A plain ``cl.Buffer`` (no pool token: its handle read from ``int_ptr``) as input and output."""
    flags = cl.mem_flags
    x = cl.Buffer(cl_device.context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=host(3))
    y = cl.Buffer(cl_device.context, flags.READ_WRITE, size=4 * N)
    prepared = PreparedLaunch(
        kernel, N, None, {3: np.float32(0.0), 4: np.int32(N)}, [(0, None), (1, None), (2, np.float32)]
    )
    prepared.call(x, y, -2.0)
    out = np.empty(N, np.float32)
    cl.enqueue_copy(cl_device.queue, out, y)
    np.testing.assert_allclose(out, reference(host(3), -2.0, 0.0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("direct", DIRECT)
def test_replay_through_prepared_enqueues_matches_eager(cl_device, kernel, monkeypatch, direct):
    """A kernels-only graph replays through enqueuers (direct or not): same values as eager launches."""
    monkeypatch.setenv(enqueue.ENV_VAR, "1" if direct else "0")
    x = nc.tensor(host(0), device=cl_device)
    bufs = [nc.Tensor.empty((N,), device=cl_device) for _ in range(2)]

    def chain(x):
        src = x
        for i in range(5):
            launch(kernel, N, None, src, bufs[i % 2], 0.5, 1.0, N)
            src = bufs[i % 2]
        return src

    graph = Graph()
    with graph.capture(cl_device.queue, inputs=[x]):
        graph.outputs = chain(x)
    expected = host(7).astype(np.float64)
    for _ in range(5):
        expected = 0.5 * expected + 1.0
    for _ in range(2):
        np.testing.assert_allclose(graph.execute(nc.tensor(host(7), device=cl_device)).to_host(), expected, rtol=1e-6)
    assert len(graph._plan.calls) == 4  # every step but the last, which returns the replay's event


def test_direct_enqueue_setting(cl_device, monkeypatch):
    queue = cl_device.queue
    monkeypatch.setenv(enqueue.ENV_VAR, "1")
    assert enqueue.direct_enabled(queue)
    monkeypatch.setenv(enqueue.ENV_VAR, "0")
    assert not enqueue.direct_enabled(queue)
    monkeypatch.setenv(enqueue.ENV_VAR, "auto")  # measured cheaper on NVIDIA's OpenCL only
    assert enqueue.direct_enabled(queue) == ("nvidia" in queue.device.platform.vendor.lower())
    assert not enqueue.direct_enabled(None)
