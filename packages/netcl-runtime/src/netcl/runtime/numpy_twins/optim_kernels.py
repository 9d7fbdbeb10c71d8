"""NumPy twins of ``netcl.runtime.ops.optim_kernels`` (arguments already checked there): the kernels'
formulas in float32 (float64 for float64 parameters); nothing changes where the ``skip`` flag is up. Non-finite
values come out as IEEE arithmetic gives them, silently, as in the kernels (an update a snapshot optimizer
discards may run on an overflowed gradient)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import float_compute_type


def _ieee(update: Callable[..., Any]) -> Callable[..., Any]:
    """``update`` with NumPy's floating-point warnings off: a new ``np.errstate`` each call (before NumPy 2 one
    instance used as a decorator keeps its saved state on itself, which two threads would share)."""

    @functools.wraps(update)
    def silent(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return update(*args, **kwargs)

    return silent


def _skipped(skip: Tensor) -> bool:
    """Whether the flag is up."""
    return bool(np.asarray(skip.data).reshape(-1)[0])


def _sgd(param: Tensor, grad: Tensor, buf: Tensor | None, step: int, hyper: np.ndarray) -> None:
    compute = float_compute_type(param.dtype)
    lr, momentum, dampening, wd, nesterov = (compute(h) for h in hyper.astype(np.float32))
    w = np.asarray(param.data, compute)
    d = np.asarray(grad.data, compute)
    if wd != 0:
        d = d + wd * w
    if buf is not None and momentum != 0:
        b = d if step == 0 else momentum * np.asarray(buf.data, compute) + (1 - dampening) * d
        buf.data[...] = b.astype(buf.dtype)
        d = d + momentum * b if nesterov != 0 else b
    param.data[...] = (w - lr * d).astype(param.dtype)


def _adam(
    param: Tensor, grad: Tensor, m: Tensor, v: Tensor, t: int, hyper: np.ndarray, decoupled: bool, vmax: Tensor | None
) -> None:
    compute = float_compute_type(param.dtype)
    lr, beta1, beta2, eps, wd = (compute(h) for h in hyper.astype(np.float32))
    w = np.asarray(param.data, compute)
    d = np.asarray(grad.data, compute)
    if decoupled:
        w = w * (1 - lr * wd)
    elif wd != 0:
        d = d + wd * w
    m1 = beta1 * np.asarray(m.data, compute) + (1 - beta1) * d
    v1 = beta2 * np.asarray(v.data, compute) + (1 - beta2) * d * d
    m.data[...] = m1.astype(m.dtype)
    v.data[...] = v1.astype(v.dtype)
    bc1 = 1 - np.power(beta1, compute(t))
    bc2 = 1 - np.power(beta2, compute(t))
    if vmax is not None:  # amsgrad: the largest second moment so far
        v1 = np.maximum(np.asarray(vmax.data, compute), v1)
        vmax.data[...] = v1.astype(vmax.dtype)
    denom = np.sqrt(v1) / np.sqrt(bc2) + eps
    param.data[...] = (w - (lr / bc1) * m1 / denom).astype(param.dtype)


@_ieee
def sgd_update(
    param: Tensor, grad: Tensor, momentum_buffer: Tensor | None, steps: Tensor, index: int, hyper: Tensor, skip: Tensor
) -> Tensor:
    if _skipped(skip):
        return param
    _sgd(param, grad, momentum_buffer, int(steps.data[index]), np.asarray(hyper.data, np.float64))
    return param


@_ieee
def adam_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    steps: Tensor,
    index: int,
    hyper: Tensor,
    decoupled_weight_decay: bool,
    skip: Tensor,
    max_exp_avg_sq: Tensor | None = None,
) -> Tensor:
    if _skipped(skip):
        return param
    step = int(steps.data[index]) + 1
    _adam(param, grad, exp_avg, exp_avg_sq, step, np.asarray(hyper.data), decoupled_weight_decay, max_exp_avg_sq)
    return param


@_ieee
def sgd_multi_update(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffers: list[Tensor | None],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    skip: Tensor,
) -> list[Tensor]:
    if _skipped(skip):
        return params
    for p, g, b, i in zip(params, grads, momentum_buffers, indices, strict=True):
        _sgd(p, g, b, int(steps.data[i]), np.asarray(hyper.data, np.float64))
    return params


@_ieee
def adam_multi_update(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    decoupled_weight_decay: bool,
    skip: Tensor,
    max_exp_avg_sqs: list[Tensor] | None = None,
) -> list[Tensor]:
    if _skipped(skip):
        return params
    maxima = max_exp_avg_sqs if max_exp_avg_sqs is not None else [None] * len(params)
    for p, g, m, v, x, i in zip(params, grads, exp_avgs, exp_avg_sqs, maxima, indices, strict=True):
        step = int(steps.data[i]) + 1
        _adam(p, g, m, v, step, np.asarray(hyper.data), decoupled_weight_decay, x)
    return params


@_ieee
def rmsprop_multi_update(
    params: list[Tensor],
    grads: list[Tensor],
    square_avgs: list[Tensor],
    grad_avgs: list[Tensor] | None,
    momentum_buffers: list[Tensor] | None,
    steps: Tensor,
    indices: list[int],
    hyper: Tensor,
    skip: Tensor,
) -> list[Tensor]:
    if _skipped(skip):
        return params
    for k, (param, grad, square) in enumerate(zip(params, grads, square_avgs, strict=True)):
        compute = float_compute_type(param.dtype)
        lr, alpha, eps, wd, momentum = (compute(h) for h in np.asarray(hyper.data).astype(np.float32))
        w, d = np.asarray(param.data, compute), np.asarray(grad.data, compute)
        if wd != 0:
            d = d + wd * w
        sq = alpha * np.asarray(square.data, compute) + (1 - alpha) * d * d
        square.data[...] = sq.astype(square.dtype)
        if grad_avgs is not None:
            ga = alpha * np.asarray(grad_avgs[k].data, compute) + (1 - alpha) * d
            grad_avgs[k].data[...] = ga.astype(param.dtype)
            avg = np.sqrt(sq - ga * ga) + eps
        else:
            avg = np.sqrt(sq) + eps
        if momentum_buffers is not None:
            b = momentum * np.asarray(momentum_buffers[k].data, compute) + d / avg
            momentum_buffers[k].data[...] = b.astype(param.dtype)
            param.data[...] = (w - lr * b).astype(param.dtype)
        else:
            param.data[...] = (w - lr * (d / avg)).astype(param.dtype)
    return params


@_ieee
def adagrad_multi_update(
    params: list[Tensor], grads: list[Tensor], sums: list[Tensor], steps: Tensor, indices: list[int], hyper: Tensor,
    skip: Tensor,
) -> list[Tensor]:  # fmt: skip
    if _skipped(skip):
        return params
    for param, grad, total, index in zip(params, grads, sums, indices, strict=True):
        compute = float_compute_type(param.dtype)
        lr, lr_decay, wd, eps = (compute(h) for h in np.asarray(hyper.data).astype(np.float32))
        t = compute(int(steps.data[index]) + 1)
        w, d = np.asarray(param.data, compute), np.asarray(grad.data, compute)
        if wd != 0:
            d = d + wd * w
        clr = lr / (1 + (t - 1) * lr_decay)
        acc = np.asarray(total.data, compute) + d * d
        total.data[...] = acc.astype(total.dtype)
        param.data[...] = (w - clr * (d / (np.sqrt(acc) + eps))).astype(param.dtype)
    return params


def count_masked(steps: Tensor, mask: Tensor, skip: Tensor) -> Tensor:
    if _skipped(skip):
        return steps
    steps.data[...] += (np.asarray(mask.data) != 0).astype(np.int32)
    return steps


def unscale_grad(grad: Tensor, inv_scale: float, found_inf: Tensor) -> Tensor:
    compute = float_compute_type(grad.dtype)
    with np.errstate(all="ignore"):
        values = np.asarray(grad.data, compute) * compute(np.float32(inv_scale))
    if not np.all(np.isfinite(values)):
        found_inf.data.reshape(-1)[0] = 1
    grad.data[...] = values.astype(grad.dtype)
    return grad
