"""Fused backward kernels that also sum gradients down the rows: a bias's gradient without a full pass.

An output of shape ``(..., F)`` is ``R`` rows of ``F``. A broadcast input of shape ``(1, ..., F)`` (a
bias) gets the column sum of its per-element gradient. The flat kernel stores that gradient at full
size and a reduction reads it back; here each work-item takes ``W`` adjacent columns of every
``G``-th row, stores the full-size results as the flat kernel does, adds the column results up in
registers, and writes one partial row: ``G x F`` floats that ``reduce_sum`` finishes (``G`` is a few
per work-item slot, ``R`` may be 10**5). Neighbouring work-items read neighbouring columns of one row,
so loads stay coalesced on GPUs and contiguous on CPUs. The partial sums are fixed by the layout, so
the result is the same on every run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from netcl.core.kernels import PRIMITIVE_PREAMBLE
from netcl.core.kernels.vector_primitives import vector_preamble
from netcl.jit.codegen import Body
from netcl.jit.opencl_source import needs_long_index, vector_lanes, vectorizable
from netcl.jit.primitive_registry import custom_preamble
from netcl.jit.shapes import broadcast_kind


@dataclass(frozen=True)
class ColumnLayout:
    """``rows`` x ``width`` elements; ``lanes`` columns per work-item; ``groups`` partial rows; per input
    how it is read: "same" (full size), "col" (one row of ``width``), "row" (one value per row),
    "one" (a single value) or "param" (a scalar argument)."""

    rows: int
    width: int
    lanes: int
    groups: int
    modes: tuple[str, ...]

    @property
    def vectors(self) -> int:
        """Work-items per partial row."""
        return self.width // self.lanes

    @property
    def work_items(self) -> int:
        return self.groups * self.vectors

    def with_groups(self, groups: int) -> ColumnLayout:
        """This layout writing ``groups`` partial rows (1 to ``rows``)."""
        return replace(self, groups=max(1, min(groups, self.rows)))


def column_input(shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> bool:
    """Whether an input of ``shape`` is one row broadcast down an output of ``out_shape`` (a bias).
    (A "col" input is never the output's own shape, so the output has more than one row.)"""
    return shape is not None and broadcast_kind(shape, out_shape) == "col"


def _mode(shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> str | None:
    if shape is None:
        return "param"
    kind = broadcast_kind(shape, out_shape)
    if kind == "full":
        return "same"
    if len(shape) <= len(out_shape) and all(d == 1 for d in shape):
        return "one"
    return kind  # "col", "row" or None


def column_layout(input_shapes, out_shape: tuple[int, ...], max_lanes: int, groups: int = 1) -> ColumnLayout | None:
    """The layout for an output of ``out_shape``, or None where a column kernel cannot read every input
    (another broadcast) or the row length has no even divisor up to ``max_lanes``."""
    if len(out_shape) < 2 or math.prod(out_shape) == 0:
        return None
    modes = tuple(_mode(s, out_shape) for s in input_shapes)
    if None in modes:
        return None
    width, rows = out_shape[-1], math.prod(out_shape[:-1])
    lanes = max((w for w in (2, 4, 8, 16) if w <= max_lanes and width % w == 0), default=0)
    if not lanes:
        return None
    return ColumnLayout(rows, width, lanes, 1, modes).with_groups(groups)  # type: ignore[arg-type]


def column_kernel_source(
    name: str,
    input_shapes,
    out_shape: tuple[int, ...],
    layout: ColumnLayout,
    body: Body,
    columns: list[bool],
    vector_body: bool,
) -> str:
    """A backward kernel (inputs, the upstream gradient ``gin_buf0``, one ``out`` per result, ``n``) in
    which result ``j`` is stored at full size, or, where ``columns[j]``, as ``groups`` partial column
    sums (``out{j}`` holds ``groups x width`` floats)."""
    index_type = "long" if needs_long_index(out_shape, input_shapes, layout.lanes) else "int"
    width = layout.lanes
    vf = f"float{width}"
    params = [
        f"__global const float* restrict in{k}" if shape is not None else f"const float p{k}"
        for k, shape in enumerate(input_shapes)
    ]
    params += ["__global const float* restrict gin_buf0"]
    params += [f"__global float* restrict out{j}" for j in range(len(body.results))]
    params.append(f"const {index_type} n")
    vector = vector_body and vectorizable(body)
    lines = [
        f"    {index_type} item = get_global_id(0);",
        f"    if (item >= {layout.work_items}) return;",
        f"    {index_type} c = item % {layout.vectors};",
    ]
    for k, mode in enumerate(layout.modes):  # what every row shares, read once
        if mode == "col":
            lines.append(f"    {vf} a{k} = vload{width}(c, in{k});")
        elif mode == "one":
            lines.append(f"    {vf} a{k} = ({vf})(in{k}[0]);")
    lines += [f"    {vf} acc{j} = ({vf})(0.0f);" for j, column in enumerate(columns) if column]
    lines += [
        f"    for ({index_type} r = item / {layout.vectors}; r < {layout.rows}; r += {layout.groups}) {{",
        f"        {index_type} v = r * {layout.vectors} + c;",
    ]
    for k, mode in enumerate(layout.modes):
        if mode == "same":
            lines.append(f"        {vf} a{k} = vload{width}(v, in{k});")
        elif mode == "row":
            lines.append(f"        {vf} a{k} = ({vf})(in{k}[r]);")
    lines.append(f"        {vf} ag = vload{width}(v, gin_buf0);")

    def store(j: int, value: str) -> str:
        return f"acc{j} += {value};" if columns[j] else f"vstore{width}({value}, v, out{j});"

    lines += vector_lanes(input_shapes, body, 1, width, "        ", vector, store)
    lines.append("    }")
    lines += [f"    vstore{width}(acc{j}, item, out{j});" for j, column in enumerate(columns) if column]
    header = f"__kernel void {name}(\n    " + ",\n    ".join(params) + "\n) {\n"
    preamble = PRIMITIVE_PREAMBLE + (vector_preamble(width) if vector else "")
    return preamble + "\n" + custom_preamble() + header + "\n".join(lines) + "\n}\n"
