"""Differentiable convolution and pooling on NCHW (kernels in ``netcl.runtime.ops.conv`` / ``pool``).

``conv2d`` and its input and weight gradients are the runtime's (implicit GEMMs on OpenCL devices,
im2col + matmul / col2im otherwise, see ``netcl.runtime.ops.conv``); its bias gradient is ``grad``
summed over batch and space. Pooling backwards gather per input pixel
(deterministic, no atomics); max-pool recomputes each window's arg-max instead of storing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from netcl.autograd import autocast_mode
from netcl.autograd.engine import Node, apply_op
from netcl.autograd.ops import plus
from netcl.autograd.ops_shape import pad
from netcl.core import ShapeError, Tensor
from netcl.runtime.ops import conv, pointwise, pool
from netcl.runtime.ops.precision import at_matmul_precision

Operand = Any  # Node | Tensor
_Grads = list[Tensor | None]


def _string_padding(x: Operand, w_shape: tuple[int, ...], stride: Any, padding: str, dilation: Any) -> tuple[Any, Any]:
    """``(x, padding)`` for a padding string: "valid" is 0; "same" the symmetric part as the padding, and x padded
    by one more row / column at the bottom / right where a total is odd."""
    if padding == "valid":
        return x, 0
    if padding != "same":
        raise ValueError(f"conv2d: padding must be an int, a pair of ints, 'same' or 'valid', got {padding!r}")
    if conv.pair(stride, "stride", "conv2d", 1) != (1, 1):
        raise ValueError(f"conv2d: padding='same' needs stride 1 (as in torch), got stride={stride!r}")
    if len(w_shape) != 4:
        raise ValueError(f"conv2d: w must be 4-d (out, in/groups, kh, kw), got shape {w_shape}")
    dilations = conv.pair(dilation, "dilation", "conv2d", 1)
    totals = [d * (k - 1) for d, k in zip(dilations, w_shape[2:], strict=True)]
    low = tuple(t // 2 for t in totals)
    extra = [t - 2 * lo for t, lo in zip(totals, low, strict=True)]
    if any(extra):
        x = pad(x, (0, extra[1], 0, extra[0]))
    return x, low


def _needs(x: Any) -> bool:
    return isinstance(x, Node) and x.requires_grad


def _shape(x: Any, op: str, arg: str) -> tuple[int, ...]:
    if not hasattr(x, "shape"):
        raise TypeError(f"{op}: {arg} must be a Node or Tensor, got {type(x).__name__}")
    return tuple(x.shape)


def conv2d(
    x: Operand,
    w: Operand,
    b: Operand | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> Node:
    """2-D cross-correlation (PyTorch ``conv2d``): x (N, C, H, W), w (O, C/groups, KH, KW), b (O,) or None.

    ``padding`` also takes torch's strings: ``"valid"`` (none) and ``"same"`` (stride 1: the output keeps x's
    size; an odd total padding puts its extra row and column at the bottom and right, as torch does). Where the
    forward runs by Winograd and w needs a gradient, x's input transform is kept until the backward, whose
    weight gradient reads it where it runs at the same tile (``conv2d(..., keep=)``)."""
    if isinstance(padding, str):
        x, padding = _string_padding(x, _shape(w, "conv2d", "w"), stride, padding, dilation)
    b_shape = None if b is None else _shape(b, "conv2d", "b")
    conv.check_conv2d(_shape(x, "conv2d", "x"), _shape(w, "conv2d", "w"), b_shape, stride, padding, dilation, groups)
    if (low := autocast_mode.low_dtype_for(x, w, b, product="conv")) is not None:  # netcl.amp.autocast
        return autocast_mode.conv2d(x, w, b, stride, padding, dilation, groups, low)
    precision = autocast_mode.fallback_precision(x, w, b, product="conv")  # autocast without float16 arithmetic
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    kept: list = []  # the forward's input transform of x, for the weight gradient

    def forward(xv: Tensor, wv: Tensor, bv: Tensor | None = None, gather: list | None = None) -> Tensor:
        """``gather``: a list refilled with the output's per-channel moments where the convolution's store gathers
        them (``conv.conv2d(..., gather=)``), for a batch norm of that output alone (``netcl.jit.conv_moments``)."""
        kept.clear()
        if gather is not None:
            gather.clear()
        return conv.conv2d(
            xv, wv, bv, stride, padding, dilation, groups, keep=kept if _needs(w) else None, gather=gather
        )

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor, addends: Sequence[Any] = (None, None, None)) -> _Grads:
        xv, wv = values[0], values[1]
        geo = conv.check_conv2d(xv.shape, wv.shape, None, stride, padding, dilation, groups)
        # the products and the bias sum take an addend of g's dtype; another is added after them
        folds = [a if a is not None and a.dtype == g.dtype else None for a in addends]
        gx = gw = None
        if _needs(x):
            gx = conv.conv2d_backward_input(g, wv, geo, groups, addend=folds[0])
            gx = gx if folds[0] is not None else plus(addends[0], gx)
        if _needs(w):
            transformed = kept[0] if kept else None
            gw = conv.conv2d_backward_weight(g, xv, wv.shape, geo, groups, addend=folds[1], transformed=transformed)
            gw = gw if folds[1] is not None else plus(addends[1], gw)
        if b is None:
            return [gx, gw]
        if not _needs(b):
            return [gx, gw, None]
        gb = conv.conv2d_backward_bias(g, addend=folds[2])
        return [gx, gw, gb if folds[2] is not None else plus(addends[2], gb)]

    args = (x, w) if b is None else (x, w, b)
    at = at_matmul_precision  # the op's forward and gradient alike
    return apply_op(
        at(precision, forward), at(precision, grad), *args, op_name="conv2d", attrs=attrs, folds_addends=True
    )


def conv_transpose2d(
    x: Operand,
    w: Operand,
    b: Operand | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    output_padding: int | tuple[int, int] = 0,
    groups: int = 1,
    dilation: int | tuple[int, int] = 1,
) -> Node:
    """torch's ``conv_transpose2d`` (argument order included): x (N, Cin, H, W), w (Cin, Cout/groups, KH, KW),
    b (Cout,). The gradient of ``conv2d`` with respect to its input, which it is: its forward is
    ``conv2d_backward_input`` of the convolution from the (N, Cout, Hout, Wout) output back to x's shape,
    Hout = (H - 1) stride - 2 padding + dilation (KH - 1) + output_padding + 1; its input gradient is that
    ``conv2d``, its weight gradient ``conv2d_backward_weight`` with the roles of x and the output swapped."""
    x_shape, w_shape = _shape(x, "conv_transpose2d", "x"), _shape(w, "conv_transpose2d", "w")
    geo, out_shape = _transposed_geometry(x_shape, w_shape, stride, padding, output_padding, groups, dilation)
    if b is not None and _shape(b, "conv_transpose2d", "b") != (out_shape[1],):
        raise ShapeError(
            f"conv_transpose2d: b must have shape ({out_shape[1]},), got {_shape(b, 'conv_transpose2d', 'b')}"
        )
    attrs = {"stride": stride, "padding": padding, "output_padding": output_padding, "groups": groups,
             "dilation": dilation}  # fmt: skip

    def forward(xv: Tensor, wv: Tensor, bv: Tensor | None = None) -> Tensor:
        out = conv.conv2d_backward_input(xv, wv, geo, groups)
        return out if bv is None else pointwise.add(out, bv.reshape(1, out_shape[1], 1, 1))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        xv, wv = values[0], values[1]
        gx = conv.conv2d(g, wv, None, stride, padding, dilation, groups) if _needs(x) else None
        gw = conv.conv2d_backward_weight(xv, g, wv.shape, geo, groups) if _needs(w) else None
        if b is None:
            return [gx, gw]
        return [gx, gw, conv.conv2d_backward_bias(g) if _needs(b) else None]

    args = (x, w) if b is None else (x, w, b)
    return apply_op(forward, grad, *args, op_name="conv_transpose2d", attrs=attrs)


def _transposed_geometry(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: Any, padding: Any, output_padding: Any, groups: Any,
    dilation: Any,
) -> tuple[Any, tuple[int, int, int, int]]:  # fmt: skip
    """(the geometry of the convolution a transposed one is the input gradient of, the output shape), checked."""
    op = "conv_transpose2d"
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ShapeError(f"{op}: x and w must be 4-d, got shapes {x_shape} and {w_shape}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or x_shape[1] % groups:
        raise ValueError(f"{op}: groups must be a positive int dividing x's {x_shape[1]} channels, got {groups!r}")
    if w_shape[0] != x_shape[1]:
        raise ShapeError(f"{op}: w must be (in_channels={x_shape[1]}, out_channels/groups, KH, KW), got {w_shape}")
    (sh, sw), (ph, pw) = conv.pair(stride, "stride", op, 1), conv.pair(padding, "padding", op, 0)
    (oph, opw), (dh, dw) = conv.pair(output_padding, "output_padding", op, 0), conv.pair(dilation, "dilation", op, 1)
    if oph >= sh or opw >= sw:  # torch also takes output_padding < dilation; netcl does not
        raise ValueError(f"{op}: output_padding {output_padding!r} must be smaller than stride {stride!r}")
    n, _, h, w = x_shape
    out_h = (h - 1) * sh - 2 * ph + dh * (w_shape[2] - 1) + oph + 1
    out_w = (w - 1) * sw - 2 * pw + dw * (w_shape[3] - 1) + opw + 1
    if out_h <= 0 or out_w <= 0:
        raise ValueError(f"{op}: the output would be {out_h} x {out_w}; x {x_shape}, w {w_shape}, padding {padding!r}")
    out_shape = (n, w_shape[1] * groups, out_h, out_w)
    # with output_padding < stride, the convolution back from the output has exactly x's H x W windows
    geo = conv.check_conv2d(out_shape, w_shape, None, (sh, sw), (ph, pw), (dh, dw), groups)
    return geo, out_shape


def max_pool2d(
    x: Operand, kernel_size: int | tuple[int, int], stride: Any = None, padding: Any = 0, ceil_mode: bool = False
) -> Node:
    """Max over windows (stride defaults to kernel_size; padding <= kernel_size / 2 counts as -inf); ``ceil_mode``
    keeps a last partial window (torch's)."""
    pool.pool_geometry(x, kernel_size, stride, padding, "max_pool2d", ceil_mode)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [pool.max_pool2d_backward(g, values[0], kernel_size, stride, padding, ceil_mode)]

    return apply_op(
        lambda v: pool.max_pool2d(v, kernel_size, stride, padding, ceil_mode),
        grad,
        x,
        op_name="max_pool2d",
        attrs={"kernel_size": kernel_size, "stride": stride, "padding": padding, "ceil_mode": ceil_mode},
    )


def avg_pool2d(
    x: Operand,
    kernel_size: int | tuple[int, int],
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Node:
    """Mean over windows; padding cells count in the divisor unless ``count_include_pad`` is False (torch's
    defaults and divisors, ``ceil_mode`` included)."""
    pool.pool_geometry(x, kernel_size, stride, padding, "avg_pool2d", ceil_mode)
    flags = (ceil_mode, count_include_pad)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [pool.avg_pool2d_backward(g, values[0].shape, kernel_size, stride, padding, *flags)]

    attrs = {"kernel_size": kernel_size, "stride": stride, "padding": padding, "ceil_mode": ceil_mode}
    return apply_op(
        lambda v: pool.avg_pool2d(v, kernel_size, stride, padding, *flags),
        grad,
        x,
        op_name="avg_pool2d",
        attrs={**attrs, "count_include_pad": count_include_pad},
    )


def adaptive_avg_pool2d(x: Operand, output_size: int | tuple[int | None, int | None]) -> Node:
    """Mean over PyTorch's adaptive windows giving ``output_size`` (an int, a pair, None keeps a size)."""
    pool.adaptive_output(x, output_size)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> _Grads:
        return [pool.adaptive_avg_pool2d_backward(g, values[0].shape)]

    return apply_op(
        lambda v: pool.adaptive_avg_pool2d(v, output_size),
        grad,
        x,
        op_name="adaptive_avg_pool2d",
        attrs={"output_size": output_size},
    )


__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "conv2d", "conv_transpose2d", "max_pool2d"]
