"""The fused detection loss on the NumPy backend, and its float64 reference.

The NumPy "kernels" mirror the OpenCL plan: ``partials`` evaluates the terms in float32 (as the
kernels do) over blocks of ``block_size()`` elements that fit one core's share of the cache, writing into
per-thread scratch buffers (``out=``), and sums each block in float64; ``reduce`` adds the block
sums in block order and rounds to float32; ``backward`` evaluates the gradient in float32, block
by block. Blocks run on ``netcl.core.host_pool``'s threads; each writes only its own slice or
block sum, and the sums are combined in a fixed order, so results are bit-identical for any
thread count. ``terms``/``grad_terms``/``detection_loss_reference`` are the float64 reference.

Branch-free forms (NumPy's ``where`` is slow on random masks; see benchmarks/RESULTS.md, "Measurements
moved out of source docstrings", detection_loss_numpy.py):
``smooth_l1(d) = 0.5 m^2 / beta + (|d| - m)`` with ``m = min(|d|, beta)``, and its gradient
``clip(d / beta, -1, 1)``; both equal the two-sided definitions (beta == 0: ``|d|`` and ``sign(d)``).
"""

from __future__ import annotations

import threading

import numpy as np

from netcl.autograd.losses import np_bce_logits as bce_logits
from netcl.autograd.losses import np_sigmoid as sigmoid
from netcl.autograd.losses import np_smooth_l1 as smooth_l1
from netcl.autograd.losses import np_smooth_l1_grad as smooth_l1_grad
from netcl.core.host_pool import block_elements, run_blocks
from netcl.jit.numpy_helpers import SIGMOID_OUT

#: Elements per block of the float64 reference (bounds its temporaries to a few MiB).
BLOCK = 1 << 18
_F = np.float32
#: float32 arrays live at once in a block: 4 inputs, 4 scratch (plus constants)
_LIVE = 8
_scratch = threading.local()


def block_size() -> int:
    """Elements per block of the fused NumPy kernels (``host_pool.block_elements``)."""
    return block_elements(_LIVE)


def _buffers(block: int, beta: float) -> list[np.ndarray]:
    """This thread's scratch: 4 work arrays, then arrays of 0, beta, 1 and -1 (NumPy's min/max
    have SIMD loops for two arrays, not for an array and a scalar)."""
    cached = getattr(_scratch, "buffers", None)
    if cached is None or cached[0].size != block:
        cached = [np.empty(block, _F) for _ in range(4)]
        cached += [np.full(block, value, _F) for value in (0.0, np.nan, 1.0, -1.0)]
        _scratch.buffers = cached
    if cached[5][0] != _F(beta):
        cached[5].fill(_F(beta))
    return cached


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
    """float64 sums of consecutive ``block_size()``-element blocks (at least one block)."""
    x, t, hw, rw = (np.ravel(a) for a in (x, t, hw, rw))
    n = x.size
    block = block_size()
    out = np.zeros(max(1, -(-n // block)), dtype=np.float64)
    hs64, rs64 = np.float64(hs), np.float64(rs)

    def one_block(start: int, stop: int) -> None:
        m = stop - start
        s0, s1, s2, s3, zeros, betas, _, _ = (b[:m] for b in _buffers(block, beta))
        xb, tb = x[start:stop], t[start:stop]
        # BCE_LOGITS = (max(x, 0) - x t) + log1p(exp(-|x|)), in the preamble's order
        np.absolute(xb, out=s0)
        np.negative(s0, out=s0)
        np.exp(s0, out=s0)
        _log1p_unit(s0, s1, s2)
        np.maximum(xb, zeros, out=s1)
        np.multiply(xb, tb, out=s2)
        np.subtract(s1, s2, out=s1)
        np.add(s1, s0, out=s1)
        np.multiply(s1, hw[start:stop], out=s1)
        heat = np.sum(s1, dtype=np.float64)
        _smooth_l1(xb, tb, beta, s0, s2, s3, betas)
        np.multiply(s0, rw[start:stop], out=s0)
        out[start // block] = hs64 * heat + rs64 * np.sum(s0, dtype=np.float64)

    run_blocks(n, block, one_block)
    return out


def _log1p_unit(e, u, d) -> None:
    """``e = log1p(e)`` in place for e in [0, 1], as ``log(u) - ((u - 1) - e) / u`` with ``u = 1 + e``.

    NumPy's float32 ``log1p`` has no SIMD loop (``log`` has one; see benchmarks/RESULTS.md, "Measurements
    moved out of source docstrings", detection_loss_numpy.py).
    ``u - 1`` is exact, so the second term corrects the rounding of ``u`` to first order (the
    error left is below (e eps)^2); for e < eps/2, u == 1 and the result is e itself.
    """
    np.add(e, _F(1), out=u)
    np.subtract(u, _F(1), out=d)
    np.subtract(d, e, out=d)
    np.divide(d, u, out=d)
    np.log(u, out=e)
    np.subtract(e, d, out=e)


def _smooth_l1(xb, tb, beta: float, out, a, m, betas) -> None:
    """SMOOTH_L1(x - t, beta) into ``out`` (``a``, ``m`` scratch)."""
    np.subtract(xb, tb, out=out)
    np.absolute(out, out=a)
    if beta == 0.0:
        np.copyto(out, a)
        return
    np.minimum(a, betas, out=m)
    np.subtract(a, m, out=a)
    np.multiply(m, m, out=out)
    np.multiply(out, _F(0.5) / _F(beta), out=out)
    np.add(out, a, out=out)


def reduce(block_sums: np.ndarray) -> np.ndarray:
    """The 0-d float32 loss from the block sums (added in block order)."""
    return np.asarray(np.sum(block_sums, dtype=np.float64), dtype=np.float32)


def backward(g, x, t, hw, rw, hs: float, rs: float, beta: float) -> np.ndarray:
    """float32 ``g * d loss / d pred`` (``g`` the 0-d upstream gradient), blockwise in float32."""
    scale = _F(np.asarray(g, dtype=np.float32).reshape(()))
    out = np.empty(np.shape(x), dtype=np.float32)
    flat, xs, ts, hws, rws = (np.ravel(a) for a in (out, x, t, hw, rw))
    block = block_size()
    hs32, rs32 = _F(hs), _F(rs)

    def one_block(start: int, stop: int) -> None:
        m = stop - start
        s0, s1, _, _, _, _, ones, minus_ones = (b[:m] for b in _buffers(block, beta))
        xb, tb = xs[start:stop], ts[start:stop]
        # heat part: hs * hw * (sigmoid(x) - t)
        SIGMOID_OUT(xb, s0, s1)
        np.subtract(s0, tb, out=s0)
        np.multiply(s0, hws[start:stop], out=s0)
        np.multiply(s0, hs32, out=s0)
        # reg part: rs * rw * SMOOTH_L1_GRAD(x - t)
        np.subtract(xb, tb, out=s1)
        if beta == 0.0:
            np.sign(s1, out=s1)
        else:
            np.divide(s1, _F(beta), out=s1)
            np.minimum(s1, ones, out=s1)
            np.maximum(s1, minus_ones, out=s1)
        np.multiply(s1, rws[start:stop], out=s1)
        np.multiply(s1, rs32, out=s1)
        np.add(s0, s1, out=s0)
        np.multiply(s0, scale, out=flat[start:stop])

    run_blocks(flat.size, block, one_block)
    return out
