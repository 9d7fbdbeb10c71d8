"""NumPy twins of the fused attention kernels (``netcl.runtime.ops.attention``): same results, same dropout bits.

Queries are processed in blocks of rows so that at most ``BLOCK_ELEMENTS`` scores exist at a time
(never the whole ``(BH, L, S)`` probabilities); arithmetic is float32 (float64 for float64
input), as in the kernels. A fully masked row gives output 0, lse -inf and zero gradients.
"""

from __future__ import annotations

import numpy as np

from netcl.core import Tensor
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.ops import random
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops.attention_spec import BOOL_MASK, AttentionSpec

#: scores held at once per block of query rows (all batch-heads together)
BLOCK_ELEMENTS = 1 << 22


def _row_blocks(spec: AttentionSpec) -> range:
    """Starts of the query-row blocks (the block size is the range's step)."""
    return range(0, spec.L, max(1, BLOCK_ELEMENTS // max(1, spec.BH * spec.S)))


def _scores(q3: np.ndarray, k3: np.ndarray, mask: Tensor | None, spec: AttentionSpec, r0: int, r1: int) -> np.ndarray:
    """Scaled, masked scores of query rows r0:r1 against every key: (BH, r1 - r0, S), -inf where masked."""
    ct = q3.dtype.type
    s = np.matmul(q3[:, r0:r1], k3.transpose(0, 2, 1)) * ct(spec.scale)
    if mask is not None:
        full = np.broadcast_to(np.asarray(mask.data).reshape(spec.mask_shape), (*spec.lead, spec.L, spec.S))
        block = full[..., r0:r1, :].reshape(spec.BH, r1 - r0, spec.S)
        s = np.where(block, s, ct(-np.inf)) if spec.mask_kind == BOOL_MASK else s + block.astype(ct)
    if spec.causal:
        rows = np.arange(r0, r1)[:, None]
        s = np.where(np.arange(spec.S)[None, :] <= rows, s, ct(-np.inf))
    return s


def _keep(spec: AttentionSpec, r0: int, r1: int, seed: int, counter: Tensor | None, ct: type) -> np.ndarray | None:
    """The dropout factors (0 or 1/(1-p)) of rows r0:r1: (BH, r1 - r0, S), or None without dropout."""
    if spec.dropout_p <= 0:
        return None
    word3 = 0 if counter is None else int(np.asarray(counter.data).reshape(-1)[0].astype(np.uint32))
    bh = np.arange(spec.BH, dtype=np.uint64)[:, None, None]
    rows = np.arange(r0, r1, dtype=np.uint64)[None, :, None]
    cols = np.arange(spec.S, dtype=np.uint64)[None, None, :]
    flat = (bh * np.uint64(spec.L) + rows) * np.uint64(spec.S) + cols
    seed = int(seed) % 2**64
    zeros = np.zeros(flat.shape, np.uint64)
    words = random.philox4x32(
        (flat & np.uint64(0xFFFFFFFF), flat >> np.uint64(32), zeros + random.DROPOUT_STREAM, zeros + word3),
        (seed, seed >> 32),
    )
    keep = (words[0] >> np.uint32(8)) >= random.dropout_threshold(spec.dropout_p)
    return np.where(keep, ct(np.float32(1.0 / (1.0 - spec.dropout_p))), ct(0))


def _operands(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec):
    ct = float_compute_type(q.dtype)
    q3 = np.asarray(q.data, dtype=ct).reshape(spec.BH, spec.L, spec.E)
    index = spec.kv_index()
    k3 = np.asarray(k.data, dtype=ct).reshape(spec.BHkv, spec.S, spec.E)[index]
    v3 = np.asarray(v.data, dtype=ct).reshape(spec.BHkv, spec.S, spec.Ev)[index]
    return ct, q3, k3, v3


def _probabilities(s: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """exp(s - lse) with 0 on rows whose lse is -inf (fully masked)."""
    safe = np.where(np.isneginf(lse), 0, lse)[..., None]
    with np.errstate(under="ignore"):
        p = np.exp(s - safe)
    return np.where(np.isneginf(lse)[..., None], 0, p)


def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    spec: AttentionSpec,
    seed: int = 0,
    counter: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(out, lse) of ``attention.attention_forward`` on the NumPy backend."""
    ct, q3, k3, v3 = _operands(q, k, v, spec)
    out = np.zeros((spec.BH, spec.L, spec.Ev), ct)
    lse = np.full((spec.BH, spec.L), -np.inf, ct)
    blocks = _row_blocks(spec)
    for r0 in blocks:
        r1 = min(spec.L, r0 + blocks.step)
        s = _scores(q3, k3, mask, spec, r0, r1)
        m = s.max(axis=-1) if spec.S else np.full(s.shape[:-1], -np.inf, ct)
        shift = np.where(np.isneginf(m), 0, m)
        with np.errstate(under="ignore"):
            e = np.exp(s - shift[..., None])
        total = e.sum(axis=-1)
        with np.errstate(divide="ignore"):
            lse[:, r0:r1] = np.where(total > 0, shift + np.log(total), -np.inf)
        p = e / np.where(total > 0, total, 1)[..., None]
        keep = _keep(spec, r0, r1, seed, counter, ct)
        if keep is not None:
            p = p * keep
        out[:, r0:r1] = np.matmul(p, v3)
    lse_dtype = float_compute_type(q.dtype)
    return (
        wrap_numpy(out.reshape(*spec.lead, spec.L, spec.Ev), q.device, q.dtype),
        wrap_numpy(lse.reshape(*spec.lead, spec.L), q.device, lse_dtype),
    )


def attention_gradients(g, q, k, v, out, lse, mask, spec: AttentionSpec, seed: int, counter):
    """(dq, dk, dv) of ``attention.attention_backward`` (``attention_gradients``) on the NumPy backend."""
    ct, q3, k3, v3 = _operands(q, k, v, spec)
    g3 = np.asarray(g.data, dtype=ct).reshape(spec.BH, spec.L, spec.Ev)
    o3 = np.asarray(out.data, dtype=ct).reshape(spec.BH, spec.L, spec.Ev)
    lse2 = np.asarray(lse.data, dtype=ct).reshape(spec.BH, spec.L)
    d = (g3 * o3).sum(axis=-1)
    dq = np.zeros_like(q3)
    dk = np.zeros((spec.BH, spec.S, spec.E), ct)
    dv = np.zeros((spec.BH, spec.S, spec.Ev), ct)
    blocks = _row_blocks(spec)
    for r0 in blocks:
        r1 = min(spec.L, r0 + blocks.step)
        p = _probabilities(_scores(q3, k3, mask, spec, r0, r1), lse2[:, r0:r1])
        keep = _keep(spec, r0, r1, seed, counter, ct)
        dp = np.matmul(g3[:, r0:r1], v3.transpose(0, 2, 1))
        if keep is not None:
            dv += np.matmul((p * keep).transpose(0, 2, 1), g3[:, r0:r1])
            dp = dp * keep
        else:
            dv += np.matmul(p.transpose(0, 2, 1), g3[:, r0:r1])
        ds = p * (dp - d[:, r0:r1, None]) * ct(spec.scale)
        dq[:, r0:r1] = np.matmul(ds, k3)
        dk += np.matmul(ds.transpose(0, 2, 1), q3[:, r0:r1])
    # q heads sharing a kv head add their gradients (in head order)
    dk = dk.reshape(spec.BHkv, spec.group, spec.S, spec.E).sum(axis=1)
    dv = dv.reshape(spec.BHkv, spec.group, spec.S, spec.Ev).sum(axis=1)
    return (
        wrap_numpy(dq.reshape(q.shape), q.device, q.dtype),
        wrap_numpy(dk.reshape(k.shape), k.device, k.dtype),
        wrap_numpy(dv.reshape(v.shape), v.device, v.dtype),
    )


__all__ = ["BLOCK_ELEMENTS", "attention_forward", "attention_gradients"]
