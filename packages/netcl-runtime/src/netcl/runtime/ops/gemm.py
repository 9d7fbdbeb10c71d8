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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from netcl.core import Device, Tensor, broadcast_shapes, same_device
from netcl.core.dtypes import float16, float32, float64
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime import capture as _capture
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.numpy_twins.gemm import apply_epilogue
from netcl.runtime.ops import precision as _precision
from netcl.runtime.ops._common import (
    device_of,
    float_dtype,
    get_kernel,
    promote,
    remember,
    storage_ctype,
    storage_pragmas,
)
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.gemm_source import IDENTITY, Epilogue, GemmConfig, portable_source
from netcl.runtime.ops.layout import broadcast_to, cast
from netcl.runtime.ops.pointwise import fill_

_I32, _I64 = np.dtype(np.int32), np.dtype(np.int64)
#: Scalar argument dtypes of ``netcl_gemm`` (None: a buffer), see ``gemm_source``.
ARG_DTYPES = [_I32, _I32, _I32, None, _I32, None, _I32, None, _I32, _I32, _I32] + [_I64] * 7 + [_I32, _I32, _I64]
_TWINS = "netcl.runtime.numpy_twins.gemm"
#: A split along K keeps each chunk at least this long.
MIN_SPLIT_CHUNK = 256
MAX_SPLITS = 256


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

    @property
    def operand_sizes(self) -> tuple[int, int]:
        """Elements A and B span (the batch strides included): what scratch operands of a trial need."""
        a = self.m * self.k + sum((d[0] - 1) * d[1] for d in self.dims)
        b = self.k * self.n + sum((d[0] - 1) * d[2] for d in self.dims)
        return a, b


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
    precision = _precision.resolve(precision)
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
    if result.kind != "f":
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
    if not _capture.RECORDING:  # a plan made while tuning was off for a capture is not kept
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
    from netcl.runtime.ops import gemm_mma

    mode = gemm_mma.mode_for(device, a.dtype, b.dtype, precision)
    if mode is None and (a.dtype != b.dtype or a.dtype.kind != "f" or (result == float64) != (a.dtype == float64)):
        return None
    problem = _problem(a.shape, b.shape, trans_a, trans_b, m, n, k, batch)
    if problem is None:
        return None
    if mode is not None:
        return gemm_mma.make_plan(device, mode, a.dtype, b.dtype, result, out_shape, problem, epilogue)
    return make_plan(device, a.dtype, result, out_shape, problem, epilogue)


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


def split_count(
    problem: Problem, block_m: int, block_n: int, bk: int, device: Device, factor: int = 1
) -> tuple[int, int]:
    """(splits, chunk) along K: about ``2 * factor`` blocks per compute unit, chunks of >= MIN_SPLIT_CHUNK."""
    blocks = -(-problem.m // block_m) * -(-problem.n // block_n) * problem.batch
    target = 2 * factor * max(1, device.cl_device.max_compute_units)
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


class Plan:
    """Everything one product launches, resolved once: kernel, sizes, scalar arguments, split-K sum."""

    __slots__ = (
        "device",
        "kernel",
        "gsize",
        "lsize",
        "args",
        "out_shape",
        "out_dtype",
        "work",
        "sum_kernel",
        "sum_args",
        "_product",
        "_sum",
    )

    def __init__(self, device, kernel, gsize, lsize, args, out_shape, out_dtype, work, sum_kernel, sum_args):
        self.device, self.kernel, self.gsize, self.lsize, self.args = device, kernel, gsize, lsize, args
        self.out_shape, self.out_dtype, self.work = out_shape, out_dtype, work
        self.sum_kernel, self.sum_args = sum_kernel, sum_args
        #: prepared launches of the product and of the split sum, made at the first run
        self._product: PreparedLaunch | None = None
        self._sum: PreparedLaunch | None = None

    def run(
        self, a: Tensor, b: Tensor, bias: Tensor | None = None, out: Tensor | None = None, extras: Sequence = ()
    ) -> Tensor:
        """``out`` (a new tensor when None) = the product of ``a`` and ``b`` with the plan's epilogue.

        Launches are prepared once per plan (the scalar arguments set on a private kernel), so a call
        sets only its buffers (and an epilogue's scalars) and enqueues: a small product's host cost.
        """
        device = self.device
        if out is None:
            out = Tensor.empty(self.out_shape, self.out_dtype, device)
        target = out if self.work is None else Tensor.empty(self.work[0], self.work[1], device)
        tail = [] if bias is None else [bias.data]
        if extras:
            tail += [x.data if isinstance(x, Tensor) else np.float32(x) for x in extras]
        if self._product is None:
            self._prepare()
        if self.work is None:  # one kernel: it applies the epilogue
            self._product.call(a.data, b.data, target.data, *tail)
        else:  # split along K: raw partial products, then their sum applies the epilogue
            self._product.call(a.data, b.data, target.data)
            self._sum.call(target.data, out.data, *tail)
        return out

    def _prepare(self) -> None:
        """The prepared launches: the scalar arguments set once; per call the buffers, then the
        epilogue's operands (bias, extras) after the fixed arguments."""
        queue = self.device.queue
        scalars = {i: v for i, v in enumerate(self.args) if v is not None}
        self._product = PreparedLaunch.binding(self.kernel, self.gsize, self.lsize, scalars, queue)
        if self.work is not None:
            total, splits, gsize, sizes = self.sum_args
            scalars = dict(enumerate([total, splits, *sizes], start=2))
            self._sum = PreparedLaunch.binding(self.sum_kernel, gsize, 256, scalars, queue)


def gemm_args(problem: Problem, splits: int, chunk: int) -> list:
    """Scalar arguments of ``netcl_gemm`` (buffers as None placeholders at 3, 5, 7)."""
    m, n = problem.m, problem.n
    dims = [(1, 0, 0)] * (3 - len(problem.dims)) + list(problem.dims)
    return [
        m, n, problem.k, None, problem.lda, None, problem.ldb, None, n,
        dims[1][0], dims[2][0], dims[0][1], dims[1][1], dims[2][1], dims[0][2], dims[1][2], dims[2][2],
        m * n, splits, chunk, problem.batch * m * n,
    ]  # fmt: skip


def index_kind(problem: Problem) -> str:
    p = problem
    return "long" if max(p.m * p.lda, p.k * p.lda, p.n * p.ldb, p.k * p.ldb, p.m * p.n) >= 2**31 else "int"


def finish_plan(
    device, kernel, gsize, lsize, problem, splits, chunk, out_shape, out_dtype, epilogue: Epilogue = IDENTITY
) -> Plan:
    """A Plan around a resolved ``netcl_gemm`` kernel; with splits > 1 a float32 workspace and its sum,
    which then applies ``epilogue`` (the kernel wrote raw partial products)."""
    work = sum_args = None
    acc = float64 if out_dtype == float64 else float32
    # built with the first plan even when this one does not split, so that a later product whose
    # new size makes it split (a larger batch in a weight gradient) builds no program
    sum_kernel = _split_sum_kernel(device, acc, out_dtype, epilogue if splits > 1 else IDENTITY)
    if splits > 1:
        total = problem.batch * problem.m * problem.n
        work = ((splits, total), acc)
        sizes = () if epilogue.is_identity else (np.int32(problem.m), np.int32(problem.n))
        sum_args = (total, splits, -(-total // 256) * 256, sizes)
    args = gemm_args(problem, splits, chunk)
    return Plan(device, kernel, gsize, lsize, args, out_shape, out_dtype, work, sum_kernel, sum_args)


def _split_sum_kernel(device: Device, acc: np.dtype, out_dtype: np.dtype, epilogue: Epilogue = IDENTITY):
    ct, st = storage_ctype(acc), storage_ctype(out_dtype)
    if epilogue.is_identity:
        store = "vstore_half_rte((float)s, 0, C + i)" if out_dtype == float16 else f"C[i] = ({st})s"
        params, lines = "", [f"{store};"]
    else:  # the store of a product split along K: element i is (zb, r, c) of C, laid out like the GEMM's C
        store = "vstore_half_rte((float)(OUT), 0, C + i)" if out_dtype == float16 else f"C[i] = ({st})(OUT)"
        params = ", const int M, const int N" + epilogue.params()
        lines = [
            "const long csb = (long)M * N;",
            "const int ldc = N;",
            "const int zb = (int)(i / csb);",
            "const IDX r = (i - zb * csb) / N;",
            "const IDX c = (i - zb * csb) - r * N;",
            *epilogue.store_lines("s", "CT", store),
        ]
    body = "\n    ".join(lines)

    def source() -> str:
        return f"""{storage_pragmas([acc, out_dtype])}
{epilogue.preamble}
#define CT {ct}
#define IDX long
__kernel void netcl_split_sum(__global const {ct}* W, __global {st}* C, const long total, const int splits{params}) {{
    const long i = get_global_id(0);
    if (i >= total) return;
    CT s = 0;
    for (int p = 0; p < splits; ++p) s += W[p * total + i];
    {body}
}}
"""

    key = ("gemm-split-sum", acc.str, out_dtype.str, epilogue)
    sizes = [] if epilogue.is_identity else [np.int32, np.int32]
    dtypes = [None, None, np.int64, np.int32, *sizes, *epilogue.arg_dtypes()]
    return get_kernel(key, device, source, "netcl_split_sum", dtypes).kernel


def make_plan(device, dtype, out_dtype, out_shape, problem, epilogue=IDENTITY, cfg=None, views=(None, None)) -> Plan:
    """The portable kernel's plan for ``problem`` (``cfg`` forces a config: the tuner's trials).

    ``views``: ``OperandView`` or None for A and B, optionally C's output index (an implicit
    operand, see ``gemm_source``); a view's vector width is narrowed to 1. A product with a C
    view is never split along K (the split workspace is laid out as plain rows).
    """
    if cfg is None:
        cfg = portable_config(device, problem, dtype)
    if (views[0] is not None and cfg.va != 1) or (views[1] is not None and cfg.vb != 1):
        cfg = replace(cfg, va=1 if views[0] is not None else cfg.va, vb=1 if views[1] is not None else cfg.vb)
    splits, chunk = 1, problem.k
    if cfg.split and (len(views) < 3 or views[2] is None):
        splits, chunk = split_count(problem, cfg.bm, cfg.bn, cfg.bk, device, cfg.split)
    c_dtype = (float64 if out_dtype == float64 else float32) if splits > 1 else out_dtype
    idx = index_kind(problem)
    store = epilogue if splits == 1 else IDENTITY  # split: the partial products are raw
    key = ("gemm", cfg, problem.trans_a, problem.trans_b, dtype.str, c_dtype.str, idx, store, views)

    def source() -> str:
        return portable_source(cfg, problem.trans_a, problem.trans_b, dtype, dtype, c_dtype, idx, store, views)

    args = ARG_DTYPES + store.arg_dtypes()
    flags = (f"-cl-nv-maxrregcount={cfg.maxreg}",) if cfg.maxreg else ()
    kernel = get_kernel(key, device, source, "netcl_gemm", args, flags).kernel
    gsize = (-(-problem.n // cfg.bn) * cfg.wgn, -(-problem.m // cfg.bm) * cfg.wgm, problem.batch * splits * cfg.ks)
    return finish_plan(
        device, kernel, gsize, (cfg.wgn, cfg.wgm, cfg.ks), problem, splits, chunk, out_shape, out_dtype, epilogue
    )
