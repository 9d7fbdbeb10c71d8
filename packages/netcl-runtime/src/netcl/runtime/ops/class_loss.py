"""Cross-entropy of (rows, C) logits against integer class targets: three launches per step.

``class_loss_forward`` runs one work-group per row (as the softmax kernels): the row max, the sum
of ``exp(x - max)`` and, with label smoothing ``eps``, the row sum of x, then per row

    loss = lse - (1 - eps) * x[t] - eps / C * sum(x)    (lse = max + log(sum exp(x - max)))

which is ``-sum_c q_c * log_softmax(x)_c`` for ``q = (1 - eps) * one_hot(t) + eps / C`` (q sums to
1), and 0 where ``t == ignore_index``. ``class_loss_reduce`` adds the row losses and counts the
kept rows in ONE work-group (a fixed order: deterministic), giving the "sum" or the "mean" (0/0 =
NaN when every row is ignored, as PyTorch). ``class_loss_backward`` writes the gradient in one
pass per row: ``scale * (softmax(x) - q)`` with ``scale`` 0 for an ignored row, else the upstream
gradient (per row for "none", divided by ``max(count, 1)`` for "mean").

The composed path (log_softmax, one_hot, products and sums: about twenty launches for a small
classifier head) took most of a batch-128 MLP step's launches. A target out of range is recorded in
the device's error word (``class_loss_forward``); on the NumPy backend the caller
(``netcl.autograd.losses``) checks targets before computing. Arithmetic is in float32
(float64 for float64 logits); the loss has that dtype, the gradient the logits' dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.core.device_errors import INDEX_CHECK_C, index_error_code
from netcl.runtime import results
from netcl.runtime.cache import register_cache
from netcl.runtime.ops._common import get_kernel, remember, storage_ctype
from netcl.runtime.ops._grid import index_dtype, launch_prepared, prepared_for, run_1d
from netcl.runtime.ops._rows import sum_combine, tree_reduce_c
from netcl.runtime.ops.backend import backend_op
from netcl.runtime.ops.layout import cast
from netcl.runtime.ops.rowwise import RowKernel, row_format, run_row_kernel, stats_dtype

_TWINS = "netcl.runtime.numpy_twins.class_loss"

#: Reductions (compile-time in the backward kernel).
NONE, SUM, MEAN = 0, 1, 2
REDUCTIONS = {"none": NONE, "sum": SUM, "mean": MEAN}

_FORWARD = RowKernel(
    "class_loss_rows",
    (
        "__global const {st}* x, __global const {tt}* t, __global {ct}* loss, __global {ct}* rowmax, "
        "__global {ct}* rowsum, __global int* err, const long ignore, const {ct} eps, const int code"
    ),
    "{check}#define SMOOTH {smooth}\n",
    """    __global const {st}* xr = x + row * C;
    {ct} s;
    const {ct} shift = netcl_row_shift_sum(xr, C, scratch_a, &s);
#if SMOOTH
    {ct} sx = 0;
    for ({idx} i = lid; i < C; i += L) sx += LD(xr, i);
    sx = ROW_SUM(sx);
#endif
    if (lid == 0) {{
        rowmax[row] = shift;
        rowsum[row] = s;
        const long target = (long)t[row];
        {ct} value = 0;
        if (target != ignore && (target < 0 || target >= C)) {{
            netcl_index_error(err, code, target, C);  /* the row adds nothing, as an ignored one */
        }} else if (target != ignore) {{
            value = (shift + log(s)) - (({ct})1 - eps) * LD(xr, target);
#if SMOOTH
            value -= eps / ({ct})C * sx;
#endif
        }}
        loss[row] = value;
    }}
""",
)

_REDUCE = """{pragmas}{tree}
__kernel void netcl_class_loss_reduce(__global const {ct}* loss, __global const {tt}* t, __global {ct}* out,
                                      __global {ct}* count, const {idx} rows, const long ignore,
                                      const int mean) {{
    __local {ct} scratch[256];
    const int lid = get_local_id(0), L = get_local_size(0);
    {ct} s = 0, c = 0;
    for ({idx} i = lid; i < rows; i += L) {{
        s += loss[i];
        c += ((long)t[i] != ignore) ? ({ct})1 : ({ct})0;
    }}
    s = netcl_tree_sum(s, scratch);
    c = netcl_tree_sum(c, scratch);
    if (lid == 0) {{
        count[0] = c;
        out[0] = mean ? s / c : s;
    }}
}}
"""

#: The backward's row in ``float{vector}`` vectors (float32 rows a work-item each on a CPU, ``rowwise.row_format``):
#: every element with the label-smoothing term ``spread``, then the target's with the scalar formula of the loop.
_GRAD_VECTOR = """#if {vector}
inline void netcl_class_grad_vector(__global float* gx, __global const float* xr, const float shift, const float inv,
                                    const float scale, const float spread, const long target, const float eps,
                                    const {idx} C) {{
    {idx} i = 0;
    for (; i + {vector} <= C; i += {vector})
        vstore{vector}(scale * (exp(vload{vector}(0, xr + i) - shift) * inv - spread), 0, gx + i);
    for (; i < C; ++i) gx[i] = scale * (exp(xr[i] - shift) * inv - spread);
    if (target >= 0 && target < C) gx[target] = scale * (exp(xr[target] - shift) * inv - ((1.0f - eps) + spread));
}}
#endif
"""

_BACKWARD = RowKernel(
    "class_loss_rows_backward",
    (
        "__global const {st}* x, __global const {tt}* t, __global const {ct}* rowmax, "
        "__global const {ct}* rowsum, __global const {ct}* g, __global const {ct}* count, "
        "__global {st}* gx, const long ignore, const {ct} eps"
    ),
    "#define REDUCTION {reduction}\n" + _GRAD_VECTOR,
    """    const long target = (long)t[row];
#if REDUCTION == 0
    const {ct} upstream = g[row];
#elif REDUCTION == 1
    const {ct} upstream = g[0];
#else
    const {ct} upstream = g[0] / fmax(count[0], ({ct})1);
#endif
    const {ct} scale = (target != ignore && target >= 0 && target < C) ? upstream : ({ct})0;
    const {ct} shift = rowmax[row], inv = ({ct})1 / rowsum[row], spread = eps / ({ct})C;
    __global const {st}* xr = x + row * C;
#if {vector}
    netcl_class_grad_vector(gx + row * C, xr, shift, inv, scale, spread, target, eps, C);
#else
    for ({idx} i = lid; i < C; i += L) {{
        const {ct} q = (i == target ? ({ct})1 - eps : ({ct})0) + spread;
        ST(gx, row * C + i, (scale * (exp(LD(xr, i) - shift) * inv - q)));
    }}
#endif
""",
)


_CHECK_TARGETS = """{check}
__kernel void netcl_check_class_targets(__global const {tt}* t, __global int* err, const long n, const long C,
                                        const long ignore, const int code) {{
    const long gid = get_global_id(0);
    if (gid >= n) return;
    const long target = (long)t[gid];
    if (target != ignore && (target < 0 || target >= C)) netcl_index_error(err, code, target, C);
}}
"""


@backend_op(_TWINS)
def check_targets(t: Tensor, classes: int, ignore_index: int, op: str) -> None:
    """IndexError for a class target outside ``[0, classes)`` that is not ``ignore_index``.

    On OpenCL the check is one launch and no wait: the value is recorded in the error word and the host
    raises at its next wait. On the NumPy backend the targets are on the host: raised here."""
    if t.size == 0:
        return
    tt = storage_ctype(t.dtype)
    word = t.device.error_word.buffer(t.device.queue)
    code = np.int32(target_error_code(op, ignore_index))
    run_1d(
        ("class_targets", tt),
        t.device,
        lambda: _CHECK_TARGETS.format(check=INDEX_CHECK_C, tt=tt),
        "netcl_check_class_targets",
        [None, None, np.int64, np.int64, np.int64, np.int32],
        t.size,
        t,
        word,
        np.int64(t.size),
        np.int64(classes),
        np.int64(ignore_index),
        code,
    )


def _formats(x: Tensor, t: Tensor, **flags: int) -> dict[str, Any]:
    return {**row_format(x, 0), "tt": storage_ctype(t.dtype), "check": INDEX_CHECK_C, **flags}


def target_error_code(op: str, ignore_index: int) -> int:
    """The error-word code of an out-of-range class target of ``op`` (``netcl.core.device_errors``)."""
    return index_error_code(op, "target", None, f"or target == ignore_index ({ignore_index})")


@backend_op(_TWINS)
def class_loss_forward(
    x: Tensor, t: Tensor, ignore_index: int, smoothing: float, op: str = "cross_entropy"
) -> tuple[Tensor, Tensor, Tensor]:
    """(per-row loss, row max, row sum of exp(x - max)) of logits ``x`` (rows, C), targets ``t`` (rows,).

    On OpenCL a target outside ``[0, C)`` that is not ``ignore_index`` adds nothing (as an ignored row,
    though it counts in the mean) and is recorded in the error word: the host raises ``IndexError`` naming
    ``op`` at its next wait. The NumPy backend's caller checks targets on the host first."""
    device = x.device
    key = (device, x.shape, x.dtype, t.dtype, bool(smoothing), op, ignore_index)
    plan = _FORWARD_PLANS.get(key)
    if plan is not None:  # a repeated signature: its launch and sizes prepared, its error code known
        prepared, rows, nbytes, sd, code = plan
        allocate = device.allocator
        loss, rowmax, rowsum = (results.tensor(allocate(device, nbytes), (rows,), sd, device) for _ in range(3))
        word = device.error_word.buffer(device.queue)
        prepared.call(x.data, t.data, loss.data, rowmax.data, rowsum.data, word, ignore_index, smoothing, code)
        return loss, rowmax, rowsum
    rows, C = x.shape
    sd = stats_dtype(x.dtype)
    loss, rowmax, rowsum = (Tensor.empty((rows,), sd, x.device) for _ in range(3))
    code = target_error_code(op, ignore_index)
    prepared = run_row_kernel(
        _FORWARD,
        _formats(x, t, smooth=int(bool(smoothing))),
        x.device,
        rows,
        C,
        [x, t, loss, rowmax, rowsum, x.device.error_word.buffer(x.device.queue)],
        (np.int64(ignore_index), sd.type(smoothing), np.int32(code)),
    )
    if prepared is not None:
        remember(_FORWARD_PLANS, key, (prepared, rows, loss.nbytes, sd, code))
    return loss, rowmax, rowsum


#: (device, logits shape, dtype, target dtype, smoothing or not, op, ignore_index) -> (prepared launch, rows,
#: bytes of each row statistic, their dtype, the error code) of ``class_loss_forward``
_FORWARD_PLANS: dict[tuple, tuple] = {}
register_cache(_FORWARD_PLANS.clear)
#: (device, logits shape, dtype, target dtype, reduction) -> (prepared launch, gradient bytes) of the backward
_BACKWARD_PLANS: dict[tuple, tuple] = {}
register_cache(_BACKWARD_PLANS.clear)


@backend_op(_TWINS)
def class_loss_reduce(loss: Tensor, t: Tensor, ignore_index: int, mean: bool) -> tuple[Tensor, Tensor]:
    """(0-d sum or mean of the row losses, 0-d count of rows whose target is not ``ignore_index``)."""
    sd = loss.dtype
    device = loss.device
    plan_key = (device, loss.shape, sd, t.dtype)
    plan = _REDUCE_PLANS.get(plan_key)
    if plan is not None:  # a repeated signature: its kernel, sizes and index type known
        prepared, nbytes, rows = plan
        allocate = device.allocator
        out, count = (
            results.tensor(allocate(device, nbytes), (), sd, device),
            results.tensor(allocate(device, nbytes), (), sd, device),
        )
        prepared.call(loss.data, t.data, out.data, count.data, rows, ignore_index, int(mean))
        return out, count
    out, count = Tensor.empty((), sd, loss.device), Tensor.empty((), sd, loss.device)
    fmt = _formats(loss, t)

    def source() -> str:
        return _REDUCE.format(tree=tree_reduce_c("netcl_tree_sum", fmt["ct"], sum_combine()), **fmt)

    idx = index_dtype(fmt["idx"])
    types = [None] * 4 + [idx, np.int64, np.int32]
    key = ("class_loss", "reduce", *sorted(fmt.items()))
    resolved = get_kernel(key, loss.device, source, "netcl_class_loss_reduce", types)
    local = min(256, resolved.max_local)
    rows = loss.shape[0]
    args = (loss, t, out, count, idx.type(rows), np.int64(ignore_index), np.int32(mean))
    launch_prepared(key, loss.device, resolved.kernel, local, local, args)
    remember(_REDUCE_PLANS, plan_key, (prepared_for(key, device, resolved.kernel, local, local), out.nbytes, rows))
    return out, count


#: (device, row-loss shape, dtype, target dtype) -> (prepared launch, bytes of each 0-d result, rows) of
#: ``class_loss_reduce``
_REDUCE_PLANS: dict[tuple, tuple] = {}
register_cache(_REDUCE_PLANS.clear)


@backend_op(_TWINS, device_arg="x")
def class_loss_backward(
    g: Tensor,
    x: Tensor,
    t: Tensor,
    rowmax: Tensor,
    rowsum: Tensor,
    count: Tensor,
    ignore_index: int,
    smoothing: float,
    reduction: str,
) -> Tensor:
    """d loss / d x for upstream ``g`` ((rows,) for "none", 0-d otherwise); x's shape and dtype."""
    sd = stats_dtype(x.dtype)
    g = g if g.dtype == sd else cast(g, sd)
    device = x.device
    key = (device, x.shape, x.dtype, t.dtype, reduction)
    plan = _BACKWARD_PLANS.get(key)
    if plan is not None:
        prepared, nbytes = plan
        gx = results.tensor(device.allocator(device, nbytes), x.shape, x.dtype, device)
        prepared.call(x.data, t.data, rowmax.data, rowsum.data, g.data, count.data, gx.data, ignore_index, smoothing)
        return gx
    rows, C = x.shape
    mode = REDUCTIONS[reduction]
    gx = Tensor.empty((rows, C), x.dtype, x.device)
    prepared = run_row_kernel(
        _BACKWARD,
        _formats(x, t, reduction=mode),
        x.device,
        rows,
        C,
        [x, t, rowmax, rowsum, g, count, gx],
        (np.int64(ignore_index), sd.type(smoothing)),
    )
    if prepared is not None:
        remember(_BACKWARD_PLANS, key, (prepared, gx.nbytes))
    return gx
