"""``KVCache``: one attention layer's preallocated keys and values for incremental decoding.

The cache holds keys ``(batch, heads, max_len, head_dim)`` and values ``(batch, heads, max_len,
value_dim)``, allocated once for the maximum length. At a decode position ``pos`` (an ``int`` or a
``netcl.runtime.Variable``, so a captured step replays for every position) a layer writes the new
keys/values with ``update(k, v, pos)`` and attends with ``attend(q, pos)``: query ``i`` of ``q``
``(batch, heads, L, head_dim)`` sits at position ``pos + i`` and sees keys ``0 .. pos + i``,
which is causal self-attention over everything decoded so far. Rows past ``pos + L - 1`` are
never read, so a cache is reused for a new sequence by decoding from position 0 again.

These are inference ops: they record no gradient (``netcl.runtime.ops.kv_cache`` has the kernels).
``rows_at(table, pos, count)`` reads rows of a table at a bound position (a position embedding).
"""

from __future__ import annotations

from typing import Any

from netcl.autograd.engine import Node, apply_op
from netcl.core import Device, Tensor, get_device
from netcl.core.dtypes import as_dtype, float32
from netcl.runtime.ops import kv_cache
from netcl.runtime.variable import Variable


def _value(x: Any) -> Any:
    return x.value if isinstance(x, Node) else x


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
    return value


class KVCache:
    """Keys ``k`` and values ``v`` of one attention layer for ``max_len`` positions (see the module doc)."""

    def __init__(
        self,
        batch: int,
        heads: int,
        max_len: int,
        head_dim: int,
        value_dim: int | None = None,
        dtype: Any = float32,
        device: Device | str | None = None,
    ) -> None:
        self.batch, self.heads = _positive("batch", batch), _positive("heads", heads)
        self.max_len, self.head_dim = _positive("max_len", max_len), _positive("head_dim", head_dim)
        self.value_dim = head_dim if value_dim is None else _positive("value_dim", value_dim)
        self.device = get_device(device)
        dtype = as_dtype(dtype)
        self.k = Tensor.zeros((batch, heads, max_len, head_dim), dtype, self.device)
        self.v = Tensor.zeros((batch, heads, max_len, self.value_dim), dtype, self.device)

    def update(self, k: Any, v: Any, pos: int | Variable) -> None:
        """Write ``k`` ``(batch, heads, S, head_dim)`` and ``v`` at positions ``pos .. pos + S - 1``."""
        kv_cache.write_rows(self.k, _value(k), pos)
        kv_cache.write_rows(self.v, _value(v), pos)

    def attend(self, q: Any, pos: int | Variable, scale: float | None = None) -> Node:
        """Attention of ``q`` ``(batch, heads, L, head_dim)`` at positions ``pos..`` over the cached keys."""
        kv_cache.check_cache_attention(_value(q), self.k, self.v, pos)
        return apply_op(
            lambda qv: kv_cache.cache_attention(qv, self.k, self.v, pos, scale), None, q, op_name="cache_attention"
        )

    def __repr__(self) -> str:
        return (
            f"KVCache(batch={self.batch}, heads={self.heads}, max_len={self.max_len}, head_dim={self.head_dim}, "
            f"dtype={self.k.dtype}, device={self.device.spec!r})"
        )


def rows_at(table: Any, pos: int | Variable, count: int = 1) -> Node:
    """Rows ``pos .. pos + count - 1`` of ``table`` ``(..., T, R)`` as ``(..., count, R)`` (no gradient)."""
    return apply_op(lambda t: kv_cache.read_rows(t, pos, count), None, table, op_name="rows_at")


__all__ = ["KVCache", "rows_at"]
