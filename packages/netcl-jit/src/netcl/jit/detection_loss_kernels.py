"""OpenCL C source of the fused detection loss (docs/architecture.md, ``detection_loss``): three kernels.

* ``detection_loss_partial`` — one work-group per block. Each work-item walks a strided range
  of elements (``VEC`` == 1) or of float4 chunks (``VEC`` == 4, ``vload4``), adds
  ``heat_scale*hw*BCE_LOGITS(x, t) + reg_scale*rw*SMOOTH_L1(x - t, beta)`` per element into a
  Kahan-compensated float accumulator, then the group tree-reduces in local memory and writes
  one partial per block.
* ``detection_loss_reduce`` — one work-group sums the partials (compensated strided sums, then
  the same tree) into the 0-d loss.
* ``detection_loss_backward`` — ``grad_pred = g * (heat_scale*hw*(sigmoid(x) - t) +
  reg_scale*rw*SMOOTH_L1_GRAD(x - t, beta))``, ``VEC`` elements per work-item; ``g`` (the
  upstream gradient) is read from its device buffer.

The work-group size (``LOCAL``), the vector width and the index type are compiled in; the
scales, ``beta`` and the element count are kernel arguments. The reduction order depends only
on the element count and the launch geometry, so a plan gives bit-identical results on every
call. Float4 loads pay off on GPUs (wide coalesced loads). On CPU devices (``VEC`` 8 or 16, the
device's preferred float width) the terms are evaluated on ``floatN`` values with the vector
helpers (``netcl.core.kernels.vector_primitives``), so they compile to SIMD code (see
benchmarks/RESULTS.md, "Measurements moved out of source docstrings", detection_loss_kernels.py).
"""

from __future__ import annotations

from netcl.core.kernels.primitives import PRIMITIVE_PREAMBLE
from netcl.core.kernels.vector_primitives import vector_preamble
from netcl.runtime.ops._rows import sum_combine, tree_reduce_c

#: every kernel here runs LOCAL work-items a group (reqd_work_group_size): the tree's size is a constant
_GROUP_SUM = tree_reduce_c("group_sum", "float", sum_combine(), final_barrier=False, half="LOCAL / 2")

PARTIAL_NAME = "detection_loss_partial"
REDUCE_NAME = "detection_loss_reduce"
BACKWARD_NAME = "detection_loss_backward"

_BODY = r"""
#define LOCAL {local}
#define VEC {vec}
typedef {index} idx_t;

inline float detection_term(float x, float t, float hw, float rw, float hs, float rs, float beta) {{
    return hs * hw * BCE_LOGITS(x, t) + rs * rw * SMOOTH_L1(x - t, beta);
}}

inline float detection_grad(float x, float t, float hw, float rw, float hs, float rs, float beta) {{
    return hs * hw * BCE_LOGITS_GRAD(x, t) + rs * rw * SMOOTH_L1_GRAD(x - t, beta);
}}

/* Kahan step: sum += value, with the running compensation in comp (float or float4). */
#define KAHAN(T, sum, comp, value) \
    {{ T y_ = (value) - comp; T s_ = sum + y_; comp = (s_ - sum) - y_; sum = s_; }}

/* Tree-reduce one value per work-item; every work-item gets the group total (runtime's tree_reduce_c). */
{group_sum}
__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void detection_loss_partial(
    __global const float* pred,
    __global const float* target,
    __global const float* heat_w,
    __global const float* reg_w,
    __global float* partials,
    const float hs,
    const float rs,
    const float beta,
    const idx_t n)
{{
    __local float scratch[LOCAL];
    const idx_t gid = get_global_id(0);
    const idx_t stride = get_global_size(0);
#if VEC == 4
    const idx_t n4 = n / 4;
    float4 sum4 = (float4)(0.0f);
    float4 comp4 = (float4)(0.0f);
    for (idx_t i = gid; i < n4; i += stride) {{
        float4 x = vload4(i, pred), t = vload4(i, target), hw = vload4(i, heat_w), rw = vload4(i, reg_w);
        float4 term = (float4)(
            detection_term(x.s0, t.s0, hw.s0, rw.s0, hs, rs, beta),
            detection_term(x.s1, t.s1, hw.s1, rw.s1, hs, rs, beta),
            detection_term(x.s2, t.s2, hw.s2, rw.s2, hs, rs, beta),
            detection_term(x.s3, t.s3, hw.s3, rw.s3, hs, rs, beta));
        KAHAN(float4, sum4, comp4, term);
    }}
    float4 v = sum4 - comp4;
    float sum = (v.s0 + v.s1) + (v.s2 + v.s3);
    const idx_t tail = 4 * n4 + gid;
    if (tail < n) sum += detection_term(pred[tail], target[tail], heat_w[tail], reg_w[tail], hs, rs, beta);
#elif VEC > 4
    const idx_t nv = n / VEC;
    VF sumv = (VF)(0.0f);
    VF compv = (VF)(0.0f);
    for (idx_t i = gid; i < nv; i += stride) {{
        VF x = vload{vec}(i, pred), t = vload{vec}(i, target), hw = vload{vec}(i, heat_w), rw = vload{vec}(i, reg_w);
        VF term = hs * hw * V_BCE_LOGITS(x, t) + rs * rw * V_SMOOTH_L1(x - t, beta);
        KAHAN(VF, sumv, compv, term);
    }}
    float lanes[VEC];
    vstore{vec}(sumv - compv, 0, lanes);
    float sum = 0.0f;
    for (int k = 0; k < VEC; ++k) sum += lanes[k];
    for (idx_t j = VEC * nv + gid; j < n; j += stride)
        sum += detection_term(pred[j], target[j], heat_w[j], reg_w[j], hs, rs, beta);
#else
    float sum = 0.0f;
    float comp = 0.0f;
    for (idx_t i = gid; i < n; i += stride) {{
        KAHAN(float, sum, comp, detection_term(pred[i], target[i], heat_w[i], reg_w[i], hs, rs, beta));
    }}
    sum -= comp;
#endif
    float total = group_sum(sum, scratch);
    if (get_local_id(0) == 0) partials[get_group_id(0)] = total;
}}

__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void detection_loss_reduce(__global const float* partials, __global float* out, const int count)
{{
    __local float scratch[LOCAL];
    float sum = 0.0f;
    float comp = 0.0f;
    for (int i = get_local_id(0); i < count; i += LOCAL) {{
        KAHAN(float, sum, comp, partials[i]);
    }}
    float total = group_sum(sum - comp, scratch);
    if (get_local_id(0) == 0) out[0] = total;
}}

__kernel void detection_loss_backward(
    __global const float* pred,
    __global const float* target,
    __global const float* heat_w,
    __global const float* reg_w,
    __global const float* grad_out,
    __global float* grad_pred,
    const float hs,
    const float rs,
    const float beta,
    const idx_t n)
{{
    const idx_t i = get_global_id(0);
    const idx_t first = VEC * i;
    if (first >= n) return;
    const float g = grad_out[0];
#if VEC == 4
    if (first + 4 <= n) {{
        float4 x = vload4(i, pred), t = vload4(i, target), hw = vload4(i, heat_w), rw = vload4(i, reg_w);
        float4 d = (float4)(
            detection_grad(x.s0, t.s0, hw.s0, rw.s0, hs, rs, beta),
            detection_grad(x.s1, t.s1, hw.s1, rw.s1, hs, rs, beta),
            detection_grad(x.s2, t.s2, hw.s2, rw.s2, hs, rs, beta),
            detection_grad(x.s3, t.s3, hw.s3, rw.s3, hs, rs, beta));
        vstore4(g * d, i, grad_pred);
        return;
    }}
    for (idx_t j = first; j < n; ++j)
        grad_pred[j] = g * detection_grad(pred[j], target[j], heat_w[j], reg_w[j], hs, rs, beta);
#elif VEC > 4
    if (first + VEC <= n) {{
        VF x = vload{vec}(i, pred), t = vload{vec}(i, target), hw = vload{vec}(i, heat_w), rw = vload{vec}(i, reg_w);
        VF d = hs * hw * V_BCE_LOGITS_GRAD(x, t) + rs * rw * V_SMOOTH_L1_GRAD(x - t, beta);
        vstore{vec}(g * d, i, grad_pred);
        return;
    }}
    for (idx_t j = first; j < n; ++j)
        grad_pred[j] = g * detection_grad(pred[j], target[j], heat_w[j], reg_w[j], hs, rs, beta);
#else
    grad_pred[i] = g * detection_grad(pred[i], target[i], heat_w[i], reg_w[i], hs, rs, beta);
#endif
}}
"""


def detection_loss_source(index_ctype: str, local_size: int, vec: int = 4) -> str:
    """The program of the three kernels: ``int``/``long`` indices, work-group ``local_size``, width ``vec``
    (1 or 4: per-element helpers; 8 or 16: the body on ``floatN`` vectors)."""
    if index_ctype not in ("int", "long"):
        raise ValueError(f"index type must be 'int' or 'long', got {index_ctype!r}")
    if local_size < 1 or local_size & (local_size - 1):
        raise ValueError(f"work-group size must be a power of two, got {local_size}")
    if vec not in (1, 4, 8, 16):
        raise ValueError(f"vector width must be 1, 4, 8 or 16, got {vec}")
    vectors = vector_preamble(vec) if vec > 4 else ""
    return (
        PRIMITIVE_PREAMBLE + vectors + _BODY.format(index=index_ctype, local=local_size, vec=vec, group_sum=_GROUP_SUM)
    )
