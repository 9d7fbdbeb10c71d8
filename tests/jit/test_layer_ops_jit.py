"""Layer and shape ops inside ``jit_compile``: they run as eager steps between fused groups."""

from __future__ import annotations

import numpy as np

import netcl.autograd as ag
from netcl.jit import jit_compile


def _step(x, w, table):
    y = ag.max_pool2d(ag.relu(ag.conv2d(x, w, None, 1, 1)), 2)
    e = ag.embedding(np.array([1, 2, 1]), table)
    return ag.sum(y.flatten(1)[:, ::2] * 2.0) + ag.sum(ag.concat([e, e * 0.5], 1)[:, 1:])


def _grads(fn, nodes):
    for n in nodes:
        n.grad = None
    with ag.Tape() as tape:
        out = fn(*nodes)
    tape.backward(out)
    return out.item(), [n.grad.to_host() for n in nodes]


def test_jitted_layer_ops_match_eager(device):
    """Same loss and gradients as eager (float32 sums of < 100 terms: rtol 1e-5)."""
    rng = np.random.default_rng(0)
    nodes = [
        ag.tensor(rng.standard_normal(s), requires_grad=True, device=device)
        for s in ((2, 1, 6, 6), (3, 1, 3, 3), (4, 2))
    ]
    eager_loss, eager_grads = _grads(_step, nodes)
    jitted = jit_compile(_step)
    for _ in range(2):  # the second call replays the cached trace
        loss, grads = _grads(jitted, nodes)
        np.testing.assert_allclose(loss, eager_loss, rtol=1e-5)
        for got, want in zip(grads, eager_grads, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_jitted_dropout_draws_a_fresh_mask_per_call(device):
    """Each call of a jitted dropout draws a new mask; its backward uses that call's mask."""
    x = ag.tensor(np.ones((256,), np.float32), requires_grad=True, device=device)
    jitted = jit_compile(lambda v: ag.dropout(v, 0.5) * 3.0)
    masks = []
    for _ in range(2):
        x.grad = None
        with ag.Tape() as tape:
            out = jitted(x)
        tape.backward(out, grad=np.ones(256, np.float32))
        values = out.to_host()
        np.testing.assert_array_equal(x.grad.to_host(), values)  # d(3 * dropout(x))/dx = 3 * mask * 2 = out at x = 1
        masks.append(values != 0)
    assert not np.array_equal(masks[0], masks[1])


def test_the_first_call_of_a_jitted_dropout_takes_the_seed_eager_would(device):
    """Tracing draws seeds that its runs do not use; they are given back, so after ``manual_seed`` the first
    (tracing) call draws the mask eager draws, and a second call after the same seed repeats it."""
    x = ag.tensor(np.ones((256,), np.float32), device=device)
    jitted = jit_compile(lambda v: ag.dropout(v, 0.5) * 3.0)
    with ag.no_grad():
        ag.manual_seed(11)
        eager = (ag.dropout(x, 0.5) * 3.0).to_host()
        ag.manual_seed(11)
        first = jitted(x).to_host()
        ag.manual_seed(11)
        again = jitted(x).to_host()
    np.testing.assert_array_equal(first, eager)
    np.testing.assert_array_equal(again, eager)
