"""Host views of a CPU device's pool blocks (``netcl.runtime.host_views``, ``memory.host_view``): the probe's
verdict, a view against the device's own reads and writes, and host products on views (no map) against host
products on maps (bit for bit: the same NumPy product of the same values)."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.runtime import host_views, memory
from netcl.runtime import ops as rops
from netcl.runtime.graph import capture_graph
from netcl.runtime.ops import gemm_cpu, host_blas


@pytest.fixture
def viewed(cpu_cl: nc.Device, monkeypatch: pytest.MonkeyPatch) -> nc.Device:
    """The CPU OpenCL device with host views (every CPU runtime the tests run on passes the probe), products on
    the host BLAS whatever their size."""
    probe = nc.Tensor.empty((4,), np.float32, cpu_cl)
    if not host_views.coherent(cpu_cl) or memory.host_view(probe.data, (4,), probe.dtype) is None:
        pytest.skip("this device's pool keeps no host views")
    monkeypatch.setenv(gemm_cpu.ENV_VAR, "off")
    monkeypatch.delenv(host_blas.ENV_VAR, raising=False)
    return cpu_cl


def test_the_probe_decides_by_device(cl_device: nc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host views only on a device whose memory the host shares (a GPU never), and never with
    ``NETCL_HOST_VIEWS=0``."""
    if not host_views.host_memory_device(cl_device):
        assert not host_views.coherent(cl_device)
    monkeypatch.setenv(host_views.ENV_VAR, "0")
    assert not host_views.coherent(cl_device)


def test_a_view_sees_the_device_writes_and_the_device_sees_the_host_writes(viewed: nc.Device) -> None:
    """A block's view after a finish holds what a kernel wrote there; what the host writes into a view is what a
    kernel enqueued afterwards reads."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((33, 17)).astype(np.float32)
    y = rops.add(nc.tensor(x, device=viewed), 1.0)  # a pooled block written by a kernel
    viewed.queue.finish()
    view = memory.host_view(y.data, y.shape, y.dtype)
    assert view is not None
    np.testing.assert_array_equal(view, x + np.float32(1))
    written = rng.standard_normal((33, 17)).astype(np.float32)
    view[...] = written
    np.testing.assert_array_equal(rops.mul(y, 2.0).to_host(), written * np.float32(2))


def test_a_buffer_outside_the_pool_has_no_view(viewed: nc.Device) -> None:
    """A buffer the pool did not hand out (no view) multiplies on maps, with the bits of a product on views."""
    a = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    raw = cl.Buffer(viewed.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
    outside = nc.Tensor(raw, (5, 6), np.dtype(np.float32), viewed)
    assert memory.host_view(raw, (5, 6), np.dtype(np.float32)) is None
    pooled = nc.tensor(a, device=viewed)
    b = nc.tensor(a.T.copy(), device=viewed)
    np.testing.assert_array_equal(rops.matmul(outside, b).to_host(), rops.matmul(pooled, b).to_host())


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "transpose_a", "transpose_b"),
    [
        ((7, 5), (5, 3), False, False),
        ((3, 40, 50), (3, 50, 30), False, False),  # batched
        ((50, 40), (30, 50), True, True),  # both read transposed
        ((4, 0), (0, 3), False, False),  # K == 0: zeros
    ],
)
def test_host_products_on_views_map_nothing_and_give_the_mapped_bits(
    viewed: nc.Device, monkeypatch: pytest.MonkeyPatch, a_shape, b_shape, transpose_a, transpose_b
) -> None:
    """A host product of pooled operands runs on their views: no map, and the bits of the same product on maps
    (its views hidden), eagerly and replayed from a captured graph."""
    rng = np.random.default_rng(len(a_shape))
    a = nc.tensor(rng.uniform(-1, 1, a_shape).astype(np.float32), device=viewed)
    b = nc.tensor(rng.uniform(-1, 1, b_shape).astype(np.float32), device=viewed)
    maps: list = []
    real_map = host_blas._map

    def counting(*args, **kwargs):
        maps.append(args[2])
        return real_map(*args, **kwargs)

    monkeypatch.setattr(host_blas, "_map", counting)

    def product(x: nc.Tensor, y: nc.Tensor) -> nc.Tensor:
        return rops.matmul(rops.add(x, 0.5), y, transpose_a=transpose_a, transpose_b=transpose_b)

    on_views = product(a, b).to_host()
    assert maps == []
    graph = capture_graph(viewed.queue, product, a, b)
    replayed = graph.execute(a, b).to_host()
    assert maps == []
    monkeypatch.setattr(host_blas, "host_view", lambda buffer, shape, dtype: None)
    on_maps = product(a, b).to_host()
    assert len(maps) == 3 or 0 in a_shape
    np.testing.assert_array_equal(on_views, on_maps)
    np.testing.assert_array_equal(replayed, on_maps)
    want = np.matmul(
        np.swapaxes(a.to_host() + np.float32(0.5), -1, -2) if transpose_a else a.to_host() + np.float32(0.5),
        np.swapaxes(b.to_host(), -1, -2) if transpose_b else b.to_host(),
    )
    np.testing.assert_allclose(on_views, want, rtol=1e-5, atol=1e-5)
