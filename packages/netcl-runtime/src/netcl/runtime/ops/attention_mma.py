"""Tensor-core attention on NVIDIA GPUs: FlashAttention-2 on ``mma.sync`` (f16 or bf16 products, fp32 accumulation).

The variant ``mma`` of ``attention.VARIANTS``, tried before the blocked kernels. It takes a call on an
NVIDIA OpenCL device whose tensor cores run f16 products (``gemm_mma.enabled(device, "f16")``: the GEMM's
probe) when the call has no mask, no dropout, ``E == Ev`` in ``FEATURES``, and

* float16 or bfloat16 (storage) tensors, or
* float32 tensors at matmul precision "fp16" or "medium" (``get_float32_matmul_precision``): what
  ``netcl.amp.autocast()`` and ``autocast(dtype=bfloat16)`` set around attention on a device where float16 is
  storage-only (NVIDIA's OpenCL), as they do for matmul (``autocast_mode.fallback_precision``).

The products are f16 for float16 tensors and at "fp16", bf16 (``mma...bf16.bf16``, the GEMM's "bf16" probe)
for bfloat16 tensors and at "medium".

Float32 at matmul precision "high" or "tf32x3" goes to the tf32 kernels (``attention_mma_tf32``, the
variant before this one); at any other precision it stays on the exact float32 kernels.
``NETCL_ATTENTION=mma`` makes these kernels take the other float32 calls too (operands rounded to f16);
``blocked``, ``quad`` or ``portable`` turn them off. Masks and dropout go to the next variant.

Numbers: q, k, v (and the upstream gradient) are rounded to f16 (nearest even; float32 tensors by a copy
before the kernels, ``layout.cast``, whose copies of q, k and v the backward of the same call reuses);
scores, the softmax statistics (row max, row sum, ``lse``) and every accumulator are float32; the
probabilities P and dS are rounded to f16 before their products (FlashAttention-2's numbers). The output
and the gradients have the inputs' dtype; ``lse`` is float32 and means what it means for the other
variants (natural log-sum-exp of the scaled scores, ``-inf`` for a row that sees no key), so any backward
follows any forward.

Kernels (``attention_mma_source``, blocking in its ``PLANS``): forward one launch (a work-group of 4 warps
per 128 query rows at E 64, 64 at E 128; key/value tiles copied by ``cp.async`` into two local buffers, the
next under this one's products; online softmax in registers); backward two: ``bwd_q`` (64 query rows, Q and
dO fragments in registers, loops over key tiles: dQ, and ``D = rowsum(dO * O)`` written for the next launch)
then ``bwd_kv`` (64 keys, loops over the q heads of its kv head and their query tiles: dK, dV). No atomics:
the backward is deterministic. Causal calls (top-left aligned, as torch) skip the tiles that are wholly
masked and mask only the tiles on the diagonal; their launches put the heads along the first grid dimension,
so every head's longest blocks run first. ``packed_kernels``: the same kernels on a packed self-attention's
``(B, L, 3 * H * E)`` q/k/v tensor in place (``attention.packed_attention_forward``).

``emulate=True`` runs the same kernels with OpenCL C models of the PTX instructions
(``attention_mma_source``) on any OpenCL device: the tests' check of the kernels' arithmetic off NVIDIA.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import bfloat16, float16, float32
from netcl.runtime.ops import (
    attention_blocked,  # noqa: F401  registers the blocked variant first: ours goes before it
    gemm_mma,
    layout,
)
from netcl.runtime.ops._common import get_kernel
from netcl.runtime.ops._grid import index_ctype, index_dtype, launch_prepared
from netcl.runtime.ops.attention import VARIANTS, AttentionVariant, PackedKernels
from netcl.runtime.ops.attention_mma_source import NAMES, THREADS, attention_source, plan
from netcl.runtime.ops.attention_spec import NO_MASK, AttentionSpec
from netcl.runtime.ops.precision import get_float32_matmul_precision

#: feature sizes (``E == Ev``) the kernels take
FEATURES = (64, 128)
#: the matmul precisions at which float32 calls run here, and the operands' kind there: autocast's on NVIDIA
PRECISIONS = {"fp16": "f16", "medium": "bf16"}
#: the 16-bit tensors the kernels take, and their kind
KIND_OF = {float16: "f16", bfloat16: "bf16"}
#: how the emulated kernels are built on a CPU device: LLVM's loop passes, let loose on their barrier-laden
#: models, took 10-35 s of a core per kernel (PoCL, a tile loop bounded by S); unoptimized they build in under a
#: second and still run the tests' sizes in milliseconds. (GPUs build them optimized: NVIDIA's compiler leaves
#: the helper functions uninlined and unresolved under -cl-opt-disable.)
EMULATION_FLAGS = ("-cl-opt-disable",)


def _choice() -> str:
    return os.environ.get("NETCL_ATTENTION", "").strip().lower()


def kind(dtype: np.dtype) -> str | None:
    """The products' kind ("f16" / "bf16") for tensors of ``dtype`` at the precision in effect, or None."""
    dtype = np.dtype(dtype)
    if dtype != float32:
        return KIND_OF.get(dtype)
    precision = get_float32_matmul_precision()
    return PRECISIONS.get(precision) or ("f16" if _choice() == "mma" else None)


def takes(dtype: np.dtype, spec: AttentionSpec) -> bool:
    """Whether the call's dtype, precision, options and sizes are ones the kernels run (any device)."""
    return (
        kind(dtype) is not None
        and spec.mask_kind == NO_MASK
        and spec.dropout_p == 0.0
        and spec.Ev == spec.E
        and spec.E in FEATURES
    )


def supports(device: Device, dtype: np.dtype, spec: AttentionSpec) -> bool:
    """``takes`` on a device whose tensor cores multiply f16 (the GEMM's probe, ``NETCL_MMA``), unless
    ``NETCL_ATTENTION`` names another variant."""
    if _choice() in ("blocked", "quad", "portable") or device.kind != "opencl":
        return False
    return takes(dtype, spec) and gemm_mma.enabled(device, kind(dtype) or "f16")


def launch_flash(
    family: str,
    kernel: str,
    name: str,
    plan: Any,
    source: Callable[..., str],
    fields: dict[str, Any],
    buffers: list[Tensor],
    items: int,
    planes: int,
    spec: AttentionSpec,
    threads: int = THREADS,
) -> None:
    """Launch ``kernel`` (C function ``name``) of a FlashAttention family (this module's, ``attention_mma_tf32``)
    over ``items`` rows (queries, or keys for bwd_kv) of ``planes`` heads, ``plan.rows`` rows a work-group of
    ``threads``. ``source(kernel, **fields, idx=...)`` builds it once per (family, kernel, plan, fields, index
    type); ``fields["packed"]``: q, k and v are one tensor three times a plane's size. After ``buffers`` the
    kernels take L, S, Hq, group, Hkv, the scale in log2 units and the scale."""
    if items == 0 or planes == 0:
        return
    device = buffers[0].device
    biggest = max(spec.BH * spec.L, spec.BHkv * spec.S) * spec.E * (3 if fields.get("packed") else 1)
    fields = {**fields, "idx": index_ctype(biggest)}
    key = (family, kernel, plan, *sorted(fields.items()))
    it = index_dtype(fields["idx"])
    types = [None] * len(buffers) + [it] * 5 + [np.float32, np.float32]
    flags = EMULATION_FLAGS if fields["emulate"] and not device.is_gpu else ()
    resolved = get_kernel(key, device, lambda: source(kernel, **fields), name, types, flags)
    blocks = -(-items // plan.rows)
    # causal: heads along the first dimension (dispatched first), so every head's longest blocks start first
    gsize = (planes * threads, blocks) if spec.causal else (blocks * threads, planes)
    scalars = [it.type(x) for x in (spec.L, spec.S, spec.Hq, spec.group, spec.Hkv)]
    scale2 = np.float32(spec.scale * math.log2(math.e))  # scores in log2 units: exp2 in the kernels
    args = [*buffers, *scalars, scale2, np.float32(spec.scale)]
    launch_prepared(key, device, resolved.kernel, gsize, (threads, 1), args)


def _run(
    kernel: str,
    buffers: list[Tensor],
    items: int,
    planes: int,
    spec: AttentionSpec,
    emulate: bool,
    half: bool,
    products: str,
    packed: bool = False,
) -> None:
    """``launch_flash`` of this module's ``kernel``; ``buffers``: 16-bit operands of kind ``products``; ``half``:
    outputs in that dtype (else float32); ``packed``: the packed self-attention layout (``packed_kernels``)."""
    fields = {"e": spec.E, "causal": spec.causal, "half": half, "emulate": emulate, "kind": products, "packed": packed}
    p = plan(kernel, spec.E)
    launch_flash("attention-mma", kernel, NAMES[kernel], p, attention_source, fields, buffers, items, planes, spec)


#: forward output -> (products, weak references to its float32 q, k and v, their 16-bit copies): the backward
#: of that call reuses the copies (and drops them) instead of rounding q, k and v again
_ROUNDED: weakref.WeakKeyDictionary[Tensor, tuple[str, tuple[weakref.ref, ...], tuple[Tensor, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _keep_copies(out: Tensor, products: str, operands: tuple[Tensor, ...], rounded: tuple[Tensor, ...]) -> None:
    if operands[0].dtype == float32:
        _ROUNDED[out] = (products, tuple(weakref.ref(x) for x in operands), rounded)


def _forwards_copies(out: Tensor, products: str, *operands: Tensor) -> tuple[Tensor, ...] | None:
    """The 16-bit copies that the forward which made ``out`` rounded these very ``operands`` to for ``products``,
    or None (dropped either way: a second backward rounds again)."""
    saved = _ROUNDED.pop(out, None)
    if saved is None or saved[0] != products:
        return None
    if not all(ref() is x for ref, x in zip(saved[1], operands, strict=True)):
        return None
    return saved[2]


def _operand(x: Tensor, products: str) -> Tensor:
    """x in the 16-bit dtype of ``products`` (float32 rounded to nearest even by ``layout.cast``; a 16-bit
    tensor as it is)."""
    if x.dtype != float32:
        return x
    return layout.cast(x, bfloat16 if products == "bf16" else float16)


def _products(q: Tensor) -> str:
    """The products' kind of a call on ``q`` (f16 where nothing chose: ``emulate`` on float32 at any precision)."""
    return kind(q.dtype) or "f16"


def _check_layout(*tensors: Tensor) -> None:
    for t in tensors:
        if t.dtype not in (float16, bfloat16, float32):
            raise TypeError(f"attention_mma: float16, bfloat16 or float32 tensors only, got {t.dtype}")


def forward(q, k, v, mask, spec: AttentionSpec, seed, counter, *, emulate: bool = False) -> tuple[Tensor, Tensor]:
    """(output in q's dtype, float32 lse) in one launch (``emulate``: the PTX models, any OpenCL device)."""
    _check_layout(q, k, v)
    products = _products(q)
    out = Tensor.empty((*spec.lead, spec.L, spec.Ev), q.dtype, q.device)
    lse = Tensor.empty((*spec.lead, spec.L), np.float32, q.device)
    rounded = tuple(_operand(x, products) for x in (q, k, v))
    _keep_copies(out, products, (q, k, v), rounded)
    _run("fwd", [*rounded, out, lse], spec.L, spec.BH, spec, emulate, out.dtype != float32, products)
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
    half, products = q.dtype != float32, _products(q)
    q, k, v = _forwards_copies(out, products, q, k, v) or (q, k, v)
    q, k, v, g = (_operand(x, products) for x in (q, k, v, g))
    _run("bwd_q", [q, k, v, out, g, lse, dq, drow], spec.L, spec.BH, spec, emulate, half, products)
    _run("bwd_kv", [q, k, v, g, lse, drow, dk, dv], spec.S, spec.BHkv, spec, emulate, half, products)
    return dq, dk, dv


#: where in each kernel's arguments an output is (its dtype: 16-bit outputs or float32 ones)
_OUTPUT = {"fwd": 3, "bwd_q": 6, "bwd_kv": 6}


def packed_kernels(emulate: bool = False) -> PackedKernels:
    """The kernels in the packed layout (q, k and v read in place from one (B, L, 3 * H * E) 16-bit tensor: a
    float32 one is rounded by one copy first, and the upstream gradient likewise); outputs in the packed
    tensor's dtype; ``emulate``: the PTX models, any OpenCL device."""

    def operand(x: Tensor) -> Tensor:
        return _operand(x, _products(x))

    def run(kernel: str, buffers: list[Tensor], items: int, planes: int, spec: AttentionSpec) -> None:
        _check_layout(*buffers)
        half = buffers[_OUTPUT[kernel]].dtype != float32
        _run(kernel, buffers, items, planes, spec, emulate, half, KIND_OF[buffers[0].dtype], packed=True)

    return PackedKernels(supports, run, operand)


VARIANT = AttentionVariant("mma", supports, forward, backward, packed_kernels(), bfloat16=True)
VARIANTS.insert(0, VARIANT)
