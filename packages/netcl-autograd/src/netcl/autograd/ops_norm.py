"""Differentiable normalizations: ``layer_norm``, ``rms_norm`` and ``batch_norm``.

``layer_norm`` / ``rms_norm`` run one row-wise kernel forward (saving mean and 1/std per row) and
one backward kernel for the input gradient; the weight and bias gradients are column sums of
``grad * x_hat`` and ``grad`` through the runtime's reductions. ``batch_norm`` runs one channel
kernel each way (statistics, normalization and the running-statistics update in the forward; dx,
dweight and dbias in the backward); ``batch_norm_relu`` is the same op with a ReLU (after an optional
residual add) applied in the normalize pass and its mask in the backward kernel. Float16 inputs are
computed in float32 (the kernels cast on load), and results keep the input's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op
from netcl.autograd.ops import add, mul, reshape
from netcl.autograd.ops_softmax import value_of
from netcl.autograd.row_hook import provided
from netcl.core import ShapeError, Tensor
from netcl.runtime.ops import batchnorm, layout, rowwise

Operand = Any  # Node | Tensor
_Grads = list[Tensor | None]


def _needs(x: Any) -> bool:
    return isinstance(x, Node) and x.requires_grad


def _as_dtype(t: Tensor, dtype: np.dtype) -> Tensor:
    return t if t.dtype == dtype else layout.cast(t, dtype)


def _row_norm(
    x: Operand, weight: Operand | None, bias: Operand | None, axes: tuple[int, ...], eps: float, mode: int, name: str
) -> Node:
    saved: dict[str, Any] = {}
    shape = tuple(x.shape[axes[0] :])

    def forward(v: Tensor, *params: Tensor) -> Tensor:
        w = params[0] if weight is not None else None
        b = params[-1] if bias is not None else None
        out, mean, rstd = rowwise.norm_forward(v, axes, w, b, eps, mode)
        saved.update(out=out, mean=mean, rstd=rstd)
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        v = values[0]
        w = values[1] if weight is not None else None
        if saved.get("out") is out:
            mean, rstd = saved["mean"], saved["rstd"]
        else:
            _, mean, rstd = rowwise.norm_forward(v, axes, w, None, eps, mode)
        grads: _Grads = [rowwise.norm_backward(g, v, w, mean, rstd, axes, mode) if _needs(x) else None]
        want_w, want_b = weight is not None and _needs(weight), bias is not None and _needs(bias)
        gw, gb = rowwise.norm_param_grads(g, v, mean, rstd, axes, want_w, want_b) if want_w or want_b else (None, None)
        if weight is not None:
            grads.append(None if gw is None else _as_dtype(gw, w.dtype).reshape(shape))
        if bias is not None:
            grads.append(None if gb is None else _as_dtype(gb, v.dtype).reshape(shape))
        return grads

    args = [x] + [p for p in (weight, bias) if p is not None]
    attrs = {"normalized_shape": shape, "eps": eps, "has_weight": weight is not None, "has_bias": bias is not None}
    return apply_op(forward, grad, *args, op_name=name, attrs=attrs)


def layer_norm(
    x: Operand,
    normalized_shape: int | tuple[int, ...],
    weight: Operand | None = None,
    bias: Operand | None = None,
    eps: float = 1e-5,
) -> Node:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape`` dims (biased var)."""
    v = value_of(x, "layer_norm")
    axes = rowwise.norm_axes(v, normalized_shape, "layer_norm")
    shape = tuple(v.shape[axes[0] :])
    rowwise.check_affine(
        None if weight is None else value_of(weight, "layer_norm", "weight"), shape, v, "layer_norm", "weight"
    )
    rowwise.check_affine(None if bias is None else value_of(bias, "layer_norm", "bias"), shape, v, "layer_norm", "bias")
    fused = provided("layer_norm", (x, weight, bias), {"normalized_shape": shape, "eps": float(eps)})
    if fused is not None:
        return fused
    return _row_norm(x, weight, bias, axes, float(eps), rowwise.LAYER, "layer_norm")


def group_norm(
    x: Operand, num_groups: int, weight: Operand | None = None, bias: Operand | None = None, eps: float = 1e-5
) -> Node:
    """torch's ``group_norm``: x (N, C, *) normalized over each group of C / num_groups channels and the
    trailing dims (biased variance), then ``weight`` and ``bias`` (C,) per channel. The row normalization
    of ``layer_norm`` on x viewed as (N, num_groups, rest), then the affine in one elementwise pass each."""
    v = value_of(x, "group_norm")
    if len(v.shape) < 2:
        raise ShapeError(f"group_norm: x must be (N, C, *), got shape {tuple(v.shape)}")
    channels = v.shape[1]
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups < 1:
        raise ValueError(f"group_norm: num_groups must be a positive int, got {num_groups!r}")
    if channels % num_groups:
        raise ValueError(f"group_norm: num_channels ({channels}) must be divisible by num_groups ({num_groups})")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(value_of(t, "group_norm", name).shape) != (channels,):
            raise ShapeError(f"group_norm: {name} must have shape ({channels},), got {tuple(t.shape)}")
    n, rest = v.shape[0], channels // int(num_groups) * math.prod(v.shape[2:])
    grouped = reshape(x, (n, int(num_groups), rest))
    out = reshape(layer_norm(grouped, grouped.shape[-1], None, None, eps), tuple(v.shape))
    per_channel = (channels,) + (1,) * (len(v.shape) - 2)
    if weight is not None:
        out = mul(out, reshape(weight, per_channel))
    if bias is not None:
        out = add(out, reshape(bias, per_channel))
    return out


def rms_norm(
    x: Operand, normalized_shape: int | tuple[int, ...], weight: Operand | None = None, eps: float | None = None
) -> Node:
    """x / sqrt(mean(x ** 2) + eps) * weight over the trailing dims; ``eps`` None: the dtype's epsilon."""
    v = value_of(x, "rms_norm")
    axes = rowwise.norm_axes(v, normalized_shape, "rms_norm")
    shape = tuple(v.shape[axes[0] :])
    rowwise.check_affine(
        None if weight is None else value_of(weight, "rms_norm", "weight"), shape, v, "rms_norm", "weight"
    )
    eps = float(np.finfo(v.dtype).eps) if eps is None else float(eps)
    fused = provided("rms_norm", (x, weight, None), {"normalized_shape": shape, "eps": eps})
    if fused is not None:
        return fused
    return _row_norm(x, weight, None, axes, eps, rowwise.RMS, "rms_norm")


def _check_channel(t: Any, channels: int, arg: str) -> Tensor | None:
    if t is None:
        return None
    v = value_of(t, "batch_norm", arg)
    if tuple(v.shape) != (channels,):
        raise ShapeError(f"batch_norm: {arg} must have shape ({channels},) (the channels of x), got {tuple(v.shape)}")
    return v


def batch_norm(
    x: Operand,
    running_mean: Tensor | Node | None,
    running_var: Tensor | Node | None,
    weight: Operand | None = None,
    bias: Operand | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    *,
    num_batches_tracked: Tensor | None = None,
) -> Node:
    """Batch normalization of x (N, C) or (N, C, *) per channel C (PyTorch's ``F.batch_norm``).

    Training normalizes with the batch mean and biased variance and, when given, updates
    ``running_mean`` / ``running_var`` IN PLACE: ``r = (1 - momentum) * r + momentum * stat`` with
    the unbiased variance. Evaluation uses the running statistics (required then).
    ``num_batches_tracked`` (netcl's addition: an int64 tensor of shape (), a BatchNorm module's
    counter) is incremented in place by each training call, inside the forward kernel.
    """
    momentum, eps = _check(x, running_mean, running_var, weight, bias, training, momentum, eps)
    needs = (_needs(x), _needs(weight), _needs(bias), False)
    forward, grad = batch_norm_rules(training, momentum, eps, False, needs)
    attrs = {"training": training, "momentum": momentum, "eps": eps}
    operands = (x, weight, bias, running_mean, running_var, num_batches_tracked)
    return apply_op(forward, grad, *operands, op_name="batch_norm", attrs=attrs)


def batch_norm_relu(
    x: Operand,
    running_mean: Tensor | Node | None,
    running_var: Tensor | Node | None,
    weight: Operand | None = None,
    bias: Operand | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    *,
    residual: Operand | None = None,
    num_batches_tracked: Tensor | None = None,
) -> Node:
    """``relu(batch_norm(x, ...))``, or ``relu(batch_norm(x, ...) + residual)`` (a ResNet basic block's tail), as
    one op: the batch norm's normalize pass applies the add and the ReLU and stores the result once; the
    backward applies the ReLU's mask (the saved output's sign) inside the batch norm's backward kernel and
    hands ``residual`` its gradient (the masked upstream gradient) from the same kernel.

    Arguments as ``batch_norm``'s; ``residual`` has x's shape and dtype (no broadcasting). Bit for bit the
    composition ``relu(batch_norm(...) [+ residual])``, forward and backward (the add and the ReLU are exact).
    ``jit_compile`` (and so ``fuse_graph``) rewrites that composition into this op where the intermediate
    values have no other use.
    """
    momentum, eps = _check(x, running_mean, running_var, weight, bias, training, momentum, eps)
    if residual is not None:
        v, r = value_of(x, "batch_norm_relu"), value_of(residual, "batch_norm_relu", "residual")
        if tuple(r.shape) != tuple(v.shape) or r.dtype != v.dtype:
            raise ShapeError(
                f"batch_norm_relu: residual must have x's shape {tuple(v.shape)} and dtype {v.dtype} "
                f"(no broadcasting), got shape {tuple(r.shape)} and dtype {r.dtype}"
            )
    needs = (_needs(x), _needs(weight), _needs(bias), _needs(residual))
    forward, grad = batch_norm_rules(training, momentum, eps, True, needs)
    attrs = {"training": training, "momentum": momentum, "eps": eps, "residual": residual is not None}
    operands = (x, weight, bias, running_mean, running_var, num_batches_tracked, residual)
    return apply_op(forward, grad, *operands, op_name="batch_norm_relu", attrs=attrs)


def _check(
    x: Operand, running_mean: Any, running_var: Any, weight: Any, bias: Any, training: bool, momentum: Any, eps: Any
) -> tuple[float, float]:
    """Validate a batch norm call before any launch; returns (momentum, eps) as floats."""
    v = value_of(x, "batch_norm")
    if v.ndim < 2:
        raise ShapeError(f"batch_norm: x must be (N, C) or (N, C, *), got shape {v.shape}")
    if v.dtype.kind != "f":
        raise TypeError(f"batch_norm: x must be a floating-point tensor, got dtype {v.dtype}")
    channels = v.shape[1]
    rm = _check_channel(running_mean, channels, "running_mean")
    rv = _check_channel(running_var, channels, "running_var")
    _check_channel(weight, channels, "weight")
    _check_channel(bias, channels, "bias")
    if (rm is None) != (rv is None):
        raise ValueError("batch_norm: running_mean and running_var must both be given or both be None")
    if not training and rm is None:
        raise ValueError("batch_norm: running_mean and running_var are required when training=False")
    axes = (0, *range(2, v.ndim))
    count = math.prod(v.shape[a] for a in axes)
    if training and count <= 1:
        raise ValueError(f"batch_norm: expected more than 1 value per channel when training, got x of shape {v.shape}")
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
        raise TypeError(f"batch_norm: momentum must be a number, got {momentum!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"batch_norm: eps must be a number > 0, got {eps!r}")
    return float(momentum), float(eps)


def batch_norm_rules(
    training: bool, momentum: float, eps: float, relu: bool, needs: tuple[bool, bool, bool, bool]
) -> tuple[Any, Any]:
    """(forward, grad) of ``batch_norm`` (``relu`` False: operands x, weight, bias, running_mean, running_var,
    num_batches_tracked) or ``batch_norm_relu`` (those and the residual, None for none), for ``apply_op``.
    ``needs``: whether x, weight, bias and the residual want gradients. A tracer that rewrites a traced
    composition into ``batch_norm_relu`` builds its rules here."""
    saved: dict[str, Any] = {}

    # One channel kernel each way (netcl.runtime.ops.batchnorm). The running statistics are arguments
    # (no gradient) updated IN PLACE by the forward kernel, so a jitted function or a captured step
    # (which replays the op, not this Python code around it) updates each call's tensors.
    def forward(
        xv: Tensor, w: Tensor | None, b: Tensor | None, rmv: Tensor | None, rvv: Tensor | None, nbt: Tensor | None,
        r: Tensor | None = None, moments: list | None = None,
    ) -> Tensor:  # fmt: skip
        """``moments``: the list a convolution refills with its output's moments (``netcl.jit.conv_moments``):
        merged for the batch statistics where they are xv's."""
        gathered = moments[0] if moments else None
        y, mean, rstd = batchnorm.batch_norm_forward(
            xv, rmv, rvv, w, b, training, momentum, eps, nbt, relu=relu, residual=r, moments=gathered
        )
        saved.update(out=y, mean=mean, rstd=rstd)
        return y

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        xv, w, b, rmv, rvv = values[:5]
        if saved.get("out") is out:
            mean, rstd = saved["mean"], saved["rstd"]
        else:  # re-derive without touching the running statistics
            stats = (None, None) if training else (rmv, rvv)
            _, mean, rstd = batchnorm.batch_norm_forward(xv, *stats, None, None, training, momentum, eps)
        g = _as_dtype(g, xv.dtype)
        if not relu:
            gx, gw, gb = batchnorm.batch_norm_backward(g, xv, mean, rstd, w, training, (needs[0], *needs[1:3]))
            return [gx, gw, None if gb is None else _as_dtype(gb, b.dtype), None, None, None]
        flags = (needs[0], needs[1] and w is not None, needs[2] and b is not None, needs[3] and values[6] is not None)
        gx, gw, gb, gr = batchnorm.batch_norm_relu_backward(g, out, xv, mean, rstd, w, training, flags)
        return [gx, gw, None if gb is None else _as_dtype(gb, b.dtype), None, None, None, gr]

    return forward, grad


__all__ = ["batch_norm", "batch_norm_relu", "batch_norm_rules", "group_norm", "layer_norm", "rms_norm"]
