"""``TransformerEncoderLayer``, ``TransformerDecoderLayer`` and ``TransformerEncoder`` as torch defines them.

Same constructor arguments, submodule names (``self_attn``, ``multihead_attn``, ``linear1``,
``linear2``, ``norm1``..``norm3``) and so the same state_dict keys; post-norm by default,
``norm_first=True`` for pre-norm. Attention runs through ``MultiheadAttention`` with
``need_weights=False``, i.e. the fused attention kernels. ``activation`` is ``"relu"``, ``"gelu"``
(torch's exact GELU), a callable, or a module such as ``nn.GELU(approximate="tanh")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.core import Device
from netcl.nn.attention import MultiheadAttention
from netcl.nn.containers import ModuleList
from netcl.nn.layers import Linear
from netcl.nn.module import Module
from netcl.nn.normalization import LayerNorm
from netcl.nn.simple import Dropout


def _activation(activation: str | Callable[[Any], Any], layer: str) -> Callable[[Any], Any]:
    if callable(activation):
        return activation
    if activation == "relu":
        return ag.relu
    if activation == "gelu":
        return ag.gelu_erf
    raise ValueError(f'{layer}: activation must be "relu", "gelu" or a callable, got {activation!r}')


class _Block(Module):
    """What encoder and decoder layers share: the feed-forward block and the constructor record."""

    def _feed_forward_parts(self, d_model: int, dim_feedforward: int, dropout: float, bias: bool, device: Any) -> None:
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, device=device)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, device=device)

    def _ff_block(self, x: Any, drop: Dropout) -> Node:
        return drop(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def clone(self) -> Module:
        """A new layer of the same configuration holding copies of this one's parameters."""
        twin = type(self)(**self._config)
        twin.load_state_dict(self.state_dict())
        return twin


class TransformerEncoderLayer(_Block):
    """Self-attention and feed-forward block (torch.nn.TransformerEncoderLayer)."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Any], Any] = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self._config = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.activation = _activation(activation, "TransformerEncoderLayer")
        self.self_attn = MultiheadAttention(
            d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, device=device
        )
        self._feed_forward_parts(d_model, dim_feedforward, dropout, bias, device)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)

    def _sa_block(self, x: Any, attn_mask: Any, key_padding_mask: Any, is_causal: bool) -> Node:
        out = self.self_attn(
            x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False, is_causal=is_causal
        )[0]
        return self.dropout1(out)

    def forward(
        self, src: Any, src_mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False
    ) -> Node:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x), self.dropout2)
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x, self.dropout2))


class TransformerDecoderLayer(_Block):
    """Self-attention, attention over ``memory`` and feed-forward (torch.nn.TransformerDecoderLayer)."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Any], Any] = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self._config = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.activation = _activation(activation, "TransformerDecoderLayer")
        kw = {"dropout": dropout, "bias": bias, "batch_first": batch_first, "device": device}
        self.self_attn = MultiheadAttention(d_model, nhead, **kw)
        self.multihead_attn = MultiheadAttention(d_model, nhead, **kw)
        self._feed_forward_parts(d_model, dim_feedforward, dropout, bias, device)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)

    def forward(
        self,
        tgt: Any,
        memory: Any,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Node:
        def sa(x: Any) -> Node:
            out = self.self_attn(
                x, x, x, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask, need_weights=False,
                is_causal=tgt_is_causal,
            )[0]  # fmt: skip
            return self.dropout1(out)

        def mha(x: Any) -> Node:
            out = self.multihead_attn(
                x, memory, memory, attn_mask=memory_mask, key_padding_mask=memory_key_padding_mask,
                need_weights=False, is_causal=memory_is_causal,
            )[0]  # fmt: skip
            return self.dropout2(out)

        x = tgt
        if self.norm_first:
            x = x + sa(self.norm1(x))
            x = x + mha(self.norm2(x))
            return x + self._ff_block(self.norm3(x), self.dropout3)
        x = self.norm1(x + sa(x))
        x = self.norm2(x + mha(x))
        return self.norm3(x + self._ff_block(x, self.dropout3))


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` (equal parameters at first, as torch's deep copies), then ``norm``."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"TransformerEncoder: num_layers must be a positive int, got {num_layers!r}")
        self.layers = ModuleList([encoder_layer.clone() for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Any, mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False) -> Node:
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
        return self.norm(x) if self.norm is not None else x


__all__ = ["TransformerDecoderLayer", "TransformerEncoder", "TransformerEncoderLayer"]
