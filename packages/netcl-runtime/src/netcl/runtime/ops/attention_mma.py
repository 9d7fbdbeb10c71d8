"""Tensor-core attention on NVIDIA GPUs: FlashAttention-2 on ``mma.sync`` (f16 products, fp32 accumulation).

The variant ``mma`` of ``attention.VARIANTS``, tried before the blocked kernels. It takes a call on an
NVIDIA OpenCL device whose tensor cores run f16 products (``gemm_mma.enabled(device, "f16")``: the GEMM's
probe) when the call has no mask, no dropout, ``E == Ev`` in ``FEATURES``, and

* float16 (storage) tensors, or
* float32 tensors at matmul precision "fp16" (``get_float32_matmul_precision``): what ``netcl.amp.autocast``
  sets around attention on a device where float16 is storage-only (NVIDIA's OpenCL), as it does for matmul
  (``autocast_mode.fallback_precision``).

Float32 at matmul precision "high" or "tf32x3" goes to the tf32 kernels (``attention_mma_tf32``, the
variant before this one); at any other precision it stays on the exact float32 kernels.
``NETCL_ATTENTION=mma`` makes these kernels take the other float32 calls too (operands rounded to f16);
``blocked``, ``quad`` or ``portable`` turn them off. Masks and dropout go to the next variant.

Numbers: q, k, v (and the upstream gradient) are rounded to f16 (nearest even; float32 tensors by a copy
before the kernels, ``cast_source``); scores, the softmax statistics (row max, row sum, ``lse``) and every
accumulator are float32; the probabilities P and dS are rounded to f16 before their products
(FlashAttention-2's numbers). The output
and the gradients have the inputs' dtype; ``lse`` is float32 and means what it means for the other
variants (natural log-sum-exp of the scaled scores, ``-inf`` for a row that sees no key), so any backward
follows any forward.

Kernels (``attention_mma_source``, blocking in its ``PLANS``): forward one launch (a work-group of 4 warps
per 128 query rows at E 64, 64 at E 128; key/value tiles copied by ``cp.async`` into two local buffers, the
next under this one's products; online softmax in registers); backward two: ``bwd_q`` (64 query rows, Q and
dO fragments in registers, loops over key tiles: dQ, and ``D = rowsum(dO * O)`` written for the next launch)
then ``bwd_kv`` (64 keys, loops over the q heads of its kv head and their query tiles: dK, dV). No atomics:
the backward is deterministic. Causal calls (top-left aligned, as torch) skip the tiles that are wholly
masked and mask only the tiles on the diagonal; their query blocks run longest first.

``emulate=True`` runs the same kernels with OpenCL C models of the PTX instructions
(``attention_mma_source``) on any OpenCL device: the tests' check of the kernels' arithmetic off NVIDIA.
"""

from __future__ import annotations

import math
import os

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float16, float32
from netcl.runtime.launch import launch
from netcl.runtime.ops import (
    attention_blocked,  # noqa: F401  registers the blocked variant first: ours goes before it
    gemm_mma,
)
from netcl.runtime.ops._common import get_kernel
from netcl.runtime.ops._grid import index_ctype, index_dtype
from netcl.runtime.ops.attention import VARIANTS, AttentionVariant
from netcl.runtime.ops.attention_mma_source import CAST_NAME, NAMES, THREADS, attention_source, cast_source, plan
from netcl.runtime.ops.attention_spec import NO_MASK, AttentionSpec
from netcl.runtime.ops.precision import get_float32_matmul_precision

#: feature sizes (``E == Ev``) the kernels take
FEATURES = (64, 128)
#: the matmul precision at which float32 calls run here (f16 operands): autocast's on NVIDIA's OpenCL
PRECISION = "fp16"


def _choice() -> str:
    return os.environ.get("NETCL_ATTENTION", "").strip().lower()


def takes(dtype: np.dtype, spec: AttentionSpec) -> bool:
    """Whether the call's dtype, precision, options and sizes are ones the kernels run (any device)."""
    dtype = np.dtype(dtype)
    if dtype == float32:
        numbers = _choice() == "mma" or get_float32_matmul_precision() == PRECISION
    else:
        numbers = dtype == float16
    return numbers and spec.mask_kind == NO_MASK and spec.dropout_p == 0.0 and spec.Ev == spec.E and spec.E in FEATURES


def supports(device: Device, dtype: np.dtype, spec: AttentionSpec) -> bool:
    """``takes`` on a device whose tensor cores multiply f16 (the GEMM's probe, ``NETCL_MMA``), unless
    ``NETCL_ATTENTION`` names another variant."""
    if _choice() in ("blocked", "quad", "portable") or device.kind != "opencl":
        return False
    return takes(dtype, spec) and gemm_mma.enabled(device, "f16")


def _run(
    kernel: str, buffers: list[Tensor], items: int, planes: int, spec: AttentionSpec, emulate: bool, half: bool
) -> None:
    """Launch ``kernel`` over ``items`` rows (queries, or keys for bwd_kv) of ``planes`` heads; ``buffers``:
    float16 operands; ``half``: float16 outputs (else float32)."""
    if items == 0 or planes == 0:
        return
    device = buffers[0].device
    idx = index_ctype(max(spec.BH * spec.L, spec.BHkv * spec.S) * spec.E)
    fields = {"e": spec.E, "causal": spec.causal, "half": half, "idx": idx, "emulate": emulate}
    p = plan(kernel, spec.E)
    key = ("attention-mma", kernel, p, *sorted(fields.items()))
    it = index_dtype(idx)
    types = [None] * len(buffers) + [it] * 5 + [np.float32, np.float32]
    resolved = get_kernel(key, device, lambda: attention_source(kernel, **fields), NAMES[kernel], types)
    gsize = (-(-items // p.rows) * THREADS, planes)
    scalars = [it.type(x) for x in (spec.L, spec.S, spec.Hq, spec.group, spec.Hkv)]
    scale2 = np.float32(spec.scale * math.log2(math.e))  # scores in log2 units: exp2 in the kernels
    launch(
        resolved.kernel,
        gsize,
        (THREADS, 1),
        *buffers,
        *scalars,
        scale2,
        np.float32(spec.scale),
        queue=device.queue,
    )


def _f16(x: Tensor) -> Tensor:
    """x as float16 (float32 rounded to nearest even; float16 as it is)."""
    if x.dtype == float16:
        return x
    out = Tensor.empty(x.shape, float16, x.device)
    n = x.size
    if n == 0:
        return out
    idx = index_ctype(n + 8)
    it = index_dtype(idx)
    resolved = get_kernel(("attention-mma-f16", idx), x.device, lambda: cast_source(idx), CAST_NAME, [None, None, it])
    items = -(-n // 8)
    launch(resolved.kernel, (-(-items // 128) * 128,), (128,), x, out, it.type(n), queue=x.device.queue)
    return out


def _check_layout(*tensors: Tensor) -> None:
    for t in tensors:
        if t.dtype not in (float16, float32):
            raise TypeError(f"attention_mma: float16 or float32 tensors only, got {t.dtype}")


def forward(q, k, v, mask, spec: AttentionSpec, seed, counter, *, emulate: bool = False) -> tuple[Tensor, Tensor]:
    """(output in q's dtype, float32 lse) in one launch (``emulate``: the PTX models, any OpenCL device)."""
    _check_layout(q, k, v)
    out = Tensor.empty((*spec.lead, spec.L, spec.Ev), q.dtype, q.device)
    lse = Tensor.empty((*spec.lead, spec.L), np.float32, q.device)
    _run("fwd", [_f16(q), _f16(k), _f16(v), out, lse], spec.L, spec.BH, spec, emulate, q.dtype == float16)
    return out, lse


def backward(
    g, q, k, v, out, lse, mask, spec: AttentionSpec, seed, counter, *, emulate: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) in the inputs' dtype, two launches: ``bwd_q`` (also writes ``D = rowsum(dO * O)``), then
    ``bwd_kv``. ``lse`` may come from any variant's forward."""
    _check_layout(g, q, k, v, out)
    if out.dtype != q.dtype:
        raise TypeError(f"attention_mma: out must have q's dtype {q.dtype}, got {out.dtype}")
    dq = Tensor.empty(q.shape, q.dtype, q.device)
    dk = Tensor.empty(k.shape, k.dtype, k.device)
    dv = Tensor.empty(v.shape, v.dtype, v.device)
    drow = Tensor.empty(lse.shape, np.float32, q.device)
    half = q.dtype == float16
    q, k, v, g = (_f16(x) for x in (q, k, v, g))
    _run("bwd_q", [q, k, v, out, g, lse, dq, drow], spec.L, spec.BH, spec, emulate, half)
    _run("bwd_kv", [q, k, v, g, lse, drow, dk, dv], spec.S, spec.BHkv, spec, emulate, half)
    return dq, dk, dv


VARIANT = AttentionVariant("mma", supports, forward, backward)
VARIANTS.insert(0, VARIANT)
