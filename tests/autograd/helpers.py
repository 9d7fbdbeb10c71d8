"""``check_op``: one-line op tests against float64 NumPy (tinygrad's ``helper_test_op`` style).

The forward is compared with ``reference_fn`` evaluated in float64 on the same (float32-rounded)
inputs; the gradients of ``sum(w * out)`` for a random ``w`` are compared with central finite
differences of the float64 reference (eps 1e-6: truncation ~1e-12, rounding ~1e-10, so the
reference gradient is exact to far below the float32 tolerances), and ``ag.gradcheck`` is run on
the netcl function itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.runtime.graph import Graph


def numeric_grad(
    fn: Callable[..., Any], arrays: list[np.ndarray], index: int, w: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """d sum(w * fn(*arrays)) / d arrays[index] by central differences in float64."""
    base = arrays[index]
    grad = np.zeros(base.shape, dtype=np.float64)
    flat = grad.reshape(-1)
    for j in range(base.size):
        total = []
        for step in (eps, -eps):
            moved = base.copy().reshape(-1)
            moved[j] += step
            args = list(arrays)
            args[index] = moved.reshape(base.shape)
            total.append(np.sum(w * np.asarray(fn(*args), dtype=np.float64)))
        flat[j] = (total[0] - total[1]) / (2 * eps)
    return grad


def check_op(
    shapes: Sequence[tuple[int, ...]],
    reference_fn: Callable[..., Any],
    netcl_fn: Callable[..., ag.Node],
    atol: float = 1e-5,
    rtol: float = 1e-5,
    grad_atol: float = 1e-4,
    *,
    device: nc.Device,
    grad_rtol: float = 1e-3,
    low: float = -2.0,
    high: float = 2.0,
    vals: Sequence[Any] | None = None,
    requires_grad: Sequence[bool] | None = None,
    gradcheck: bool = True,
    seed: int = 0,
) -> None:
    """Check forward and gradients of ``netcl_fn`` against ``reference_fn`` on ``device``.

    Inputs are uniform in ``[low, high)`` with the given ``shapes`` unless ``vals`` gives an
    array for that position; ``requires_grad`` picks the inputs whose gradients are checked
    (default: all).
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for k, shape in enumerate(shapes):
        given = None if vals is None else vals[k]
        data = rng.uniform(low, high, size=shape) if given is None else np.asarray(given, dtype=np.float64)
        arrays.append(data.astype(np.float32).astype(np.float64))
    wants = [True] * len(arrays) if requires_grad is None else list(requires_grad)
    nodes = [
        ag.tensor(a.astype(np.float32), requires_grad=r, device=device) for a, r in zip(arrays, wants, strict=True)
    ]

    with ag.Tape() as tape:
        out = netcl_fn(*nodes)
    expected = np.asarray(reference_fn(*arrays), dtype=np.float64)
    assert out.shape == expected.shape, f"shape {out.shape} != reference {expected.shape}"
    np.testing.assert_allclose(out.to_host(), expected, atol=atol, rtol=rtol, err_msg="forward")
    if not any(wants):
        return

    w = rng.standard_normal(expected.shape)
    tape.backward(out, grad=w.astype(np.float32))
    for k, node in enumerate(nodes):
        if not wants[k]:
            continue
        ref = numeric_grad(reference_fn, arrays, k, w)
        assert node.grad is not None, f"input {k} got no gradient"
        assert node.grad.shape == node.shape
        np.testing.assert_allclose(node.grad.to_host(), ref, atol=grad_atol, rtol=grad_rtol, err_msg=f"grad {k}")
        assert node.value.grad is node.grad

    if gradcheck:
        fresh = [
            ag.tensor(a.astype(np.float32), requires_grad=r, device=device) for a, r in zip(arrays, wants, strict=True)
        ]
        assert ag.gradcheck(netcl_fn, *fresh)


def raises_before_launch(device: nc.Device, error: type[BaseException], match: str, fn: Callable[[], Any]) -> None:
    """``fn()`` raises ``error`` matching ``match`` and, on OpenCL, launches no kernel first (it runs
    inside a ``Graph`` capture, which must record nothing)."""
    if device.kind != "opencl":
        with pytest.raises(error, match=match):
            fn()
        return
    graph = Graph()
    with pytest.raises(error, match=match), graph.capture(device.queue):
        fn()
    assert len(graph) == 0, f"{len(graph)} kernel(s) launched before the error"
