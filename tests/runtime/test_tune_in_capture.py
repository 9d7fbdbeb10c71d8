"""A first-use search inside a capture: its trials run unrecorded, and the capture keeps the winner's launches."""

from __future__ import annotations

import numpy as np

import netcl.core as nc
from netcl.runtime import clear_caches, tune
from netcl.runtime import ops as R
from netcl.runtime.capture import capture_graph
from netcl.runtime.ops import conv_implicit
from netcl.runtime.ops.gemm_configs import fits
from netcl.runtime.ops.gemm_source import GemmConfig
from tests.runtime.test_conv_winograd import _direct


def test_a_search_inside_a_capture_records_only_the_winners_launch(cl_device, searching):
    x = nc.tensor(np.arange(6, dtype=np.float32), device=cl_device)
    tried: list[int] = []

    def trial(scale: int):
        tried.append(scale)
        return lambda: R.mul(x, float(scale))  # each timed run is a real launch on the capture's queue

    def step(v):
        scale = tune.select(cl_device, "capture-trial", [2, 3], 2, trial, lambda c: {"s": c}, lambda d: d["s"])
        return R.mul(v, float(scale))

    graph = capture_graph(cl_device.queue, step, x)
    assert sorted(set(tried)) == [2, 3]  # searched although a capture was recording
    assert len(graph) == 1  # the step's product alone: none of the trials' runs
    winner = tune.lookup(cl_device, "capture-trial")["s"]
    np.testing.assert_array_equal(graph.execute(x).to_host(), np.arange(6, dtype=np.float32) * winner)


def test_a_product_captured_first_replays_the_searched_config(cl_device, two_tiles):
    """Two candidate tiles of different work-group sizes: the captured launch has the stored winner's."""
    rng = np.random.default_rng(7)
    a, b = rng.uniform(-1, 1, (48, 40)).astype(np.float32), rng.uniform(-1, 1, (40, 24)).astype(np.float32)
    x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
    graph = capture_graph(cl_device.queue, R.matmul, x, y)
    (stored,) = [w for key, w in tune.winners(cl_device).items() if key.startswith("portable|NN|<f4|")]
    winner = GemmConfig(**{k: v for k, v in stored.items() if not k.startswith("_")})
    assert [launch.local_size for launch in graph.launches] == [(winner.wgn, winner.wgm, 1)]
    # 40 products of magnitude <= 1 in float32: error well below 1e-5
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(graph.execute(x, y).to_host(), expected, rtol=0, atol=1e-5)


def test_a_convolution_captured_first_records_what_a_later_capture_records(cl_device, searching, monkeypatch):
    """The algorithm choice (on a host-BLAS CPU device) and the implicit GEMM's tiles are searched inside the
    first capture; a second capture, which finds them stored, records the same launches."""
    tiles = [GemmConfig(8, 8, 2, 2, 16, 1, 1, 1), GemmConfig(16, 16, 2, 2, 16, 1, 1, 1)]
    monkeypatch.setattr(
        conv_implicit, "candidates", lambda layer: [c for c in tiles if fits(layer.device, c, 4, layer.problem)]
    )
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, (2, 32, 6, 6)).astype(np.float32), rng.uniform(-1, 1, (8, 32, 3, 3)).astype(np.float32)
    x, w = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)

    def conv(v, k):
        return R.conv2d(v, k, padding=1, winograd=False)  # C * 3 * 3 = 288: long enough to time both algorithms

    first = capture_graph(cl_device.queue, conv, x, w)
    searched = [key for key in tune.winners(cl_device) if key.startswith("conv-")]
    assert searched  # a choice was timed inside the capture
    stored = tune.winners(cl_device)
    clear_caches()  # the second capture plans again, from the stored winners
    second = capture_graph(cl_device.queue, conv, x, w)
    assert [s.name for s in first.steps] == [s.name for s in second.steps]
    assert tune.winners(cl_device) == stored  # nothing searched again
    # 288 products of magnitude <= 1 in float32: error well below 1e-4
    expected = _direct(a.astype(np.float64), b.astype(np.float64), (1, 1))
    for graph in (first, second):
        np.testing.assert_allclose(graph.execute(x, w).to_host(), expected, rtol=0, atol=1e-4)
