"""The fused detection loss vs the un-fused netcl composition vs NumPy, forward and forward+backward.

Run: ``pytest benchmarks/bench_detection_loss.py`` (pytest-benchmark; groups ``detection_loss fwd``
and ``detection_loss fwd+bwd`` put the three variants side by side). Every timed call ends with a
``queue.finish()``, so it is host + device wall time of one step. Size: ``NETCL_BENCH_N`` elements
(default 16M on a GPU, 1M otherwise), on the default netcl device (``NETCL_DEVICE`` picks another).

* ``fused``: ``fused_weighted_bce_smooth_l1_loss`` — 2 launches forward, 1 backward;
* ``unfused``: ``heat*sum(weighted_bce) + reg*sum(weighted_smooth_l1)`` through autograd — one
  kernel per op and per gradient, with full-size temporaries;
* ``numpy``: float32 NumPy (loss; loss and gradient for fwd+bwd) on the host arrays.

``extra_info`` has the effective GB/s over the bytes the step must move (16 B/element forward,
36 B/element forward+backward).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core import get_device
from netcl.jit import fused_weighted_bce_smooth_l1_loss

HEAT, REG, BETA = 1.5, 0.5, 0.05
MODES = ("fwd", "fwd+bwd")
BYTES_PER_ELEMENT = {"fwd": 16, "fwd+bwd": 36}


def _size(device) -> int:
    env = os.environ.get("NETCL_BENCH_N")
    if env:
        return int(env)
    return 1 << 24 if device.kind == "opencl" and device.is_gpu else 1 << 20


class Workload:
    """Host arrays, the netcl leaves (pred trainable) and one runner per variant and mode."""

    def __init__(self) -> None:
        self.device = get_device()
        n = self.n = _size(self.device)
        rng = np.random.default_rng(0)
        self.arrays = [
            rng.uniform(-6, 6, n).astype(np.float32),
            (rng.random(n) > 0.7).astype(np.float32),
            rng.random(n, dtype=np.float32),
            rng.random(n, dtype=np.float32),
        ]
        self.pred = ag.tensor(self.arrays[0], requires_grad=True, device=self.device)
        self.rest = [ag.tensor(a, device=self.device) for a in self.arrays[1:]]

    def sync(self) -> None:
        if self.device.queue is not None:
            self.device.queue.finish()

    def fused(self, p, t, hw, rw):
        return fused_weighted_bce_smooth_l1_loss(p, t, hw, rw, HEAT, REG, BETA)

    def unfused(self, p, t, hw, rw):
        return ag.sum(ag.weighted_bce(p, t, hw)) * HEAT + ag.sum(ag.weighted_smooth_l1(p, t, rw, BETA)) * REG

    def runner(self, variant: str, mode: str):
        if variant == "numpy":
            return lambda: numpy_step(*self.arrays, backward=mode == "fwd+bwd")
        fn = self.fused if variant == "fused" else self.unfused
        if mode == "fwd":

            def forward():
                with ag.no_grad():
                    loss = fn(self.pred, *self.rest)
                self.sync()
                return float(loss.item())

            return forward

        def forward_backward():
            self.pred.grad = self.pred.value.grad = None
            with ag.Tape() as tape:
                loss = fn(self.pred, *self.rest)
            tape.backward(loss)
            self.sync()
            return float(loss.item())

        return forward_backward


def numpy_step(p, t, hw, rw, backward: bool):
    """float32 NumPy loss (float64 sums), and the gradient w.r.t. p when ``backward``."""
    bce = np.maximum(p, 0) - p * t + np.log1p(np.exp(-np.abs(p)))
    d = p - t
    a = np.abs(d)
    sl1 = np.where(a < BETA, 0.5 * d * d / BETA, a - 0.5 * BETA)
    loss = HEAT * np.sum(hw * bce, dtype=np.float64) + REG * np.sum(rw * sl1, dtype=np.float64)
    if backward:
        e = np.exp(-np.abs(p))
        sig = np.where(p >= 0, 1 / (1 + e), e / (1 + e))
        grad = HEAT * hw * (sig - t) + REG * rw * np.where(a < BETA, d / BETA, np.sign(d))
        assert grad.shape == p.shape
    return float(loss)


@pytest.fixture(scope="module")
def workload() -> Workload:
    return Workload()


@pytest.fixture(scope="module")
def reference(workload: Workload) -> float:
    return numpy_step(*(a.astype(np.float64) for a in workload.arrays), backward=False)


def _bench(benchmark, workload: Workload, reference: float, variant: str, mode: str) -> None:
    benchmark.group = f"detection_loss {mode}"
    benchmark.extra_info.update(
        {"variant": variant, "mode": mode, "elements": workload.n, "device": workload.device.name}
    )
    loss = benchmark(workload.runner(variant, mode))
    assert loss == pytest.approx(reference, rel=1e-4)  # every variant computes the same loss
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        seconds = stats.stats.median
        benchmark.extra_info["GB/s"] = BYTES_PER_ELEMENT[mode] * workload.n / seconds / 1e9


@pytest.mark.parametrize("mode", MODES)
def test_detection_loss_fused(benchmark, workload, reference, mode):
    _bench(benchmark, workload, reference, "fused", mode)


@pytest.mark.parametrize("mode", MODES)
def test_detection_loss_unfused(benchmark, workload, reference, mode):
    _bench(benchmark, workload, reference, "unfused", mode)


@pytest.mark.parametrize("mode", MODES)
def test_detection_loss_numpy(benchmark, workload, reference, mode):
    _bench(benchmark, workload, reference, "numpy", mode)
