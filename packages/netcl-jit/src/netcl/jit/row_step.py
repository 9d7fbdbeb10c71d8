"""A row group made runnable: ONE forward row kernel, and ONE backward row kernel per output and pattern.

The forward writes the group's outputs and every reduction's per-row result (the saved
statistics). Each output becomes one Node through ``apply_op``; its gradient function runs the
backward program (``row_ir.backward_program``): the forward recomputed from the saved statistics,
then the gradients of the inputs that want one. A per-column input's gradient (a weight of shape
``(C,)``) is summed over the rows afterwards; every other gradient comes out of the one kernel.
The backend (OpenCL row kernels or NumPy functions, ``row_kernels``) is chosen once, when the step is built.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op, is_grad_enabled, untracked
from netcl.autograd.ops import plus
from netcl.core import Device, Tensor
from netcl.jit.row_group import RowGroup, build_program
from netcl.jit.row_ir import COL, ELEM, PARAM, ROW, RowInput, RowProgram, Stmt, backward_program, copies
from netcl.jit.row_kernels import RowKernels, row_kernels
from netcl.jit.row_ops import get_row_op
from netcl.runtime.ops import indexing, layout, reduce
from netcl.runtime.ops.class_loss import check_targets

FORWARD_NAME = "row_forward"
BACKWARD_NAME = "row_backward"


class RowStep:
    """Runs one ``RowGroup`` on one device."""

    def __init__(self, group: RowGroup, device: Device, label: str) -> None:
        self.group = group
        self.device = device
        self.label = label
        self.shape = group.shape
        self.C = group.shape[-1]
        self.rows = math.prod(group.shape[:-1])
        self.program = group.program = build_program(group)
        self.stats = [s.var for s in self.program.stmts if s.reduce]
        self.out_kinds = self.program.output_kinds()
        #: (input position, ignore_index, op name) of each class target a row op of the group reads
        #: (its entry's ``class_target``), checked against the row length before the forward
        position = {p.id: k for k, p in enumerate(group.inputs)}
        self.target_checks = [
            (position[target.id], node.attrs.get("ignore_index", -100), node.op_name)
            for node in group.nodes
            for row_op in [get_row_op(node.op_name)]
            if row_op is not None and row_op.class_target is not None
            for target in [node.inputs[row_op.class_target]]
            if target.id in position
        ]
        #: rows a backward work-group takes when it sums a per-column gradient (a few thousand groups)
        groups = int(os.environ.get("NETCL_ROW_GROUPS", 2048 if device.is_gpu else 64))
        self.rows_per_group = max(1, self.rows // max(1, groups))
        #: the backend, chosen once: OpenCL row kernels or generated NumPy functions
        self.kernels: RowKernels = row_kernels(device, label, self.rows, self.C, self.rows_per_group)
        forward = RowProgram(self.C, self.program.inputs, self.program.stmts, self.program.outputs + self.stats)
        self.forward_source, self._forward = self.kernels.build(FORWARD_NAME, forward)
        #: (output, wants, folded inputs) -> (kernel, source, gradient inputs, whether each gradient is the upstream)
        self._backward: dict[tuple[int, tuple[bool, ...], tuple[int, ...]], tuple[Any, str, list[int], bool]] = {}
        #: where a forward without a backward writes the row statistics (nobody reads them)
        self._scratch: list[Tensor] | None = None

    # ---- building ------------------------------------------------------------------------
    def _backward_kernel(self, output_index: int, wants: tuple[bool, ...], folded: tuple[int, ...] = ()):
        key = (output_index, wants, folded)
        entry = self._backward.get(key)
        if entry is None:
            program, which, _ = backward_program(self.program, output_index, list(wants))
            upstream = (
                self.out_kinds[output_index] == ELEM
                and all(self._full_elem(k) for k in which)
                and all(is_upstream(program, var) for var in program.outputs)
            )
            program = with_addends(program, which, folded)
            columns = frozenset(j for j, k in enumerate(which) if self.program.inputs[k].kind == COL)
            source, compiled = self.kernels.build(BACKWARD_NAME, program, columns)
            entry = self._backward[key] = (compiled, source, which, upstream and not folded)
        return entry

    def backward_source(self, output_index: int, wants: tuple[bool, ...]) -> str:
        return self._backward_kernel(output_index, tuple(wants))[1]

    # ---- running -------------------------------------------------------------------------
    def _run(self, compiled, program_inputs, values: list[Any], outs: list[Tensor]) -> None:
        self.kernels.run(compiled, program_inputs, values, outs)

    def _empty(self, shape: tuple[int, ...]) -> Tensor:
        return self.kernels.empty(shape)

    def forward(self, ext: list[Any]) -> list[Node]:
        """Run the forward kernel on the external inputs (Nodes, Tensors, floats); one Node per output."""
        values = [x.value if isinstance(x, Node) else x for x in ext]
        for k, ignore, op_name in self.target_checks:  # on OpenCL: IndexError at the next wait
            if isinstance(values[k], Tensor):
                check_targets(values[k], self.C, int(ignore), op_name)
        outs = [self._empty(o.shape) for o in self.group.outputs]
        wants = tuple(isinstance(x, Node) and x.requires_grad for x in ext)
        if not (any(wants) and is_grad_enabled()):  # no backward: the statistics go to a scratch buffer
            if self._scratch is None:
                self._scratch = [self._empty((self.rows,)) for _ in self.stats]
            self._run(self._forward, self.program.inputs, values, outs + self._scratch)
            return [untracked(out, self.label) for out in outs]
        stats = [self._empty((self.rows,)) for _ in self.stats]
        self._run(self._forward, self.program.inputs, values, outs + stats)
        return [
            apply_op(_Precomputed(out), self._grad_fn(j, wants, stats), *ext, op_name=self.label, folds_addends=True)
            for j, out in enumerate(outs)
        ]

    def _grad_fn(self, output_index: int, wants: tuple[bool, ...], stats: list[Tensor]):
        def grad_fn(
            grad_out: Tensor, inputs: tuple[Any, ...], output: Tensor, addends: list[Tensor | None] | None = None
        ) -> list[Tensor | None]:
            return self.backward(output_index, wants, grad_out, list(inputs), stats, addends)

        return grad_fn

    def backward(
        self,
        output_index: int,
        wants: tuple[bool, ...],
        grad_out: Tensor,
        values: list[Any],
        stats: list[Tensor],
        addends: list[Tensor | None] | None = None,
    ) -> list[Tensor | None]:
        """Gradients of the inputs that want one (None where the output does not reach an input).

        ``addends`` (``apply_op``'s ``folds_addends``): per input, a gradient already summed for it or None;
        such an input gets a new tensor ``addend + its gradient``, added in the kernel's store for a float32
        per-element input (the bits of the add kernel it replaces), else by an add after it."""
        wants = tuple(w and i.kind != PARAM for w, i in zip(wants, self.program.inputs, strict=True))
        if not any(wants):
            return [None] * len(values)
        folded = self._foldable(addends, wants)
        compiled, _, which, upstream = self._backward_kernel(output_index, wants, folded)
        out_shape = tuple(self.group.outputs[output_index].shape)
        if tuple(grad_out.shape) != out_shape:
            grad_out = layout.broadcast_to(grad_out, out_shape)
        if upstream:  # every gradient is the upstream one (a residual sum's): no kernel
            result: list[Tensor | None] = [None] * len(values)
            for k in which:
                grad = grad_out.reshape(tuple(self.group.inputs[k].shape))
                result[k] = grad if addends is None else plus(addends[k], grad)
            return result
        program_inputs = [*self.program.inputs, *self._stat_inputs(), self._gout_input(output_index)]
        program_inputs += addend_inputs(folded)
        groups = self.kernels.partial_groups(compiled)  # column gradients as per-group partial sums, or 0
        partial = groups > 0
        shapes = [self._grad_shape(k, groups) for k in which]
        columns = [j for j, k in enumerate(which) if self.program.inputs[k].kind == COL]
        stack, blocks = self._column_stack(shapes, columns)
        grads = [blocks[j] if j in blocks else self._empty(shape) for j, shape in enumerate(shapes)]
        self._run(compiled, program_inputs, [*values, *stats, grad_out, *(addends[k] for k in folded)], grads)
        if stack is not None:  # every column gradient summed over the rows in one reduction
            sums = reduce.sum(stack, 1)
            for position, j in enumerate(columns):
                grads[j] = indexing.getitem(sums, position)
        result = [None] * len(values)
        for k, grad in zip(which, grads, strict=True):
            target = tuple(self.group.inputs[k].shape)
            if self.program.inputs[k].kind == COL:
                if stack is not None:
                    grad = grad.reshape(target)
                else:
                    grad = reduce.sum(grad, 0).reshape(target) if partial else layout.sum_to_shape(grad, target)
            elif grad.shape != target:
                grad = grad.reshape(target)
            result[k] = grad if k in folded or addends is None else plus(addends[k], grad)
        return result

    def _column_stack(
        self, shapes: list[tuple[int, ...]], columns: list[int]
    ) -> tuple[Tensor | None, dict[int, Tensor]]:
        """Where two or more column gradients come out (a norm's weight and bias): one ``(count, rows, C)``
        tensor and its blocks, by gradient position, as their buffers (one reduction then sums them all, the
        bits of a reduction each); (None, {}) where there is one, or the device cannot address the blocks."""
        if len(columns) < 2:
            return None, {}
        rows = math.prod(shapes[columns[0]]) // self.C
        stack = self._empty((len(columns), rows, self.C))
        blocks = indexing.leading_views(stack)
        if blocks is None:
            return None, {}
        return stack, {j: block.reshape(shapes[j]) for j, block in zip(columns, blocks, strict=True)}

    def _foldable(self, addends: list[Tensor | None] | None, wants: tuple[bool, ...]) -> tuple[int, ...]:
        """The inputs whose addend the backward kernel adds in its store: float32 per-element inputs of the
        group's full size that want a gradient."""
        if addends is None:
            return ()
        size = self.rows * self.C
        return tuple(
            k
            for k, (addend, want) in enumerate(zip(addends, wants, strict=True))
            if want and addend is not None and addend.dtype == _F32 and addend.size == size and self._full_elem(k)
        )

    def _full_elem(self, k: int) -> bool:
        """Whether input ``k`` is per-element and of the group's full size (no broadcast)."""
        return self.program.inputs[k].kind == ELEM and math.prod(self.group.inputs[k].shape) == self.rows * self.C

    def _stat_inputs(self) -> list[RowInput]:
        return [RowInput(f"s{j}", ROW) for j in range(len(self.stats))]

    def _gout_input(self, output_index: int) -> RowInput:
        return RowInput("gout", ELEM if self.out_kinds[output_index] == ELEM else ROW)

    def _grad_shape(self, k: int, groups: int) -> tuple[int, ...]:
        kind = self.program.inputs[k].kind
        if kind == COL and groups:
            return (groups, self.C)
        if kind in (ELEM, COL):
            return self.shape
        return tuple(self.group.inputs[k].shape)


def is_upstream(program: RowProgram, var: str) -> bool:
    """Whether ``var`` of a backward ``program`` is the upstream gradient ``gout`` itself, through copies."""
    exprs = {s.var: s.expr for s in program.stmts if not (s.reduce or s.op) and s.kind == ELEM}
    return copies(exprs, var, "gout")


def addend_inputs(folded: tuple[int, ...]) -> list[RowInput]:
    """The backward kernel's extra elem inputs ``a{k}``: the addend of each input ``k`` in ``folded``."""
    return [RowInput(f"a{k}", ELEM) for k in folded]


def with_addends(program: RowProgram, which: list[int], folded: tuple[int, ...]) -> RowProgram:
    """``program`` (a backward: its outputs are the gradients of inputs ``which``) taking one more elem input
    ``a{k}`` per input ``k`` in ``folded`` and writing ``a{k} + its gradient`` for that input instead."""
    if not folded:
        return program
    inputs = [*program.inputs, *addend_inputs(folded)]
    stmts, outputs = list(program.stmts), list(program.outputs)
    for j, k in enumerate(which):
        if k in folded:
            stmts.append(Stmt(f"fold{k}", ELEM, f"ADD(a{k}, {outputs[j]})"))
            outputs[j] = f"fold{k}"
    return RowProgram(program.C, inputs, stmts, outputs)


_F32 = np.dtype(np.float32)


class _Precomputed:
    """The forward ``fn`` handed to apply_op: the kernel already ran, so it returns its output."""

    __slots__ = ("out",)

    def __init__(self, out: Tensor) -> None:
        self.out = out

    def __call__(self, *values: Any) -> Tensor:
        return self.out
