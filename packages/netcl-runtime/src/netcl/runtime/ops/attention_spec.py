"""What an attention call is: its validation (torch's rules) and the ``AttentionSpec`` the kernels and the
NumPy twins take (``attention``, ``numpy_twins.attention``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.core.dtypes import is_floating, refuse_bfloat16
from netcl.core.errors import DTypeError, ShapeError

#: mask kinds (compile-time in the kernels)
NO_MASK, BOOL_MASK, ADDITIVE_MASK = 0, 1, 2


@dataclass(frozen=True)
class AttentionSpec:
    """A validated attention call: sizes, options and the mask's broadcast layout."""

    lead: tuple[int, ...]  #: q's leading dims (output shape is lead + (L, Ev))
    kv_lead: tuple[int, ...]  #: k's and v's leading dims
    BH: int  #: prod(lead): query batch-heads
    BHkv: int  #: prod(kv_lead)
    Hq: int  #: q heads per batch (1 for fewer than 3 dims)
    Hkv: int  #: kv heads per batch
    L: int
    S: int
    E: int
    Ev: int
    scale: float
    causal: bool
    dropout_p: float
    mask_kind: int
    mask_shape: tuple[int, ...]  #: the mask's shape padded with leading 1s to len(lead) + 2 dims

    @property
    def group(self) -> int:
        """q heads per kv head."""
        return self.Hq // self.Hkv

    def mask_strides(self) -> tuple[int, ...]:
        """Element strides of the padded mask broadcast to lead + (L, S) (0 on broadcast axes)."""
        strides, step = [], 1
        for d in reversed(self.mask_shape):
            strides.append(0 if d == 1 else step)
            step *= d
        return tuple(reversed(strides))

    def mask_offsets(self) -> np.ndarray:
        """The mask's base offset for each of the BH batch-heads (int64, C order over lead)."""
        strides = self.mask_strides()[: len(self.lead)]
        offsets = np.zeros(self.lead, dtype=np.int64)
        for axis, (size, stride) in enumerate(zip(self.lead, strides, strict=True)):
            shape = [1] * len(self.lead)
            shape[axis] = size
            offsets = offsets + (np.arange(size, dtype=np.int64) * stride).reshape(shape)
        return offsets.reshape(-1)

    def kv_index(self) -> np.ndarray:
        """For each query batch-head, the kv batch-head it reads."""
        bh = np.arange(self.BH)
        return (bh // self.Hq) * self.Hkv + (bh % self.Hq) // self.group


def _shape_of(x: Any, name: str) -> tuple[int, ...]:
    if not all(hasattr(x, a) for a in ("shape", "dtype")):
        raise TypeError(f"scaled_dot_product_attention: {name} must be a Tensor, got {type(x).__name__}")
    return tuple(int(d) for d in x.shape)


def check_attention(
    q: Any,
    k: Any,
    v: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> AttentionSpec:
    """Validate an attention call (torch's rules) and return its spec; raises before any launch.

    Errors name the argument: ShapeError for shapes (head or batch dims that disagree, a mask that
    does not broadcast to ``(..., L, S)``), DTypeError for dtypes, ValueError for ``dropout_p``
    outside [0, 1) and for ``is_causal`` together with ``attn_mask``.
    """
    op = "scaled_dot_product_attention"
    qs, ks, vs = _shape_of(q, "query"), _shape_of(k, "key"), _shape_of(v, "value")
    for name, s in (("query", qs), ("key", ks), ("value", vs)):
        if len(s) < 2:
            raise ShapeError(f"{op}: {name} must have at least 2 dims (..., seq, features), got shape {s}")
    if not len(qs) == len(ks) == len(vs):
        raise ShapeError(f"{op}: query, key and value must have the same number of dims, got {qs}, {ks}, {vs}")
    for name, x in (("query", q), ("key", k), ("value", v)):  # bfloat16: see attention.select_variant
        if not is_floating(x.dtype):
            raise DTypeError(f"{op}: {name} must be a floating-point tensor, got dtype {x.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise DTypeError(f"{op}: query, key and value must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if qs[-1] != ks[-1]:
        raise ShapeError(f"{op}: key's feature dim {ks[-1]} must equal query's {qs[-1]} (q {qs}, k {ks})")
    if ks[-2] != vs[-2]:
        raise ShapeError(f"{op}: value's sequence dim {vs[-2]} must equal key's {ks[-2]} (k {ks}, v {vs})")
    if ks[:-2] != vs[:-2]:
        raise ShapeError(f"{op}: key and value must have the same batch and head dims, got {ks[:-2]} and {vs[:-2]}")
    lead, kv_lead = qs[:-2], ks[:-2]
    if enable_gqa and len(qs) >= 3:
        hq, hkv = qs[-3], ks[-3]
        if lead[:-1] != kv_lead[:-1]:
            raise ShapeError(f"{op}: query and key batch dims disagree: {lead[:-1]} vs {kv_lead[:-1]}")
        if hkv == 0 or hq % hkv:
            raise ShapeError(
                f"{op}: with enable_gqa the query heads ({hq}) must be a multiple of the key/value heads ({hkv})"
            )
    else:
        if lead != kv_lead:
            hint = "" if enable_gqa else " (set enable_gqa=True for grouped-query heads)"
            raise ShapeError(f"{op}: query and key batch/head dims disagree: {lead} vs {kv_lead}{hint}")
        hq = hkv = qs[-3] if len(qs) >= 3 else 1
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, np.floating)):
        raise TypeError(f"{op}: dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{op}: pass either attn_mask or is_causal=True, not both (torch raises here too)")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating))):
        raise TypeError(f"{op}: scale must be a float or None, got {scale!r}")
    L, S, E, Ev = qs[-2], ks[-2], qs[-1], vs[-1]
    mask_kind, mask_shape = NO_MASK, ()
    if attn_mask is not None:
        ms = _shape_of(attn_mask, "attn_mask")
        target = (*lead, L, S)
        if len(ms) > len(target) or any(m not in (1, t) for m, t in zip(ms[::-1], target[::-1], strict=False)):
            raise ShapeError(f"{op}: attn_mask of shape {ms} does not broadcast to (..., L, S) = {target}")
        mdt = np.dtype(attn_mask.dtype)
        if mdt == np.dtype(np.bool_):
            mask_kind = BOOL_MASK
        elif mdt == np.dtype(q.dtype):
            mask_kind = ADDITIVE_MASK
        else:
            raise DTypeError(f"{op}: attn_mask must be bool or query's dtype {q.dtype}, got {mdt}")
        mask_shape = (1,) * (len(target) - len(ms)) + ms
    return AttentionSpec(
        lead=lead,
        kv_lead=kv_lead,
        BH=math.prod(lead),
        BHkv=math.prod(kv_lead),
        Hq=hq,
        Hkv=hkv,
        L=L,
        S=S,
        E=E,
        Ev=Ev,
        scale=1.0 / math.sqrt(E) if scale is None else float(scale),
        causal=bool(is_causal),
        dropout_p=float(dropout_p),
        mask_kind=mask_kind,
        mask_shape=mask_shape,
    )


def check_packed_attention(
    qkv: Any, num_heads: Any, is_causal: bool = False, scale: float | None = None
) -> AttentionSpec:
    """Validate a self-attention call on a packed ``qkv`` (B, L, 3 * D): q, k and v side by side along the
    last axis (a fused in-projection's output), ``num_heads`` heads of ``D / num_heads`` features each in
    every one; returns the spec of the (B, H, L, E) attention it is. Raises before any launch."""
    op = "packed attention"
    shape = _shape_of(qkv, "qkv")
    if len(shape) != 3:
        raise ShapeError(f"{op}: qkv must be (batch, seq, 3 * embed_dim), got shape {shape}")
    refuse_bfloat16(op, np.dtype(qkv.dtype))
    if np.dtype(qkv.dtype).kind != "f":
        raise DTypeError(f"{op}: qkv must be a floating-point tensor, got dtype {qkv.dtype}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) or num_heads <= 0:
        raise ValueError(f"{op}: num_heads must be a positive int, got {num_heads!r}")
    batch, length, width = shape
    if width == 0 or width % (3 * num_heads):
        raise ShapeError(
            f"{op}: qkv's last dim must be 3 * num_heads * head_dim with head_dim >= 1 (num_heads {num_heads}), "
            f"got shape {shape}"
        )
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating))):
        raise TypeError(f"{op}: scale must be a float or None, got {scale!r}")
    heads, features = int(num_heads), width // (3 * int(num_heads))
    return AttentionSpec(
        lead=(batch, heads),
        kv_lead=(batch, heads),
        BH=batch * heads,
        BHkv=batch * heads,
        Hq=heads,
        Hkv=heads,
        L=length,
        S=length,
        E=features,
        Ev=features,
        scale=1.0 / math.sqrt(features) if scale is None else float(scale),
        causal=bool(is_causal),
        dropout_p=0.0,
        mask_kind=NO_MASK,
        mask_shape=(),
    )
