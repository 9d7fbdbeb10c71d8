"""The fused detection loss on the NumPy backend, and its float64 reference.

The NumPy "kernels" mirror the OpenCL plan's structure: ``partials`` sums fixed blocks of
``BLOCK`` elements in float64, ``reduce`` adds the block sums in order and rounds to float32,
``backward`` evaluates the gradient in float64 and rounds to float32. Fixed blocks keep the
temporaries small and the result deterministic.
"""

from __future__ import annotations

import numpy as np

from netcl.autograd.losses import np_bce_logits as bce_logits
from netcl.autograd.losses import np_sigmoid as sigmoid
from netcl.autograd.losses import np_smooth_l1 as smooth_l1
from netcl.autograd.losses import np_smooth_l1_grad as smooth_l1_grad

#: Elements per block of the NumPy partial sums (bounds the float64 temporaries to a few MiB).
BLOCK = 1 << 18


def terms(x, t, hw, rw, hs: float, rs: float, beta: float) -> np.ndarray:
    """The per-element loss terms in float64."""
    x, t, hw, rw = (np.asarray(a, dtype=np.float64) for a in (x, t, hw, rw))
    return hs * hw * bce_logits(x, t) + rs * rw * smooth_l1(x - t, beta)


def grad_terms(x, t, hw, rw, hs: float, rs: float, beta: float) -> np.ndarray:
    """d loss / d pred per element, in float64, for an upstream gradient of 1."""
    x, t, hw, rw = (np.asarray(a, dtype=np.float64) for a in (x, t, hw, rw))
    return hs * hw * (sigmoid(x) - t) + rs * rw * smooth_l1_grad(x - t, beta)


def detection_loss_reference(pred, target, heat_weight, reg_weight, heat_scale=1.0, reg_scale=1.0, beta=0.05):
    """float64 loss and gradient w.r.t. pred of ``detection_loss`` (docs/architecture.md), upstream gradient 1."""
    args = (float(heat_scale), float(reg_scale), float(beta))
    loss = float(np.sum(partials(pred, target, heat_weight, reg_weight, *args), dtype=np.float64))
    grad = np.empty(np.shape(pred), dtype=np.float64)
    flat, xs, ts, hws, rws = (np.ravel(a) for a in (grad, pred, target, heat_weight, reg_weight))
    for start in range(0, flat.size, BLOCK):
        s = slice(start, start + BLOCK)
        flat[s] = grad_terms(xs[s], ts[s], hws[s], rws[s], *args)
    return loss, grad


def partials(x, t, hw, rw, hs: float, rs: float, beta: float) -> np.ndarray:
    """float64 sums of consecutive ``BLOCK``-element blocks (at least one block)."""
    x, t, hw, rw = (np.ravel(a) for a in (x, t, hw, rw))
    n = x.size
    out = np.zeros(max(1, -(-n // BLOCK)), dtype=np.float64)
    for b, start in enumerate(range(0, n, BLOCK)):
        s = slice(start, start + BLOCK)
        out[b] = np.sum(terms(x[s], t[s], hw[s], rw[s], hs, rs, beta), dtype=np.float64)
    return out


def reduce(block_sums: np.ndarray) -> np.ndarray:
    """The 0-d float32 loss from the block sums."""
    return np.asarray(np.sum(block_sums, dtype=np.float64), dtype=np.float32)


def backward(g, x, t, hw, rw, hs: float, rs: float, beta: float) -> np.ndarray:
    """float32 ``g * d loss / d pred`` (``g`` the 0-d upstream gradient), blockwise in float64."""
    scale = float(np.asarray(g, dtype=np.float64).reshape(()))
    out = np.empty(np.shape(x), dtype=np.float32)
    flat, xs, ts, hws, rws = (np.ravel(a) for a in (out, x, t, hw, rw))
    for start in range(0, flat.size, BLOCK):
        s = slice(start, start + BLOCK)
        flat[s] = scale * grad_terms(xs[s], ts[s], hws[s], rws[s], hs, rs, beta)
    return out
