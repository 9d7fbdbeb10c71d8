"""``matmul``: (M, K) @ (K, N) and batched (..., M, K) @ (..., K, N) with broadcast batch dims.

NumPy's semantics (1-D operands: a vector on the left is a row, on the right a column, and that
dimension is dropped from the result). The product itself is ``gemm`` (``netcl.runtime.ops.gemm``):
tiled, tuned per device, tensor cores for float16 operands and for float32 at precision "high"
or "medium" where the device has them; ``transpose_a`` / ``transpose_b`` multiply by a stored
operand's transpose without a transpose kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import Tensor, broadcast_shapes
from netcl.core.dtypes import is_floating
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime.ops import gemm_cpu, host_blas
from netcl.runtime.ops._common import device_of, float_dtype, promote
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.call_plans import PlanCache, env_reader
from netcl.runtime.ops.gemm import gemm
from netcl.runtime.ops.gemm_source import PLUS_ADDEND, Epilogue
from netcl.runtime.ops.pointwise import add
from netcl.runtime.ops.precision import (
    get_float32_matmul_precision,
    matmul_precision,
    set_float32_matmul_precision,
)

_TWINS = "netcl.runtime.numpy_twins.linalg"

__all__ = [
    "get_float32_matmul_precision",
    "matmul",
    "matmul_precision",
    "matmul_shapes",
    "product",
    "set_float32_matmul_precision",
]


def matmul_shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[tuple, tuple, tuple, tuple]:
    """(a as >= 2-D, b as >= 2-D, batch shape, result shape) for ``a @ b``; ShapeError if they do not fit."""
    if not a_shape or not b_shape:
        raise ShapeError(f"matmul: operands must be at least 1-D, got shapes {a_shape} and {b_shape}")
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    if a2[-1] != b2[-2]:
        raise ShapeError(
            f"matmul: shapes {a_shape} and {b_shape} do not fit: inner dimensions {a2[-1]} and {b2[-2]} differ"
        )
    try:
        batch = broadcast_shapes(a2[:-2], b2[:-2])
    except ShapeError as exc:
        raise ShapeError(f"matmul: batch dimensions of {a_shape} and {b_shape} do not broadcast ({exc})") from None
    out = (*batch, a2[-2], b2[-1])
    if len(a_shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b_shape) == 1:
        out = out[:-1]
    return a2, b2, batch, out


def _product_shapes(a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool) -> tuple[tuple, tuple, tuple, tuple]:
    """``matmul_shapes`` of the operands as the product reads them (a transposed operand's last two axes swapped)."""
    a_shape = (*a.shape[:-2], a.shape[-1], a.shape[-2]) if transpose_a else a.shape
    b_shape = (*b.shape[:-2], b.shape[-1], b.shape[-2]) if transpose_b else b.shape
    return matmul_shapes(a_shape, b_shape)


def product_dtype(a: Tensor, b: Tensor) -> np.dtype:
    """The float dtype of ``a @ b`` (``float_dtype(promote((a, b)))``), without NumPy's promotion for the
    common operands: two of one float dtype."""
    dtype = a.dtype
    if dtype == b.dtype and is_floating(dtype):
        return dtype
    return float_dtype(promote((a, b)))


def matmul(
    a: Tensor,
    b: Tensor,
    *,
    transpose_a: bool = False,
    transpose_b: bool = False,
    precision: str | None = None,
    out_dtype: np.dtype | None = None,
    bias: Tensor | None = None,
    addend: Tensor | None = None,
) -> Tensor:
    """Matrix product with NumPy's ``matmul`` semantics; float result (float32 for integer inputs).

    ``transpose_a`` / ``transpose_b`` use a (>= 2-D) operand's last two axes swapped. ``precision``
    for float32 operands: "highest", "high" (tf32), "medium" (bf16); default
    ``get_float32_matmul_precision()``. ``out_dtype``: e.g. float32 for float16 operands (fp32
    accumulation either way). ``bias``: a float32 ``(N,)`` tensor added to every row of a float32
    result of >= 2-D operands (``torch.addmm``'s broadcast bias), in the product's store.
    ``addend``: a tensor of the result's shape and dtype; the result is ``addend + a @ b`` (BLAS's
    beta = 1), summed in the product's store where one GEMM kernel writes a float32 result (how a
    backward adds a gradient to one already there without a kernel of its own), else by an ``add``.
    """
    if type(a) is Tensor and type(b) is Tensor and out_dtype is None and host_blas.host_memory(a.device):
        key = _cpu_signature(a, b, transpose_a, transpose_b, bias, addend)
        product = _CPU_PRODUCTS.plans.get(key) if key is not None else _ELSEWHERE
        if product is None:  # a signature not seen yet: the full way, which checks it, then its plan kept
            out = _matmul(a, b, transpose_a, transpose_b, precision, out_dtype, bias, addend)
            _CPU_PRODUCTS.keep(key, _cpu_plan(a, b, transpose_a, transpose_b, bias, addend))
            return out
        if product is not _ELSEWHERE:
            return gemm_cpu.run(product, a, b, addend if bias is None else bias)
    return _matmul(a, b, transpose_a, transpose_b, precision, out_dtype, bias, addend)


def product(a: Tensor, b: Tensor) -> Tensor:
    """``matmul(a, b)`` of two Tensors with no options. On a host-memory device a signature ``matmul`` has seen
    launches its kept product at once (under ``_cpu_signature``'s key), without ``matmul``'s keywords and device
    test; every other call is ``matmul(a, b)``."""
    kept = _CPU_PRODUCTS.plans.get(_cpu_signature(a, b, False, False, None, None))
    if kept is None or kept is _ELSEWHERE:
        return matmul(a, b)
    return gemm_cpu.run(kept, a, b)


#: CPU devices' products by signature (``_cpu_signature``): the kernel's prepared ``gemm_cpu.Product``, or
#: ``_ELSEWHERE`` where the product goes another way (the host BLAS, a separate add): what ``matmul`` on a host-memory
#: device decides once per signature instead of on every call
_CPU_PRODUCTS = PlanCache("matmul_cpu")
_ELSEWHERE = object()
#: the environment variables the CPU path's choice reads
_cpu_env = env_reader(host_blas.ENV_VAR, gemm_cpu.ENV_VAR)


def _cpu_signature(a: Tensor, b: Tensor, transpose_a: Any, transpose_b: Any, bias: Any, addend: Any) -> tuple | None:
    """What decides a product on a CPU device besides the operands' device (two Tensors, no ``out_dtype``): their
    shapes and dtypes, the transposes, the extra operand's shape, dtype and device, the environment; None for
    arguments of other types (the call goes the full way)."""
    if type(transpose_a) is not bool or type(transpose_b) is not bool:
        return None
    extra = None
    if bias is not None or addend is not None:
        given = addend if bias is None else bias
        if type(given) is not Tensor or (bias is not None and addend is not None):
            return None
        extra = (bias is None, given.shape, given.dtype, given.device)
    return (a.shape, a.dtype, a.device, b.shape, b.dtype, b.device, transpose_a, transpose_b, extra, _cpu_env())


def _cpu_plan(a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool, bias: Any, addend: Any) -> Any:
    """The ``gemm_cpu.Product`` a checked call on a host-memory device ran (``_kernel_plan``), else ``_ELSEWHERE``."""
    extra = addend if bias is None else bias
    how = _kernel_plan(a, b, transpose_a, transpose_b, extra)
    if how is None:
        return _ELSEWHERE
    epilogue = "none" if extra is None else "addend" if bias is None else "column"
    return gemm_cpu.prepare(a, b, transpose_a, transpose_b, how, epilogue)


def _kernel_plan(
    a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool, extra: Tensor | None
) -> gemm_cpu.Plan | None:
    """How a CPU device's product kernel runs ``a @ b`` of checked operands (float result of their own dtype; an
    extra operand, a bias or an addend, on their device), or None where it does not (``gemm_cpu.plan``)."""
    if not _host_product(a, b, product_dtype(a, b)) or (extra is not None and extra.device != a.device):
        return None
    return gemm_cpu.plan(a, b, transpose_a, transpose_b)


def _matmul(
    a: Tensor,
    b: Tensor,
    transpose_a: bool,
    transpose_b: bool,
    precision: str | None,
    out_dtype: np.dtype | None,
    bias: Tensor | None,
    addend: Tensor | None,
) -> Tensor:
    """``matmul``'s full way: every check, then the product where the device and operands send it."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected two Tensors, got {type(a).__name__} and {type(b).__name__}")
    if (transpose_a and a.ndim < 2) or (transpose_b and b.ndim < 2):
        raise ShapeError(f"matmul: a transposed operand must be at least 2-D, got shapes {a.shape} and {b.shape}")
    if addend is not None:
        return _matmul_addend(a, b, addend, transpose_a, transpose_b, precision, out_dtype, bias)
    if bias is not None:
        return _matmul_bias(a, b, bias, transpose_a, transpose_b, precision, out_dtype)
    if out_dtype is None and _host_product(a, b, product_dtype(a, b)):
        # CPU OpenCL: a kernel shaped for CPUs where gemm_cpu takes the product (no host wait), else NumPy's BLAS on
        # the mapped buffers (transposes are free views there); matmul_shapes checks the shapes for both
        out_shape = _product_shapes(a, b, transpose_a, transpose_b)[3]
        how = _kernel_plan(a, b, transpose_a, transpose_b, None)
        if how is not None:
            return gemm_cpu.matmul(a, b, transpose_a, transpose_b, how)
        return host_blas.matmul(a, b, out_shape, a.dtype, transpose_a=transpose_a, transpose_b=transpose_b)
    if a.ndim >= 2 and b.ndim >= 2:
        return gemm(a, b, trans_a=transpose_a, trans_b=transpose_b, out_dtype=out_dtype, precision=precision)
    _, _, _, out_shape = matmul_shapes(a.shape, b.shape)
    a2 = a.reshape(1, *a.shape) if a.ndim == 1 else a
    b2 = b.reshape(*b.shape, 1) if b.ndim == 1 else b
    result = gemm(a2, b2, trans_a=transpose_a, trans_b=transpose_b, out_dtype=out_dtype, precision=precision)
    return result.reshape(out_shape)


#: the store of a product with a bias: ``acc + bias[column]``
COL_BIAS = Epilogue(bias="col")


def _matmul_addend(a, b, addend, transpose_a, transpose_b, precision, out_dtype, bias) -> Tensor:
    """``addend + matmul(a, b)``: in the GEMM's store where it runs one writing float32, else an ``add``
    (both round the one float sum the same way, so the result's bits do not depend on the path)."""
    if bias is not None:
        raise ValueError("matmul: bias= and addend= together are not supported; add the bias to the addend")
    if not isinstance(addend, Tensor):
        raise TypeError(f"matmul: addend must be a Tensor, got {type(addend).__name__}")
    a2, _, _, out_shape = _product_shapes(a, b, transpose_a, transpose_b)
    result = np.dtype(out_dtype) if out_dtype is not None else product_dtype(a, b)
    if tuple(addend.shape) != tuple(out_shape):
        raise ShapeError(f"matmul: addend must have the result's shape {tuple(out_shape)}, got {tuple(addend.shape)}")
    if addend.dtype != result:
        raise DTypeError(f"matmul: addend must have the result's dtype {result}, got {addend.dtype}")
    device_of((a, b, addend), "matmul")  # one device (DeviceError naming both otherwise)
    return add_product(a, b, addend, transpose_a, transpose_b, precision, out_dtype, result, a2)


@backend_op(_TWINS, device_arg="addend")
def add_product(
    a: Tensor,
    b: Tensor,
    addend: Tensor,
    transpose_a: bool,
    transpose_b: bool,
    precision: str | None,
    out_dtype: np.dtype | None,
    result: np.dtype,
    a2: tuple[int, ...],
) -> Tensor:
    """``_matmul_addend`` of a checked call (``result``: the product's dtype, ``a2``: a's shape as >= 2-D)."""
    host = _host_product(a, b, result)
    folds = result == np.float32 and a.ndim >= 2 and b.ndim >= 2 and a2[-1] > 0 and addend.size > 0 and not host
    if not folds:
        how = _kernel_plan(a, b, transpose_a, transpose_b, addend) if host and out_dtype is None else None
        if how is not None:  # a CPU product kernel adds it in its store
            return gemm_cpu.matmul(a, b, transpose_a, transpose_b, how, addend, "addend")
        return add(
            matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b, precision=precision, out_dtype=out_dtype),
            addend,
        )
    return gemm(
        a,
        b,
        trans_a=transpose_a,
        trans_b=transpose_b,
        out_dtype=out_dtype,
        precision=precision,
        epilogue=PLUS_ADDEND,
        epilogue_args=(addend,),
    )


def product_plus_rows(a: Tensor, b: Tensor, bias: Tensor) -> Tensor | None:
    """``a @ b`` with ``bias[i]`` added to row i of every product (a convolution's per-channel bias on ``w @ columns``)
    in the store of a CPU device's product kernel (``gemm_cpu``), or None where no such kernel takes the product (the
    caller then adds the bias itself: the same bits)."""
    if a.ndim < 2 or b.ndim < 2 or bias.dtype != np.float32 or bias.shape != (a.shape[-2],) or bias.device != a.device:
        return None
    how = gemm_cpu.plan(a, b, False, False) if _host_product(a, b, product_dtype(a, b)) else None
    return None if how is None else gemm_cpu.matmul(a, b, False, False, how, bias, "row")


def _host_product(a: Tensor, b: Tensor, result: np.dtype) -> bool:
    """Whether ``a @ b`` of ``result`` dtype is a CPU device's product (``gemm_cpu``'s kernels or ``host_blas``):
    ``host_blas.host_memory`` first, cached, so GPUs skip the host-BLAS checks at no cost per call."""
    return host_blas.host_memory(a.device) and host_blas.applies(device_of((a, b), "matmul"), a, b, result)


def _matmul_bias(a, b, bias, transpose_a, transpose_b, precision, out_dtype) -> Tensor:
    """``matmul(a, b) + bias`` (a (N,) row added to each row): in the GEMM's store where it runs one."""
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"matmul: a bias needs operands of at least 2-D, got shapes {a.shape} and {b.shape}")
    _product_shapes(a, b, transpose_a, transpose_b)  # ShapeError before any launch (the CPU kernels trust them)
    if not isinstance(bias, Tensor):
        raise TypeError(f"matmul: bias must be a float32 Tensor, got {type(bias).__name__}")
    if bias.dtype != np.float32:
        raise DTypeError(f"matmul: bias must be float32, got {bias.dtype}")
    n = b.shape[-2] if transpose_b else b.shape[-1]
    if bias.shape != (n,):
        raise ShapeError(f"matmul: bias must have shape ({n},) for a product with {n} columns, got {bias.shape}")
    result = np.dtype(out_dtype) if out_dtype is not None else product_dtype(a, b)
    if result != np.float32:
        raise DTypeError(f"matmul: a bias needs a float32 result, got {result}")
    if _host_product(a, b, result):
        how = _kernel_plan(a, b, transpose_a, transpose_b, bias)
        if how is not None:  # a CPU product kernel adds it in its store
            return gemm_cpu.matmul(a, b, transpose_a, transpose_b, how, bias, "column")
        out = matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b, out_dtype=out_dtype)
        return add(out, bias)
    return gemm(
        a,
        b,
        trans_a=transpose_a,
        trans_b=transpose_b,
        out_dtype=out_dtype,
        precision=precision,
        epilogue=COL_BIAS,
        bias=bias,
    )
