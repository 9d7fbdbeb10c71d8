"""Gradient sums folded into the store of a product (``apply_op``'s ``folds_addends``).

matmul, linear and conv2d take the gradient summed so far for an input (a second use, or a
leaf's stored ``grad``) into their product's store (a bias's into its sum's last store): the sum
has the bits of the add it replaces (one float add either way), and accumulating costs no add
kernel. ``NETCL_HOST_BLAS=0`` keeps PoCL's products on the GEMM kernels (the host BLAS path adds
after its product).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn.functional as F
from netcl.runtime.ops import host_blas


@pytest.fixture(autouse=True)
def _gemm_kernels(monkeypatch):
    monkeypatch.setenv(host_blas.ENV_VAR, "0")


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


#: name -> (loss of (input, params), input shape, parameter shapes); the 24 x 16 weight gradient
#: of "linear" sums over 1536 rows, so the GEMM splits along K and its sum kernel adds the addend
CASES = {
    "matmul": (lambda x, p: ag.sum(ag.tanh(ag.matmul(x, p[0]))), (32, 16), [(16, 8)]),
    "batched_matmul": (lambda x, p: ag.sum(ag.tanh(ag.matmul(x, p[0]))), (3, 8, 16), [(16, 8)]),
    "linear": (lambda x, p: ag.sum(ag.tanh(F.linear(x, p[0], p[1]))), (1536, 16), [(24, 16), (24,)]),
    "conv2d": (
        lambda x, p: ag.sum(ag.tanh(ag.conv2d(x, p[0], p[1], padding=1))),
        (4, 8, 10, 10),
        [(16, 8, 3, 3), (16,)],
    ),
}


def _grads(device, case, x_seed):
    """The gradients of one step's loss w.r.t. its input and parameters, each from a fresh backward."""
    loss_fn, x_shape, p_shapes = CASES[case]
    x = ag.tensor(_rand(x_shape, x_seed), requires_grad=True, device=device)
    params = [ag.tensor(_rand(s, 10 + k), requires_grad=True, device=device) for k, s in enumerate(p_shapes)]
    with ag.Tape() as tape:
        loss = loss_fn(x, params)
    tape.backward(loss)
    return [v.grad.to_host() for v in (x, *params)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_micro_batches_accumulate_to_the_float32_sum(device, case):
    """Two backward passes on two micro-batches: each leaf's grad is exactly the float32 sum of the two
    passes' own gradients (one add of two floats either way, whether a store or a kernel adds)."""
    loss_fn, x_shape, p_shapes = CASES[case]
    first, second = _grads(device, case, 0), _grads(device, case, 1)
    params = [ag.tensor(_rand(s, 10 + k), requires_grad=True, device=device) for k, s in enumerate(p_shapes)]
    for seed in (0, 1):
        x = ag.tensor(_rand(x_shape, seed), requires_grad=True, device=device)
        with ag.Tape() as tape:
            loss = loss_fn(x, params)
        tape.backward(loss)
    for param, a, b in zip(params, first[1:], second[1:], strict=True):
        np.testing.assert_array_equal(param.grad.to_host(), a + b)


@pytest.mark.parametrize("case", ["matmul", "linear", "conv2d"])
def test_accumulating_launches_no_add_kernel(cl_device, launch_counter, case):
    """A backward into leaves that already hold a gradient launches the kernels of one into empty grads
    (the products and the bias sums add the stored grads in their stores); the input, weight and bias
    grads then hold exactly twice the first pass's."""
    loss_fn, x_shape, p_shapes = CASES[case]
    x = ag.tensor(_rand(x_shape, 0), requires_grad=True, device=cl_device)
    params = [ag.tensor(_rand(s, 10 + k), requires_grad=True, device=cl_device) for k, s in enumerate(p_shapes)]
    names, grads = [], []
    for _ in range(2):
        with ag.Tape() as tape:
            loss = loss_fn(x, params)
        with launch_counter(cl_device.queue) as launches:
            tape.backward(loss)
        names.append(launches.names)
        grads.append([v.grad.to_host().copy() for v in (x, *params)])
    assert names[1] == names[0]
    for once, twice in zip(*grads, strict=True):
        np.testing.assert_array_equal(twice, 2 * once)


def test_a_residual_join_adds_in_the_product(cl_device, launch_counter):
    """``h`` feeds a linear layer and a skip connection: its two gradients meet in the input-gradient
    product's store (the same kernels as without the skip), and x's gradient matches float64."""
    x_host, w_host = _rand((64, 32), 0), _rand((32, 32), 1) / 4
    names = {}
    for skip in (False, True):
        x = ag.tensor(x_host, requires_grad=True, device=cl_device)
        w = ag.tensor(w_host, requires_grad=True, device=cl_device)
        with ag.Tape() as tape:
            h = x * 2.0
            product = F.linear(h, w)
            loss = ag.sum(ag.tanh(product + h if skip else product))
        with launch_counter(cl_device.queue) as launches:
            tape.backward(loss)
        names[skip] = launches.names
    assert names[True] == names[False]
    h64 = 2 * x_host.astype(np.float64)
    d_out = 1 - np.tanh(h64 @ w_host.T.astype(np.float64) + h64) ** 2
    expected = 2 * (d_out @ w_host.astype(np.float64) + d_out)
    np.testing.assert_allclose(x.grad.to_host(), expected, rtol=1e-5, atol=1e-5)


def test_one_node_twice_in_a_folding_op(device):
    """``h @ h`` with ``h`` already holding a pending gradient: the sum so far goes into ONE of the two
    products (the other adds its own), vs the float64 gradient."""
    x_host = _rand((8, 8), 0) / 2
    x = ag.tensor(x_host, requires_grad=True, device=device)
    with ag.Tape() as tape:
        h = x * 2.0
        loss = ag.sum(ag.matmul(h, h) + h)
    tape.backward(loss)
    h64, ones = 2 * x_host.astype(np.float64), np.ones((8, 8))
    expected = 2 * (ones @ h64.T + h64.T @ ones + ones)
    np.testing.assert_allclose(x.grad.to_host(), expected, rtol=1e-5, atol=1e-4)


def test_a_leaf_used_twice_keeps_the_unfolded_order(device):
    """A leaf with a stored grad and two uses is not offered its grad (the sum stays (g1 + g2) + stored,
    the order without folding): the result equals that float32 sum exactly."""
    w_host = _rand((16, 16), 1) / 4
    x = ag.tensor(_rand((4, 16), 0), device=device)
    w = ag.tensor(w_host, requires_grad=True, device=device)

    def step():
        with ag.Tape() as tape:
            loss = ag.sum(ag.tanh(ag.matmul(ag.matmul(x, w), w)))
        tape.backward(loss)

    step()
    stored = w.grad.to_host().copy()
    step()
    np.testing.assert_array_equal(w.grad.to_host(), stored + stored)


def test_grad_ready_hooks_see_the_folded_sum(device):
    w = ag.tensor(_rand((16, 8), 1), requires_grad=True, device=device)
    x = ag.tensor(_rand((32, 16), 0), device=device)
    seen = []
    w.register_grad_ready_hook(lambda node, g: seen.append(g.to_host().copy()))
    for _ in range(2):
        with ag.Tape() as tape:
            loss = ag.sum(ag.tanh(ag.matmul(x, w)))
        tape.backward(loss)
    np.testing.assert_array_equal(seen[1], 2 * seen[0])
    np.testing.assert_array_equal(w.grad.to_host(), seen[1])


def test_a_failed_backward_leaves_a_folded_leaf_grad_alone(device):
    """The product folds w's stored grad into a NEW buffer; when a later grad_fn fails, w.grad is the
    one from before the pass, untouched."""
    w = ag.tensor(_rand((16, 8), 1), requires_grad=True, device=device)
    x = ag.tensor(_rand((32, 16), 0), requires_grad=True, device=device)
    with ag.Tape() as tape:
        loss = ag.sum(ag.matmul(x, w))
    tape.backward(loss)
    before = w.grad.to_host().copy()

    def broken(g, values, out):
        raise ValueError("boom")

    with ag.Tape() as tape:
        bad = ag.apply_op(lambda v: v, broken, x, op_name="broken")
        loss = ag.sum(ag.matmul(bad, w))
    with pytest.raises(ValueError, match="boom"):
        tape.backward(loss)
    np.testing.assert_array_equal(w.grad.to_host(), before)
