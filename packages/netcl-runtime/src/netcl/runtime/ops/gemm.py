"""``gemm``: the one matrix-product entry point behind ``matmul`` and its gradients.

``gemm(a, b, trans_a=..., trans_b=...)`` computes ``op(a) @ op(b)`` over broadcast batch dims,
where ``op(x)`` swaps x's last two axes when its flag is set, WITHOUT a transpose kernel: the
kernel reads the stored layout directly (NN, NT, TN and TT variants), which is what the backward
of ``matmul`` needs (``g @ w.T``, ``x.T @ g``).

Planning (all on the host, nothing here changes the program unless the layout class changes):
batch dims of both operands are merged into at most three (size, stride) dims, a stride 0 being
a broadcast; a batched ``x @ w`` with a 2-D ``w`` folds the batch into M; an output with too few
blocks to fill the device is split along K into a float32 workspace that ``sum`` reduces. The
tile shape comes from ``netcl.runtime.tune`` (searched per device at first use, or defaults).
Float32 products run on tensor cores (``gemm_mma``) when the precision asks for it and the device
passed the probe; float16 operands always do there. Everything else runs the portable kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from netcl.core import Device, Tensor, broadcast_shapes
from netcl.core.dtypes import float32, float64
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime.launch import launch
from netcl.runtime.ops import numpy_backend
from netcl.runtime.ops import precision as _precision
from netcl.runtime.ops._common import device_of, float_dtype, get_kernel, promote
from netcl.runtime.ops.gemm_source import IDENTITY, Epilogue, GemmConfig, portable_source
from netcl.runtime.ops.layout import broadcast_to, cast
from netcl.runtime.ops.pointwise import fill_
from netcl.runtime.ops.reduce import sum as reduce_sum

_I32, _I64 = np.dtype(np.int32), np.dtype(np.int64)
#: Scalar argument dtypes of ``netcl_gemm`` (None: a buffer), see ``gemm_source``.
ARG_DTYPES = [_I32, _I32, _I32, None, _I32, None, _I32, None, _I32, _I32, _I32] + [_I64] * 7 + [_I32, _I32, _I64]
#: A split along K keeps each chunk at least this long.
MIN_SPLIT_CHUNK = 256
MAX_SPLITS = 64


@dataclass(frozen=True)
class Problem:
    """One product after batch merging: ``dims`` are (size, a stride, b stride), outermost first."""

    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    dims: tuple[tuple[int, int, int], ...]

    @property
    def batch(self) -> int:
        return math.prod(d[0] for d in self.dims)

    @property
    def lda(self) -> int:
        return self.m if self.trans_a else self.k

    @property
    def ldb(self) -> int:
        return self.k if self.trans_b else self.n


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
) -> Tensor:
    """``act(op(a) @ op(b) + bias)`` with broadcast batch dims; see the module docstring.

    ``precision`` (float32 operands): "highest" (fp32 FMA), "high" (tf32 tensor cores), "medium"
    (bf16 tensor cores); None means ``get_float32_matmul_precision()``. Devices without tensor
    cores compute in fp32 whatever is asked. ``out_dtype`` defaults to the promoted float dtype.
    """
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected two Tensors, got {type(a).__name__} and {type(b).__name__}")
    device = device_of((a, b) if bias is None else (a, b, bias), "matmul")
    m, n, k, batch = operand_dims(a.shape, b.shape, trans_a, trans_b)
    precision = _precision.resolve(precision)
    result = np.dtype(out_dtype) if out_dtype is not None else float_dtype(promote((a, b)))
    if result.kind != "f":
        raise DTypeError(f"matmul: out_dtype must be a float dtype, got {result}")
    device.check_dtype(result)
    _check_epilogue(epilogue, bias, m, n)
    out_shape = (*batch, m, n)
    if device.kind == "cpu":
        return numpy_backend.gemm(a, b, trans_a, trans_b, result, epilogue, bias)
    return _gemm_cl(device, a, b, trans_a, trans_b, m, n, k, batch, out_shape, result, precision, epilogue, bias)


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


def _gemm_cl(device, a, b, trans_a, trans_b, m, n, k, batch, out_shape, result, precision, epilogue, bias):
    out = Tensor.empty(out_shape, result, device)
    if out.size == 0:
        return out
    if k == 0:
        return _epilogue_on_zero(fill_(out, 0), epilogue, bias)
    from netcl.runtime.ops import gemm_mma

    mode = gemm_mma.mode_for(device, a.dtype, b.dtype, precision)
    if mode is None:  # portable kernel: one storage dtype for both operands, float
        compute = float64 if float64 in (a.dtype, b.dtype, result) else float32
        if a.dtype != b.dtype or a.dtype.kind != "f":
            a, b = _as_dtype(a, compute), _as_dtype(b, compute)
    dims = merge_batch(a.shape[:-2], b.shape[:-2], batch, m * k, k * n)
    if len(dims) > 3:  # an interleaving of broadcast dims merging cannot collapse: materialize
        a = broadcast_to(a, (*batch, *a.shape[-2:]))
        b = broadcast_to(b, (*batch, *b.shape[-2:]))
        dims = merge_batch(batch, batch, batch, m * k, k * n)
    if len(dims) == 1 and not trans_a and dims[0][2] == 0 and dims[0][1] == m * k:
        m, dims = m * dims[0][0], []  # x (B, M, K) @ w (K, N): one (B*M, K) @ (K, N) product
    problem = Problem(m, n, k, trans_a, trans_b, tuple(dims))
    if mode is not None:
        return gemm_mma.run(device, mode, a, b, out, problem, epilogue, bias)
    return run_portable(device, a, b, out, problem, epilogue, bias)


def _as_dtype(x: Tensor, dtype: np.dtype) -> Tensor:
    return x if x.dtype == dtype else cast(x, dtype)


def _epilogue_on_zero(out: Tensor, epilogue: Epilogue, bias: Tensor | None) -> Tensor:
    """K == 0: the product is zero; the epilogue still applies (bias, activation)."""
    if epilogue.is_identity:
        return out
    values = numpy_backend.apply_epilogue(
        np.zeros(out.shape, np.float32), epilogue, None if bias is None else bias.to_host()
    )
    return Tensor.from_host(out.device, values.astype(out.dtype))


def split_count(problem: Problem, block_m: int, block_n: int, bk: int, device: Device) -> tuple[int, int]:
    """(splits, chunk) along K: enough blocks to fill the device, chunks of >= MIN_SPLIT_CHUNK."""
    blocks = -(-problem.m // block_m) * -(-problem.n // block_n) * problem.batch
    target = 2 * max(1, device.cl_device.max_compute_units)
    if blocks >= target or problem.k < 2 * MIN_SPLIT_CHUNK:
        return 1, problem.k
    splits = min(-(-target // blocks), problem.k // MIN_SPLIT_CHUNK, MAX_SPLITS)
    per_split = -(-problem.k // splits)
    chunk = -(-per_split // bk) * bk
    return -(-problem.k // chunk), chunk


def _vector_width(wanted: int, leading: int, strides: list[int]) -> int:
    """The widest of wanted, 2, 1 that divides the leading dimension and every batch stride."""
    for width in (wanted, 2, 1):
        if width <= wanted and leading % width == 0 and all(s % width == 0 for s in strides):
            return width
    return 1


def portable_config(device: Device, problem: Problem, dtype: np.dtype) -> GemmConfig:
    """The tuned (or default) config, with vector widths the operands' alignment allows."""
    from netcl.runtime.ops import gemm_configs

    return with_alignment(gemm_configs.portable(device, problem, dtype), problem)


def with_alignment(cfg: GemmConfig, problem: Problem) -> GemmConfig:
    """``cfg`` with its global vector widths narrowed to what the leading dims and strides allow."""
    va = _vector_width(cfg.va, problem.lda, [d[1] for d in problem.dims])
    vb = _vector_width(cfg.vb, problem.ldb, [d[2] for d in problem.dims])
    return cfg if (va, vb) == (cfg.va, cfg.vb) else replace(cfg, va=va, vb=vb)


def run_portable(
    device: Device,
    a: Tensor,
    b: Tensor,
    out: Tensor,
    problem: Problem,
    epilogue: Epilogue = IDENTITY,
    bias: Tensor | None = None,
    cfg: GemmConfig | None = None,
) -> Tensor:
    """Launch the portable kernel for ``problem`` (``cfg`` forces a config: the tuner's trials)."""
    if cfg is None:
        cfg = portable_config(device, problem, a.dtype)
    splits, chunk = 1, problem.k
    if epilogue.is_identity:
        splits, chunk = split_count(problem, cfg.bm, cfg.bn, cfg.bk, device)
    target = out
    if splits > 1:
        target = Tensor.empty((splits, *out.shape), float64 if out.dtype == float64 else float32, device)
    launch_kernel(device, cfg, a, b, target, problem, splits, chunk, epilogue, bias)
    if splits > 1:
        summed = reduce_sum(target, axis=0)
        return summed if summed.dtype == out.dtype else cast(summed, out.dtype)
    return out


def launch_kernel(device, cfg, a, b, c, problem, splits, chunk, epilogue, bias) -> None:
    """One launch of ``netcl_gemm`` (portable) writing ``c`` (or its split workspace)."""
    m, n = problem.m, problem.n
    big = max(m * problem.lda, problem.k * problem.lda, n * problem.ldb, problem.k * problem.ldb, m * n) >= 2**31
    idx = "long" if big else "int"
    key = ("gemm", cfg, problem.trans_a, problem.trans_b, a.dtype.str, b.dtype.str, c.dtype.str, idx, epilogue)

    def source() -> str:
        return portable_source(cfg, problem.trans_a, problem.trans_b, a.dtype, b.dtype, c.dtype, idx, epilogue)

    args = ARG_DTYPES + ([None] if bias is not None else [])
    kernel = get_kernel(key, device, source, "netcl_gemm", args).kernel
    dims = [(1, 0, 0)] * (3 - len(problem.dims)) + list(problem.dims)
    batch = problem.batch
    gsize = (-(-n // cfg.bn) * cfg.wgn, -(-m // cfg.bm) * cfg.wgm, batch * splits)
    extra = (bias,) if bias is not None else ()
    launch(
        kernel,
        gsize,
        (cfg.wgn, cfg.wgm, 1),
        m,
        n,
        problem.k,
        a,
        problem.lda,
        b,
        problem.ldb,
        c,
        n,
        dims[1][0],
        dims[2][0],
        dims[0][1],
        dims[1][1],
        dims[2][1],
        dims[0][2],
        dims[1][2],
        dims[2][2],
        m * n,
        splits,
        chunk,
        batch * m * n,
        *extra,
        queue=device.queue,
    )
