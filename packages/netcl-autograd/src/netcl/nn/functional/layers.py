"""Convolution, pooling, normalization, embedding, dropout and padding in ``torch.nn.functional``'s names,
argument order and defaults; each calls the autograd op that defines it (``netcl.autograd``). torch arguments
netcl does not implement are refused by name when they ask for something other than the default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd import ops_shape
from netcl.autograd.engine import Node
from netcl.core import ShapeError, Tensor, get_device
from netcl.runtime.ops import layout
from netcl.runtime.ops._common import DEVICE_CONSTANTS, remember


def _refuse(op: str, name: str, value: Any, default: Any) -> None:
    if value != default:
        raise ValueError(f"{op}: {name}={value!r} is not supported by netcl (only the default {default!r})")


def conv2d(
    input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
) -> Node:
    """2-D cross-correlation: input (N, C, H, W), weight (O, C / groups, KH, KW); ``padding`` also "same" / "valid"."""
    return ag.conv2d(input, weight, bias, stride, padding, dilation, groups)


def conv_transpose2d(
    input: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> Node:
    """The transposed convolution: input (N, Cin, H, W), weight (Cin, Cout / groups, KH, KW)."""
    return ag.conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv1d(
    input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
) -> Node:
    """1-D cross-correlation: input (N, C, L), weight (O, C / groups, K); ``padding`` also "same" / "valid". Run as
    ``conv2d`` on a height of 1 (the same kernels; the result squeezed back to (N, O, L_out))."""
    _rank("conv1d", "input", input, 3, "(N, C, L)")
    _rank("conv1d", "weight", weight, 3, "(O, C / groups, K)")
    pad = padding if isinstance(padding, str) else (0, single(padding, "conv1d", "padding"))
    rows = (1, single(stride, "conv1d", "stride")), (1, single(dilation, "conv1d", "dilation"))
    out = ag.conv2d(ag.unsqueeze(input, 2), ag.unsqueeze(weight, 2), bias, rows[0], pad, rows[1], groups)
    return ag.squeeze(out, 2)


def max_pool1d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Node:
    """Max over windows of (N, C, L) input (``max_pool2d`` on a height of 1)."""
    _rank("max_pool1d", "input", input, 3, "(N, C, L)")
    window = (1, single(kernel_size, "max_pool1d", "kernel_size"))
    step = None if stride is None else (1, single(stride, "max_pool1d", "stride"))
    pad = (0, single(padding, "max_pool1d", "padding"))
    refuse_pool_options("max_pool1d", dilation, return_indices)
    return ag.squeeze(ag.max_pool2d(ag.unsqueeze(input, 2), window, step, pad, ceil_mode), 2)


def avg_pool1d(
    input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Node:  # fmt: skip
    """Mean over windows of (N, C, L) input with torch's divisors (``avg_pool2d`` on a height of 1)."""
    _rank("avg_pool1d", "input", input, 3, "(N, C, L)")
    window = (1, single(kernel_size, "avg_pool1d", "kernel_size"))
    step = None if stride is None else (1, single(stride, "avg_pool1d", "stride"))
    pad = (0, single(padding, "avg_pool1d", "padding"))
    return ag.squeeze(ag.avg_pool2d(ag.unsqueeze(input, 2), window, step, pad, ceil_mode, count_include_pad), 2)


def adaptive_avg_pool1d(input: Any, output_size: Any) -> Node:
    """Mean over torch's adaptive windows of (N, C, L) input giving length ``output_size``."""
    _rank("adaptive_avg_pool1d", "input", input, 3, "(N, C, L)")
    size = single(output_size, "adaptive_avg_pool1d", "output_size")
    return ag.squeeze(ag.adaptive_avg_pool2d(ag.unsqueeze(input, 2), (1, size)), 2)


def single(value: Any, op: str, name: str) -> int:
    """torch's 1-d size argument (an int or a one-element tuple or list) as an int, else a ValueError naming it."""
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{op}: {name} must be an int or a 1-tuple of ints, got {value!r}")
    return value


def _rank(op: str, arg: str, value: Any, ndim: int, layout: str) -> None:
    shape = tuple(getattr(value, "shape", ()))
    if len(shape) != ndim:
        raise ShapeError(f"{op}: {arg} must be {layout}, got shape {shape}")


def max_pool2d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Node:
    """Max over windows (stride defaults to kernel_size); ``dilation`` 1 and ``return_indices`` False only."""
    refuse_pool_options("max_pool2d", dilation, return_indices)
    return ag.max_pool2d(input, kernel_size, stride, padding, ceil_mode)


def refuse_pool_options(op: str, dilation: Any, return_indices: bool) -> None:
    """A ValueError naming ``op`` for a ``dilation`` other than 1 or ``return_indices=True`` (netcl's max pooling
    has neither); the functions and the modules check through this."""
    if dilation not in (1, (1,), (1, 1)):
        raise ValueError(f"{op}: netcl pools without dilation (1), got dilation={dilation!r}")
    if return_indices:
        raise ValueError(f"{op}: return_indices=True is not supported (netcl keeps no indices)")


def avg_pool2d(
    input: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Node:
    """Mean over windows with torch's divisors; without ``divisor_override``."""
    _refuse("avg_pool2d", "divisor_override", divisor_override, None)
    return ag.avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad)


def adaptive_avg_pool2d(input: Any, output_size: Any) -> Node:
    """Mean over torch's adaptive windows giving ``output_size`` (an int, a pair, None keeps a size)."""
    return ag.adaptive_avg_pool2d(input, output_size)


def embedding(
    input: Any,
    weight: Any,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Node:
    """Rows of ``weight`` (num_embeddings, dim) at the ids ``input``; the ``padding_idx`` row gets no gradient.
    ``max_norm`` (which renormalizes rows in place), ``scale_grad_by_freq`` and ``sparse`` are refused."""
    _refuse("embedding", "max_norm", max_norm, None)
    _refuse("embedding", "scale_grad_by_freq", scale_grad_by_freq, False)
    _refuse("embedding", "sparse", sparse, False)
    return ag.embedding(input, weight, padding_idx)


def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p); the input itself when not
    ``training`` (``inplace`` is accepted and computed out of place, as in ``activations``)."""
    return ag.dropout(input, p, training)


def dropout2d(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """Zero whole channels of (N, C, ...) input with probability ``p`` (one draw per sample and channel), scaling
    the others by 1 / (1 - p); the input itself when not ``training``."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout2d: p must be a probability in [0, 1], got {p!r}")
    if not training or p == 0.0:
        return input
    shape = tuple(input.shape)
    if len(shape) < 3:
        raise ValueError(f"dropout2d: input must be (N, C, H, W) or (N, C, L), got shape {shape}")
    value = input.value if isinstance(input, Node) else input
    ones = layout.full((shape[0], shape[1]) + (1,) * (len(shape) - 2), 1.0, value.dtype, value.device)
    return ag.mul(input, ag.dropout(Node(ones), float(p)))  # one scaled keep-or-drop per sample and channel


def layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Node:
    """Normalized over the trailing ``normalized_shape`` dims (biased variance), then ``* weight + bias``."""
    return ag.layer_norm(input, _shape_arg(normalized_shape), weight, bias, eps)


def rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> Node:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape`` dims (eps None: the
    dtype's machine epsilon, as torch)."""
    return ag.rms_norm(input, _shape_arg(normalized_shape), weight, eps)


def group_norm(input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Node:
    """Normalized over each of ``num_groups`` channel groups of (N, C, ...) input, then per-channel affine."""
    return ag.group_norm(input, num_groups, weight, bias, eps)


def batch_norm(
    input: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Node:
    """Per-channel normalization of (N, C, ...) input: by the batch's statistics when ``training`` (the running
    ones, if given, updated in place with ``momentum``), else by the running statistics."""
    return ag.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def pad(input: Any, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Node:
    """torch's ``F.pad``: (before, after) pairs from the last axis backwards; ``mode`` "constant" (``value``, None:
    0), "reflect", "replicate" or "circular"."""
    return ops_shape.pad(input, pad, 0.0 if value is None else value, mode=mode)


def normalize(input: Any, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Node:
    """``x / max(||x||_p, eps)`` along ``dim``, for ``p`` 1 or 2 (others are refused). The clamp is taken on the
    norm's inner sum (``max(sum x^2, eps^2)`` under the square root), so an all-zero row gets torch's gradient,
    ``g / eps``, where a square root of 0 would give 0 * inf."""
    if p not in (1, 2):
        raise ValueError(f"normalize: netcl takes p = 1 or 2, got p={p!r}")
    if p == 1:
        denom = ag.clamp(ag.sum(ag.abs(input), axis=dim, keepdims=True), float(eps))
    else:
        denom = ag.sqrt(ag.clamp(ag.sum(ag.mul(input, input), axis=dim, keepdims=True), float(eps) ** 2))
    return ag.div(input, denom)


def one_hot(tensor: Any, num_classes: int = -1) -> Node:
    """torch's ``one_hot``: int64 ``tensor.shape + (num_classes,)``, 1 at each label. A label outside ``[0,
    num_classes)`` raises ``IndexError`` (on an OpenCL device at the next wait: the rows are an ``index_select`` of
    the identity, whose kernel checks them); ``num_classes=-1`` takes the largest label + 1, which reads the labels
    back (as torch's does)."""
    labels = tensor.value if isinstance(tensor, Node) else tensor
    if not isinstance(labels, Tensor):
        labels = Tensor.from_host(get_device(), np.asarray(labels, np.int64))
    if labels.dtype.kind not in "iu":
        raise TypeError(f"one_hot: the labels must be integers, got dtype {labels.dtype}")
    if num_classes == -1:
        if labels.size == 0:
            raise ValueError("one_hot: num_classes=-1 needs at least one label to take the count from")
        num_classes = int(labels.to_host().max()) + 1
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes <= 0:
        raise ValueError(f"one_hot: num_classes must be a positive int or -1, got {num_classes!r}")
    key = (labels.device, num_classes)
    identity = _IDENTITIES.get(key)
    if identity is None:
        identity = Tensor.from_host(labels.device, np.eye(num_classes, dtype=np.float32))
        identity = remember(_IDENTITIES, key, identity, DEVICE_CONSTANTS)
    rows = ag.index_select(identity, 0, labels.reshape(labels.size))
    return ag.cast(ag.reshape(rows, (*labels.shape, num_classes)), np.int64)


#: (device, classes) -> the identity matrix ``one_hot`` selects rows of
_IDENTITIES: dict[tuple, Tensor] = {}


def _shape_arg(shape: Any) -> Any:
    """torch's ``normalized_shape`` (an int, a list, a tuple, a ``torch.Size``) as the ops take it."""
    return tuple(shape) if isinstance(shape, list) else shape


__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "batch_norm",
    "conv1d",
    "conv2d",
    "conv_transpose2d",
    "dropout",
    "dropout2d",
    "embedding",
    "group_norm",
    "layer_norm",
    "max_pool1d",
    "max_pool2d",
    "normalize",
    "one_hot",
    "pad",
    "rms_norm",
]
