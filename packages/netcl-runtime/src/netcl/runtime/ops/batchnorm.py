"""``batch_norm``: one channel kernel forward, one backward (PyTorch's ``F.batch_norm``).

x is (N, C) or (N, C, *) and C-contiguous; channel ``c`` is every element ``x[n, c, s]`` (``N * S``
values, ``S`` the product of the trailing dims). One work-group takes one channel: its lanes walk
the channel's planes (``float4`` loads when ``S % 4 == 0``), a tree in local memory combines them.
On a GPU with few, long channels (``_parts``) a work-group takes one chunk of a channel instead: a
first launch stores each chunk's sums, a second adds them in chunk order and writes (the result does
not depend on timing); elsewhere each pass below is one launch.

- Forward (training): one pass takes shifted sums ``sum(x - k)`` and ``sum((x - k)^2)`` with ``k``
  the channel's first element (no ``E[x^2] - E[x]^2`` cancellation for data far from zero), then
  ``mean``, the biased ``var`` and ``rstd = 1 / sqrt(var + eps)``; a second pass writes
  ``y = x * (w rstd) + (b - mean w rstd)``. Lane 0 stores ``mean``/``rstd`` (for the backward) and
  updates ``running_mean``/``running_var`` IN PLACE with the unbiased variance:
  ``r = (1 - momentum) r + momentum stat``, and adds one to ``num_batches_tracked`` when given (the
  counter of ``nn.BatchNorm*``: no launch of its own). Evaluation reads the running statistics (one pass).
  Given x's moments gathered where x was stored (``moments=``, float32: ``netcl.runtime.ops.moments``), the
  training forward merges them for the statistics and makes the second pass only (one launch, one read of x).
- Backward: one pass sums ``g`` and ``g (x - mean)`` (giving ``db`` and ``dw = sum(g xhat)``), a
  second writes ``dx = w rstd (g - mean(g) - xhat mean(g xhat))`` (training) or ``g w rstd`` (eval).
- Epilogue (``relu=True``, optionally ``residual``): the normalize pass writes ``relu(y [+ residual])`` (y
  rounded to x's dtype first, as the unfused composition stores it); ``batch_norm_relu_backward`` reads that
  output and multiplies ``g`` by its mask (``out > 0``) wherever the backward reads ``g``, and stores the
  masked ``g`` as the residual's gradient in the pass that visits each element once (the sums' pass, whose
  stores the dx pass then reads instead of ``g`` and the output; else the dx pass). The add, the ReLU and
  the mask are exact: bit for bit the unfused ops.

Statistics are float32 (float64 for float64 x); float16 x is loaded and stored as half and computed
in float32. N, C and S are kernel arguments: a new batch or image size builds nothing. Each kernel
has a NumPy twin (the NumPy backend), the same formulas in the statistics' dtype.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core import Device, Tensor, same_device
from netcl.core.dtypes import refuse_bfloat16
from netcl.core.errors import DTypeError, ShapeError
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import ARG_DTYPES, get_kernel, pow2_ceil, pragmas, storage_ctype
from netcl.runtime.ops._grid import index_ctype
from netcl.runtime.ops._rows import sum_combine, tree_loop_c, tree_reduce_c
from netcl.runtime.ops.backend import NUMPY_KIND, backend_op
from netcl.runtime.ops.call_plans import UNKEYED, PlanCache, complete, exact, tensor_sig
from netcl.runtime.ops.layout import cast
from netcl.runtime.ops.moments import MERGE_C, TREE_COMBINE, ChannelMoments
from netcl.runtime.ops.moments import of as moments_of
from netcl.runtime.ops.pointwise import add_

_TWINS = "netcl.runtime.numpy_twins.batchnorm"

#: Widest work-group a channel gets (fewer lanes for short channels, the kernel's limit on small devices): a GPU
#: needs wide groups to keep loads in flight with one group per channel; on a CPU (PoCL) each lane is a loop
#: iteration between barriers, so fewer lanes win (see benchmarks/RESULTS.md, "Measurements moved out of source
#: docstrings", batchnorm.py).
MAX_LANES, CPU_LANES = 1024, 64
#: Vectors each lane handles at least (the group is no wider than the chunk's vectors / this).
PER_LANE = 4
#: A GPU with fewer channels than this many work-groups per compute unit splits each channel into
#: chunks of at least ``MIN_CHUNK`` vectors, one work-group each (``_parts``), so that every unit has
#: work; shorter channels stay whole, where a second launch's host time is not hidden
#: (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", batchnorm.py).
GROUPS_PER_UNIT, MIN_CHUNK = 4, 8192
#: The backward (about six tensor passes in its two stages) takes chunks down to this many vectors, and no more
#: groups than ``GROUPS_PER_UNIT`` a compute unit (see benchmarks/RESULTS.md, "Thirty-ninth session").
BACKWARD_MIN_CHUNK = 2048

Grads = tuple[Tensor | None, Tensor | None, Tensor | None]

_HEADER = """{pragmas}#define ACC {acc}
#define IDX {idx}
#define LMAX {lmax}
#if VEC == 4
#define VT {acc}4
#define LOADV(p, i) convert_{acc}4(vload4((i), (p)))
#define STOREV(v, p, i, T) vstore4(convert_##T##4(v), (i), (p))
#define HSUM(v) ((v).x + (v).y + (v).z + (v).w)
#define POS(v) isgreater((v), (VT)0)
#define PICK(a, b, c) select((a), (b), (c))
#else
#define VT ACC
#define LOADV(p, i) ((ACC)(p)[i])
#define STOREV(v, p, i, T) ((p)[i] = (T)(v))
#define HSUM(v) (v)
#define POS(v) ((v) > (ACC)0)
#define PICK(a, b, c) ((c) ? (b) : (a))
#endif
/* The epilogue's ReLU (RELU of the primitives: NaN passes) and its mask (RELU_GRAD: 1 where the output is > 0,
   which is where its input is), in ACC. */
#define RELUV(v) PICK((VT)0, (v), POS(v) | ((v) != (v)))
#define MASKV(v) PICK((VT)0, (VT)1, POS(v))
/* Lane lid's walk over its group's vectors [lo, hi) of one channel: vector i of T = N * SV sits in plane n
   at offset s (no division per step). STEP(at) runs for each of the lane's vectors, four per iteration
   (their loads issue together). */
#define AT_NS ((n * C + c) * SV + s)
#define WALK {{ n += dn; s += ds; if (s >= SV) {{ s -= SV; ++n; }} }}
#define CHANNEL_LOOP(STEP) {{ \
    IDX i = lo + lid, n = i / SV, s = i % SV; \
    for (; i + 3 * (IDX)ls < hi; i += 4 * (IDX)ls) {{ \
        const IDX a0 = AT_NS; WALK; const IDX a1 = AT_NS; WALK; \
        const IDX a2 = AT_NS; WALK; const IDX a3 = AT_NS; WALK; \
        STEP(a0); STEP(a1); STEP(a2); STEP(a3); }} \
    for (; i < hi; i += ls) {{ const IDX a0 = AT_NS; WALK; STEP(a0); }} }}
/* Work-group (channel c, chunk p of P): vectors [lo, hi) of the channel's T. */
#define CHUNK \
    const IDX c = get_group_id(0) / P; \
    const int p = get_group_id(0) % P, lid = get_local_id(0), ls = get_local_size(0); \
    const IDX T = N * SV, dn = ls / SV, ds = ls % SV, per = (T + P - 1) / P, lo = p * per, hi = min(T, lo + per);
/* The channel's sums A, B of STEP: this group's chunk (P == 1: the whole channel; stage 0 stores the
   chunk's and returns), or in stage 1 the chunks' stored sums added in chunk order. */
#define CHANNEL_SUMS(A, B, STEP) \
    if (P == 1 || stage == 0) {{ \
        CHANNEL_LOOP(STEP) \
        netcl_sum2(&A, &B, sa, sb); \
        if (P > 1) {{ \
            if (lid == 0) {{ part[2 * (c * P + p)] = A; part[2 * (c * P + p) + 1] = B; }} \
            return; \
        }} \
    }} else {{ \
        for (int q = 0; q < P; ++q) {{ A += part[2 * (c * P + q)]; B += part[2 * (c * P + q) + 1]; }} \
    }}
"""
#: The channel's two sums over the work-group (``_rows``' tree; each caller is done with ``sa``/``sb`` after it).
_SUM2 = tree_reduce_c("netcl_sum2", ["ACC", "ACC"], sum_combine(2), final_barrier=False)
#: The forward's batch statistics from x's moments gathered where x was stored (``moments``; float32): lane l
#: merges groups l, l + ls, ... of the channel's G (their loads issue together), then the lanes holding any merge
#: in a fixed tree (``_rows.tree_loop_c``) over the first power of two of them; slot 0 of s0, s1, s2 holds the
#: channel's count, mean and M2.
_MERGED = """    __local float s0[LMAX], s1[LMAX], s2[LMAX];
    float cnt = 0.0f, mo_mean = 0.0f, mo_m2 = 0.0f;
    for (int q = lid; q < G; q += ls) {
        __global const float* at = mo + (c * G + q) * 3;
        netcl_moments_merge(&cnt, &mo_mean, &mo_m2, at[0], at[1], at[2]);
    }
    s0[lid] = cnt; s1[lid] = mo_mean; s2[lid] = mo_m2;
    int span = 1;
    while (span < min(G, ls)) span <<= 1;
    span >>= 1;
""" + tree_loop_c(TREE_COMBINE, half="span")

_FORWARD = """
__kernel void netcl_batch_norm(__global const {xt}* restrict x, {params}__global {xt}* restrict y,
                               __global ACC* restrict mean, __global ACC* restrict rstd, const ACC eps,
                               const ACC momentum, const IDX N, const IDX C, const IDX SV,{moments}
                               __global ACC* restrict part, const int P, const int stage) {{
    __local ACC sa[LMAX], sb[LMAX];
    CHUNK
#if TRAINING && MOMENTS
{merged}
    const ACC count = s0[0], var = max(s2[0] / s0[0], 0.0f), mu = s1[0], rs = rsqrt(var + eps);
#elif TRAINING
    const ACC k = (ACC)x[c * SV * VEC];
    ACC s1 = 0, s2 = 0;
#define STATS(at) {{ const VT v = LOADV(x, at) - k; s1 += HSUM(v); s2 += HSUM(v * v); }}
    CHANNEL_SUMS(s1, s2, STATS)
    const ACC count = (ACC)(T * VEC), d = s1 / count;
    const ACC var = max(s2 / count - d * d, (ACC)0);
    const ACC mu = k + d, rs = rsqrt(var + eps);
#endif
#if TRAINING
    if (lid == 0 && p == 0) {{
        mean[c] = mu;
        rstd[c] = rs;
#if RUNNING
        rm[c] = (1 - momentum) * (ACC)rm[c] + momentum * mu;
        rv[c] = (1 - momentum) * (ACC)rv[c] + momentum * var * count / (count - 1);
#endif
#if COUNTER
        if (c == 0) nbt[0] += 1;
#endif
    }}
#else
    const ACC mu = (ACC)rm[c], rs = rsqrt((ACC)rv[c] + eps);
    if (lid == 0 && p == 0) {{ mean[c] = mu; rstd[c] = rs; }}
#endif
#if RESID
#define RESIDUAL(at) + LOADV(r, at)
#else
#define RESIDUAL(at)
#endif
    const ACC scale = {w} * rs, shift = {b} - mu * scale;
#if RELU
/* y = relu(bn + r): bn rounded to x's dtype first (what the unfused composition stores), then the add and the
   ReLU (exact), one store. */
#define NORMALIZE(at) {{ VT v = LOADV(x, at) * scale + shift; v = STORED(v); v = RELUV(v RESIDUAL(at)); \
                         STOREV(v, y, at, {xt}); }}
#else
#define NORMALIZE(at) STOREV(LOADV(x, at) * scale + shift, y, at, {xt})
#endif
    CHANNEL_LOOP(NORMALIZE)
}}
"""

_BACKWARD = """
__kernel void netcl_batch_norm_backward(__global const {xt}* restrict x, __global const {gt}* restrict g,
                                        {params}__global const ACC* restrict mean,
                                        __global const ACC* restrict rstd, __global {gt}* restrict gx, {gr}
                                        __global ACC* restrict dw, __global ACC* restrict db,
                                        const IDX N, const IDX C, const IDX SV,
                                        __global ACC* restrict part, const int P, const int stage) {{
    __local ACC sa[LMAX], sb[LMAX];
    CHUNK
    const ACC mu = mean[c], rs = rstd[c];
/* GIN: the gradient of the normalized output: g, or with the ReLU epilogue g * (out > 0) (exact). KEEP_S / KEEP_D
   store it as the residual's gradient, in whichever loop visits every element once. */
#if RELU
#define GIN(at) (LOADV(g, at) * MASKV(LOADV(out, at)))
#else
#define GIN(at) LOADV(g, at)
#endif
#if RESID_GRAD && REDUCE
#define KEEP_S(at, v) STOREV(v, gr, at, {gt})
#define KEEP_D(at)
/* the dx pass reads back what this work-item (or, chunked, stage 0) stored: one load instead of g's and out's */
#define GDX(at) LOADV(gr, at)
#elif RESID_GRAD
#define KEEP_S(at, v)
#define KEEP_D(at) STOREV(GIN(at), gr, at, {gt})
#else
#define KEEP_S(at, v)
#define KEEP_D(at)
#endif
#ifndef GDX
#define GDX(at) GIN(at)
#endif
#if REDUCE
    ACC a = 0, b = 0;
#define SUMS(at) {{ const VT gg = GIN(at); KEEP_S(at, gg); a += HSUM(gg); b += HSUM(gg * (LOADV(x, at) - mu)); }}
    CHANNEL_SUMS(a, b, SUMS)
    if (lid == 0 && p == 0) {{ dw[c] = b * rs; db[c] = a; }}
#endif
#if NEED_DX
    const ACC ws = {w} * rs;
#if TRAINING
    const ACC count = (ACC)(T * VEC), ca = a / count, cb = b * rs * rs / count;
#define DX(at) {{ STOREV(ws * (GDX(at) - ca - (LOADV(x, at) - mu) * cb), gx, at, {gt}); KEEP_D(at); }}
    CHANNEL_LOOP(DX)
#else
#define DX(at) {{ STOREV(ws * GDX(at), gx, at, {gt}); KEEP_D(at); }}
    CHANNEL_LOOP(DX)
#endif
#elif RESID_GRAD && !REDUCE
#define DX(at) KEEP_D(at)
    CHANNEL_LOOP(DX)
#endif
}}
"""


# ---- checks ---------------------------------------------------------------------------------------------
def _tensor(op: str, name: str, t: Any, optional: bool = True) -> Tensor | None:
    if t is None and optional:
        return None
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor{' or None' if optional else ''}, got {type(t).__name__}")
    refuse_bfloat16(op, t.dtype)
    if t.dtype.kind != "f":
        raise DTypeError(f"{op}: {name} must be a floating-point tensor (float16/32/64), got dtype {t.dtype}")
    return t


def check_batch_norm(
    x: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any,
    bias: Any,
    training: bool,
    momentum: Any = 0.1,
    eps: Any = 1e-5,
    num_batches_tracked: Any = None,
) -> tuple[int, int, int]:
    """Validate a ``batch_norm`` call (types, dtypes, shapes, devices, numbers); returns (N, C, S)."""
    op = "batch_norm"
    _tensor(op, "x", x, optional=False)
    named = {"running_mean": running_mean, "running_var": running_var, "weight": weight, "bias": bias}
    for name, t in named.items():
        _tensor(op, name, t)
    if x.ndim < 2:
        raise ShapeError(f"{op}: x must be (N, C) or (N, C, *), got shape {x.shape}")
    N, C, S = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    for name, t in named.items():
        if t is not None:
            if tuple(t.shape) != (C,):
                raise ShapeError(f"{op}: {name} must have shape ({C},) (the channels of x), got {tuple(t.shape)}")
            same_device(x.device, t.device)
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{op}: running_mean and running_var must both be given or both be None")
    if not training and running_mean is None:
        raise ValueError(f"{op}: running_mean and running_var are required when training=False")
    if training and N * S <= 1:
        raise ValueError(f"{op}: expected more than 1 value per channel when training, got x of shape {x.shape}")
    for name, value in (("momentum", momentum), ("eps", eps)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise TypeError(f"{op}: {name} must be a number, got {value!r}")
    if not eps > 0:
        raise ValueError(f"{op}: eps must be > 0, got {eps!r}")
    if num_batches_tracked is not None:
        counter = num_batches_tracked
        if not isinstance(counter, Tensor) or counter.dtype != np.int64 or counter.shape != ():
            raise TypeError(
                f"{op}: num_batches_tracked must be an int64 tensor of shape () (a BatchNorm's counter), got "
                + (f"dtype {counter.dtype}, shape {counter.shape}" if isinstance(counter, Tensor) else repr(counter))
            )
        same_device(x.device, counter.device)
        if not training:
            raise ValueError(f"{op}: num_batches_tracked counts training calls; got training=False")
    return N, C, S


def check_epilogue(x: Tensor, relu: Any, residual: Any) -> None:
    """Validate ``batch_norm_forward``'s epilogue: ``relu`` a bool, ``residual`` None or a tensor of x's shape,
    dtype and device, given only with ``relu`` (the epilogues are ``relu(y)`` and ``relu(y + residual)``)."""
    op = "batch_norm"
    if type(relu) is not bool:
        raise TypeError(f"{op}: relu must be a bool, got {relu!r}")
    if residual is None:
        return
    if not relu:
        raise ValueError(f"{op}: a residual is added only before the ReLU epilogue: pass relu=True with residual")
    if not isinstance(residual, Tensor):
        raise TypeError(f"{op}: residual must be a Tensor or None, got {type(residual).__name__}")
    if tuple(residual.shape) != tuple(x.shape) or residual.dtype != x.dtype:
        raise ShapeError(
            f"{op}: residual must have x's shape {tuple(x.shape)} and dtype {x.dtype} (no broadcasting), "
            f"got shape {tuple(residual.shape)} and dtype {residual.dtype}"
        )
    same_device(x.device, residual.device)


def _acc(dtype: np.dtype) -> tuple[str, np.dtype]:
    return ("double", np.dtype(np.float64)) if dtype == np.float64 else ("float", np.dtype(np.float32))


# ---- launches -------------------------------------------------------------------------------------------
_LIMITS: dict[tuple[Any, Device], int] = {}
#: Plans of ``batch_norm_forward`` / ``batch_norm_backward`` calls by signature (``call_plans``).
_FORWARDS, _BACKWARDS = PlanCache("batch_norm"), PlanCache("batch_norm_backward")


def _parts(device: Device, channels: int, vectors: int, backward: bool = False) -> int:
    """Chunks per channel (work-groups each): on a GPU with fewer channels than ``GROUPS_PER_UNIT``
    work-groups per compute unit, enough chunks of >= ``MIN_CHUNK`` vectors to reach that; for the ``backward``,
    chunks of >= ``BACKWARD_MIN_CHUNK`` vectors up to that many groups; else (and on other devices) 1."""
    if not device.is_gpu:
        return 1
    target = GROUPS_PER_UNIT * max(1, device.cl_device.max_compute_units)
    if backward:
        return max(1, min(target // channels, vectors // BACKWARD_MIN_CHUNK))
    return max(1, min(-(-target // channels), vectors // MIN_CHUNK))


class _ChannelLaunches:
    """Kernel ``name``'s launches over ``channels`` channels of ``vectors`` vectors, prepared: one work-group of
    up to ``MAX_LANES`` lanes per chunk of a channel (``_parts``; its ``backward`` rule for the backward kernel).
    With several chunks and ``two_stages`` (the kernel reduces the channel first), stage 0 stores each chunk's
    sums and stage 1 adds them in chunk order, then writes; otherwise one launch. ``types`` are the kernel's
    arguments up to where the chunk arguments begin (the chunk sums' workspace, P, the stage); ``scalars``
    (index -> value) are bound once, the buffers before them passed per call."""

    def __init__(
        self,
        key: tuple,
        device: Device,
        make: Callable[[], str],
        name: str,
        types: list,
        channels: int,
        vectors: int,
        scalars: dict[int, Any],
        two_stages: bool,
        backward: bool = False,
    ) -> None:
        resolved = get_kernel(("batch_norm", *key), device, make, name, [*types, None, np.int32, np.int32])
        limit = _LIMITS.get((key, device))
        if limit is None:
            wg = resolved.kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device.cl_device)
            cap = CPU_LANES if device.cl_device.type & cl.device_type.CPU else MAX_LANES
            limit = _LIMITS[(key, device)] = min(cap, 1 << (int(wg).bit_length() - 1))
        parts = _parts(device, channels, vectors, backward)
        lanes = min(limit, pow2_ceil(max(1, -(-vectors // (PER_LANE * parts)))))
        self.device, self.staged = device, parts > 1 and two_stages
        self.work_shape = (channels * parts * 2,)
        chunk = len(types)  # the workspace's index; P and the stage follow it
        self.calls = [
            PreparedLaunch.binding(
                resolved.kernel, channels * parts * lanes, lanes, {**scalars, chunk + 1: parts, chunk + 2: stage},
                device.queue,
            ).call
            for stage in ((0, 1) if self.staged else (1,))
        ]  # fmt: skip

    def __call__(self, buffers: list[Any], spare: Tensor) -> None:
        """Launch on ``buffers`` (raw); one stage passes ``spare``, a statistics tensor it does not read there,
        as the workspace."""
        work = Tensor.empty(self.work_shape, spare.dtype, self.device) if self.staged else spare
        for call in self.calls:
            call(*buffers, work.data)


def _header(dtypes: list[np.dtype], acc: str, idx: str, flags: dict[str, int]) -> str:
    defines = "".join(f"#define {k} {int(v)}\n" for k, v in flags.items())
    return defines + _HEADER.format(pragmas=pragmas(dtypes), acc=acc, idx=idx, lmax=MAX_LANES) + _SUM2


def _stored(dtype: np.dtype, acc: str, vec: int) -> str:
    """``STORED(v)``: an ACC value (vector) rounded to the storage ``dtype`` and back (identity unless half)."""
    if dtype != np.float16:
        return "#define STORED(v) (v)\n"
    suffix = "4" if vec == 4 else ""
    return f"#define STORED(v) convert_{acc}{suffix}(convert_half{suffix}(v))\n"


def _param(name: str, dtype: np.dtype | None, const: bool = True) -> str:
    return "" if dtype is None else f"__global {'const ' if const else ''}{storage_ctype(dtype)}* restrict {name}, "


def _dtype(t: Tensor | None) -> np.dtype | None:
    return None if t is None else t.dtype


def batch_norm_forward(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    num_batches_tracked: Tensor | None = None,
    *,
    relu: bool = False,
    residual: Tensor | None = None,
    moments: ChannelMoments | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, mean, rstd): the output and the per-channel statistics that normalized x (batch or running);
    a training call adds one to ``num_batches_tracked`` (an int64 scalar) when given. Checked and prepared
    once per call signature (``call_plans``).

    ``moments``: x's per-channel moments gathered where x was stored (``moments.ChannelMoments``, e.g. by a
    Winograd forward's output transform): a training call on an OpenCL device merges them for the batch
    statistics instead of reading x for them (one pass over x fewer; the statistics within float32 rounding
    of the pass's). Moments of another tensor than this very x are not read.

    Epilogue, in the same pass that writes y: ``relu=True`` writes ``relu(bn)``, with ``residual`` (x's shape and
    dtype) ``relu(bn + residual)``, where ``bn`` is the normalized output rounded to x's dtype: bit for bit what
    ``batch_norm`` followed by ``add`` and ``relu`` gives (both are exact)."""
    key = (
        tensor_sig(x) if x is not None else UNKEYED,
        tensor_sig(running_mean),
        tensor_sig(running_var),
        tensor_sig(weight),
        tensor_sig(bias),
        exact(training, bool),
        exact(momentum, float, int),
        exact(eps, float, int),
        tensor_sig(num_batches_tracked),
        exact(relu, bool),
        tensor_sig(residual),
        _parts,  # the chunking policy the launches were prepared with
    )
    taken = _moments_read(moments, x, training)
    if taken is not None:
        key = (*key, taken.groups)
    plan = _FORWARDS.plans.get(key)
    if plan is None:
        training = bool(training)
        N, C, S = check_batch_norm(
            x, running_mean, running_var, weight, bias, training, momentum, eps, num_batches_tracked
        )
        check_epilogue(x, relu, residual)
        acc, stat = _acc(x.dtype)
        args = (training, momentum, eps, (N, C, S), acc, stat, relu)
        if x.device.kind == NUMPY_KIND:
            made = functools.partial(_apply_with, args)
        else:
            stats = (running_mean, running_var)
            groups = 0 if taken is None else taken.groups
            made = _forward_launches(x, *stats, weight, bias, num_batches_tracked, residual, *args, groups)
        plan = _FORWARDS.keep(complete(key), made)
    if taken is not None:
        return plan(x, running_mean, running_var, weight, bias, num_batches_tracked, residual, taken.parts)
    return plan(x, running_mean, running_var, weight, bias, num_batches_tracked, residual)


def _moments_read(moments: Any, x: Any, training: Any) -> ChannelMoments | None:
    """The ``moments`` a ``batch_norm_forward`` call merges: those of this very x in a training call on an OpenCL
    device, else None (x's own pass); a TypeError for a ``moments`` that is not ``ChannelMoments`` or None."""
    if moments is None:
        return None
    if not isinstance(moments, ChannelMoments):
        raise TypeError(f"batch_norm: moments must be ChannelMoments or None, got {type(moments).__name__}")
    if training is not True or not isinstance(x, Tensor) or x.ndim < 2 or x.device.kind == NUMPY_KIND:
        return None  # (an x of fewer than two dims: check_batch_norm's error)
    taken = moments_of(moments, x)
    if taken is not None:
        parts = taken.parts
        ok = isinstance(parts, Tensor) and parts.dtype == np.float32 and parts.ndim == 3
        if not ok or parts.shape[0] != x.shape[1] or parts.shape[1] < 1 or parts.shape[2] != 3:
            got = f"{type(parts).__name__} {getattr(parts, 'dtype', '')} {getattr(parts, 'shape', '')}".strip()
            raise ShapeError(
                f"batch_norm: moments.parts must be float32 of shape ({x.shape[1]}, groups >= 1, 3) for x of "
                f"{x.shape[1]} channels, got {got}"
            )
        same_device(x.device, parts.device)
    return taken


def _apply_with(
    args: tuple, x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
    bias: Tensor | None, num_batches_tracked: Tensor | None, residual: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    return batch_norm_apply(x, running_mean, running_var, weight, bias, num_batches_tracked, residual, *args)


def _forward_launches(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    num_batches_tracked: Tensor | None,
    residual: Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
    sizes: tuple[int, int, int],
    acc: str,
    stat: np.dtype,
    relu: bool,
    groups: int = 0,
) -> Callable[..., tuple[Tensor, Tensor, Tensor]]:
    """``batch_norm_apply`` on OpenCL for operands like these as ``run(x, running_mean, running_var, weight,
    bias, num_batches_tracked, residual[, parts]) -> (y, mean, rstd)``: eps, momentum, the sizes and the epilogue
    bound (the operands' dtypes read, not kept). ``groups`` > 0 (training, float32 x): the batch statistics are
    merged from ``parts``, x's moments in that many groups a channel (``moments.ChannelMoments.parts``), in one
    launch that reads x once."""
    N, C, S = sizes
    device, shape, x_dtype = x.device, x.shape, x.dtype
    empty = Tensor.empty
    if C == 0 or x.size == 0:

        def nothing(x: Tensor, *operands: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
            if operands[4] is not None:  # no channel to normalize, one batch counted all the same
                add_(operands[4], 1)
            return empty(shape, x_dtype, device), empty((C,), stat, device), empty((C,), stat, device)

        return nothing
    vec = 4 if S % 4 == 0 else 1
    running = running_mean is not None
    idx = index_ctype(x.size)
    optional = [_dtype(t) for t in (weight, bias, running_mean, running_var)]
    dtypes = [x_dtype, stat, *[d for d in optional if d is not None]]
    counts, resid = num_batches_tracked is not None, residual is not None
    flags = {"VEC": vec, "TRAINING": training, "RUNNING": running, "COUNTER": counts, "RELU": relu, "RESID": resid}
    flags["MOMENTS"] = groups > 0
    w_dtype, b_dtype, rm_dtype, rv_dtype = optional

    def make() -> str:
        return (
            _header(dtypes, acc, idx, flags)
            + (MERGE_C if groups else "")
            + _stored(x_dtype, acc, vec)
            + _FORWARD.format(
                moments="\n                               __global const float* restrict mo, const int G,"
                if groups
                else "",
                merged=_MERGED if groups else "",
                xt=storage_ctype(x_dtype),
                params=_param("w", w_dtype)
                + _param("b", b_dtype)
                + _param("rm", rm_dtype, not training)
                + _param("rv", rv_dtype, not training)
                + ("__global long* restrict nbt, " if counts else "")
                + _param("r", x_dtype if resid else None),
                w="(ACC)w[c]" if w_dtype is not None else "(ACC)1",
                b="(ACC)b[c]" if b_dtype is not None else "(ACC)0",
            )
        )

    present = (w_dtype is not None, b_dtype is not None, running, counts, relu, resid)
    key = ("fwd", tuple(d.str for d in dtypes), *present, training, vec, idx, bool(groups))
    buffers = 4 + len(dtypes) - 2 + counts + resid  # x, the optional tensors, the counter, residual, y, mean, rstd
    types = [None] * buffers + [ARG_DTYPES[acc]] * 2 + [ARG_DTYPES[idx]] * 3 + [None, np.int32] * bool(groups)
    values = [float(eps), float(momentum), N, C, S // vec]
    scalars = {buffers + i: v for i, v in enumerate(values)}
    if groups:  # the moments' buffer passed per call (after the bound sizes), their group count bound
        scalars[buffers + len(values) + 1] = groups
    launches = _ChannelLaunches(
        key, device, make, "netcl_batch_norm", types, C, N * S // vec, scalars, training and not groups
    )  # fmt: skip

    def run(
        x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
        bias: Tensor | None, num_batches_tracked: Tensor | None, residual: Tensor | None, parts: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        y = empty(shape, x_dtype, device)
        mean, rstd = empty((C,), stat, device), empty((C,), stat, device)
        operands = (weight, bias, running_mean, running_var, num_batches_tracked, residual)
        present = [t.data for t in operands if t is not None]
        gathered = [] if parts is None else [parts.data]
        launches([x.data, *present, y.data, mean.data, rstd.data, *gathered], mean)
        return y, mean, rstd

    return run


@backend_op(_TWINS)
def batch_norm_apply(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    num_batches_tracked: Tensor | None,
    residual: Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
    sizes: tuple[int, int, int],
    acc: str,
    stat: np.dtype,
    relu: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """``batch_norm_forward`` of a checked call: x viewed as ``sizes`` (N, C, S), arithmetic in ``acc``
    (``stat``), the statistics' dtype, the epilogue ``relu`` (+ ``residual``) applied (prepared for this call
    alone: ``batch_norm_forward`` keeps them)."""
    args = (training, momentum, eps, sizes, acc, stat, relu)
    operands = (x, running_mean, running_var, weight, bias, num_batches_tracked, residual)
    return _forward_launches(*operands, *args)(*operands)


def batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """PyTorch's ``F.batch_norm``: training normalizes with the batch statistics and updates the running
    ones in place (when given); evaluation normalizes with the running statistics."""
    return batch_norm_forward(x, running_mean, running_var, weight, bias, training, momentum, eps)[0]


def batch_norm_backward(
    g: Tensor,
    x: Tensor,
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None = None,
    training: bool = False,
    needs: tuple[bool, bool, bool] = (True, True, True),
) -> Grads:
    """(dx, dweight, dbias) of ``batch_norm`` from the ``mean``/``rstd`` its forward returned; ``needs``
    picks which are computed (dweight only with a weight). Checked and prepared once per call signature."""
    flags = (*needs, False) if _flags(needs, 3) else UNKEYED
    return _backward(g, x, None, mean, rstd, weight, training, flags)[:3]


def batch_norm_relu_backward(
    g: Tensor,
    out: Tensor,
    x: Tensor,
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None = None,
    training: bool = False,
    needs: tuple[bool, bool, bool, bool] = (True, True, True, False),
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dweight, dbias, dresidual) of ``batch_norm_forward(..., relu=True[, residual=r])`` whose output was
    ``out``: the ReLU's mask (``out > 0``) applied to ``g`` inside the batch norm's kernel, and with ``needs[3]``
    the masked ``g`` (the residual's gradient) stored by the same kernel. Bit for bit the unfused backward (the
    mask's products are exact). Checked and prepared once per call signature."""
    flags = needs if _flags(needs, 4) else UNKEYED
    if out is None:
        raise TypeError(
            "batch_norm_relu_backward: out (the forward's output, whose sign is the ReLU's mask) is required"
        )
    return _backward(g, x, out, mean, rstd, weight, training, flags)


def _flags(needs: Any, count: int) -> bool:
    return type(needs) is tuple and len(needs) == count and {*map(type, needs)} <= {bool}


def _backward(
    g: Tensor, x: Tensor, out: Tensor | None, mean: Tensor, rstd: Tensor, weight: Tensor | None, training: bool,
    flags: Any,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:  # fmt: skip
    key = (
        tensor_sig(g) if g is not None else UNKEYED,
        tensor_sig(x) if x is not None else UNKEYED,
        tensor_sig(out),
        tensor_sig(mean) if mean is not None else UNKEYED,
        tensor_sig(rstd) if rstd is not None else UNKEYED,
        tensor_sig(weight),
        exact(training, bool),
        flags,
        _parts,  # the chunking policy the launches were prepared with
    )
    plan = _BACKWARDS.plans.get(key)
    if plan is None:
        plan = _BACKWARDS.keep(complete(key), _backward_plan(g, x, out, mean, rstd, weight, training, flags))
    return plan(g, x, out, mean, rstd, weight)


def _backward_plan(
    g: Tensor, x: Tensor, out: Tensor | None, mean: Tensor, rstd: Tensor, weight: Tensor | None, training: bool,
    needs: Any,
) -> Callable[..., tuple[Tensor | None, ...]]:  # fmt: skip
    """``_backward``'s checks for these arguments, and its work as ``run(g, x, out, mean, rstd, weight)``."""
    op = "batch_norm_backward"
    for name, t in (("g", g), ("x", x), ("mean", mean), ("rstd", rstd), ("weight", weight), ("out", out)):
        _tensor(op, name, t, optional=name in ("weight", "out"))
        if t is not None:
            same_device(x.device, t.device)
    if x.ndim < 2 or tuple(g.shape) != tuple(x.shape):
        raise ShapeError(f"{op}: g {tuple(g.shape)} and x {tuple(x.shape)} must be one (N, C, *) shape")
    if out is not None and (tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype):
        raise ShapeError(
            f"{op}: out (the ReLU epilogue's output) must have x's shape {tuple(x.shape)} and dtype {x.dtype}, "
            f"got {tuple(out.shape)} {out.dtype}"
        )
    if not _flags(needs, 4):
        raise TypeError(f"{op}: needs must be a tuple of bools (dx, dweight, dbias[, dresidual]), got {needs!r}")
    if needs[3] and out is None:
        raise ValueError(f"{op}: a residual's gradient exists only with the ReLU epilogue's output (out)")
    N, C, S = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    for name, t in (("mean", mean), ("rstd", rstd), ("weight", weight)):
        if t is not None and tuple(t.shape) != (C,):
            raise ShapeError(f"{op}: {name} must have shape ({C},), got {tuple(t.shape)}")
    acc, stat = _acc(x.dtype)
    if mean.dtype != stat or rstd.dtype != stat:
        raise DTypeError(f"{op}: mean and rstd must be {stat} (what batch_norm_forward returns), got {mean.dtype}")
    resolved = (needs[0], needs[1] and weight is not None, needs[2], needs[3])
    w_dtype = weight.dtype if weight is not None else x.dtype
    args = (bool(training), resolved, (N, C, S), acc, stat, w_dtype)
    if x.device.kind == NUMPY_KIND:
        return functools.partial(_grads_with, args)
    return _backward_launches(g, x, out, weight, *args)


def _grads_with(
    args: tuple, g: Tensor, x: Tensor, out: Tensor | None, mean: Tensor, rstd: Tensor, weight: Tensor | None
) -> tuple[Tensor | None, ...]:
    return batch_norm_grads(g, x, out, mean, rstd, weight, *args)


def _backward_launches(
    g: Tensor,
    x: Tensor,
    out: Tensor | None,
    weight: Tensor | None,
    training: bool,
    needs: tuple[bool, bool, bool, bool],
    sizes: tuple[int, int, int],
    acc: str,
    stat: np.dtype,
    w_dtype: np.dtype,
) -> Callable[..., tuple[Tensor | None, ...]]:
    """``batch_norm_grads`` on OpenCL for operands like these as ``run(g, x, out, mean, rstd, weight)``: the sizes
    bound (the operands' dtypes read, not kept)."""
    (need_dx, need_dw, need_db, need_dr), (N, C, S) = needs, sizes
    device, shape, g_dtype, x_dtype = x.device, x.shape, g.dtype, x.dtype
    has_weight, relu = weight is not None, out is not None
    reduce = need_dw or need_db or (need_dx and training)
    empty = Tensor.empty
    launches: _ChannelLaunches | None = None
    if C and (need_dx or reduce or need_dr) and x.size:
        vec = 4 if S % 4 == 0 else 1
        idx = index_ctype(x.size)
        dtypes = [x_dtype, g_dtype, stat, *([weight.dtype] if has_weight else [])]
        flags = {
            "VEC": vec, "TRAINING": bool(training), "REDUCE": reduce, "NEED_DX": need_dx, "RELU": relu,
            "RESID_GRAD": need_dr,
        }  # fmt: skip
        weight_dtype = _dtype(weight)

        def make() -> str:
            return _header(dtypes, acc, idx, flags) + _BACKWARD.format(
                xt=storage_ctype(x_dtype),
                gt=storage_ctype(g_dtype),
                params=_param("w", weight_dtype) + _param("out", x_dtype if relu else None),
                w="(ACC)w[c]" if has_weight else "(ACC)1",
                gr=_param("gr", g_dtype if need_dr else None, const=False),
            )

        key = ("bwd", tuple(d.str for d in dtypes), has_weight, *flags.values(), idx)
        buffers = 7 + has_weight + relu + need_dr  # x, g, (weight), (out), mean, rstd, gx (or dw), (gr), dw, db
        types = [None] * buffers + [ARG_DTYPES[idx]] * 3
        values = [N, C, S // vec]
        launches = _ChannelLaunches(
            key, device, make, "netcl_batch_norm_backward", types, C, N * S // vec,
            {buffers + i: v for i, v in enumerate(values)}, reduce, backward=True,
        )  # fmt: skip
    zero = bool(C and (need_dx or reduce) and not x.size)

    def run(
        g: Tensor, x: Tensor, out: Tensor | None, mean: Tensor, rstd: Tensor, weight: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        gx = empty(shape, g_dtype, device) if need_dx else None
        gr = empty(shape, g_dtype, device) if need_dr else None
        dw, db = empty((C,), stat, device), empty((C,), stat, device)
        if launches is not None:
            extra = [t.data for t in (weight, out) if t is not None]
            grad_out = [gr.data] if gr is not None else []
            launches([x.data, g.data, *extra, mean.data, rstd.data, (gx if need_dx else dw).data, *grad_out, dw.data,
                      db.data], dw)  # fmt: skip
        elif zero:
            from netcl.runtime.ops.pointwise import fill_

            fill_(dw, 0.0)
            fill_(db, 0.0)
        return (
            gx,
            _as(dw, w_dtype) if need_dw else None,
            _as(db, w_dtype) if need_db else None,
            gr,
        )

    return run


@backend_op(_TWINS, device_arg="x")
def batch_norm_grads(
    g: Tensor,
    x: Tensor,
    out: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
    training: bool,
    needs: tuple[bool, bool, bool, bool],
    sizes: tuple[int, int, int],
    acc: str,
    stat: np.dtype,
    w_dtype: np.dtype,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """``batch_norm_relu_backward`` of a checked call (``out`` None: no ReLU epilogue, plain
    ``batch_norm_backward``): ``needs`` (dx, dweight, dbias, dresidual) resolved (dweight only with a weight), x
    viewed as ``sizes`` (N, C, S), arithmetic in ``acc`` (``stat``), dweight and dbias in ``w_dtype`` (prepared
    for this call alone: the public functions keep them)."""
    run = _backward_launches(g, x, out, weight, training, needs, sizes, acc, stat, w_dtype)
    return run(g, x, out, mean, rstd, weight)


def _as(t: Tensor, dtype: np.dtype) -> Tensor:
    return t if t.dtype == dtype else cast(t, dtype)


__all__ = [
    "batch_norm",
    "batch_norm_backward",
    "batch_norm_forward",
    "batch_norm_relu_backward",
    "check_batch_norm",
    "check_epilogue",
]
