"""launch: argument handling, local-size choice, size checks, default queue; enqueue_copy/fill."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.runtime.cache import program_cache
from netcl.runtime.errors import LaunchError
from netcl.runtime.launch import PreparedLaunch, _pick_local_size, enqueue_copy, enqueue_fill, launch

SRC = """
__kernel void local_size(__global int *out) { out[get_global_id(0)] = (int)get_local_size(0); }
__kernel void axpy(__global float *y, __global const float *x, float a, int n) {
    int i = get_global_id(0); if (i < n) y[i] += a * x[i];
}
"""


@pytest.fixture
def handle(cl_device):
    return program_cache.get_or_compile("test_launch", SRC, cl_device.context)


def local_size_used(handle, device, global_size, local_size=None) -> int:
    out = nc.Tensor.empty(global_size, nc.int32, device)
    launch(handle.kernel("local_size"), global_size, local_size, out)
    values = out.to_host()
    assert (values == values[0]).all()
    return int(values[0])


def test_local_size_is_picked_for_1d_launches(cl_device, handle):
    kernel = handle.kernel("local_size")
    limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, cl_device.cl_device)
    for global_size in (1024, 96, 7, 1):
        expected = next(s for s in (256, 128, 64, 32, 16, 8, 4, 2, 1) if s <= limit and global_size % s == 0)
        assert _pick_local_size(kernel, (global_size,)) == (expected,)
        assert local_size_used(handle, cl_device, global_size) == expected
    assert _pick_local_size(kernel, (8, 8)) is None  # the driver chooses for 2-D/3-D
    assert local_size_used(handle, cl_device, 64, 16) == 16


def test_arguments_tensors_buffers_and_python_scalars(cl_device, handle):
    kernel = handle.kernel("axpy", [None, None, np.float32, np.int32])
    x_host = np.arange(10, dtype=np.float32)
    y = nc.tensor(np.ones(10, np.float32), device=cl_device)
    x = nc.tensor(x_host, device=cl_device)
    event = launch(kernel, 16, None, y, x.data, 0.5, 10)  # Tensor and raw cl.Buffer, Python numbers
    assert isinstance(event, cl.Event)
    launch(kernel, 16, 8, y, x, np.float32(2.0), np.int32(10), queue=cl_device.queue, wait_for=[event])
    np.testing.assert_allclose(y.to_host(), 1.0 + 2.5 * x_host.astype(np.float64), rtol=1e-6)


def test_prepared_launch_binding_sets_bound_arguments_once(cl_device, handle):
    """``PreparedLaunch.binding``: bound numbers typed by the declared dtypes, the rest per call in order."""
    kernel = handle.kernel("axpy", [None, None, np.float32, np.int32])
    x_host = np.arange(10, dtype=np.float32)
    y = nc.tensor(np.ones(10, np.float32), device=cl_device)
    x = nc.tensor(x_host, device=cl_device)
    prepared = PreparedLaunch.binding(kernel, 16, 8, {2: 0.5, 3: 10})
    prepared(y.data, x.data)
    prepared(y.data, x.data)
    np.testing.assert_allclose(y.to_host(), 1.0 + 1.0 * x_host.astype(np.float64), rtol=1e-6)
    with pytest.raises(LaunchError, match="no declared scalar dtypes"):
        PreparedLaunch.binding(handle.kernel("local_size"), 16, 8, {})


def test_prepared_launch_with_bound_sets_a_per_call_argument_once(cl_device, handle):
    """``with_bound``: a new launch with a per-call buffer set once; the original launch is unchanged, and the
    remaining per-call arguments keep their order."""
    kernel = handle.kernel("axpy", [None, None, np.float32, np.int32])
    x_host = np.arange(10, dtype=np.float32)
    y = nc.tensor(np.ones(10, np.float32), device=cl_device)
    z = nc.tensor(np.zeros(10, np.float32), device=cl_device)
    x = nc.tensor(x_host, device=cl_device)
    prepared = PreparedLaunch.binding(kernel, 16, 8, {2: 2.0, 3: 10})
    into_y = prepared.with_bound({0: y.data})
    into_y(x.data)
    into_y(x.data)
    prepared(z.data, x.data)
    np.testing.assert_array_equal(y.to_host(), 1.0 + 4.0 * x_host)
    np.testing.assert_array_equal(z.to_host(), 2.0 * x_host)


def test_prepared_launch_with_trailing_sets_the_last_per_call_arguments_once(cl_device, handle):
    """``with_trailing``: the last per-call arguments set once, numbers typed as declared (a Python float and int
    here); the original launch is unchanged; more values than per-call arguments raise ``LaunchError``."""
    kernel = handle.kernel("axpy", [None, None, np.float32, np.int32])
    x_host = np.arange(10, dtype=np.float32)
    y = nc.tensor(np.ones(10, np.float32), device=cl_device)
    x = nc.tensor(x_host, device=cl_device)
    prepared = PreparedLaunch.binding(kernel, 16, 8, {})
    scaled = prepared.with_trailing((3.0, 7))
    scaled(y.data, x.data)
    prepared(y.data, x.data, np.float32(0.5), np.int32(10))
    expected = 1.0 + 3.0 * np.where(np.arange(10) < 7, x_host, 0) + 0.5 * x_host
    np.testing.assert_array_equal(y.to_host(), expected)
    assert prepared.with_trailing(()) is prepared
    with pytest.raises(LaunchError, match="4 per-call arguments"):
        prepared.with_trailing((1, 2, 3, 4, 5))


@pytest.mark.parametrize(
    ("global_size", "local_size", "message"),
    [
        (0, None, "positive"),
        ((16, -1), None, "positive"),
        ((2, 2, 2, 2), None, "1 to 3 dimensions"),
        ("16", None, "int or a tuple"),
        ((16.0,), None, "int or a tuple"),
        (16, 5, "divide"),
        (16, (4, 4), "dimensions"),
        (16, 0, "positive"),
    ],
)
def test_bad_sizes_raise_launch_error(cl_device, handle, global_size, local_size, message):
    out = nc.Tensor.empty(64, nc.int32, cl_device)
    with pytest.raises(LaunchError, match=message):
        launch(handle.kernel("local_size"), global_size, local_size, out)


def test_driver_rejections_become_launch_errors(cl_device, handle):
    kernel = handle.kernel("local_size")
    limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, cl_device.cl_device)
    out = nc.Tensor.empty(limit * 2, nc.int32, cl_device)
    with pytest.raises(LaunchError, match="local size"):
        launch(kernel, limit * 2, limit * 2, out)
    with pytest.raises(LaunchError, match="cannot set arguments of kernel 'local_size'"):
        launch(kernel, 4, None, out, out)
    fresh = cl.Program(cl_device.context, SRC).build().axpy  # no declared scalar types
    with pytest.raises(LaunchError, match="axpy"):
        launch(fresh, 4, None, out, out, 1.0, 4)


def test_default_queue_and_foreign_context(cl_device, handle):
    out = nc.Tensor.empty(8, nc.int32, cl_device)
    event = launch(handle.kernel("local_size"), 8, None, out)
    assert event.command_queue == cl_device.queue
    foreign = cl.Context([cl_device.cl_device])
    kernel = cl.Program(foreign, SRC).build().local_size
    buf = cl.Buffer(foreign, cl.mem_flags.READ_WRITE, 32)
    with pytest.raises(LaunchError, match="pass queue= explicitly"):
        launch(kernel, 8, None, buf)
    queue = cl.CommandQueue(foreign)
    launch(kernel, 8, None, buf, queue=queue).wait()


def test_enqueue_copy_and_fill(cl_device):
    src = nc.tensor(np.arange(6, dtype=np.float32), device=cl_device)
    dst = nc.Tensor.zeros(6, device=cl_device)
    enqueue_copy(cl_device.queue, dst, src)
    np.testing.assert_array_equal(dst.to_host(), np.arange(6))
    enqueue_fill(cl_device.queue, dst, 2.5, np.float32)
    np.testing.assert_array_equal(dst.to_host(), 2.5)
    enqueue_fill(cl_device.queue, dst.data, byte_count=8)  # raw buffer, zero bytes, first two floats
    np.testing.assert_array_equal(dst.to_host(), [0, 0, 2.5, 2.5, 2.5, 2.5])


def test_python_float_to_an_undeclared_kernel_hints_scalar_dtypes(cl_device) -> None:
    import re

    from netcl.runtime.errors import LaunchError

    handle = program_cache.get_or_compile(
        "test_launch_hint", "__kernel void set_a(__global float* x, float a) { x[0] = a; }", cl_device.context
    )
    t = nc.Tensor.zeros(4, device=cl_device)
    with pytest.raises(LaunchError, match=re.escape("#2 (float 2.5)")) as info:
        launch(handle.kernel("set_a"), 1, 1, t, 2.5)
    assert "scalar_dtypes=[None, np.float32, ...]" in str(info.value) and "np.float32(x)" in str(info.value)
    launch(handle.kernel("set_a", [None, np.float32]), 1, 1, t, 2.5)  # declared: Python floats are fine
    assert t.to_host()[0] == 2.5
