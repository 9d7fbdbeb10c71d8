"""``gradcheck``: compare tape gradients with central finite differences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, Tape, untracked
from netcl.core import Tensor


class GradcheckError(AssertionError):
    """Analytical and numerical gradients disagree."""


def gradcheck(
    fn: Callable[..., Node],
    *inputs: Any,
    eps: float = 1e-3,
    atol: float = 1e-3,
    rtol: float = 1e-2,
    seed: int = 0,
) -> bool:
    """Check the gradients of ``fn`` with respect to every input Node that requires grad.

    ``fn(*inputs)`` returns a Node of any shape; it is reduced to ``L = sum(w * out)`` with a fixed
    random ``w`` so every output element counts. The analytical gradient of ``L`` comes from
    ``Tape.backward(out, grad=w)``; the numerical one is ``(L(x + eps) - L(x - eps)) / (x+eps - x-eps)``
    per element, with ``fn`` evaluated on the inputs' own device in their own dtype (float32) and
    ``L`` summed in float64 on the host. Dividing by the perturbation actually representable in
    float32 removes the rounding of ``x +- eps``; what remains is float32 rounding of the outputs,
    about ``1e-7 * |L| / eps``, hence the defaults ``eps=1e-3``, ``atol=1e-3``, ``rtol=1e-2``.
    Keep points away from kinks (relu at 0, abs at 0) by more than ``eps``.
    Inputs' ``grad`` attributes are left as they were. Returns True or raises ``GradcheckError``.
    """
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Node) and x.requires_grad]
    if not checked:
        raise ValueError("gradcheck needs at least one input Node with requires_grad=True")
    saved = [(inputs[i].grad, inputs[i]._grad_owned, inputs[i].value.grad) for i in checked]
    try:
        for i in checked:
            inputs[i].grad = None
        with Tape() as tape:
            out = fn(*inputs)
        if not isinstance(out, Node) or not out.requires_grad:
            raise GradcheckError("fn did not return a Node that depends on the inputs that require grad")
        w = np.random.default_rng(seed).standard_normal(out.shape).astype(out.dtype)
        tape.backward(out, grad=Tensor.from_host(out.device, w))
        analytic = [inputs[i].grad.to_host() if inputs[i].grad is not None else None for i in checked]
    finally:
        for i, (grad, owned, value_grad) in zip(checked, saved, strict=True):
            inputs[i].grad, inputs[i]._grad_owned, inputs[i].value.grad = grad, owned, value_grad
    detached = [untracked(x.value, "tensor") if isinstance(x, Node) else x for x in inputs]
    weights = w.astype(np.float64)
    for k, i in enumerate(checked):
        numeric = _numerical_grad(fn, detached, i, weights, eps)
        got = analytic[k] if analytic[k] is not None else np.zeros_like(numeric)
        bad = ~np.isclose(got.astype(np.float64), numeric, atol=atol, rtol=rtol)
        if bad.any():
            where = np.unravel_index(int(np.argmax(bad)), numeric.shape) if numeric.shape else ()
            raise GradcheckError(
                f"gradient of input {i} (shape {numeric.shape}) disagrees in {int(bad.sum())} element(s); "
                f"first at {tuple(int(j) for j in where)}: analytical {float(got[where])}, "
                f"numerical {float(numeric[where])} (atol={atol}, rtol={rtol})"
            )
    return True


def _numerical_grad(
    fn: Callable[..., Node], inputs: list[Any], index: int, weights: np.ndarray, eps: float
) -> np.ndarray:
    x = inputs[index]
    base = x.to_host()
    flat = base.reshape(-1)

    def loss_at(j: int, step: float) -> tuple[float, float]:
        moved = flat.copy()
        moved[j] = flat[j] + step
        args = list(inputs)
        args[index] = untracked(Tensor.from_host(x.device, moved.reshape(base.shape), x.dtype), "tensor")
        return float(moved[j]), float(np.sum(weights * fn(*args).to_host().astype(np.float64)))

    grad = np.zeros(flat.shape, dtype=np.float64)
    for j in range(flat.size):
        x_plus, l_plus = loss_at(j, eps)
        x_minus, l_minus = loss_at(j, -eps)
        grad[j] = (l_plus - l_minus) / (x_plus - x_minus)
    return grad.reshape(base.shape)
