"""Normalization layers: ``BatchNorm1d``, ``BatchNorm2d``, ``LayerNorm``, ``RMSNorm``, ``GroupNorm`` and
``InstanceNorm1d`` / ``InstanceNorm2d`` (PyTorch's state and defaults)."""

from __future__ import annotations

from typing import Any

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.core import Device, ShapeError, Tensor, get_device
from netcl.core.dtypes import float32, int64
from netcl.nn import init
from netcl.nn.layers import empty_parameter, positive_int
from netcl.nn.module import Module
from netcl.runtime.ops import pointwise


def _affine(module: Module, shape: tuple[int, ...], weight: bool, bias: bool | None, device: Any) -> None:
    """torch's affine parameters of a normalization: ``weight`` (ones) and ``bias`` (zeros) of ``shape`` where asked,
    registered as None where not; ``bias=None``: the layer has no bias at all (RMSNorm)."""
    if weight:
        module.weight = empty_parameter(shape, device)
        init.ones_(module.weight)
    else:
        module.register_parameter("weight", None)
    if bias:
        module.bias = empty_parameter(shape, device)
        init.zeros_(module.bias)
    elif bias is not None:
        module.register_parameter("bias", None)


class _BatchNorm(Module):
    """Batch normalization over the channel axis 1; ``running_mean``, ``running_var`` and
    ``num_batches_tracked`` buffers as PyTorch's (running_var keeps the unbiased batch variance)."""

    _ranks: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self.num_features = positive_int("num_features", num_features, type(self).__name__)
        self.eps, self.momentum = float(eps), float(momentum)
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        target = get_device(device)
        if affine:
            self.weight = empty_parameter((num_features,), target)
            self.bias = empty_parameter((num_features,), target)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", Tensor.zeros((num_features,), float32, target))
            self.register_buffer("running_var", Tensor.zeros((num_features,), float32, target))
            self.register_buffer("num_batches_tracked", Tensor.zeros((), int64, target))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            pointwise.fill_(self.running_mean, 0.0)
            pointwise.fill_(self.running_var, 1.0)
            pointwise.fill_(self.num_batches_tracked, 0)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, x: Any) -> Node:
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) not in self._ranks or shape[1] != self.num_features:
            c = self.num_features
            forms = {2: f"(N, {c})", 3: f"(N, {c}, L)", 4: f"(N, {c}, H, W)"}
            expected = " or ".join(forms[r] for r in self._ranks)
            raise ShapeError(f"{type(self).__name__}: x has shape {shape}, expected {expected}")
        use_batch_stats = self.training or not self.track_running_stats
        # the counter is an operand of the op (its kernel adds one), so a jit trace keeps the count and a
        # captured graph replays it
        counter = self.num_batches_tracked if self.training and self.track_running_stats else None
        return ag.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, use_batch_stats, self.momentum,
            self.eps, num_batches_tracked=counter,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    """Batch norm of (N, C) or (N, C, L) inputs."""

    _ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm of (N, C, H, W) inputs."""

    _ranks = (4,)


class LayerNorm(Module):
    """Normalization over the trailing ``normalized_shape``; weight ones, bias zeros (when affine)."""

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        for size in shape:
            positive_int("normalized_shape entries", size, "LayerNorm")
        self.normalized_shape, self.eps, self.elementwise_affine = shape, float(eps), bool(elementwise_affine)
        _affine(self, shape, elementwise_affine, elementwise_affine and bias, device)

    def forward(self, x: Any) -> Node:
        return ag.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    """torch's ``RMSNorm``: ``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape``; weight ones
    when ``elementwise_affine``; ``eps`` None is the input dtype's machine epsilon (torch's default)."""

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        for size in shape:
            positive_int("normalized_shape entries", size, "RMSNorm")
        self.normalized_shape, self.elementwise_affine = shape, bool(elementwise_affine)
        self.eps = None if eps is None else float(eps)
        _affine(self, shape, elementwise_affine, None, device)

    def forward(self, x: Any) -> Node:
        return ag.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    """torch's ``GroupNorm``: (N, C, *) normalized per group of C / num_groups channels; weight ones, bias zeros
    (C,) when ``affine``."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self.num_groups = positive_int("num_groups", num_groups, "GroupNorm")
        self.num_channels = positive_int("num_channels", num_channels, "GroupNorm")
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.eps, self.affine = float(eps), bool(affine)
        _affine(self, (num_channels,), affine, affine, device)

    def forward(self, x: Any) -> Node:
        return ag.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _InstanceNorm(Module):
    """torch's ``InstanceNorm``: each sample's channel normalized over its own positions (``group_norm`` with one
    channel a group); ``affine`` adds a weight (ones) and a bias (zeros) of shape (C,). ``track_running_stats`` is
    refused (netcl keeps no running statistics for it)."""

    spatial = 2

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.num_features = positive_int("num_features", num_features, owner)
        if track_running_stats:
            raise ValueError(f"{owner}: track_running_stats=True is not supported by netcl")
        self.eps, self.momentum, self.affine = float(eps), momentum, bool(affine)
        _affine(self, (num_features,), affine, affine, device)

    def forward(self, x: Any) -> Node:
        shape = tuple(x.shape)
        if len(shape) not in (self.spatial + 1, self.spatial + 2) or shape[-self.spatial - 1] != self.num_features:
            raise ShapeError(
                f"{type(self).__name__}: input must be (N, {self.num_features}, ...) with {self.spatial} spatial "
                f"axes (or unbatched), got shape {shape}"
            )
        unbatched = len(shape) == self.spatial + 1
        x = ag.unsqueeze(x, 0) if unbatched else x
        out = ag.group_norm(x, self.num_features, self.weight, self.bias, self.eps)
        return ag.squeeze(out, 0) if unbatched else out

    def extra_repr(self) -> str:
        text = f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"
        return text + ", track_running_stats=False"


class InstanceNorm1d(_InstanceNorm):
    spatial = 1


class InstanceNorm2d(_InstanceNorm):
    spatial = 2
