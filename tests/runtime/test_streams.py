"""Streams: own queues, priority hints with a stated fallback, wait_for ordering, submit."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.runtime import scheduler
from netcl.runtime.cache import program_cache
from netcl.runtime.errors import LaunchError
from netcl.runtime.scheduler import Stream

N = 1024
SRC = """
__kernel void write_value(__global float *buf, float value) { buf[get_global_id(0)] = value; }
__kernel void copy_plus_one(__global const float *src, __global float *dst) {
    dst[get_global_id(0)] = src[get_global_id(0)] + 1.0f;
}
"""


@pytest.fixture
def handle(cl_device):
    return program_cache.get_or_compile("test_streams", SRC, cl_device.context)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(scheduler, "_warned", set())


@pytest.mark.filterwarnings("ignore:device .* does not support")
def test_wait_for_orders_work_across_streams(cl_device, handle):
    s1, s2 = Stream("high", device=cl_device), Stream("low", device=cl_device)
    src = nc.Tensor.zeros(N, device=cl_device)
    dst = nc.Tensor.zeros(N, device=cl_device)
    cl_device.queue.finish()
    gate = cl.UserEvent(cl_device.context)  # holds s2's writer back until we open it
    s2.submit(handle.kernel("write_value", [None, np.float32]), src, 41.0, wait_for=[gate])
    s1.wait_for(s2)
    reader = s1.submit(handle.kernel("copy_plus_one"), src, dst)
    s1.flush()
    time.sleep(0.2)  # without the edge the reader would run now and see zeros
    assert reader.command_execution_status != cl.command_execution_status.COMPLETE
    gate.set_status(cl.command_execution_status.COMPLETE)
    s1.finish()
    np.testing.assert_array_equal(dst.to_host(), np.full(N, 42.0, np.float32))


def test_streams_have_their_own_queues_and_submit_goes_through_launch(cl_device, handle):
    s = Stream(device=cl_device)
    assert s.queue is not cl_device.queue and s.queue.context == cl_device.context
    assert s.queue.properties & cl.command_queue_properties.PROFILING_ENABLE
    buf = nc.Tensor.empty(N, device=cl_device)
    event = s.submit(handle.kernel("write_value", [None, np.float32]), buf, 3.0)  # the page: submit(kernel, *args)
    assert isinstance(event, cl.Event)
    s.finish()
    assert event.command_execution_status == cl.command_execution_status.COMPLETE
    np.testing.assert_array_equal(buf.to_host(), 3.0)
    with pytest.raises(LaunchError):
        s.submit(handle.kernel("copy_plus_one"), buf, buf, global_size=N, local_size=7)
    with pytest.raises(LaunchError, match="pass global_size="):
        s.submit(handle.kernel("copy_plus_one"), buf.data, buf.data)  # raw buffers: no size to infer
    s.submit(handle.kernel("copy_plus_one"), buf.data, buf.data, global_size=N).wait()


def test_priority_fallback_is_stated_once(cl_device):
    supported = scheduler.PRIORITY_EXTENSION in cl_device.extensions
    if supported:
        assert Stream("high", device=cl_device).priority_applied
        return
    with pytest.warns(RuntimeWarning, match="cl_khr_priority_hints"):
        high = Stream("high", device=cl_device)
    assert high.priority_applied is False and "hint not applied" in repr(high)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low = Stream("low", device=cl_device)  # already said once for this device
        normal = Stream(device=cl_device)
    assert low.priority_applied is False and normal.priority_applied is False


def test_out_of_order_stream(cl_device, handle):
    s = Stream(out_of_order=True, device=cl_device)
    ooo = bool(s.queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
    assert ooo == s.out_of_order_applied
    buf = nc.Tensor.empty(N, device=cl_device)
    out = nc.Tensor.empty(N, device=cl_device)
    e = s.submit(handle.kernel("write_value", [None, np.float32]), buf, 5.0, global_size=N)
    s.submit(handle.kernel("copy_plus_one"), buf, out, wait_for=[e])
    s.finish()
    np.testing.assert_array_equal(out.to_host(), 6.0)


def test_bad_priority_is_rejected():
    with pytest.raises(ValueError, match="priority"):
        Stream("urgent")


def test_numpy_backend_stream_is_a_no_op():
    s = Stream(device="cpu")
    assert s.queue is None and s.wait_for(Stream(device="cpu")) is None and s.record() is None
    s.finish()
    with pytest.raises(LaunchError, match="NumPy"):
        s.submit(None, global_size=1)


def test_default_stream_wraps_the_device_queue(cl_device):
    assert Stream.default(cl_device).queue is cl_device.queue
