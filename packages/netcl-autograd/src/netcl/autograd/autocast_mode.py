"""Autocast state and the mixed-precision forms of the matrix-product ops (used by ``netcl.amp``).

While ``netcl.amp.autocast`` is active on this thread, ``matmul``, ``conv2d`` and
``netcl.nn.functional.linear`` of float32 operands read their operands rounded to float16 and
return float32 (fp32 accumulation); their gradients w.r.t. the float32 inputs are float32.
Everything else (reductions, norms, losses, elementwise ops) stays float32. On a device where
float16 is storage-only but tensor cores multiply it (NVIDIA's OpenCL), the same ops run on the
float32 tensors at a matmul precision instead (``fallback_precision``): "fp16" for matmul and
linear (operands rounded to float16 in the kernel, the same numbers), "high" for convolutions;
elsewhere autocast warns once and does nothing.

``autocast(dtype=bfloat16)`` does the same with bfloat16 operands: where the device computes in it
(the NumPy backend) and, for matmul and linear, on every OpenCL device too (bfloat16 tensors are
storage-only there and the matrix-product kernels take them: cast, then multiplied exactly in float32
or on tensor cores). On NVIDIA's OpenCL, where tensor cores take bf16, matmul and linear run on the
float32 tensors at precision "medium" instead (operands rounded to bf16 in the kernel: the same
numbers, no casts); convolutions at "high" (tf32) there, and in float32 (one warning) elsewhere.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op, get_tracer
from netcl.core import Tensor
from netcl.core.dtypes import bfloat16, float16, float32
from netcl.runtime.ops import layout, linalg, pointwise


class _ThreadState(threading.local):
    """This thread's autocast dtype; the class attribute is the default (None: off), read without the failed
    instance lookup a bare ``threading.local`` pays on every product."""

    dtype: np.dtype | None = None


_local = _ThreadState()
#: devices autocast has warned about (once each)
_WARNED: set = set()


def autocast_dtype() -> np.dtype | None:
    """The low-precision dtype of the active autocast on this thread (None: autocast off)."""
    return getattr(_local, "dtype", None)


def set_autocast_dtype(dtype: np.dtype | None) -> np.dtype | None:
    """Turn autocast on (``dtype``) or off (None) on this thread; returns the previous value."""
    previous = autocast_dtype()
    _local.dtype = None if dtype is None else np.dtype(dtype)
    return previous


def _autocast_device(operands: tuple[Any, ...]) -> tuple[np.dtype, Any] | None:
    """(autocast's dtype, the operands' device) when autocast is on and every operand given is a
    float32 Tensor or a Node of one (a traced Node too: ``jit_compile`` and ``fuse_graph`` trace the
    autocast forms, as eager runs them), else None: the products autocast takes."""
    dtype = autocast_dtype()
    if dtype is None:
        return None
    given = [x for x in operands if x is not None]
    if not given or any(not _float32_operand(x) for x in given):
        return None
    return dtype, given[0].device


def _float32_operand(x: Any) -> bool:
    """Whether ``x`` is a float32 Tensor, or a Node of one (or of a traced float32 value)."""
    if isinstance(x, Node):
        return x.dtype == float32 and (isinstance(x.value, Tensor) or get_tracer() is not None)
    return isinstance(x, Tensor) and x.dtype == float32


def low_dtype_for(*operands: Any, product: str = "matmul") -> np.dtype | None:
    """The dtype the operands' ``product`` ("matmul" or "conv") runs in under autocast, or None
    (autocast off, not all float32, or a device that does not compute in that dtype; bfloat16
    matrix products run on bfloat16 tensors on every device without a ``fallback_precision``)."""
    taken = _autocast_device(operands)
    if taken is None:
        return None
    dtype, device = taken
    if device.computes(dtype):
        return dtype
    if device_fallback_precision(device, product, dtype) is not None:  # ``fallback_precision`` takes these
        return None
    if dtype == bfloat16 and product == "matmul":  # storage-only bfloat16 tensors: the GEMM takes them
        return dtype
    if device not in _WARNED:
        _WARNED.add(device)
        needs = " (cl_khr_fp16)" if dtype == float16 else ""
        ops = "matmul and conv run" if dtype == float16 else "conv2d runs"
        warnings.warn(
            f"autocast: device {device.name!r} has no {dtype} support{needs}; {ops} in float32 "
            "there (autocast does nothing on this device)",
            RuntimeWarning,
            stacklevel=3,
        )
    return None


#: The matmul precision of autocast's matrix products on a device where float16 is storage-only
#: and tensor cores multiply it (NVIDIA's OpenCL): float32 tensors whose operands the kernel rounds
#: to float16 as it loads them (the numbers of float16 operands, without cast kernels), fp32
#: accumulation; forward and gradient products alike.
FALLBACK_PRECISION = "fp16"
#: The same for convolutions, and for matrix products where tensor cores take tf32 but not float16:
#: operands rounded to tf32 (float16's 10-bit mantissa with float32's range; 3x3 layers run
#: Winograd on tf32x3 there, ``conv2d``), fp32 accumulation.
CONV_FALLBACK_PRECISION = "high"
#: ``FALLBACK_PRECISION`` of ``autocast(dtype=bfloat16)``: operands rounded to bf16 in the kernel (bf16 mma).
BF16_FALLBACK_PRECISION = "medium"


def device_fallback_precision(device: Any, product: str = "matmul", dtype: Any = float16) -> str | None:
    """The matmul precision autocast runs ``product`` ("matmul" or "conv") at on ``device`` when the
    device does not compute in ``dtype`` (float16 or bfloat16): ``FALLBACK_PRECISION`` (bfloat16:
    ``BF16_FALLBACK_PRECISION``) for matrix products where tensor cores take it, else
    ``CONV_FALLBACK_PRECISION`` where they take tf32, else None."""
    from netcl.runtime.ops import gemm_mma

    bf16 = np.dtype(dtype) == bfloat16
    if product == "matmul" and gemm_mma.enabled(device, "bf16" if bf16 else "f16"):
        return BF16_FALLBACK_PRECISION if bf16 else FALLBACK_PRECISION
    return CONV_FALLBACK_PRECISION if gemm_mma.enabled(device, "tf32") else None


def fallback_precision(*operands: Any, product: str = "matmul") -> str | None:
    """``device_fallback_precision`` when autocast is on, the operands are float32 and their device
    does not compute in float16 (then the op runs on them at that matmul precision), else None."""
    taken = _autocast_device(operands)
    if taken is None:
        return None
    dtype, device = taken
    return None if device.computes(dtype) else device_fallback_precision(device, product, dtype)


def lower(x: Tensor, dtype: np.dtype) -> Tensor:
    """``x`` rounded to ``dtype`` (itself when it already has it)."""
    return x if x.dtype == dtype else layout.cast(x, dtype)


def _needs(x: Any) -> bool:
    return isinstance(x, Node) and x.requires_grad


def matmul(a: Any, b: Any, dtype: np.dtype) -> Node:
    """``a @ b`` with operands in ``dtype`` and a float32 result (autocast's matmul)."""

    def forward(x: Tensor, y: Tensor) -> Tensor:
        return linalg.matmul(lower(x, dtype), lower(y, dtype), out_dtype=float32)

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        x, y = (lower(v, dtype) for v in values)
        g16 = lower(g, dtype)
        ga = linalg.matmul(g16, y, transpose_b=True, out_dtype=float32) if _needs(a) else None
        gb = linalg.matmul(x, g16, transpose_a=True, out_dtype=float32) if _needs(b) else None
        return [
            None if ga is None else layout.sum_to_shape(ga, values[0].shape),
            None if gb is None else layout.sum_to_shape(gb, values[1].shape),
        ]

    return apply_op(forward, grad, a, b, op_name="matmul_autocast", attrs={"dtype": str(dtype)})


def conv2d(x: Any, w: Any, b: Any, stride: Any, padding: Any, dilation: Any, groups: int, dtype: np.dtype) -> Node:
    """``conv2d`` with x and w in ``dtype`` and a float32 result (autocast's convolution)."""
    from netcl.runtime.ops import conv

    def forward(xv: Tensor, wv: Tensor, bv: Tensor | None = None) -> Tensor:
        out = layout.cast(
            conv.conv2d(lower(xv, dtype), lower(wv, dtype), None, stride, padding, dilation, groups), float32
        )
        return out if bv is None else pointwise.add(out, bv.reshape(1, wv.shape[0], 1, 1))

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        xv, wv = values[0], values[1]
        geo = conv.check_conv2d(xv.shape, wv.shape, None, stride, padding, dilation, groups)
        g16 = lower(g, dtype)
        gx = layout.cast(conv.conv2d_backward_input(g16, lower(wv, dtype), geo, groups), float32) if _needs(x) else None
        gw = (
            layout.cast(conv.conv2d_backward_weight(g16, lower(xv, dtype), wv.shape, geo, groups), float32)
            if _needs(w)
            else None
        )
        if b is None:
            return [gx, gw]
        return [gx, gw, conv.conv2d_backward_bias(g) if _needs(b) else None]

    args = (x, w) if b is None else (x, w, b)
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups, "dtype": str(dtype)}
    return apply_op(forward, grad, *args, op_name="conv2d_autocast", attrs=attrs)
