"""Differentiable ``scaled_dot_product_attention`` (kernels in ``netcl.runtime.ops.attention``).

torch's semantics: ``softmax(q @ k^T * scale + mask) @ v`` with ``scale`` default ``1/sqrt(E)``,
a boolean ``attn_mask`` (True = takes part) or an additive float one broadcasting to
``(..., L, S)``, ``is_causal`` (top-left aligned lower triangle), ``dropout_p`` on the
probabilities and ``enable_gqa`` (grouped-query heads). The forward is one fused launch that
saves the output and the row log-sum-exp; the backward is two launches that recompute the
probabilities from them: no ``L x S`` tensor is ever allocated. The mask is a constant: it gets
no gradient. Dropout draws a fresh seed per call from the global generator (``manual_seed``
makes it repeat); the backward regenerates the same mask from it. A row whose keys are all
masked gives 0 (torch >= 2.5), not NaN. Under ``netcl.amp.autocast`` on a device where float16 is
storage-only (NVIDIA's OpenCL) the op runs, forward and backward, at autocast's matmul precision
(``autocast_mode.fallback_precision``, as matmul does): the tensor-core kernels (``attention_mma``) take it.
"""

from __future__ import annotations

import weakref
from typing import Any

from netcl.autograd import autocast_mode
from netcl.autograd.engine import Node, apply_op
from netcl.core import Tensor
from netcl.runtime.capture import is_recording
from netcl.runtime.ops import attention, random
from netcl.runtime.ops.precision import at_matmul_precision

#: output tensor -> (lse, seed, device counter or None) of the forward that made it
_SAVED: weakref.WeakKeyDictionary[Tensor, tuple[Tensor, int, Tensor | None]] = weakref.WeakKeyDictionary()


def _value(x: Any) -> Any:
    return x.value if isinstance(x, Node) else x


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Node:
    """Attention of ``query`` (..., L, E) over ``key`` (..., S, E) and ``value`` (..., S, Ev): (..., L, Ev).

    Bad shapes, dtypes, a mask that does not broadcast, ``dropout_p`` outside [0, 1) and
    ``is_causal`` with ``attn_mask`` raise (naming the argument) before any launch.
    """
    q, k, v, m = (_value(x) for x in (query, key, value, attn_mask))
    spec = attention.check_attention(q, k, v, m, dropout_p, is_causal, scale, enable_gqa)
    for name, t in (("key", k), ("value", v), ("attn_mask", m)):
        if isinstance(t, Tensor) and isinstance(q, Tensor) and t.device is not q.device:
            raise ValueError(f"scaled_dot_product_attention: {name} is on {t.device}, query on {q.device}")

    def forward(qv: Tensor, kv: Tensor, vv: Tensor, mv: Tensor | None = None) -> Tensor:
        seed, counter = 0, None
        if spec.dropout_p > 0:
            seed = random.next_seed()
            if qv.device.kind == "opencl" and is_recording(qv.device.queue):
                counter = random.advance_counter(random.new_counter(qv.device))
        out, lse = attention.attention_forward(qv, kv, vv, mv, spec, seed, counter)
        _SAVED[out] = (lse, seed, counter)
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        qv, kv, vv = values[:3]
        mv = values[3] if len(values) > 3 else None
        saved = _SAVED.get(out)
        if saved is None:  # out was not made by this op's forward (a tracer re-ran it): recompute the lse
            if spec.dropout_p > 0:
                raise RuntimeError("scaled_dot_product_attention: the dropout mask of this output is unknown")
            saved = (attention.attention_forward(qv, kv, vv, mv, spec)[1], 0, None)
        lse, seed, counter = saved
        dq, dk, dv = attention.attention_backward(g, qv, kv, vv, out, lse, mv, spec, seed, counter)
        return [dq, dk, dv] + ([None] if len(values) > 3 else [])

    args = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    attrs = {
        "dropout_p": spec.dropout_p,
        "is_causal": spec.causal,
        "scale": spec.scale,
        "enable_gqa": bool(enable_gqa),
    }
    precision = autocast_mode.fallback_precision(query, key, value)  # autocast on a device without float16
    at = at_matmul_precision  # the forward and the gradient alike
    return apply_op(
        at(precision, forward), at(precision, grad), *args, op_name="scaled_dot_product_attention", attrs=attrs
    )


def packed_self_attention(qkv: Any, num_heads: int, is_causal: bool = False, scale: float | None = None) -> Node:
    """Multi-head self-attention of a fused in-projection's output: ``qkv`` (B, L, 3 * D) holds q, k and v
    side by side along the last axis, each ``num_heads`` heads of ``E = D / num_heads`` features (head h at
    columns h * E). Returns (B, L, D), the heads merged: what ``split`` into q, k, v, ``reshape`` to
    (B, L, H, E), ``permute`` to (B, H, L, E), ``scaled_dot_product_attention`` and the way back compute,
    without their copies where the kernels read the packed layout in place (the blocked kernels: float32,
    E in 16/32/64/128 on OpenCL CPUs and NVIDIA GPUs; NVIDIA's tensor-core kernels, E 64/128, float32 under
    autocast after one rounding copy); elsewhere the same copies run inside. The backward
    returns the gradient as one packed tensor. Bad shapes raise before any launch.
    """
    packed = _value(qkv)
    spec = attention.check_packed_attention(packed, num_heads, is_causal, scale)
    saved: dict[str, Tensor] = {}

    def forward(x: Tensor) -> Tensor:
        out, lse = attention.packed_attention_forward(x, spec)
        saved.update(out=out, lse=lse)
        return out

    def grad(g: Tensor, values: tuple[Any, ...], out: Tensor) -> list[Tensor | None]:
        x = values[0]
        lse = saved["lse"] if saved.get("out") is out else attention.packed_attention_forward(x, spec)[1]
        return [attention.packed_attention_backward(g, x, out, lse, spec)]

    attrs = {"num_heads": spec.Hq, "is_causal": spec.causal, "scale": spec.scale}
    precision = autocast_mode.fallback_precision(qkv)  # as scaled_dot_product_attention
    at = at_matmul_precision
    return apply_op(at(precision, forward), at(precision, grad), qkv, op_name="packed_self_attention", attrs=attrs)


__all__ = ["packed_self_attention", "scaled_dot_product_attention"]
