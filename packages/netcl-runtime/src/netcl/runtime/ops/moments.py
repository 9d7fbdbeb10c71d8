"""Per-channel moments gathered in a convolution's store, for the batch norm that reads its output.

A kernel writing a float32 (N, C, *) tensor y may hand, beside it, each channel's moments over groups of its
elements: (count, mean, M2 = sum((v - mean)^2)) per (channel, group), a (C, G, 3) float32 tensor. A work-item
sums its own values shifted by its first one (a block of neighbours: no E[v^2] - E[v]^2 cancellation), the
work-items of a group are merged by the local-memory tree (``_rows.tree_loop_c``) with the pairwise update of
Chan, Golub and LeVeque, and ``batchnorm.batch_norm_forward(..., moments=)`` merges a channel's G groups by
the same update (each lane a share of them, then a tree over the lanes) instead of reading y for its
statistics: one pass over y fewer. Every pairing is fixed by the layout, so the result never depends on
timing. The Winograd forward's output transform gathers them (``conv_winograd.forward(..., gather=)``;
through ``conv.conv2d`` on GPUs: ``conv_winograd.gathers_moments``); the JIT asks for them where a
convolution's output goes to a training batch norm alone (``netcl.jit.conv_moments``).
"""

from __future__ import annotations

from dataclasses import dataclass

from netcl.core import Tensor
from netcl.core.dtypes import float32

#: C: merge a group's moments (nb, mb, qb) into the running (n, mean, m2) (a group of no elements changes nothing).
MERGE_C = """inline void netcl_moments_merge(float* n, float* mean, float* m2, const float nb, const float mb,
                                      const float qb) {
    if (nb > 0.0f) {
        const float na = *n, total = na + nb, d = mb - *mean, f = nb / total;
        *mean += d * f;
        *m2 += qb + d * d * na * f;
        *n = total;
    }
}
"""
#: ``_rows.tree_loop_c``'s combine of moments held in the local arrays s0 (count), s1 (mean), s2 (m2).
TREE_COMBINE = (
    "float n = s0[lid], mu = s1[lid], q = s2[lid];",
    "netcl_moments_merge(&n, &mu, &q, s0[lid + h], s1[lid + h], s2[lid + h]);",
    "s0[lid] = n; s1[lid] = mu; s2[lid] = q;",
)


@dataclass(frozen=True, eq=False)
class ChannelMoments:
    """The moments of ``source`` (N, C, *) float32 by channel and group: ``parts`` (C, G, 3) float32, each row
    (count, mean, M2) of one group of the channel's elements, the groups in the order a batch norm merges them."""

    source: Tensor
    parts: Tensor

    @property
    def groups(self) -> int:
        return int(self.parts.shape[1])


def of(moments: ChannelMoments | None, x: Tensor) -> ChannelMoments | None:
    """``moments`` where they are those of this very tensor ``x`` (float32, on its device), else None."""
    if moments is None or moments.source is not x or x.dtype != float32:
        return None
    return moments


__all__ = ["MERGE_C", "TREE_COMBINE", "ChannelMoments", "of"]
