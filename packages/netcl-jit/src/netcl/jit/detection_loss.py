"""``FusedDetectionLossPlan``: the compiled fused detection loss for one device, and input checks.

A plan holds ``partial_kernel``, ``reduce_kernel`` and ``backward_kernel`` (OpenCL kernels built
through ``program_cache``, or their NumPy twins on the NumPy backend). Calling it returns the
scalar loss Node: forward = 2 launches (partial + reduce), backward = 1 launch, gradient w.r.t.
``pred`` only. Scales and ``beta`` are arguments of every call, never compiled in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op
from netcl.core import Device, Tensor, same_device
from netcl.core.errors import DTypeError, ShapeError
from netcl.jit import detection_loss_numpy
from netcl.jit.detection_loss_kernels import BACKWARD_NAME, PARTIAL_NAME, REDUCE_NAME, detection_loss_source
from netcl.runtime.cache import program_cache
from netcl.runtime.launch import launch
from netcl.runtime.ops._common import index_ctype as runtime_index_ctype

OP_NAME = "weighted_bce_smooth_l1_sum"
ARG_NAMES = ("pred", "target", "heat_weight", "reg_weight")
#: Upper bound on the number of partial sums (work-groups of the partial kernel).
MAX_BLOCKS = 1024
#: Partial sums on GPUs, chosen with benchmarks/tune_detection_loss.py (see benchmarks/RESULTS.md, "Measurements
#: moved out of source docstrings", detection_loss.py).
GPU_MAX_BLOCKS = 8192
#: Preferred work-group size.
LOCAL_SIZE = 256


def index_ctype(n: int) -> str:
    """``long`` when strided indices could pass 2**31 for ``n`` elements (2**24 of headroom), else ``int``."""
    return runtime_index_ctype(n, headroom=2**24)


# ---- validation --------------------------------------------------------------------------------
_F32 = np.dtype(np.float32)


def _value(x: Any) -> Any:
    return x.value if isinstance(x, Node) else x


def _is_traced(x: Any) -> bool:
    return isinstance(x, Node) and not isinstance(x.value, Tensor)


def _concrete(args: tuple[Any, ...]) -> list[Tensor] | None:
    """The four tensors when they are float32 Tensors (or Nodes of them) of one shape and device, else None."""
    values = [a.value if isinstance(a, Node) else a for a in args]
    first = values[0]
    if not isinstance(first, Tensor):
        return None
    shape, device = first.shape, first.device
    for v in values:
        if not isinstance(v, Tensor) or v.shape != shape or v.dtype != _F32 or v.device is not device:
            return None
    return values


def validate_inputs(pred: Any, target: Any, heat_weight: Any, reg_weight: Any) -> None:
    """One shape, float32 and one device for all four inputs; errors name the offending argument."""
    args = (pred, target, heat_weight, reg_weight)
    if _concrete(args) is not None:  # the common case, checked fast
        return
    for name, arg in zip(ARG_NAMES, args, strict=True):
        if not isinstance(arg, (Node, Tensor)):
            raise TypeError(
                f"fused_weighted_bce_smooth_l1_loss: {name} must be a netcl Node or Tensor, got {type(arg).__name__}"
            )
    shape = tuple(pred.shape)
    for name, arg in zip(ARG_NAMES, args, strict=True):
        if np.dtype(arg.dtype) != _F32:
            raise DTypeError(
                f"fused_weighted_bce_smooth_l1_loss: {name} has dtype {arg.dtype}; all four inputs must be float32"
            )
        if tuple(arg.shape) != shape:
            raise ShapeError(
                f"fused_weighted_bce_smooth_l1_loss: {name} has shape {tuple(arg.shape)} but pred has shape {shape}; "
                "all four inputs must have one shape (no broadcasting)"
            )
    if not any(_is_traced(a) for a in args):
        same_device(*(_value(a).device for a in args))


def validate_scalars(heat_scale: Any, reg_scale: Any, beta: Any) -> tuple[float, float, float]:
    """The scales and beta as floats: real numbers, beta finite and >= 0 (0 means plain L1)."""
    values = []
    for name, v in (("heat_scale", heat_scale), ("reg_scale", reg_scale), ("beta", beta)):
        if type(v) is not float and (isinstance(v, bool) or not isinstance(v, (Real, np.floating, np.integer))):
            raise TypeError(f"fused_weighted_bce_smooth_l1_loss: {name} must be a real number, got {type(v).__name__}")
        values.append(float(v))
    if not 0.0 <= values[2] < math.inf:
        raise ValueError(f"fused_weighted_bce_smooth_l1_loss: beta must be finite and >= 0 (0 is plain L1), got {beta}")
    return values[0], values[1], values[2]


def plan_key(pred: Any, target: Any, heat_weight: Any, reg_weight: Any, *rest: Any, **kwargs: Any) -> tuple:
    """What a plan is compiled for: device, dtype and index type."""
    value = _value(pred)
    return (value.device, value.dtype.str, index_ctype(value.size))


def matches(pred: Any, target: Any, heat_weight: Any, reg_weight: Any, *rest: Any, **kwargs: Any) -> bool:
    """True when the four inputs are concrete float32 tensors of one shape on one device."""
    return _concrete((pred, target, heat_weight, reg_weight)) is not None


# ---- the plan ----------------------------------------------------------------------------------
@dataclass(eq=False)
class FusedDetectionLossPlan:
    """The three kernels of the fused detection loss for one (device, dtype, index type).

    ``compile_plan`` builds the subclass of the device's backend (``OpenCLDetectionLossPlan`` or
    ``NumpyDetectionLossPlan``), which runs the kernels; this class holds what both share.
    """

    device: Device
    index_ctype: str
    local_size: int
    partial_kernel: Any
    reduce_kernel: Any
    backward_kernel: Any
    source: str | None = None
    max_blocks: int = MAX_BLOCKS
    #: elements per work-item step: 4 (float4 loads) on GPUs, 8 or 16 (float vectors) on CPU devices
    vec: int = 1

    def blocks(self, n: int) -> int:
        """Partial sums the forward makes for ``n`` elements."""
        raise NotImplementedError

    def forward(
        self, pred: Tensor, target: Tensor, hw: Tensor, rw: Tensor, hs: float, rs: float, beta: float
    ) -> Tensor:
        """The 0-d float32 loss."""
        raise NotImplementedError

    def backward(
        self, grad_out: Tensor, pred: Tensor, target: Tensor, hw: Tensor, rw: Tensor, hs: float, rs: float, beta: float
    ) -> Tensor:
        """``grad_out * d loss / d pred``."""
        raise NotImplementedError

    def __call__(
        self,
        pred: Any,
        target: Any,
        heat_weight: Any,
        reg_weight: Any,
        heat_scale: float = 1.0,
        reg_scale: float = 1.0,
        beta: float = 0.05,
    ) -> Node:
        """The scalar loss Node; its gradient flows to ``pred`` only."""
        return self.apply(pred, target, heat_weight, reg_weight, *validate_scalars(heat_scale, reg_scale, beta))

    def apply(self, pred: Any, target: Any, heat_weight: Any, reg_weight: Any, hs: float, rs: float, b: float) -> Node:
        """``__call__`` with the scalars already checked floats."""
        return apply_op(
            self.forward,
            self._grad,
            pred,
            target,
            heat_weight,
            reg_weight,
            hs,
            rs,
            b,
            op_name=OP_NAME,
            attrs={"heat_scale": hs, "reg_scale": rs, "beta": b},
        )

    def _grad(self, grad_out: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        return [self.backward(grad_out, *values), None, None, None, None, None, None]

    def __repr__(self) -> str:
        return (
            f"<FusedDetectionLossPlan on {self.device.spec} index={self.index_ctype} local={self.local_size} "
            f"vec={self.vec} max_blocks={self.max_blocks}>"
        )


class OpenCLDetectionLossPlan(FusedDetectionLossPlan):
    """The plan on an OpenCL device: its three kernels launched through ``launch``."""

    def blocks(self, n: int) -> int:
        """Work-groups (= partial sums) for ``n`` elements: >= ``vec`` elements per work-item, <= ``max_blocks``."""
        return min(self.max_blocks, max(1, -(-n // (self.vec * self.local_size))))

    def forward(
        self, pred: Tensor, target: Tensor, hw: Tensor, rw: Tensor, hs: float, rs: float, beta: float
    ) -> Tensor:
        """The 0-d float32 loss (two launches: partial, then reduce)."""
        n = int(pred.size)
        blocks = self.blocks(n)
        local = self.local_size
        pred, target, hw, rw = (t.contiguous() for t in (pred, target, hw, rw))  # strided views: read as copies
        partials = Tensor.empty((blocks,), np.float32, self.device)
        launch(self.partial_kernel, blocks * local, local, pred, target, hw, rw, partials, hs, rs, beta, n)
        out = Tensor.empty((), np.float32, self.device)  # allocated while the partial kernel runs
        launch(self.reduce_kernel, local, local, partials, out, blocks)
        return out

    def backward(
        self, grad_out: Tensor, pred: Tensor, target: Tensor, hw: Tensor, rw: Tensor, hs: float, rs: float, beta: float
    ) -> Tensor:
        """``grad_out * d loss / d pred`` (one launch; ``grad_out`` stays on the device)."""
        n = int(pred.size)
        grad = Tensor.empty(tuple(pred.shape), np.float32, self.device)
        if n:
            pred, target, hw, rw, grad_out = (t.contiguous() for t in (pred, target, hw, rw, grad_out))
            local = self.local_size
            work = -(-n // self.vec)
            launch(
                self.backward_kernel,
                -(-work // local) * local,
                local,
                pred,
                target,
                hw,
                rw,
                grad_out,
                grad,
                hs,
                rs,
                beta,
                n,
            )
        return grad


class NumpyDetectionLossPlan(FusedDetectionLossPlan):
    """The plan on the NumPy backend: its kernels are the twins in ``detection_loss_numpy``."""

    def blocks(self, n: int) -> int:
        """Partial sums for ``n`` elements: one per ``detection_loss_numpy.BLOCK`` elements."""
        return max(1, -(-n // detection_loss_numpy.BLOCK))

    def forward(
        self, pred: Tensor, target: Tensor, hw: Tensor, rw: Tensor, hs: float, rs: float, beta: float
    ) -> Tensor:
        """The 0-d float32 loss (partial sums, then their sum)."""
        sums = self.partial_kernel(pred.data, target.data, hw.data, rw.data, hs, rs, beta)
        out = self.reduce_kernel(sums)
        return Tensor(out, (), out.dtype, self.device)

    def backward(
        self, grad_out: Tensor, pred: Tensor, target: Tensor, hw: Tensor, rw: Tensor, hs: float, rs: float, beta: float
    ) -> Tensor:
        """``grad_out * d loss / d pred``."""
        data = self.backward_kernel(grad_out.data, pred.data, target.data, hw.data, rw.data, hs, rs, beta)
        return Tensor(data, tuple(pred.shape), data.dtype, self.device)


def build_plan(
    pred: Any, target: Any, heat_weight: Any, reg_weight: Any, *rest: Any, **kwargs: Any
) -> FusedDetectionLossPlan:
    """Compile the plan for the device, dtype and index type of ``pred`` (the built-in planner)."""
    device, _, ctype = plan_key(pred, target, heat_weight, reg_weight)
    return compile_plan(device, ctype)


def compile_plan(device: Device, ctype: str = "int", vec: int | None = None) -> FusedDetectionLossPlan:
    """The plan for ``device``: its kernels built through ``program_cache`` (NumPy functions on "cpu").

    ``vec`` defaults to 4 on GPUs and to the preferred float width (8 with AVX2, 16 with AVX-512)
    on CPU devices, whose kernels then evaluate the terms on float vectors.
    """
    if device.kind != "opencl":
        return NumpyDetectionLossPlan(
            device, ctype, 1, detection_loss_numpy.partials, detection_loss_numpy.reduce, detection_loss_numpy.backward
        )
    # reqd_work_group_size pins the work-group size: 256, or the device's largest power of two below it
    local = min(LOCAL_SIZE, _pow2_floor(device.cl_device.max_work_group_size))
    if vec is None:
        vec = 4 if device.is_gpu else max(8, device.vector_width)
    source = detection_loss_source(ctype, local, vec)
    handle = program_cache.get_or_compile(("netcl.jit.detection_loss", ctype, local, vec), source, device.context)
    index = np.int64 if ctype == "long" else np.int32
    scalars = [np.float32, np.float32, np.float32, index]
    partial = handle.kernel(PARTIAL_NAME, [None] * 5 + scalars)
    reduce = handle.kernel(REDUCE_NAME, [None, None, np.int32])
    backward = handle.kernel(BACKWARD_NAME, [None] * 6 + scalars)
    max_blocks = GPU_MAX_BLOCKS if device.is_gpu else MAX_BLOCKS
    return OpenCLDetectionLossPlan(device, ctype, local, partial, reduce, backward, source, max_blocks, vec=vec)


def _pow2_floor(value: int) -> int:
    return 1 << (max(int(value), 1).bit_length() - 1)
