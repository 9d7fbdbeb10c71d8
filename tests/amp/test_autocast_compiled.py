"""autocast inside ``jit_compile`` and ``fuse_graph``: a compiled function or captured step computes what
the same code computes eagerly under autocast (before, tracing saw symbolic operands, skipped the autocast
forms and ran every product in float32).

Both sides run the same products on the same rounded operands; the compiled side only moves elementwise
ops (the bias, the ReLU) into the product's store, which is the same float32 arithmetic. So the compiled
result equals the eager one to 1e-6 relative (a GPU compiler may contract the store differently), while
autocast itself moves the result by the operands' rounding (> 1e-4 here: 16-bit operands of 36-144
products), which the test also checks wherever autocast changes anything on the device.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import netcl.amp as amp
import netcl.autograd as ag
import netcl.nn as nn
import netcl.nn.functional as F
from netcl.jit import fuse_graph, jit_compile

N = 4


def _arrays(device):
    rng = np.random.default_rng(7)
    shapes = {"x": (N, 3, 6, 6), "wc": (4, 3, 3, 3), "w1": (8, 144), "b1": (8,), "w2": (8, 5)}
    return {k: ag.tensor(rng.uniform(-1, 1, s).astype(np.float32), device=device) for k, s in shapes.items()}


def _program(x, wc, w1, b1, w2):
    h = ag.relu(ag.conv2d(x, wc, None, 1, 1))
    h = ag.relu(F.linear(ag.reshape(h, (N, 144)), w1, b1))  # linear + ReLU: one GEMM with its store on OpenCL
    return ag.matmul(h, w2)


def _quietly(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a device without float16 warns once
        return fn(*args)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_jit_compile_runs_the_autocast_forms(device, dtype):
    t = _arrays(device)
    args = [t[k] for k in ("x", "wc", "w1", "b1", "w2")]
    compiled = jit_compile(_program)
    plain = compiled(*args).to_host()  # compiled once outside autocast first: that plan must not be reused
    with amp.autocast(dtype=dtype):
        eager = _quietly(_program, *args).to_host()
        got = _quietly(compiled, *args).to_host()
    np.testing.assert_allclose(got, eager, rtol=1e-6, atol=1e-6 * np.abs(eager).max())
    if np.abs(eager - _program(*args).to_host()).max() > 0:  # autocast changes products on this device
        assert np.abs(got - plain).max() > 1e-4
    np.testing.assert_allclose(compiled(*args).to_host(), plain, rtol=0, atol=0)  # and back without it


def test_a_captured_step_under_autocast_replays_the_autocast_forms(device):
    def model():
        ag.manual_seed(3)
        return nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1, device=device),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(144, 8, device=device),
            nn.ReLU(),
            nn.Linear(8, 5, device=device),
        )

    t = _arrays(device)
    y = ag.tensor(np.arange(N, dtype=np.int32) % 5, device=device)
    with amp.autocast(dtype="bfloat16"):
        eager_model = model()
        with ag.Tape() as tape:
            eager_loss = _quietly(lambda: ag.cross_entropy(eager_model(t["x"]), y))
        tape.backward(eager_loss)
        graph = _quietly(fuse_graph, model(), t["x"], y, ag.cross_entropy)
    replayed = graph.execute(t["x"], y)
    grads = [p.grad.to_host() for p in graph.params]
    eager_grads = [p.grad.to_host() for p in eager_model.parameters()]
    reference = float(eager_loss.to_host())
    assert float(np.asarray(replayed.to_host())) == pytest.approx(reference, rel=1e-6)
    for got, want in zip(grads, eager_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    with ag.no_grad():
        plain = float(ag.cross_entropy(model()(t["x"]), y).to_host())
    if abs(plain - reference) > 0:  # autocast changes products on this device
        assert abs(float(np.asarray(replayed.to_host())) - plain) > 1e-6


def test_jit_compile_runs_attention_at_autocasts_precision(device):
    """Attention under autocast runs at the fallback precision where float16 is storage-only (NVIDIA's
    tensor cores); compiled, it must run there too (elsewhere autocast leaves it in float32 on both sides)."""
    rng = np.random.default_rng(11)
    q, k, v = (ag.tensor(rng.uniform(-1, 1, (2, 2, 16, 64)).astype(np.float32), device=device) for _ in range(3))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2.0

    compiled = jit_compile(attend)
    with amp.autocast():
        eager = _quietly(attend, q, k, v).to_host()
        got = _quietly(compiled, q, k, v).to_host()
    np.testing.assert_allclose(got, eager, rtol=1e-6, atol=1e-6 * np.abs(eager).max())
