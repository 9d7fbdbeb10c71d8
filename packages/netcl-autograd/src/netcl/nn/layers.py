"""Layers with parameters: ``Linear``, ``Conv2d``, ``Embedding`` (PyTorch names, shapes and init)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.autograd.ops_index import padding_row
from netcl.core import Device, ShapeError, Tensor, get_device
from netcl.core.dtypes import float32
from netcl.nn import init
from netcl.nn.functional import conv1d, linear
from netcl.nn.functional.layers import single
from netcl.nn.module import Module
from netcl.nn.parameter import Parameter
from netcl.runtime.ops.upload import write_


def empty_parameter(shape: tuple[int, ...], device: Device | str | None, dtype: Any = float32) -> Parameter:
    """A Parameter of ``shape`` (contents set by the caller's init)."""
    return Parameter(Tensor.zeros(shape, dtype, get_device(device)))


def positive_int(name: str, value: Any, layer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}")
    return value


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)  # type: ignore[return-value]


class Linear(Module):
    """``y = x @ weight.T + bias``; weight (out_features, in_features), both U(-1/sqrt(in), 1/sqrt(in))."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device: Device | str | None = None
    ) -> None:
        super().__init__()
        self.in_features = positive_int("in_features", in_features, "Linear")
        self.out_features = positive_int("out_features", out_features, "Linear")
        self.weight = empty_parameter((out_features, in_features), device)
        if bias:
            self.bias = empty_parameter((out_features,), device)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Any) -> Node:
        return linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _Convolution(Module):
    """What the convolutions share: channel and padding checks, a weight and an optional bias, torch's
    initialization (kaiming-uniform with a = sqrt(5), the bias uniform in +-1 / sqrt(fan_in), fan_in from the
    weight's second axis on) and torch's repr."""

    def _channels_of(self, in_channels: int, out_channels: int, groups: int) -> None:
        """Check and keep the channel counts and groups (both counts divisible by groups)."""
        owner = type(self).__name__
        self.in_channels = positive_int("in_channels", in_channels, owner)
        self.out_channels = positive_int("out_channels", out_channels, owner)
        self.groups = positive_int("groups", groups, owner)
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{owner}: in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by "
                f"groups ({groups})"
            )

    def _parameters_of(self, weight_shape: tuple[int, ...], channels: int, bias: bool, device: Any) -> None:
        self.weight = empty_parameter(weight_shape, device)
        if bias:
            self.bias = empty_parameter((channels,), device)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def _padding_of(self, padding: Any, sizes: tuple[int, ...]) -> None:
        """Keep ``padding``: its parsed ``sizes``, or torch's string "same" (stride 1 only) / "valid"."""
        owner = type(self).__name__
        if not isinstance(padding, str):
            self.padding = sizes
            return
        if padding not in ("same", "valid"):
            raise ValueError(f"{owner}: padding must be an int, a tuple of ints, 'same' or 'valid', got {padding!r}")
        if padding == "same" and any(step != 1 for step in self.stride):
            raise ValueError(f"{owner}: padding='same' needs stride 1 (as in torch), got stride={self.stride!r}")
        self.padding = padding  #: conv resolves the string

    def extra_repr(self) -> str:
        """torch's: channels, kernel size and stride, then what differs from its default."""
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        zeros, ones = (0,) * len(self.kernel_size), (1,) * len(self.kernel_size)
        for name, default in (("padding", zeros), ("output_padding", zeros), ("dilation", ones)):
            value = getattr(self, name, default)
            if value != default:
                text += f", {name}={value!r}" if isinstance(value, str) else f", {name}={value}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + (", bias=False" if self.bias is None else "")

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init.calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound)


class Conv1d(_Convolution):
    """1-D convolution on (N, C, L); weight (out, in / groups, k), torch's initialization and attribute tuples
    (``kernel_size == (k,)``); run as ``conv2d`` on a height of 1 (``nn.functional.conv1d``)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int],
        stride: int | tuple[int] = 1,
        padding: int | tuple[int] | str = 0,
        dilation: int | tuple[int] = 1,
        groups: int = 1,
        bias: bool = True,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self._channels_of(in_channels, out_channels, groups)
        self.kernel_size = (positive_int("kernel_size", single(kernel_size, "Conv1d", "kernel_size"), "Conv1d"),)
        self.stride = (positive_int("stride", single(stride, "Conv1d", "stride"), "Conv1d"),)
        self.dilation = (positive_int("dilation", single(dilation, "Conv1d", "dilation"), "Conv1d"),)
        self._padding_of(padding, () if isinstance(padding, str) else (single(padding, "Conv1d", "padding"),))
        self._parameters_of((out_channels, in_channels // groups, *self.kernel_size), out_channels, bias, device)

    def forward(self, x: Any) -> Node:
        return conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(_Convolution):
    """2-D convolution on NCHW; weight (out, in / groups, kh, kw), init as ``Linear`` with fan_in = in/groups*kh*kw."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self._channels_of(in_channels, out_channels, groups)
        self.kernel_size = _pair(kernel_size)
        self.stride, self.dilation = _pair(stride), _pair(dilation)
        self._padding_of(padding, () if isinstance(padding, str) else _pair(padding))
        self._parameters_of((out_channels, in_channels // groups, *self.kernel_size), out_channels, bias, device)

    def forward(self, x: Any) -> Node:
        return ag.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose2d(_Convolution):
    """torch's ``ConvTranspose2d`` on NCHW: weight (in, out / groups, kh, kw), torch's initialization (fan_in from
    the weight's second axis) and argument order; ``output_padding`` below ``stride``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        output_padding: int | tuple[int, int] = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: int | tuple[int, int] = 1,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self._channels_of(in_channels, out_channels, groups)
        self.kernel_size = _pair(kernel_size)
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.output_padding = _pair(output_padding)
        self._parameters_of((in_channels, out_channels // groups, *self.kernel_size), out_channels, bias, device)

    def forward(self, x: Any) -> Node:
        return ag.conv_transpose2d(
            x, self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation
        )


class Embedding(Module):
    """A lookup table (num_embeddings, embedding_dim) initialized N(0, 1); ``forward(ids)`` gathers rows.

    ``padding_idx`` (torch's): that row starts at zero and gets no gradient (negative: from the end)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self.num_embeddings = positive_int("num_embeddings", num_embeddings, "Embedding")
        self.embedding_dim = positive_int("embedding_dim", embedding_dim, "Embedding")
        self.padding_idx = padding_row(padding_idx, num_embeddings, "Embedding")
        self.weight = empty_parameter((num_embeddings, embedding_dim), device)
        self.reset_parameters()

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Any,
        freeze: bool = True,
        padding_idx: int | None = None,
        device: Device | str | None = None,
    ) -> Embedding:
        """torch's: an Embedding whose table is ``embeddings`` (num_embeddings, dim), frozen (no gradient) unless
        ``freeze`` is False; the ``padding_idx`` row keeps its values and gets no gradient."""
        host = embeddings.to_host() if hasattr(embeddings, "to_host") else np.asarray(embeddings, np.float32)
        if host.ndim != 2:
            raise ShapeError(f"Embedding.from_pretrained: embeddings must be 2-d, got shape {host.shape}")
        layer = cls(host.shape[0], host.shape[1], padding_idx, device)
        write_(layer.weight.value, host.astype(np.float32))
        layer.weight.requires_grad_(not freeze)
        return layer

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            row = np.asarray(self.weight.to_host())
            row[self.padding_idx] = 0
            write_(self.weight.value, row)

    def forward(self, ids: Any) -> Node:
        return ag.embedding(ids, self.weight, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"
