"""A trace rewrite: a convolution read by a training batch norm alone hands it its output's moments.

``jit_compile`` (and so ``fuse_graph``'s captured training step) runs this pass on every trace after
``norm_epilogue``'s. Where a ``conv2d``'s output has one use, a ``batch_norm`` or ``batch_norm_relu`` in
training mode that normalizes it, the two ops share a list: the convolution refills it with the output's
per-channel moments where its store gathers them (a Winograd forward's output transform:
``netcl.runtime.ops.moments``), and the batch norm merges them for its batch statistics instead of reading
its input for them, one pass over the convolution's output fewer. Where the convolution runs another
algorithm the list stays empty and the batch norm reads its input as before; moments of any other tensor
are never read (``moments.of``). The statistics agree with the batch norm's own to float32 rounding (a
different order of the same sums), not bit for bit. ``NETCL_JIT_CONV_MOMENTS=0`` turns the pass off (read at
each compile).
"""

from __future__ import annotations

import functools
import os
from collections import Counter

import numpy as np

from netcl.jit.partition import uses_of
from netcl.jit.tracing import TraceNode

#: Set to ``0`` to keep each batch norm's own statistics pass (compare the step without the rewrite).
ENV = "NETCL_JIT_CONV_MOMENTS"
#: The batch norms that take moments (``ops_norm.batch_norm_rules``' forward, keyword ``moments``).
_NORMS = ("batch_norm", "batch_norm_relu")


def enabled() -> bool:
    """Whether the pass runs (``NETCL_JIT_CONV_MOMENTS`` unset or not ``0``)."""
    return os.environ.get(ENV, "").strip() != "0"


def share_conv_moments(outputs: list[TraceNode]) -> int:
    """Pair each convolution with the training batch norm that alone reads it, among the nodes ``outputs``
    depend on (the convolution's ``fn`` given ``gather=``, the batch norm's ``moments=``, one list); returns
    how many pairs."""
    if not enabled():
        return 0
    nodes, uses = uses_of(outputs)
    count = 0
    for norm in nodes:
        conv = _normalized_conv(norm, uses)
        if conv is not None:
            shared: list = []
            conv.fn = functools.partial(conv.fn, gather=shared)
            norm.fn = functools.partial(norm.fn, moments=shared)
            count += 1
    return count


def _normalized_conv(norm: TraceNode, uses: Counter[int]) -> TraceNode | None:
    """The float32 ``conv2d`` node that ``norm`` (a training batch norm) normalizes and nothing else reads."""
    if norm.kind != "op" or norm.op_name not in _NORMS or not norm.attrs.get("training") or not norm.arg_layout:
        return None
    kind, index = norm.arg_layout[0]
    if kind != "node":
        return None
    conv = norm.inputs[index]
    single = uses[conv.id] == 1 and conv.kind == "op" and conv.op_name == "conv2d"
    return conv if single and conv.dtype == np.float32 and conv.fn is not None else None


__all__ = ["ENV", "enabled", "share_conv_moments"]
