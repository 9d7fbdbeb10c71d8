"""Layers without parameters: activations, pooling, dropout, padding, ``Flatten``, ``Unflatten`` and ``Identity``."""

from __future__ import annotations

from typing import Any

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.nn import functional
from netcl.nn.functional.layers import refuse_pool_options
from netcl.nn.module import Module


class Identity(Module):
    """Returns its input."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


class _Inplace(Module):
    """An activation with torch's ``inplace`` argument (accepted, computed out of place) and no other
    (torch documents ``inplace`` as an optional optimization)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace


class ReLU(_Inplace):
    def forward(self, x: Any) -> Node:
        return functional.relu(x)


class GELU(Module):
    """GELU as torch's ``nn.GELU``: exact (x * Phi(x)) by default, the tanh approximation with
    ``approximate="tanh"`` (GPT-2's)."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Any) -> Node:
        return functional.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = float(negative_slope), inplace

    def forward(self, x: Any) -> Node:
        return functional.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = float(alpha), inplace

    def forward(self, x: Any) -> Node:
        return functional.elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)

    def forward(self, x: Any) -> Node:
        return functional.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Softmax(Module):
    """softmax along ``dim`` (required: torch's implicit choice of dim is deprecated)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Any) -> Node:
        return functional.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """log_softmax along ``dim``."""

    def forward(self, x: Any) -> Node:
        return functional.log_softmax(x, self.dim)


class Hardtanh(Module):
    """``clamp(x, min_val, max_val)`` (torch's)."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        if max_val <= min_val:
            raise ValueError(f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val, self.max_val, self.inplace = float(min_val), float(max_val), inplace

    def forward(self, x: Any) -> Node:
        return functional.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


class ReLU6(Hardtanh):
    """``clamp(x, 0, 6)``."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)


class Hardsigmoid(_Inplace):
    """``F.hardsigmoid``: ``clamp(x / 6 + 1 / 2, 0, 1)``."""

    def forward(self, x: Any) -> Node:
        return functional.hardsigmoid(x)


class Hardswish(_Inplace):
    """``F.hardswish``: ``x * hardsigmoid(x)``."""

    def forward(self, x: Any) -> Node:
        return functional.hardswish(x)


class Mish(_Inplace):
    """``F.mish``: ``x * tanh(softplus(x))``."""

    def forward(self, x: Any) -> Node:
        return functional.mish(x)


class Softmin(Softmax):
    """softmin along ``dim`` (``softmax(-x)``)."""

    def forward(self, x: Any) -> Node:
        return functional.softmin(x, self.dim)


class GLU(Module):
    """``a * sigmoid(b)`` of the two halves of the input along ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Any) -> Node:
        return functional.glu(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSigmoid(Module):
    def forward(self, x: Any) -> Node:
        return functional.logsigmoid(x)


class Softsign(Module):
    def forward(self, x: Any) -> Node:
        return functional.softsign(x)


class SiLU(_Inplace):
    def forward(self, x: Any) -> Node:
        return functional.silu(x)


class Tanh(Module):
    def forward(self, x: Any) -> Node:
        return functional.tanh(x)


class Sigmoid(Module):
    def forward(self, x: Any) -> Node:
        return functional.sigmoid(x)


class Dropout(Module):
    """Zeroes elements with probability ``p`` in training mode (scaling the rest by 1/(1-p)); identity in eval."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got {p!r}")
        self.p, self.inplace = float(p), inplace

    def forward(self, x: Any) -> Node:
        return functional.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Dropout2d(Module):
    """Zeroes whole channels of (N, C, ...) input with probability ``p`` in training mode, scaling the others by
    1 / (1 - p) (torch's ``Dropout2d``: one draw per sample and channel); identity in eval."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout2d: p must be a probability in [0, 1], got {p!r}")
        self.p, self.inplace = float(p), inplace

    def forward(self, x: Any) -> Any:
        return functional.dropout2d(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class _Pool(Module):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.ceil_mode = ceil_mode

    def extra_repr(self) -> str:
        text = f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
        return text + (", ceil_mode=True" if self.ceil_mode else "")


class MaxPool2d(_Pool):
    """Max over ``kernel_size`` windows of NCHW input (stride defaults to kernel_size); torch's arguments, with
    ``dilation`` 1 and ``return_indices`` False only."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        refuse_pool_options("MaxPool2d", dilation, return_indices)
        super().__init__(kernel_size, stride, padding, ceil_mode)

    def forward(self, x: Any) -> Node:
        return functional.max_pool2d(x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode)


class AvgPool2d(_Pool):
    """Mean over ``kernel_size`` windows of NCHW input; torch's arguments and divisors (padding counts unless
    ``count_include_pad`` is False), without ``divisor_override``."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: Any = None,
    ) -> None:
        if divisor_override is not None:
            raise ValueError(f"AvgPool2d: divisor_override is not supported, got {divisor_override!r}")
        super().__init__(kernel_size, stride, padding, ceil_mode)
        self.count_include_pad = count_include_pad

    def forward(self, x: Any) -> Node:
        return functional.avg_pool2d(
            x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad
        )


class MaxPool1d(_Pool):
    """Max over ``kernel_size`` windows of (N, C, L) input (``nn.functional.max_pool1d``); ``dilation`` 1 and
    ``return_indices`` False only."""

    def __init__(
        self,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        refuse_pool_options("MaxPool1d", dilation, return_indices)
        super().__init__(kernel_size, stride, padding, ceil_mode)

    def forward(self, x: Any) -> Node:
        return functional.max_pool1d(x, self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode)


class AvgPool1d(_Pool):
    """Mean over ``kernel_size`` windows of (N, C, L) input with torch's divisors (``nn.functional.avg_pool1d``)."""

    def __init__(
        self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(kernel_size, stride, padding, ceil_mode)
        self.count_include_pad = count_include_pad

    def forward(self, x: Any) -> Node:
        return functional.avg_pool1d(
            x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad
        )


class AdaptiveAvgPool1d(Module):
    """Mean over the adaptive windows of (N, C, L) input that give length ``output_size``."""

    def __init__(self, output_size: int) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Any) -> Node:
        return functional.adaptive_avg_pool1d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class Upsample(Module):
    """torch's ``Upsample``: ``interpolate`` with the module's ``size`` or ``scale_factor``, ``mode`` and
    ``align_corners``."""

    def __init__(
        self, size: Any = None, scale_factor: Any = None, mode: str = "nearest", align_corners: bool | None = None
    ) -> None:
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners

    def forward(self, x: Any) -> Node:
        return functional.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners)

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"


class AdaptiveAvgPool2d(Module):
    """Mean over the adaptive windows that give ``output_size`` (e.g. 1 for global average pooling)."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Any) -> Node:
        return functional.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class Flatten(Module):
    """Merges dimensions ``start_dim..end_dim`` (default: all but the batch dimension)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Any) -> Node:
        return ag.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Splits dimension ``dim`` into ``unflattened_size`` (its product must be that dimension's length)."""

    def __init__(self, dim: int, unflattened_size: tuple[int, ...]) -> None:
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x: Any) -> Node:
        shape = tuple(x.shape)
        axis = self.dim % len(shape) if shape else self.dim
        return ag.reshape(x, shape[:axis] + self.unflattened_size + shape[axis + 1 :])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class _Pad(Module):
    """torch's padding modules: ``padding`` an int (every side of the padded axes) or torch's tuple (last axis
    first, before / after), through ``functional.pad`` in ``mode``."""

    mode = "constant"
    axes = 2

    def __init__(self, padding: Any, value: float = 0.0) -> None:
        super().__init__()
        self.padding = (padding,) * (2 * self.axes) if isinstance(padding, int) else tuple(padding)
        if len(self.padding) != 2 * self.axes:
            raise ValueError(f"{type(self).__name__}: padding must be an int or {2 * self.axes} ints, got {padding!r}")
        self.value = float(value)

    def forward(self, x: Any) -> Node:
        return functional.pad(x, self.padding, self.mode, self.value if self.mode == "constant" else None)

    def extra_repr(self) -> str:
        return f"{self.padding}"


class ConstantPad1d(_Pad):
    axes = 1

    def extra_repr(self) -> str:
        return f"padding={self.padding}, value={self.value}"


class ConstantPad2d(ConstantPad1d):
    axes = 2


class ZeroPad1d(_Pad):
    axes = 1

    def __init__(self, padding: Any) -> None:
        super().__init__(padding, 0.0)


class ZeroPad2d(ZeroPad1d):
    axes = 2


class ReflectionPad1d(ZeroPad1d):
    mode = "reflect"


class ReflectionPad2d(ZeroPad2d):
    mode = "reflect"


class ReplicationPad1d(ZeroPad1d):
    mode = "replicate"


class ReplicationPad2d(ZeroPad2d):
    mode = "replicate"


class PixelShuffle(Module):
    """(N, C r^2, H, W) -> (N, C, H r, W r): ``out[n, c, h r + i, w r + j] = in[n, c r^2 + i r + j, h, w]``."""

    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        if isinstance(upscale_factor, bool) or not isinstance(upscale_factor, int) or upscale_factor <= 0:
            raise ValueError(f"PixelShuffle: upscale_factor must be a positive int, got {upscale_factor!r}")
        self.upscale_factor = upscale_factor

    def forward(self, x: Any) -> Node:
        *lead, c, h, w = tuple(x.shape)
        r = self.upscale_factor
        if c % (r * r):
            raise ValueError(f"PixelShuffle: channels ({c}) must be divisible by upscale_factor ** 2 ({r * r})")
        y = ag.reshape(x, (-1, c // (r * r), r, r, h, w))
        y = ag.permute(y, (0, 1, 4, 2, 5, 3))
        return ag.reshape(y, (*lead, c // (r * r), h * r, w * r))

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """The inverse of ``PixelShuffle``: (N, C, H r, W r) -> (N, C r^2, H, W)."""

    def __init__(self, downscale_factor: int) -> None:
        super().__init__()
        if isinstance(downscale_factor, bool) or not isinstance(downscale_factor, int) or downscale_factor <= 0:
            raise ValueError(f"PixelUnshuffle: downscale_factor must be a positive int, got {downscale_factor!r}")
        self.downscale_factor = downscale_factor

    def forward(self, x: Any) -> Node:
        *lead, c, h, w = tuple(x.shape)
        r = self.downscale_factor
        if h % r or w % r:
            raise ValueError(f"PixelUnshuffle: height ({h}) and width ({w}) must be divisible by {r}")
        y = ag.reshape(x, (-1, c, h // r, r, w // r, r))
        y = ag.permute(y, (0, 1, 3, 5, 2, 4))
        return ag.reshape(y, (*lead, c * r * r, h // r, w // r))

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"
