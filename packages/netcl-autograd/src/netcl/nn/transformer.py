"""``TransformerEncoderLayer``, ``TransformerDecoderLayer``, ``TransformerEncoder``, ``TransformerDecoder`` and
``Transformer`` as torch defines them.

Same constructor arguments, submodule names (``self_attn``, ``multihead_attn``, ``linear1``,
``linear2``, ``norm1``..``norm3``) and so the same state_dict keys; post-norm by default,
``norm_first=True`` for pre-norm. Attention runs through ``MultiheadAttention`` with
``need_weights=False``, i.e. the fused attention kernels. ``activation`` is ``"relu"``, ``"gelu"``
(torch's exact GELU), a callable, or a module such as ``nn.GELU(approximate="tanh")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.core import Device, ShapeError
from netcl.nn import init
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
        self.num_layers = _stack_size("TransformerEncoder", num_layers)
        self.layers = ModuleList([encoder_layer.clone() for _ in range(num_layers)])
        self.norm = norm

    def forward(self, src: Any, mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False) -> Node:
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
        return self.norm(x) if self.norm is not None else x


def _stack_size(owner: str, num_layers: Any) -> int:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers <= 0:
        raise ValueError(f"{owner}: num_layers must be a positive int, got {num_layers!r}")
    return num_layers


class TransformerDecoder(Module):
    """``num_layers`` copies of ``decoder_layer`` (equal parameters at first), then ``norm``."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.num_layers = _stack_size("TransformerDecoder", num_layers)
        self.layers = ModuleList([decoder_layer.clone() for _ in range(num_layers)])
        self.norm = norm

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
        x = tgt
        for layer in self.layers:
            x = layer(
                x, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
                memory_is_causal,
            )  # fmt: skip
        return self.norm(x) if self.norm is not None else x


class Transformer(Module):
    """torch's ``nn.Transformer``: an encoder of ``num_encoder_layers`` and a decoder of ``num_decoder_layers``,
    each stack ending in a LayerNorm (submodules ``encoder`` and ``decoder``: torch's state_dict keys), the weight
    matrices initialized xavier-uniform as torch's. ``forward(src, tgt, ...)`` encodes ``src`` and decodes ``tgt``
    against it."""

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Any], Any] = "relu",
        custom_encoder: Module | None = None,
        custom_decoder: Module | None = None,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        kw = {"dropout": dropout, "activation": activation, "layer_norm_eps": layer_norm_eps, "bias": bias,
              "batch_first": batch_first, "norm_first": norm_first, "device": device}  # fmt: skip
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, **kw)
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device)
            self.encoder = TransformerEncoder(layer, num_encoder_layers, norm)
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, **kw)
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device)
            self.decoder = TransformerDecoder(layer, num_decoder_layers, norm)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, bool(batch_first)
        for param in self.parameters():
            if len(param.shape) > 1:
                init.xavier_uniform_(param)

    def forward(
        self,
        src: Any,
        tgt: Any,
        src_mask: Any = None,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        src_key_padding_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        src_is_causal: bool = False,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Node:
        batch_axis = 0 if self.batch_first else 1
        if len(src.shape) == 3 and len(tgt.shape) == 3 and src.shape[batch_axis] != tgt.shape[batch_axis]:
            raise ShapeError(f"Transformer: src and tgt must have the same batch size, got shapes {src.shape} and "
                             f"{tgt.shape}")  # fmt: skip
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ShapeError(f"Transformer: src and tgt must have d_model = {self.d_model} features, got shapes "
                             f"{src.shape} and {tgt.shape}")  # fmt: skip
        memory = self.encoder(src, src_mask, src_key_padding_mask, src_is_causal)
        return self.decoder(
            tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal,
            memory_is_causal,
        )  # fmt: skip

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Device | str | None = None, dtype: Any = None) -> Node:
        """torch's causal mask: an (sz, sz) float tensor, -inf above the diagonal and 0 elsewhere (an additive mask)."""
        mask = np.triu(np.full((sz, sz), -np.inf, np.float32), 1)
        return ag.tensor(mask, device=device, dtype=dtype)


__all__ = [
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]
