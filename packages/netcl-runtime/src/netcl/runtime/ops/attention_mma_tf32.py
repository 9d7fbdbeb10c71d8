"""Tensor-core attention for float32 tensors on NVIDIA GPUs: FlashAttention-2 on ``mma.sync`` m16n8k8 tf32.

The variant ``mma-tf32`` of ``attention.VARIANTS`` (before ``mma`` and the blocked kernels). It takes a
float32 call on an NVIDIA OpenCL device whose tensor cores passed the GEMM's probe of the kind
(``gemm_mma.enabled(device, kind)``) when the call has no mask, no dropout and ``E == Ev`` in ``FEATURES``,
at matmul precision (``get_float32_matmul_precision``)

* "high": kind "tf32": q, k, v, dO, P and dS rounded to tf32 (10-bit mantissa, nearest, ties away: the
  GEMM's rounding, ``precision.round_tf32``) before their products, fp32 accumulation;
* "tf32x3": kind "tf32x3": every operand split x = hi + lo into two tf32 parts, each product
  lo*hi + hi*lo + hi*hi (fp32's accuracy, the GEMM's tf32x3);
* "highest" (the default): ``HIGHEST``'s kind, "tf32x3" (None: the blocked fp32 kernels run it).

``NETCL_ATTENTION=blocked``, ``quad`` or ``portable`` turns the kernels off; ``mma`` leaves them on (the f16
kernels take the float32 calls these do not).

Numbers: scores, softmax statistics (row max, row sum, ``lse``) and every accumulator are float32; the
output and the gradients are float32; ``lse`` means what it means for the other variants (natural
log-sum-exp of the scaled scores, ``-inf`` for a row that sees no key), so any backward follows any
forward. Kernels: ``attention_mma_tf32_source`` (forward one launch; backward two, ``bwd_q`` then
``bwd_kv``, no atomics: deterministic; causal calls skip wholly masked tiles).

``emulate=True`` runs the same kernels with OpenCL C models of the PTX instructions on any OpenCL device:
the tests' check of the kernels' arithmetic off NVIDIA.
"""

from __future__ import annotations

import os

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float32
from netcl.runtime.ops import attention_mma, gemm_mma
from netcl.runtime.ops.attention import VARIANTS, AttentionVariant, PackedKernels
from netcl.runtime.ops.attention_mma_tf32_source import KINDS, NAMES, THREADS, attention_source, plan
from netcl.runtime.ops.attention_spec import NO_MASK, AttentionSpec
from netcl.runtime.ops.precision import get_float32_matmul_precision

#: feature sizes (``E == Ev``) the kernels take
FEATURES = (64, 128)
#: the kind float32 calls at matmul precision "highest" run (None: the blocked fp32 kernels run them): tf32x3,
#: whose errors against float64 measured at or below the blocked kernels' at 1.3-1.4x their speed; torch's
#: float32 SDPA multiplies the same way (3xTF32). See docs/attention_mma.md, "Routing highest"
HIGHEST: str | None = "tf32x3"
#: matmul precision -> kind (bf16x3 has no attention kernel of its own: tf32x3, the more accurate, runs it)
_KIND_OF = {"high": "tf32", "tf32x3": "tf32x3", "bf16x3": "tf32x3"}


def kind_for(precision: str) -> str | None:
    """The kind ("tf32", "tf32x3") float32 calls at matmul ``precision`` run, or None (not these kernels)."""
    return HIGHEST if precision == "highest" else _KIND_OF.get(precision)


def takes(dtype: np.dtype, spec: AttentionSpec) -> bool:
    """Whether the call's dtype, precision, options and sizes are ones the kernels run (any device)."""
    return (
        np.dtype(dtype) == float32
        and kind_for(get_float32_matmul_precision()) is not None
        and spec.mask_kind == NO_MASK
        and spec.dropout_p == 0.0
        and spec.Ev == spec.E
        and spec.E in FEATURES
    )


def supports(device: Device, dtype: np.dtype, spec: AttentionSpec) -> bool:
    """``takes`` on a device whose tensor cores multiply the kind (the GEMM's probe, ``NETCL_MMA``), unless
    ``NETCL_ATTENTION`` names a portable variant."""
    if os.environ.get("NETCL_ATTENTION", "").strip().lower() in ("blocked", "quad", "portable"):
        return False
    if device.kind != "opencl" or not takes(dtype, spec):
        return False
    return gemm_mma.enabled(device, kind_for(get_float32_matmul_precision()))


def _kind(kind: str | None) -> str:
    """``kind``, or the current precision's; checked."""
    kind = kind_for(get_float32_matmul_precision()) if kind is None else kind
    if kind not in KINDS:
        raise ValueError(f"attention_mma_tf32: kind must be one of {KINDS} (or matmul precision 'high' / 'tf32x3')")
    return kind


def _run(
    kernel: str,
    buffers: list[Tensor],
    items: int,
    planes: int,
    spec: AttentionSpec,
    kind: str,
    emulate: bool,
    packed: bool = False,
) -> None:
    """``attention_mma.launch_flash`` of this module's ``kernel`` in ``kind``; ``packed``: q, k and v (and
    their gradients) in one (B, L, 3 * H * E) tensor, the output and its gradient (B, L, H * E)."""
    fields = {"e": spec.E, "causal": spec.causal, "kind": kind, "emulate": emulate, "packed": packed}
    p = plan(kernel, spec.E, kind)
    attention_mma.launch_flash(
        "attention-mma-tf32", kernel, NAMES[kernel], p, attention_source, fields, buffers, items, planes, spec, THREADS
    )


def _check(*tensors: Tensor) -> None:
    for t in tensors:
        if t.dtype != float32:
            raise TypeError(f"attention_mma_tf32: float32 tensors only, got {t.dtype}")


def forward(
    q, k, v, mask, spec: AttentionSpec, seed, counter, *, kind: str | None = None, emulate: bool = False
) -> tuple[Tensor, Tensor]:
    """(float32 output, float32 lse) in one launch; ``kind``: "tf32" or "tf32x3" (None: the current matmul
    precision's); ``emulate``: the PTX models, any OpenCL device."""
    _check(q, k, v)
    kind = _kind(kind)
    out = Tensor.empty((*spec.lead, spec.L, spec.Ev), float32, q.device)
    lse = Tensor.empty((*spec.lead, spec.L), float32, q.device)
    _run("fwd", [q, k, v, out, lse], spec.L, spec.BH, spec, kind, emulate)
    return out, lse


def backward(
    g, q, k, v, out, lse, mask, spec: AttentionSpec, seed, counter, *, kind: str | None = None, emulate: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) in float32, two launches: ``bwd_q`` (also writes ``D = rowsum(dO * O)``), then ``bwd_kv``.
    ``lse`` may come from any variant's forward."""
    _check(g, q, k, v, out)
    kind = _kind(kind)
    dq = Tensor.empty(q.shape, float32, q.device)
    dk = Tensor.empty(k.shape, float32, k.device)
    dv = Tensor.empty(v.shape, float32, v.device)
    drow = Tensor.empty(lse.shape, np.float32, q.device)
    _run("bwd_q", [q, k, v, out, g, lse, dq, drow], spec.L, spec.BH, spec, kind, emulate)
    _run("bwd_kv", [q, k, v, g, lse, drow, dk, dv], spec.S, spec.BHkv, spec, kind, emulate)
    return dq, dk, dv


def packed_kernels(kind: str | None = None, emulate: bool = False) -> PackedKernels:
    """The kernels in the packed layout (q, k and v read in place from one (B, L, 3 * H * E) tensor, dq, dk
    and dv written into one): ``kind`` "tf32" / "tf32x3" (None: the current matmul precision's at each
    launch); ``emulate``: the PTX models, any OpenCL device."""

    def run(kernel: str, buffers: list[Tensor], items: int, planes: int, spec: AttentionSpec) -> None:
        _check(*buffers)
        _run(kernel, buffers, items, planes, spec, _kind(kind), emulate, packed=True)

    return PackedKernels(supports, run)


VARIANT = AttentionVariant("mma-tf32", supports, forward, backward, packed_kernels())
VARIANTS.insert(VARIANTS.index(attention_mma.VARIANT), VARIANT)
