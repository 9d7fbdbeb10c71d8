"""``gemm``: the one matrix-product entry point behind ``matmul`` and its gradients.

``gemm(a, b, trans_a=..., trans_b=...)`` computes ``op(a) @ op(b)`` over broadcast batch dims,
where ``op(x)`` swaps x's last two axes when its flag is set, WITHOUT a transpose kernel: the
kernel reads the stored layout directly (NN, NT, TN and TT variants), which is what the backward
of ``matmul`` needs (``g @ w.T``, ``x.T @ g``).

Planning (all on the host, nothing here changes the program unless the layout class changes):
batch dims of both operands are merged into at most three (size, stride) dims, a stride 0 being
a broadcast; a batched ``x @ w`` with a 2-D ``w`` folds the batch into M; an output with too few
blocks to fill the device is split along K into a float32 workspace that ``sum`` reduces (and where
the product has an epilogue, the sum kernel applies it: the partial products are raw). The
tile shape comes from ``netcl.runtime.tune`` (searched per device at first use, or defaults).
Float32 products run on tensor cores (``gemm_mma``) when the precision asks for it and the device
passed the probe; float16 operands always do there. Everything else runs the portable kernel.
The launch plans themselves (``Problem``, ``Plan``, the split along K) are built in ``gemm_plan``,
the module under this one, ``gemm_mma`` and ``gemm_configs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from netcl.core import Device, Tensor, broadcast_shapes, same_device
from netcl.core.dtypes import float32, float64, is_floating
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime.numpy_twins.gemm import apply_epilogue
from netcl.runtime.ops import gemm_configs, gemm_mma
from netcl.runtime.ops._common import device_of, float_dtype, promote, remember
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.gemm_plan import Problem, make_plan, with_alignment
from netcl.runtime.ops.gemm_source import IDENTITY, Epilogue, GemmConfig
from netcl.runtime.ops.layout import broadcast_to, cast
from netcl.runtime.ops.pointwise import fill_
from netcl.runtime.ops.precision import resolve_precision

_TWINS = "netcl.runtime.numpy_twins.gemm"


def operand_dims(a_shape, b_shape, trans_a: bool, trans_b: bool) -> tuple[int, int, int, tuple[int, ...]]:
    """(M, N, K, batch shape) of ``op(a) @ op(b)``; ShapeError naming both shapes if they do not fit."""
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise ShapeError(f"gemm: operands must be at least 2-D, got shapes {a_shape} and {b_shape}")
    m, ka = (a_shape[-1], a_shape[-2]) if trans_a else (a_shape[-2], a_shape[-1])
    kb, n = (b_shape[-1], b_shape[-2]) if trans_b else (b_shape[-2], b_shape[-1])
    if ka != kb:
        raise ShapeError(
            f"matmul: shapes {a_shape}{'.T' if trans_a else ''} and {b_shape}{'.T' if trans_b else ''} do not fit: "
            f"inner dimensions {ka} and {kb} differ"
        )
    try:
        batch = broadcast_shapes(a_shape[:-2], b_shape[:-2])
    except ShapeError as exc:
        raise ShapeError(f"matmul: batch dimensions of {a_shape} and {b_shape} do not broadcast ({exc})") from None
    return m, n, ka, batch


def merge_batch(a_batch, b_batch, batch, a_mat: int, b_mat: int) -> list[tuple[int, int, int]]:
    """(size, a stride, b stride) per merged batch dim; broadcast dims get stride 0."""
    nd = len(batch)
    a_b = (1,) * (nd - len(a_batch)) + tuple(a_batch)
    b_b = (1,) * (nd - len(b_batch)) + tuple(b_batch)
    a_strides, b_strides = [0] * nd, [0] * nd
    sa, sb = a_mat, b_mat
    for d in range(nd - 1, -1, -1):
        a_strides[d] = sa if a_b[d] != 1 else 0
        b_strides[d] = sb if b_b[d] != 1 else 0
        sa *= a_b[d]
        sb *= b_b[d]
    dims: list[tuple[int, int, int]] = []
    for d in range(nd):
        if batch[d] == 1:
            continue
        size, sa_d, sb_d = batch[d], a_strides[d], b_strides[d]
        if dims:
            psize, psa, psb = dims[-1]
            if psa == sa_d * size and psb == sb_d * size:
                dims[-1] = (psize * size, sa_d, sb_d)
                continue
        dims.append((size, sa_d, sb_d))
    return dims


_PLANS: dict = {}


def gemm(
    a: Tensor,
    b: Tensor,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    out_dtype: np.dtype | None = None,
    precision: str | None = None,
    epilogue: Epilogue = IDENTITY,
    bias: Tensor | None = None,
    epilogue_args: Sequence[Tensor | float] = (),
) -> Tensor:
    """``act(op(a) @ op(b) + bias)`` with broadcast batch dims; see the module docstring.

    A code epilogue (``Epilogue.code``, OpenCL devices only) reads and writes ``epilogue_args``, one
    per ``Epilogue.operands`` kind: float32 Tensors of C's shape ("full", "out"), of N or of the
    flattened rows of C ("col", "row"), and floats ("scalar").

    ``precision`` (float32 operands): "highest" (fp32 FMA), "high" (tf32 tensor cores), "medium"
    (bf16 tensor cores); None means ``get_float32_matmul_precision()``. Devices without tensor
    cores compute in fp32 whatever is asked. ``out_dtype`` defaults to the promoted float dtype.
    A repeated call with the same shapes, dtypes and options reuses its launch plan.
    """
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected two Tensors, got {type(a).__name__} and {type(b).__name__}")
    precision = resolve_precision(precision)
    device = a.device
    key = (
        device,
        a.shape,
        b.shape,
        a.dtype,
        b.dtype,
        trans_a,
        trans_b,
        out_dtype,
        precision,
        None if epilogue is IDENTITY else epilogue,
        None if bias is None else (bias.shape, bias.dtype, bias.device),
    )
    plan = _PLANS.get(key)
    if plan is not None and b.device is device:
        if epilogue_args or epilogue.operands:
            _check_epilogue_args(epilogue, epilogue_args, plan.out_shape, device)
        return plan.run(a, b, bias, extras=epilogue_args)
    device = device_of((a, b) if bias is None else (a, b, bias), "matmul")
    m, n, k, batch = operand_dims(a.shape, b.shape, trans_a, trans_b)
    result = np.dtype(out_dtype) if out_dtype is not None else float_dtype(promote((a, b)))
    if not is_floating(result):
        raise DTypeError(f"matmul: out_dtype must be a float dtype, got {result}")
    device.check_dtype(result)
    _check_epilogue(epilogue, bias, m, n)
    out_shape = (*batch, m, n)
    _check_epilogue_args(epilogue, epilogue_args, out_shape, device)
    return product(
        a, b, trans_a, trans_b, m, n, k, batch, out_shape, result, precision, epilogue, bias, epilogue_args, key
    )


@backend_op(_TWINS, device_arg="a")
def product(
    a: Tensor,
    b: Tensor,
    trans_a: bool,
    trans_b: bool,
    m: int,
    n: int,
    k: int,
    batch: tuple[int, ...],
    out_shape: tuple[int, ...],
    result: np.dtype,
    precision: str,
    epilogue: Epilogue,
    bias: Tensor | None,
    epilogue_args: Sequence[Tensor | float],
    key: tuple,
) -> Tensor:
    """``gemm`` of a checked call: ``op(a) @ op(b)`` (M x K by K x N over ``batch``) into ``result``,
    its launch plan remembered under ``key``."""
    device = a.device
    plan = _plan_cl(device, a, b, trans_a, trans_b, m, n, k, batch, out_shape, result, precision, epilogue)
    if plan is None:  # rare layouts (casts, materialized broadcasts, empty): no plan, the general path
        return _gemm_general(
            device, a, b, trans_a, trans_b, m, n, k, batch, out_shape, result, precision, epilogue, bias, epilogue_args
        )
    remember(_PLANS, key, plan)
    return plan.run(a, b, bias, extras=epilogue_args)


def _check_epilogue(epilogue: Epilogue, bias: Tensor | None, m: int, n: int) -> None:
    if epilogue.bias == "none":
        if bias is not None:
            raise ValueError("matmul: a bias was given but the epilogue has bias='none'")
        return
    want = n if epilogue.bias == "col" else m
    if bias is None or bias.size != want:
        got = None if bias is None else bias.shape
        raise ShapeError(f"matmul: epilogue bias ({epilogue.bias}) needs {want} values, got {got}")
    if bias.dtype != float32:
        raise DTypeError(f"matmul: epilogue bias must be float32, got {bias.dtype}")


def _check_epilogue_args(epilogue: Epilogue, args: Sequence, out_shape: tuple[int, ...], device: Device) -> None:
    if len(args) != len(epilogue.operands):
        raise ValueError(f"matmul: the epilogue has {len(epilogue.operands)} operands, got {len(args)} arguments")
    rows = math.prod(out_shape[:-1])
    want = {"full": math.prod(out_shape), "out": math.prod(out_shape), "col": out_shape[-1], "row": rows}
    for k, (kind, arg) in enumerate(zip(epilogue.operands, args, strict=True)):
        if kind == "scalar":
            if isinstance(arg, Tensor) or not isinstance(arg, (int, float, np.floating, np.integer)):
                raise TypeError(
                    f"matmul: epilogue operand {k} (scalar) must be a real number, got {type(arg).__name__}"
                )
            continue
        if not isinstance(arg, Tensor) or arg.dtype != float32 or arg.size != want[kind]:
            got = (arg.shape, arg.dtype) if isinstance(arg, Tensor) else type(arg).__name__
            raise ShapeError(
                f"matmul: epilogue operand {k} ({kind}) must be a float32 Tensor of {want[kind]} values, got {got}"
            )
        if arg.device is not device:
            same_device(device, arg.device)


def _problem(a_shape, b_shape, trans_a, trans_b, m, n, k, batch) -> Problem | None:
    dims = merge_batch(a_shape[:-2], b_shape[:-2], batch, m * k, k * n)
    if len(dims) > 3:
        return None
    if len(dims) == 1 and not trans_a and dims[0][2] == 0 and dims[0][1] == m * k:
        m, dims = m * dims[0][0], []  # x (B, M, K) @ w (K, N): one (B*M, K) @ (K, N) product
    return Problem(m, n, k, trans_a, trans_b, tuple(dims))


def _plan_cl(device, a, b, trans_a, trans_b, m, n, k, batch, out_shape, result, precision, epilogue):
    """The launch plan of a product that needs no operand casts or materialized broadcasts, else None."""
    if math.prod(out_shape) == 0 or k == 0:
        return None
    mode = gemm_mma.mode_for(device, a.dtype, b.dtype, precision)
    if mode is None and (a.dtype != b.dtype or not is_floating(a.dtype) or (result == float64) != (a.dtype == float64)):
        return None
    problem = _problem(a.shape, b.shape, trans_a, trans_b, m, n, k, batch)
    if problem is None:
        return None
    if mode is not None:
        return gemm_mma.make_plan(device, mode, a.dtype, b.dtype, result, out_shape, problem, epilogue)
    return make_plan(
        device, a.dtype, result, out_shape, problem, epilogue, cfg=portable_config(device, problem, a.dtype, epilogue)
    )


def _gemm_general(
    device, a, b, trans_a, trans_b, m, n, k, batch, out_shape, result, precision, epilogue, bias, epilogue_args=()
):
    """Empty products, K == 0, operand casts and broadcasts that merging cannot express."""
    out = Tensor.empty(out_shape, result, device)
    if out.size == 0:
        return out
    if k == 0:
        if epilogue.code:
            raise ValueError("matmul: a code epilogue needs an inner dimension K > 0")
        return _epilogue_on_zero(fill_(out, 0), epilogue, bias)
    compute = float64 if float64 in (a.dtype, b.dtype, result) else float32
    a, b = _as_dtype(a, compute), _as_dtype(b, compute)
    if _problem(a.shape, b.shape, trans_a, trans_b, m, n, k, batch) is None:
        a = broadcast_to(a, (*batch, *a.shape[-2:]))
        b = broadcast_to(b, (*batch, *b.shape[-2:]))
    return gemm(
        a,
        b,
        trans_a=trans_a,
        trans_b=trans_b,
        out_dtype=result,
        precision=precision,
        epilogue=epilogue,
        bias=bias,
        epilogue_args=epilogue_args,
    )


def _as_dtype(x: Tensor, dtype: np.dtype) -> Tensor:
    return x if x.dtype == dtype else cast(x, dtype)


def _epilogue_on_zero(out: Tensor, epilogue: Epilogue, bias: Tensor | None) -> Tensor:
    """K == 0: the product is zero; the epilogue still applies (bias, activation)."""
    if epilogue.is_identity:
        return out
    values = apply_epilogue(np.zeros(out.shape, np.float32), epilogue, None if bias is None else bias.to_host())
    return Tensor.from_host(out.device, values.astype(out.dtype))


def portable_config(device: Device, problem: Problem, dtype: np.dtype, epilogue: Epilogue = IDENTITY) -> GemmConfig:
    """The tuned (or default) config for ``problem`` with ``epilogue``, with vector widths the operands'
    alignment allows."""
    return with_alignment(gemm_configs.portable(device, problem, dtype, epilogue), problem)
