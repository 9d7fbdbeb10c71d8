"""``MultiheadAttention`` with torch's constructor, parameter names, state_dict keys and forward.

Parameters: ``in_proj_weight`` (3E, E) when ``kdim == vdim == embed_dim``, else ``q_proj_weight``
(E, E), ``k_proj_weight`` (E, kdim) and ``v_proj_weight`` (E, vdim); ``in_proj_bias`` (3E,);
``out_proj.weight`` / ``out_proj.bias``. Initialization as torch: Xavier-uniform projections,
zero biases, ``out_proj.weight`` as ``Linear``'s.

Masks follow torch's *module* convention, the opposite of ``scaled_dot_product_attention``'s: a
boolean ``key_padding_mask`` (N, S) or ``attn_mask`` (L, S) / (N * num_heads, L, S) is True where
attention is NOT allowed; float masks are added to the scores. Both are turned into one additive
mask of the query's dtype, broadcast (never expanded to (N, H, L, S) unless ``attn_mask`` already
is). With ``need_weights=False`` the heads run through the fused ``scaled_dot_product_attention``
(no L x S tensor); with ``need_weights=True`` (torch's default) the probabilities are computed
explicitly, since they are returned (averaged over heads unless ``average_attn_weights=False``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.core import Device, ShapeError, Tensor
from netcl.nn import init
from netcl.nn.functional import linear
from netcl.nn.layers import Linear, empty_parameter
from netcl.nn.module import Module
from netcl.runtime.ops import layout, pointwise


def _value(x: Any) -> Any:
    return x.value if isinstance(x, Node) else x


def _additive(mask: Any, dtype: np.dtype, name: str) -> Tensor:
    """torch's module mask as an additive float mask: -inf where a boolean mask is True, a float mask as is."""
    m = _value(mask)
    if not isinstance(m, Tensor):
        raise TypeError(f"MultiheadAttention: {name} must be a Tensor or Node, got {type(mask).__name__}")
    if m.dtype == np.bool_:
        m = pointwise.where(m, -np.inf, 0.0)
    elif m.dtype.kind != "f":
        raise TypeError(f"MultiheadAttention: {name} must be bool or float, got dtype {m.dtype}")
    return m if m.dtype == dtype else layout.cast(m, dtype)


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention (without ``add_bias_kv`` / ``add_zero_attn``)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"MultiheadAttention: {name} must be a positive int, got {value!r}")
        if embed_dim % num_heads:
            raise ValueError(
                f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        if add_bias_kv or add_zero_attn:
            raise ValueError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported by netcl")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1), got {dropout!r}")
        self.embed_dim = embed_dim
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        self.batch_first = bool(batch_first)
        if self._qkv_same_embed_dim:
            self.in_proj_weight = empty_parameter((3 * embed_dim, embed_dim), device)
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = empty_parameter((embed_dim, embed_dim), device)
            self.k_proj_weight = empty_parameter((embed_dim, self.kdim), device)
            self.v_proj_weight = empty_parameter((embed_dim, self.vdim), device)
        if bias:
            self.in_proj_bias = empty_parameter((3 * embed_dim,), device)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def _projections(self, query: Any, key: Any, value: Any) -> tuple[Node, Node, Node]:
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            wq, wk, wv = ag.split(self.in_proj_weight, E, 0)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        bq = bk = bv = None
        if self.in_proj_bias is not None:
            bq, bk, bv = ag.split(self.in_proj_bias, E, 0)
        return linear(query, wq, bq), linear(key, wk, bk), linear(value, wv, bv)

    def forward(
        self,
        query: Any,
        key: Any,
        value: Any,
        key_padding_mask: Any = None,
        need_weights: bool = True,
        attn_mask: Any = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Node, Node | None]:
        """(attn_output, attn_weights or None), shapes as torch: (L, N, E) / (N, L, E) with ``batch_first``,
        (L, E) unbatched; weights (N, L, S), or (N, H, L, S) with ``average_attn_weights=False``."""
        if is_causal and attn_mask is None:
            raise ValueError("MultiheadAttention: is_causal=True needs attn_mask (the causal mask), as in torch")
        self_attention = query is key and key is value
        batched = len(query.shape) == 3
        if not batched and len(query.shape) != 2:
            raise ShapeError(f"MultiheadAttention: query must be (L, E) or 3-d, got shape {tuple(query.shape)}")
        for name, x, dim in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if len(x.shape) != len(query.shape) or x.shape[-1] != dim:
                raise ShapeError(
                    f"MultiheadAttention: {name} must be {len(query.shape)}-d with {dim} features, got {tuple(x.shape)}"
                )
        if not batched:
            query, key, value = (ag.unsqueeze(x, 0) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = _value(key_padding_mask).reshape(1, -1)
        elif not self.batch_first:
            query, key, value = (ag.transpose(x, (1, 0, 2)) for x in (query, key, value))
        N, L, S, H, hd = query.shape[0], query.shape[1], key.shape[1], self.num_heads, self.head_dim
        if key.shape[0] != N or value.shape[:2] != key.shape[:2]:
            raise ShapeError(
                f"MultiheadAttention: batch or source sizes disagree: query {tuple(query.shape)}, "
                f"key {tuple(key.shape)}, value {tuple(value.shape)} (batch-first view)"
            )
        p = self.dropout if self.training else 0.0
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None  # torch's rule: the hint stands for the causal mask given with it
        else:
            is_causal = False  # the mask is merged and applied as given
        plain = key_padding_mask is None and attn_mask is None and p == 0.0
        if self_attention and self._qkv_same_embed_dim and plain and not need_weights:
            # torch's fast path too: one in-projection, attention reading q, k and v from its output in place
            qkv = linear(query, self.in_proj_weight, self.in_proj_bias)
            heads = ag.packed_self_attention(qkv, H, is_causal=is_causal)
            return self._finish(heads, None, batched, L, average_attn_weights)
        q, k, v = self._projections(query, key, value)
        q, k, v = (ag.permute(ag.reshape(x, (N, -1, H, hd)), (0, 2, 1, 3)) for x in (q, k, v))
        mask = self._merged_mask(key_padding_mask, attn_mask, (N, L, S), q.dtype)
        if need_weights:
            scores = ag.matmul(q, ag.permute(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(hd))
            if mask is not None:
                scores = scores + mask
            weights = ag.dropout(ag.softmax(scores, -1), p, self.training)
            heads = ag.matmul(weights, v)
        else:
            weights = None
            heads = ag.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)
        merged = ag.reshape(ag.permute(heads, (0, 2, 1, 3)), (N, L, self.embed_dim))
        return self._finish(merged, weights, batched, L, average_attn_weights)

    def _finish(
        self, merged: Any, weights: Any, batched: bool, length: int, average_attn_weights: bool
    ) -> tuple[Node, Node | None]:
        """The output projection of the merged heads (N, L, E), and the layouts of the caller's inputs."""
        out = self.out_proj(merged)
        if weights is not None and average_attn_weights:
            weights = ag.mean(weights, 1)
        if not batched:
            out = ag.reshape(out, (length, self.embed_dim))
            if weights is not None:
                weights = ag.reshape(weights, tuple(weights.shape[1:]))
        elif not self.batch_first:
            out = ag.transpose(out, (1, 0, 2))
        return out, weights

    def _merged_mask(self, key_padding_mask: Any, attn_mask: Any, sizes: tuple[int, int, int], dtype: Any) -> Any:
        """One additive mask (a Tensor) broadcasting to (N, H, L, S) for ``sizes`` = (N, L, S), or None."""
        N, L, S = sizes
        merged = None
        if key_padding_mask is not None:
            kpm = _additive(key_padding_mask, np.dtype(dtype), "key_padding_mask")
            if tuple(kpm.shape) != (N, S):
                raise ShapeError(f"MultiheadAttention: key_padding_mask must be (N, S) = {(N, S)}, got {kpm.shape}")
            merged = kpm.reshape(N, 1, 1, S)
        if attn_mask is not None:
            am = _additive(attn_mask, np.dtype(dtype), "attn_mask")
            if tuple(am.shape) == (N * self.num_heads, L, S):
                am = am.reshape(N, self.num_heads, L, S)
            elif tuple(am.shape) != (L, S):
                raise ShapeError(
                    f"MultiheadAttention: attn_mask must be (L, S) = {(L, S)} or (N * num_heads, L, S) = "
                    f"{(N * self.num_heads, L, S)}, got {am.shape}"
                )
            merged = am if merged is None else pointwise.add(merged, am)
        return merged

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"


__all__ = ["MultiheadAttention"]
