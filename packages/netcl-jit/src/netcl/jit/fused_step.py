"""A fused group made runnable: its forward kernel, and a backward kernel per output and pattern.

The backend is chosen once, when the step is built (``fused_kernels``): on OpenCL the kernels are
built through the runtime's program cache and run through prepared launches; on the NumPy
backend they are generated Python functions. Each output of the
group becomes one Node through ``apply_op``, whose gradient function runs ONE backward kernel
(specialized for that output and for which inputs require a gradient) plus a reduction for
each broadcast input. On GPUs, a bias-like input's gradient (one row broadcast down the output) is
summed over the rows inside that kernel (``column_source``), leaving a small partial sum.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op, untracked
from netcl.core import Device, Tensor
from netcl.jit.codegen import backward_body, forward_body, reached_inputs
from netcl.jit.column_source import ColumnLayout, column_input
from netcl.jit.fused_kernels import FusedKernels, fused_kernels
from netcl.jit.partition import FusedGroup
from netcl.jit.row_ir import copies
from netcl.runtime.ops import reduce
from netcl.runtime.ops.layout import broadcast_to, full, sum_to_shape

_F32 = np.dtype(np.float32)
#: per output of a direct plan: how many small output buffers the plan recycles, and up to what size
RING_SIZE = 4
RING_MAX_BYTES = 1 << 20
#: the ring reads ``sys.getrefcount`` as calibrated on the interpreters this project tests (CPython with the GIL,
#: before 3.14); CPython 3.14 loads locals as borrowed references where it can and free-threaded builds count per
#: thread, so there a count could pass a held buffer for a free one: every call goes to the allocator instead
RING_COUNTS_TRUSTED = sys.version_info < (3, 14) and getattr(sys, "_is_gil_enabled", lambda: True)()
FORWARD_NAME = "fused_forward"
BACKWARD_NAME = "fused_backward"


class FusedStep:
    """Runs one ``FusedGroup`` on one device (its kernels come from the device's ``FusedKernels``)."""

    def __init__(self, group: FusedGroup, device: Device, label: str, build_forward: bool = True) -> None:
        self.group = group
        self.device = device
        self.label = label
        self.shape = group.shape
        self.size = math.prod(group.shape)
        self.nbytes = self.size * 4
        #: per external input: its shape, or None for a scalar parameter
        self.input_shapes: list[tuple[int, ...] | None] = [None if p.kind == "param" else p.shape for p in group.inputs]
        #: the backend, chosen once: OpenCL kernels or generated NumPy functions
        self.kernels: FusedKernels = fused_kernels(device, label, self.input_shapes, self.shape)
        self.forward_source = self.kernels.source(FORWARD_NAME, forward_body(group), has_gout=False)
        #: None when another kernel computes the forward (a GEMM epilogue, ``gemm_epilogue``)
        self._forward = (
            self.kernels.build(FORWARD_NAME, self.forward_source, len(group.outputs), has_gout=False)
            if build_forward
            else None
        )
        #: (output, wants) -> (kernel, source, column layout, per result whether it is column sums, whether every
        #: result is the upstream gradient)
        self._backward: dict[tuple[int, tuple[bool, ...]], tuple[Any, str, Any, list[bool], bool]] = {}
        #: per output: which external inputs its gradient reaches (others get None, not zeros)
        self._reached = [tuple(reached_inputs(group, out)) for out in group.outputs]

    def direct_caller(self, positions: list[int], outputs: list[int], returns_tuple: bool):
        """``call(args)``: the forward of a plan that is this one kernel on argument values, no gradient.

        Generated once per plan: it reads the arguments at ``positions`` (Nodes, Tensors or
        numbers), allocates the outputs, sets the per-call arguments of a prepared launch and
        enqueues it, and returns the Nodes of ``outputs`` (a tuple when ``returns_tuple``).
        None where there is no such path (NumPy backend, empty shape).

        Outputs of at most ``RING_MAX_BYTES`` come from a ring of up to ``RING_SIZE`` buffers per
        output that the plan keeps (taken from the device allocator once; where ``RING_COUNTS_TRUSTED``):
        a ring buffer is reused only when its reference count says that nothing else holds it (every result, view,
        capture or user variable that reads it holds the ``cl.Buffer``), which is cheaper than a
        pool round trip. As with the pool, reuse is ordered after earlier work by the in-order
        device queue. When every ring buffer is still referenced, the allocator serves the call.
        Two threads cannot take one buffer: the loop variable that found it holds a reference
        from the check on, so the other thread's count is one higher (the GIL orders them).
        """
        call = self.kernels.direct_call(self._forward) if self.size else None
        if call is None:
            return None
        lines = ["def direct(args):"]
        values = []
        for n, (position, shape) in enumerate(zip(positions, self.input_shapes, strict=True)):
            lines.append(f"    x{n} = args[{position}]")
            if shape is None:
                values.append(f"f32(x{n})")
            else:
                values.append(f"(x{n}.value.data if isinstance(x{n}, Node) else x{n}.data)")
        outs = [f"o{j}" for j in range(len(self.group.outputs))]
        recycle = RING_COUNTS_TRUSTED and self.nbytes <= RING_MAX_BYTES
        for j, out in enumerate(outs):
            if recycle:  # a buffer of this plan's ring that nothing references any more, else a new one
                lines.append(f"    for {out} in ring{j}:")
                lines.append(f"        if getrefcount({out}) == FREE: break")
                lines.append("    else:")
                lines.append(f"        {out} = device.allocator(device, nbytes)")
                lines.append(f"        if len(ring{j}) < RING: ring{j}.append({out})")
            else:
                lines.append(f"    {out} = device.allocator(device, nbytes)")
        lines.append(f"    call({', '.join(values + outs)})")
        nodes = [f"untracked(Tensor(o{j}, shape, F32, device), label)" for j in outputs]
        lines.append(f"    return ({', '.join(nodes)},)" if returns_tuple else f"    return {nodes[0]}")
        lines += ["def calibrate(ring0):", "    for o0 in ring0:", "        return getrefcount(o0)"]
        scope = {
            "Tensor": Tensor,
            "Node": Node,
            "untracked": untracked,
            "F32": _F32,
            "f32": np.float32,
            "device": self.device,
            "nbytes": self.nbytes,
            "shape": self.shape,
            "label": self.label,
            "call": call,
            "getrefcount": sys.getrefcount,
            "RING": RING_SIZE,
            **{f"ring{j}": [] for j in range(len(outs))},
        }
        exec(compile("\n".join(lines), f"<netcl jit direct call {self.label}>", "exec"), scope)
        scope["FREE"] = scope.pop("calibrate")([object()])  # the count of a buffer only the ring holds
        return scope.pop("direct")  # popped: the function and its globals form no reference cycle

    def backward_source(self, output_index: int, wants: tuple[bool, ...]) -> str:
        return self._backward_kernel(output_index, wants)[1]

    def _backward_kernel(self, output_index: int, wants: tuple[bool, ...]):
        """(compiled, source, column layout or None, per result: whether it comes as partial column sums, whether
        every result is the upstream gradient itself)."""
        key = (output_index, wants)
        entry = self._backward.get(key)
        if entry is None:
            body = backward_body(self.group, self.group.outputs[output_index], list(wants))
            wanted = [shape for shape, want in zip(self.input_shapes, wants, strict=True) if want]
            columns = [column_input(shape, self.shape) for shape in wanted]
            layout = self.kernels.column_layout() if any(columns) else None
            if layout is None:
                columns = [False] * len(columns)
                source = self.kernels.source(BACKWARD_NAME, body, has_gout=True)
                work_items = None
            else:
                source = self.kernels.column_source(BACKWARD_NAME, body, layout, columns)
                work_items = layout.work_items
            compiled = self.kernels.build(
                BACKWARD_NAME, source, len(body.results), has_gout=True, work_items=work_items
            )
            exprs = dict(body.lines)
            entry = (compiled, source, layout, columns, all(copies(exprs, r, "gout") for r in body.results))
            self._backward[key] = entry
        return entry

    def sums_columns(self, k: int) -> bool:
        """Whether the backward kernel sums input ``k``'s gradient over the rows itself (a bias; GPUs by default)."""
        return column_input(self.input_shapes[k], self.shape) and self.kernels.column_layout() is not None

    # ---- running -------------------------------------------------------------------------
    def _run(self, compiled, values: list[Any], outs: list[Tensor], gout: Tensor | None) -> None:
        self.kernels.run(compiled, values, outs, gout)

    def _empty(self) -> Tensor:
        """A new float32 tensor of the group's shape (straight from the device's allocator)."""
        return self.kernels.empty()

    def forward(self, ext: list[Any]) -> list[Node]:
        """Run the forward kernel on the external inputs (Nodes, Tensors, floats); one Node per output."""
        values = [x.value if isinstance(x, Node) else x for x in ext]
        outs = [self._empty() for _ in self.group.outputs]
        if self.size:
            self._run(self._forward, values, outs, None)
        wants = tuple(isinstance(x, Node) and x.requires_grad for x in ext)
        if not any(wants):  # nothing to differentiate: what apply_op returns here, without its overhead
            return [untracked(out, self.label) for out in outs]
        return [
            apply_op(Precomputed(out), self._grad_fn(j, wants), *ext, op_name=self.label) for j, out in enumerate(outs)
        ]

    def _grad_fn(self, output_index: int, wants: tuple[bool, ...]):
        def grad_fn(grad_out: Tensor, inputs: tuple[Any, ...], output: Tensor) -> list[Tensor | None]:
            return self.backward(output_index, wants, grad_out, list(inputs))

        return grad_fn

    def backward(self, output_index: int, wants: tuple[bool, ...], grad_out: Tensor, values: list[Any]):
        """Gradients of the external inputs that want one, from the upstream gradient of an output.

        An input the output's gradient does not reach gets None (as an un-fused op gives it).
        """
        wants = tuple(w and r for w, r in zip(wants, self._reached[output_index], strict=True))
        if not any(wants):
            return [None] * len(values)
        if tuple(grad_out.shape) != self.shape:
            grad_out = broadcast_to(grad_out, self.shape)
        compiled, _, layout, columns, upstream = self._backward_kernel(output_index, wants)
        if upstream:  # every gradient is the upstream one (a sum's): no kernel, broadcast inputs summed from it
            return [
                None if not want else grad_out if shape == self.shape else sum_to_shape(grad_out, shape)
                for want, shape in zip(wants, self.input_shapes, strict=True)
            ]
        grads = [self._partial_sums(layout) if column else self._empty() for column in columns]
        if self.size:
            self._run(compiled, values, grads, grad_out)
        else:
            grads = [full(self.shape, 0.0, device=self.device) for _ in grads]
        result: list[Tensor | None] = []
        pending = iter(zip(grads, columns, strict=True))
        for want, shape in zip(wants, self.input_shapes, strict=True):
            if not want:
                result.append(None)
                continue
            grad, column = next(pending)
            if column:  # (groups, width) partial sums of a bias's gradient
                result.append((grad if layout.groups == 1 else reduce.sum(grad, axis=0)).reshape(shape))
            else:
                result.append(grad if shape == self.shape else sum_to_shape(grad, shape))
        return result

    def _partial_sums(self, layout: ColumnLayout) -> Tensor:
        """A new (groups, width) float32 tensor for a column kernel's partial sums."""
        shape = (layout.groups, layout.width)
        return Tensor(self.device.allocator(self.device, 4 * math.prod(shape)), shape, _F32, self.device)


class Precomputed:
    """The forward ``fn`` handed to apply_op: the kernel already ran, so it returns its output."""

    __slots__ = ("out",)

    def __init__(self, out: Tensor) -> None:
        self.out = out

    def __call__(self, *values: Any) -> Tensor:
        return self.out
