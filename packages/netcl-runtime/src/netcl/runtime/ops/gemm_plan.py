"""A GEMM launch plan: the ``Problem`` after batch merging, the split along K, and ``Plan``.

The layer under ``gemm`` (which plans a product from its operands' shapes), ``gemm_mma`` (the
tensor-core kernel's plans), ``gemm_configs`` (which tile config a product uses) and
``conv_implicit`` (convolutions as products with operand views): each of them builds its plans
here from a config it has chosen, so none of them imports another to make a plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import STORAGE_ONLY, float32, float64
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import get_kernel, storage_ctype, storage_pragmas
from netcl.runtime.ops.gemm_source import IDENTITY, Epilogue, GemmConfig, OperandView, portable_source
from netcl.runtime.ops.storage_io import store_c

_I32, _I64 = np.dtype(np.int32), np.dtype(np.int64)
#: Scalar argument dtypes of ``netcl_gemm`` (None: a buffer), see ``gemm_source``.
ARG_DTYPES = [_I32, _I32, _I32, None, _I32, None, _I32, None, _I32, _I32, _I32] + [_I64] * 7 + [_I32, _I32, _I64]
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

    def tiles(self, block_m: int, block_n: int) -> int:
        """Output blocks of ``block_m`` x ``block_n``, every matrix of the batch."""
        return -(-self.m // block_m) * -(-self.n // block_n) * self.batch

    @property
    def operand_sizes(self) -> tuple[int, int]:
        """Elements A and B span (the batch strides included): what scratch operands of a trial need."""
        a = self.m * self.k + sum((d[0] - 1) * d[1] for d in self.dims)
        b = self.k * self.n + sum((d[0] - 1) * d[2] for d in self.dims)
        return a, b


def split_count(
    problem: Problem, block_m: int, block_n: int, bk: int, device: Device, factor: int = 1
) -> tuple[int, int]:
    """(splits, chunk) along K: about ``2 * factor`` blocks per compute unit, chunks of >= MIN_SPLIT_CHUNK."""
    blocks = problem.tiles(block_m, block_n)
    target = 2 * factor * max(1, device.cl_device.max_compute_units)
    if blocks >= target or problem.k < 2 * MIN_SPLIT_CHUNK:
        return 1, problem.k
    splits = min(-(-target // blocks), problem.k // MIN_SPLIT_CHUNK, MAX_SPLITS)
    per_split = -(-problem.k // splits)
    chunk = -(-per_split // bk) * bk
    return -(-problem.k // chunk), chunk


def split_twins(device: Device, problem: Problem, candidates: Sequence[Any], mode: str | None) -> list:
    """For candidates that split along K: twins that never split and twins that split 4x finer
    (the search decides: a split adds a workspace and a second launch, which small products may
    not win back, while memory-bound ones such as weight gradients want more work-groups).

    ``candidates``: ``GemmConfig`` (``mode`` None) or ``MmaConfig`` of tensor-core ``mode``.
    """
    out = []
    for c in candidates:
        bk = c.bk_elements(mode) if mode else c.bk
        if split_count(problem, c.bm, c.bn, bk, device)[0] > 1:
            out += [replace(c, split=0), replace(c, split=4)]
    return out


def _vector_width(wanted: int, leading: int, strides: list[int]) -> int:
    """The widest of wanted, 2, 1 that divides the leading dimension and every batch stride."""
    for width in (wanted, 2, 1):
        if width <= wanted and leading % width == 0 and all(s % width == 0 for s in strides):
            return width
    return 1


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
        self,
        a: Tensor,
        b: Tensor,
        bias: Tensor | None = None,
        out: Tensor | None = None,
        extras: Sequence = (),
        work: Tensor | None = None,
    ) -> Tensor:
        """``out`` (a new tensor when None) = the product of ``a`` and ``b`` with the plan's epilogue.

        Launches are prepared once per plan (the scalar arguments set on a private kernel), so a call
        sets only its buffers (and an epilogue's scalars) and enqueues: a small product's host cost.
        ``work``: the split-K workspace to use (``new_work()``; a new one per call when None).
        """
        device = self.device
        if out is None:
            out = Tensor.empty(self.out_shape, self.out_dtype, device)
        target = out if self.work is None else (work if work is not None else self.new_work())
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

    def new_work(self) -> Tensor | None:
        """A split-K workspace for ``run`` (None for a plan that does not split)."""
        return None if self.work is None else Tensor.empty(self.work[0], self.work[1], self.device)

    def _prepare(self) -> None:
        """The prepared launches: the scalar arguments set once; per call the buffers, then the
        epilogue's operands (bias, extras) after the fixed arguments."""
        queue = self.device.queue
        scalars = {i: v for i, v in enumerate(self.args) if v is not None}
        self._product = PreparedLaunch.binding(self.kernel, self.gsize, self.lsize, scalars, queue)
        if self.work is not None:
            gsize, scalars = self.sum_args
            self._sum = PreparedLaunch.binding(self.sum_kernel, gsize, 256, dict(enumerate(scalars, start=2)), queue)


def trial_run(
    plan: Any, a: Tensor, b: Tensor, bias: Tensor | None = None, out: Tensor | None = None, extras: Sequence = ()
) -> Callable[[], Tensor]:
    """A tile search's run of ``plan`` (a ``Plan`` or ``TransposedPlan``): run once, then returned for timing.
    Every run writes one split-K workspace made here and the output of the first, as a replay does: a timed
    run allocates nothing (see benchmarks/RESULTS.md, "Tile searches in the GPT block's first capture")."""
    work = plan.new_work()
    out = plan.run(a, b, bias, out=out, extras=extras, work=work)
    return lambda: plan.run(a, b, bias, out=out, extras=extras, work=work)


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
    """The C index type of ``problem``'s kernels: "long" where an operand or C spans 2**31 elements, else "int"."""
    p = problem
    return "long" if max(p.m * p.lda, p.k * p.lda, p.n * p.ldb, p.k * p.ldb, p.m * p.n) >= 2**31 else "int"


def finish_plan(
    device,
    kernel,
    gsize,
    lsize,
    problem,
    splits,
    chunk,
    out_shape,
    out_dtype,
    epilogue: Epilogue = IDENTITY,
    fixed: Sequence = (),
    views: tuple[OperandView | None, ...] = (),
) -> Plan:
    """A Plan around a resolved ``netcl_gemm`` kernel; with splits > 1 a float32 workspace and its sum,
    which then applies ``epilogue`` (the kernel wrote raw partial products) and stores through C's view
    (``views[2]``, when given: the kernel wrote plain rows). ``fixed``: arguments of the kernel after ``css``
    set once (a TMA kernel's tensor maps), before the epilogue's."""
    work = sum_args = None
    acc = float64 if out_dtype == float64 else float32
    out_view = views[2] if len(views) > 2 else None
    if out_view is None:
        # built with the first plan even when this one does not split, so that a later product whose
        # new size makes it split (a larger batch in a weight gradient) builds no program
        sum_kernel = _split_sum_kernel(device, acc, out_dtype, epilogue if splits > 1 else IDENTITY)
    else:  # a sum per output layout, built only where a plan splits
        sum_kernel = _view_sum_kernel(device, acc, out_dtype, epilogue, out_view) if splits > 1 else None
    if splits > 1:
        total = problem.batch * problem.m * problem.n
        work = ((splits, total), acc)
        plain = epilogue.is_identity and out_view is None
        width = sum_width(total, epilogue) if plain else 1
        items = -(-total // width)
        # the sum's scalar arguments: C's sizes where it finds each element's row and column (an epilogue or
        # an output view), else the width
        shape = (np.int32(width),) if plain else (np.int32(problem.m), np.int32(problem.n))
        sum_args = (-(-items // 256) * 256, (total, splits, *shape))
    args = gemm_args(problem, splits, chunk) + list(fixed)
    return Plan(device, kernel, gsize, lsize, args, out_shape, out_dtype, work, sum_kernel, sum_args)


#: Elements a work-item of a split sum without an epilogue adds where the product's size allows.
SUM_VECTOR = 4


def sum_width(total: int, epilogue: Epilogue = IDENTITY) -> int:
    """How many neighbouring elements a work-item of the split sum takes: ``SUM_VECTOR`` for a sum without
    an epilogue where every split's partial block starts on a vector boundary (``total`` a multiple of it),
    else 1 (an epilogue's operands read four elements apart by neighbouring work-items measured slower: see
    benchmarks/RESULTS.md, "Split sums as vectors")."""
    return SUM_VECTOR if epilogue.is_identity and total % SUM_VECTOR == 0 else 1


def _split_sum_kernel(device: Device, acc: np.dtype, out_dtype: np.dtype, epilogue: Epilogue = IDENTITY):
    """The split sum: element i of C is the partials' sum in split order, then the epilogue. One program
    per (accumulator, output dtype, epilogue), shape-generic. Without an epilogue ``width`` (``sum_width``)
    is an argument: 4 loads each split's four elements as one vector (the same adds, lane by lane)."""
    ct, st = storage_ctype(acc), storage_ctype(out_dtype)
    key = ("gemm-split-sum", acc.str, out_dtype.str, epilogue)
    if not epilogue.is_identity:
        dtypes = [None, None, np.int64, np.int32, np.int32, np.int32, *epilogue.arg_dtypes()]
        return get_kernel(
            key, device, lambda: _epilogue_sum_source(acc, out_dtype, epilogue), "netcl_split_sum", dtypes
        ).kernel
    vec = SUM_VECTOR
    if out_dtype in STORAGE_ONLY:
        lane = store_c(out_dtype, "C", "first + e", "sums[e]")
        vector_store = (
            f"CT sums[{vec}] = {{v.s0, v.s1, v.s2, v.s3}};\n        for (int e = 0; e < {vec}; ++e) {{ {lane}; }}"
        )
        scalar_store = store_c(out_dtype, "C", "first", "s") + ";"
    else:
        vector_store = f"((__global {st}{vec}*)(C))[first / {vec}] = convert_{st}{vec}(v);"
        scalar_store = f"C[first] = ({st})s;"

    def source() -> str:
        return f"""{storage_pragmas([acc, out_dtype])}
#define CT {ct}
#define CTV {ct}{vec}
__kernel void netcl_split_sum(__global const {ct}* W, __global {st}* C, const long total, const int splits,
                              const int width) {{
    const long first = get_global_id(0) * width;
    if (first >= total) return;
    if (width == {vec}) {{  /* total % {vec} == 0: every split's block starts on a vector boundary */
        CTV v = (CTV)(0);
        for (int p = 0; p < splits; ++p) v += ((__global const CTV*)(W + p * total))[first / {vec}];
        {vector_store}
    }} else {{
        CT s = 0;
        for (int p = 0; p < splits; ++p) s += W[p * total + first];
        {scalar_store}
    }}
}}
"""

    return get_kernel(key, device, source, "netcl_split_sum", [None, None, np.int64, np.int32, np.int32]).kernel


def _view_sum_kernel(device: Device, acc: np.dtype, out_dtype: np.dtype, epilogue: Epilogue, out_view: OperandView):
    """The split sum of a product with an output view: ``_epilogue_sum_source`` storing element (r, c) of C at the
    view's offset, the view's helpers (every macro its expression reads) before it."""
    key = ("gemm-split-sum-view", acc.str, out_dtype.str, epilogue, out_view)
    dtypes = [None, None, np.int64, np.int32, np.int32, np.int32, *epilogue.arg_dtypes()]
    return get_kernel(
        key, device, lambda: _epilogue_sum_source(acc, out_dtype, epilogue, out_view), "netcl_split_sum", dtypes
    ).kernel


def _epilogue_sum_source(
    acc: np.dtype, out_dtype: np.dtype, epilogue: Epilogue, out_view: OperandView | None = None
) -> str:
    """The split sum that applies ``epilogue``: one element a work-item; element i is (zb, r, c) of C,
    laid out like the GEMM's C, or stored at ``out_view``'s offset in its batch entry."""
    ct, st = storage_ctype(acc), storage_ctype(out_dtype)
    at = "(IDX)r * ldc + c" if out_view is None else f"({out_view.element})"
    element = f"zb * csb + {at}"
    store = store_c(out_dtype, "C", element, "OUT") if out_dtype in STORAGE_ONLY else f"C[{element}] = ({st})(OUT)"
    lines = [
        "const long csb = (long)M * N;",
        "const int ldc = N;",
        "const int zb = (int)(i / csb);",
        "const IDX r = (i - zb * csb) / N;",
        "const IDX c = (i - zb * csb) - r * N;",
        *epilogue.store_lines("s", "CT", store, at=at),
    ]
    body = "\n    ".join(lines)
    helpers = "" if out_view is None else out_view.helpers
    return f"""{storage_pragmas([acc, out_dtype])}
{epilogue.preamble}
#define CT {ct}
#define IDX long
{helpers}
__kernel void netcl_split_sum(__global const {ct}* W, __global {st}* C, const long total, const int splits,
                              const int M, const int N{epilogue.params()}) {{
    const long i = get_global_id(0);
    if (i >= total) return;
    CT s = 0;
    for (int p = 0; p < splits; ++p) s += W[p * total + i];
    {body}
}}
"""


def make_plan(
    device: Device,
    dtype: np.dtype,
    out_dtype: np.dtype,
    out_shape: tuple[int, ...],
    problem: Problem,
    epilogue: Epilogue = IDENTITY,
    *,
    cfg: GemmConfig,
    views: tuple[OperandView | None, ...] = (None, None),
) -> Plan:
    """The portable kernel's plan for ``problem`` with tile config ``cfg`` (``gemm.portable_config``
    chooses one for a product, ``conv_implicit`` for a convolution, a search's trial forces one).

    ``views``: ``OperandView`` or None for A and B, optionally C's output index (an implicit
    operand, see ``gemm_source``); a view's vector width is narrowed to 1. Split along K, a product
    with a C view writes its partial products as plain rows and the split sum stores through the view.
    """
    if (views[0] is not None and cfg.va != 1) or (views[1] is not None and cfg.vb != 1):
        cfg = replace(cfg, va=1 if views[0] is not None else cfg.va, vb=1 if views[1] is not None else cfg.vb)
    splits, chunk = 1, problem.k
    if cfg.split:
        splits, chunk = split_count(problem, cfg.bm, cfg.bn, cfg.bk, device, cfg.split)
    c_dtype = (float64 if out_dtype == float64 else float32) if splits > 1 else out_dtype
    idx = index_kind(problem)
    store = epilogue if splits == 1 else IDENTITY  # split: the partial products are raw
    kernel_views = views if splits == 1 else views[:2]  # split: plain rows, the sum stores through C's view
    key = ("gemm", cfg, problem.trans_a, problem.trans_b, dtype.str, c_dtype.str, idx, store, kernel_views)

    def source() -> str:
        return portable_source(
            cfg, problem.trans_a, problem.trans_b, dtype, dtype, c_dtype, idx, store, kernel_views
        )  # fmt: skip

    args = ARG_DTYPES + store.arg_dtypes()
    flags = (f"-cl-nv-maxrregcount={cfg.maxreg}",) if cfg.maxreg else ()
    kernel = get_kernel(key, device, source, "netcl_gemm", args, flags).kernel
    gsize = (-(-problem.n // cfg.bn) * cfg.wgn, -(-problem.m // cfg.bm) * cfg.wgm, problem.batch * splits * cfg.ks)
    return finish_plan(
        device, kernel, gsize, (cfg.wgn, cfg.wgm, cfg.ks), problem, splits, chunk, out_shape, out_dtype, epilogue,
        views=views,
    )  # fmt: skip
