"""Metrics for ``Trainer.fit`` / ``evaluate``: ``metric(output, target)`` returns a batch mean on the device."""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.autograd.engine import Node
from netcl.core import Tensor
from netcl.runtime.ops import layout, pointwise, reduce, scan


def accuracy(output: Any, target: Any) -> Tensor:
    """Fraction of rows of ``output`` (N, C) whose argmax equals ``target`` (N,) integer classes:
    a 0-d float32 Tensor on the device (no host read)."""
    logits = output.value if isinstance(output, Node) else output
    labels = target.value if isinstance(target, Node) else target
    if not isinstance(labels, Tensor):
        labels = Tensor.from_host(logits.device, np.asarray(labels))
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"accuracy: expected output (N, C) and target (N,), got {logits.shape} and {labels.shape}")
    predicted = layout.cast(scan.argmax(logits, axis=1), np.int64)
    hits = layout.cast(pointwise.eq(predicted, layout.cast(labels, np.int64)), np.float32)
    return reduce.mean(hits)
