"""A small GPT (decoder-only transformer) written with netcl.nn, with a key/value-cache decode path.

``GPT(vocab_size, max_len, d_model, n_head, n_layer)``: token and position embeddings, ``n_layer``
pre-norm blocks (causal self-attention through the fused ``scaled_dot_product_attention``, a 4x
GELU MLP), a final LayerNorm and a bias-free LM head. ``forward(ids)`` ``(B, S)`` -> logits
``(B, S, vocab)`` for training; ``new_caches`` / ``decode`` implement ``netcl.nn.generation``'s
decoding protocol (one token per sequence at a bound position, reading and writing
``netcl.nn.KVCache``s), so ``netcl.nn.generation.generate(model, prompt, n)`` works, eager or replayed.

The reference workload ``gpt_block`` is ``GPT(1024, 256, d_model=512, n_head=8, n_layer=1)`` at
batch 8, sequence 256, trained with AdamW (``benchmarks``); ``examples/train_gpt.py`` trains one
on characters.
"""

from __future__ import annotations

from typing import Any

import netcl.autograd as ag
from netcl import nn
from netcl.core import Device, get_device
from netcl.nn.kv_cache import KVCache, rows_at
from netcl.runtime.variable import Variable


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one fused q/k/v projection, fused attention, output projection."""

    def __init__(self, d_model: int, n_head: int, device: Any = None) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"CausalSelfAttention: d_model {d_model} is not divisible by n_head {n_head}")
        self.d_model, self.n_head, self.head_dim = d_model, n_head, d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, device=device)
        self.proj = nn.Linear(d_model, d_model, device=device)

    def _heads(self, x: Any, batch: int, length: int) -> tuple[Any, Any, Any]:
        q, k, v = ag.split(self.qkv(x), self.d_model, axis=-1)
        if length == 1:  # (B, 1, H, E) and (B, H, 1, E) share one memory layout
            return tuple(ag.reshape(t, (batch, self.n_head, 1, self.head_dim)) for t in (q, k, v))
        return tuple(
            ag.permute(ag.reshape(t, (batch, length, self.n_head, self.head_dim)), (0, 2, 1, 3)) for t in (q, k, v)
        )

    def forward(self, x: Any) -> Any:
        # q, k and v read in place from the projection's output; the same as splitting it into (B, H, L, E)
        # heads, scaled_dot_product_attention and merging the heads back (what ``decode`` does for one row)
        return self.proj(ag.packed_self_attention(self.qkv(x), self.n_head, is_causal=True))

    def decode(self, x: Any, pos: Variable | int, cache: KVCache) -> Any:
        """``x`` ``(B, 1, d_model)`` at position ``pos``: writes its keys/values into ``cache``, attends over it."""
        batch = x.shape[0]
        q, k, v = self._heads(x, batch, 1)
        cache.update(k, v, pos)
        y = cache.attend(q, pos)
        return self.proj(ag.reshape(y, (batch, 1, self.d_model)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))`` (4x GELU MLP)."""

    def __init__(self, d_model: int, n_head: int, device: Any = None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, device=device)
        self.attn = CausalSelfAttention(d_model, n_head, device=device)
        self.ln2 = nn.LayerNorm(d_model, device=device)
        self.fc = nn.Linear(d_model, 4 * d_model, device=device)
        self.act = nn.GELU(approximate="tanh")  # GPT-2's
        self.out = nn.Linear(4 * d_model, d_model, device=device)

    def _mlp(self, x: Any) -> Any:
        return self.out(self.act(self.fc(self.ln2(x))))

    def forward(self, x: Any) -> Any:
        x = x + self.attn(self.ln1(x))
        return x + self._mlp(x)

    def decode(self, x: Any, pos: Variable | int, cache: KVCache) -> Any:
        x = x + self.attn.decode(self.ln1(x), pos, cache)
        return x + self._mlp(x)


class GPT(nn.Module):
    """A decoder-only transformer over ``vocab_size`` tokens and at most ``max_len`` positions."""

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        d_model: int = 512,
        n_head: int = 8,
        n_layer: int = 1,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self.config = {
            "vocab_size": vocab_size,
            "max_len": max_len,
            "d_model": d_model,
            "n_head": n_head,
            "n_layer": n_layer,
        }
        device = get_device(device)
        self.max_len, self.n_head, self.d_model = max_len, n_head, d_model
        self.tok_emb = nn.Embedding(vocab_size, d_model, device=device)
        self.pos_emb = nn.Embedding(max_len, d_model, device=device)
        for table in (self.tok_emb.weight, self.pos_emb.weight):
            nn.init.normal_(table, std=0.02)
        self.blocks = nn.ModuleList([Block(d_model, n_head, device=device) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model, device=device)
        self.head = nn.Linear(d_model, vocab_size, bias=False, device=device)

    def forward(self, ids: Any) -> Any:
        """Logits ``(B, S, vocab)`` for token ids ``(B, S)`` (int32 Tensor or array), S <= max_len."""
        length = ids.shape[1]
        if length > self.max_len:
            raise ValueError(f"GPT: sequence length {length} exceeds max_len {self.max_len}")
        x = self.tok_emb(ids) + self.pos_emb.weight[:length]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    # ---- netcl.nn.generation's decoding protocol ------------------------------------------
    def new_caches(self, batch: int) -> list[KVCache]:
        """One ``KVCache`` per block for ``batch`` sequences of up to ``max_len`` tokens."""
        head_dim = self.d_model // self.n_head
        return [KVCache(batch, self.n_head, self.max_len, head_dim, device=self.device) for _ in self.blocks]

    def decode(self, ids: Any, pos: Variable | int, caches: list[KVCache]) -> Any:
        """Logits ``(B, vocab)`` of the next token after ``ids`` ``(B, 1)`` at position ``pos``."""
        batch = ids.shape[0]
        x = self.tok_emb(ids) + rows_at(self.pos_emb.weight, pos)
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block.decode(x, pos, cache)
        return ag.reshape(self.head(self.ln_f(x)), (batch, -1))
