"""``pad_sequence``, torch's ``torch.nn.utils.rnn.pad_sequence``: variable-length sequences as one padded batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import netcl.autograd as ag
from netcl.autograd.engine import Node
from netcl.core import ShapeError


def pad_sequence(
    sequences: Sequence[Any], batch_first: bool = False, padding_value: float = 0.0, padding_side: str = "right"
) -> Node:
    """Sequences of shapes (L_i, *) (the trailing axes equal) padded with ``padding_value`` to the longest and
    stacked: (L_max, N, *), or (N, L_max, *) with ``batch_first``; ``padding_side`` "right" (torch's default) or
    "left". Gradients flow back into each sequence."""
    if not sequences:
        raise ValueError("pad_sequence: got no sequences")
    if padding_side not in ("right", "left"):
        raise ValueError(f"pad_sequence: padding_side must be 'right' or 'left', got {padding_side!r}")
    shapes = [tuple(s.shape) for s in sequences]
    if any(not shape or shape[1:] != shapes[0][1:] for shape in shapes):
        raise ShapeError(f"pad_sequence: sequences must be (L, *) with equal trailing shapes, got {shapes}")
    longest = max(shape[0] for shape in shapes)
    padded = []
    for sequence, shape in zip(sequences, shapes, strict=True):
        missing = longest - shape[0]
        if missing:
            widths = [0, 0] * (len(shape) - 1) + ([0, missing] if padding_side == "right" else [missing, 0])
            sequence = ag.pad(sequence, widths, float(padding_value))
        padded.append(sequence)
    return ag.stack(padded, 0 if batch_first else 1)


__all__ = ["pad_sequence"]
