"""A matmul and the fused elementwise group it feeds, run as ONE GEMM kernel.

``merge_epilogues`` runs after ``partition``: where a fused group reads a float32 ``matmul`` (or
``nn.functional.linear`` outside autocast: ``x @ weight.T``, its bias added in the store) whose
result nothing else reads, the two become one ``MatmulGroup``. ``GemmEpilogueStep`` runs it: on
OpenCL the group's per-element body (the same ``codegen`` body the fused kernel would run) is
injected into the GEMM's store as a code epilogue (``netcl.runtime.ops.gemm_source.Epilogue``),
so ``relu(x @ w + b) + 1`` is one kernel. Under autograd the kernel also stores the product where
the group's backward reads it (``relu`` does; ``x @ w + b`` does not). The backward is the group's
fused backward kernel for ``d(product)`` (a bias gradient with the same expression is summed down
the rows in that kernel on GPUs, ``column_source``, or is the sum of ``d(product)`` to the bias's
shape; no kernel at all where ``d(product)`` is the upstream gradient), then the matmul's own
gradient rule (``dX = dP W^T``, ``dW = X^T dP``). On the NumPy backend, and on CPU OpenCL devices
whose products run on the host BLAS, the product and the group's kernel (or generated function) run
one after the other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.autograd.engine import Node, apply_op, untracked
from netcl.core import Device, Tensor
from netcl.jit.codegen import backward_body, forward_body
from netcl.jit.fused_step import FusedStep, Precomputed
from netcl.jit.partition import EagerStep, FusedGroup, Step
from netcl.jit.primitive_registry import custom_preamble
from netcl.jit.shapes import broadcast_kind
from netcl.jit.tracing import TraceNode
from netcl.runtime.ops import host_blas, layout, linalg
from netcl.runtime.ops.gemm import gemm
from netcl.runtime.ops.gemm_source import Epilogue

_F32 = np.dtype(np.float32)
#: ``_alias`` source meaning "the upstream gradient itself"
_GOUT = -1


@dataclass
class MatmulGroup:
    """A matmul whose only reader is ``group``; ``others`` are the group's other inputs and ``kinds``
    how the GEMM store reads each of them (an ``Epilogue`` operand kind)."""

    matmul: TraceNode
    group: FusedGroup
    others: list[TraceNode]
    kinds: list[str]

    @property
    def inputs(self) -> list[TraceNode]:
        return [*self.matmul.inputs, *self.others]

    @property
    def trans_b(self) -> bool:
        """Whether the product reads its second operand transposed (``x @ weight.T``: ``nn.functional.linear``)."""
        return PRODUCTS[self.matmul.op_name].trans_b

    @property
    def operands(self) -> int:
        """How many of ``inputs`` belong to the product: a, b and a linear layer's bias."""
        return len(self.matmul.inputs)

    @property
    def outputs(self) -> list[TraceNode]:
        return self.group.outputs


def operand_kind(node: TraceNode, out_shape: tuple[int, ...]) -> str | None:
    """How a GEMM store reads ``node`` for an output of ``out_shape``; None when it cannot."""
    return "scalar" if node.kind == "param" else broadcast_kind(node.shape, out_shape)


@dataclass(frozen=True)
class Product:
    """An op whose result a GEMM's store can follow with an epilogue."""

    #: whether a traced node of the op runs as one GEMM (its operands, attributes, the function it runs)
    eligible: Callable[[TraceNode], bool]
    #: the GEMM reads the second operand transposed
    trans_b: bool


#: op name -> how it runs as a GEMM: ``matmul`` (``a @ b``), ``linear`` (``x @ weight.T (+ bias)`` outside autocast)
PRODUCTS: dict[str, Product] = {
    "matmul": Product(lambda node: node.fn is linalg.matmul and len(node.inputs) == 2, trans_b=False),
    "linear": Product(
        lambda node: node.attrs.get("autocast", "?") is None and len(node.inputs) == 2 + bool(node.attrs.get("bias")),
        trans_b=True,
    ),
}


def _eligible(node: TraceNode) -> bool:
    """A float32 ``PRODUCTS`` op (``matmul``, ``linear`` outside autocast) of >= 2-D operands."""
    product = PRODUCTS.get(node.op_name)
    if product is None or not product.eligible(node):
        return False
    if node.dtype != _F32 or any(kind != "node" for kind, _ in node.arg_layout):
        return False
    a, b = node.inputs[:2]
    return (
        all(p.dtype == _F32 for p in node.inputs)
        and len(a.shape) >= 2
        and len(b.shape) >= 2
        and a.shape[-1] > 0
        and math.prod(node.shape) > 0
    )


def merge_epilogues(steps: list[Step], outputs: list[TraceNode]) -> list[Step | MatmulGroup]:
    """``steps`` with each (matmul, group reading only it) pair replaced by one ``MatmulGroup``."""
    readers: dict[int, int] = {o.id: 1 for o in outputs}
    matmuls: dict[int, TraceNode] = {}
    for step in steps:
        reads = step.node.inputs if isinstance(step, EagerStep) else step.inputs
        for node_id in {p.id for p in reads}:
            readers[node_id] = readers.get(node_id, 0) + 1
        if isinstance(step, EagerStep) and _eligible(step.node):
            matmuls[step.node.id] = step.node
    merged: dict[int, MatmulGroup] = {}
    for step in steps:
        if not isinstance(step, FusedGroup):
            continue
        for node in step.inputs:
            if node.id not in matmuls or readers.get(node.id) != 1 or node.shape != step.shape:
                continue
            others = [p for p in step.inputs if p is not node]
            kinds = [operand_kind(p, step.shape) for p in others]
            if None in kinds or any(p.kind != "param" and p.dtype != _F32 for p in others):
                continue
            merged[id(step)] = MatmulGroup(node, step, others, kinds)  # type: ignore[arg-type]
            break
    dropped = {m.matmul.id for m in merged.values()}
    result: list[Step | MatmulGroup] = []
    for step in steps:
        if isinstance(step, EagerStep) and step.node.id in dropped:
            continue
        result.append(merged.get(id(step), step))
    return result


_NAME = re.compile(r"[A-Za-z_]\w*")


def _live_names(lines: list[tuple[str, str]], results: list[str]) -> set[str]:
    """Every name the ``results`` of a body depend on, through its (variable, expression) lines."""
    exprs = dict(lines)
    live: set[str] = set()
    stack = list(results)
    while stack:
        name = stack.pop()
        if name in live:
            continue
        live.add(name)
        if name in exprs:
            stack.extend(_NAME.findall(exprs[name]))
    return live


def one_kernel(device: Device) -> bool:
    """Whether the group runs in the GEMM's store on ``device``: on OpenCL, except where products run on
    the host BLAS (a CPU device's mapped memory, ``NETCL_HOST_BLAS``), which beats the portable GEMM kernel
    there even with the extra pass (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings",
    gemm_epilogue.py)."""
    if device.kind != "opencl":
        return False
    return not (host_blas.enabled() and host_blas.host_memory_device(device))


class GemmEpilogueStep:
    """Runs one ``MatmulGroup``; ``group`` lists its external inputs (matmul operands first) and outputs."""

    def __init__(self, merged: MatmulGroup, device: Device, label: str) -> None:
        self.merged = merged
        self.group = FusedGroup(merged.group.nodes, merged.group.shape, merged.inputs, merged.outputs)
        self.device = device
        self.shape = merged.group.shape
        self.one_kernel = one_kernel(device)
        self.inner = FusedStep(merged.group, device, label, build_forward=not self.one_kernel)
        self.label = label
        self.h_index = merged.group.inputs.index(merged.matmul)
        self.epilogues = {save: self._epilogue(save) for save in (False, True)}
        self.forward_source = self.epilogues[False].code
        self._aliases: dict[tuple[int, tuple[bool, ...]], tuple[tuple[bool, ...], dict[int, int]]] = {}
        self._needs: dict[tuple, bool] = {}

    # ---- the code epilogue ---------------------------------------------------------------
    def _epilogue(self, save: bool) -> Epilogue:
        """The group's forward body as GEMM store statements; ``save`` also stores the product."""
        group = self.merged.group
        body = forward_body(group)
        lead = self.merged.operands - 2  # a linear layer's bias: operand 0, added to the product
        operand = {p.id: lead + j for j, p in enumerate(self.merged.others)}
        product = "ep_value + ep0" if lead else "ep_value"
        lines = [
            f"float x{k} = {product if p is self.merged.matmul else f'ep{operand[p.id]}'};"
            for k, p in enumerate(group.inputs)
        ]
        lines += [f"float {var} = {expr};" for var, expr in body.lines]
        results = list(body.results) + ([f"x{self.h_index}"] if save else [])
        lines += [f"float ep_out{j} = {var};" for j, var in enumerate(results)]
        kinds = ("col",) * lead + tuple(self.merged.kinds) + ("out",) * (len(results) - 1)
        return Epilogue(code="\n".join(lines), operands=kinds, preamble=custom_preamble())

    # ---- running -------------------------------------------------------------------------
    def _empty(self) -> Tensor:
        return self.inner._empty()

    def forward(self, ext: list[Any]) -> list[Node]:
        """The product and the group on the external inputs (matmul operands first); one Node per output."""
        values = [x.value if isinstance(x, Node) else x for x in ext]
        wants = tuple(isinstance(x, Node) and x.requires_grad for x in ext)
        grad = any(wants)
        save = grad and self._needs_product(wants)
        n = self.merged.operands
        a, b, lead, others = values[0], values[1], values[2:n], values[n:]
        n_out = len(self.group.outputs)
        if self.one_kernel:
            extra = [self._empty() for _ in range(n_out - 1)] + ([self._empty()] if save else [])
            epilogue, args = self.epilogues[save], [*lead, *others, *extra]
            precision = self.merged.matmul.attrs.get("precision")  # autocast's, where the op has one
            first = gemm(a, b, trans_b=self.merged.trans_b, precision=precision, epilogue=epilogue, epilogue_args=args)
            outs = [first, *extra[: n_out - 1]]
            product = extra[-1] if save else None
        else:
            product = self.merged.matmul.fn(*values[:n])  # the traced op itself
            outs = [self._empty() for _ in range(n_out)]
            group_values = self._group_values(product, others)
            self.inner._run(self.inner._forward, group_values, outs, None)
        if not grad:
            return [untracked(out, self.inner.label) for out in outs]
        return [
            apply_op(Precomputed(out), self._grad_fn(j, wants, product), *ext, op_name=self.inner.label)
            for j, out in enumerate(outs)
        ]

    def _group_values(self, product: Any, others: list[Any]) -> list[Any]:
        """Values in the group's input order: the product at its slot, the others around it."""
        rest = iter(others)
        return [product if k == self.h_index else next(rest) for k in range(len(self.merged.group.inputs))]

    def _group_wants(self, wants: tuple[bool, ...]) -> tuple[bool, ...]:
        """Per group input, from per external input: the product wants one if an operand of it does."""
        n = self.merged.operands
        return tuple(self._group_values(any(wants[:n]), list(wants[n:])))

    def _grad_fn(self, output_index: int, wants: tuple[bool, ...], product: Tensor):
        def grad_fn(grad_out: Tensor, inputs: tuple[Any, ...], output: Tensor) -> list[Tensor | None]:
            return self.backward(output_index, wants, grad_out, list(inputs), product)

        return grad_fn

    def backward(self, output_index: int, wants, grad_out: Tensor, values: list[Any], product: Tensor | None):
        """Gradients of every external input (None where not wanted or not reached).

        ``product`` is None where no backward kernel reads it (``_needs_product``); the kernel then
        gets the upstream gradient in its slot, a same-shape buffer it never reads.
        """
        n = self.merged.operands
        group_wants = self._group_wants(wants)
        kernel_wants, alias = self._alias(output_index, group_wants)
        if tuple(grad_out.shape) != self.shape:
            grad_out = layout.broadcast_to(grad_out, self.shape)
        group_values = self._group_values(grad_out if product is None else product, values[n:])
        grads = self.inner.backward(output_index, kernel_wants, grad_out, group_values) if any(kernel_wants) else []
        grads = grads or [None] * len(group_values)
        for k, source in sorted(alias.items(), key=lambda item: item[0] != self.h_index):  # the product first
            grad = grad_out if source == _GOUT else grads[source]
            if grad is not None:
                shape = self.inner.input_shapes[k]
                grads[k] = grad if shape == self.shape else layout.sum_to_shape(grad, shape)
        d_product = grads[self.h_index]
        matmul_grads = [None] * n
        if d_product is not None and any(wants[:n]):  # the product's own rule (matmul's, linear's)
            matmul_grads = self.merged.matmul.grad_fn(d_product, tuple(values[:n]), product)
            matmul_grads = [g if w else None for g, w in zip(matmul_grads, wants[:n], strict=True)]
        rest = [g for k, g in enumerate(grads) if k != self.h_index]
        return [*matmul_grads, *rest]

    def _alias(self, output_index: int, wants: tuple[bool, ...]) -> tuple[tuple[bool, ...], dict[int, int]]:
        """Which group inputs the backward kernel computes, and those it need not: an input whose
        gradient is the same expression as the product's (a bias) is summed from the product's gradient
        (unless the kernel sums it down the rows itself: ``FusedStep.sums_columns``), and where that is
        the upstream gradient itself (``x @ w + b``) no kernel runs (source ``_GOUT``)."""
        key = (output_index, wants)
        if key not in self._aliases:
            alias: dict[int, int] = {}
            h = self.h_index
            if wants[h]:
                body = backward_body(self.merged.group, self.group.outputs[output_index], list(wants))
                exprs = dict(body.lines)

                def resolved(var: str) -> str:
                    while exprs.get(var, "").strip() in exprs:
                        var = exprs[var].strip()
                    return exprs.get(var, var).strip()

                names = dict(zip([k for k, w in enumerate(wants) if w], body.results, strict=True))
                product = resolved(names[h])
                if product == "gout":
                    alias[h] = _GOUT
                for k, var in names.items():
                    if k == h or self.inner.input_shapes[k] is None or resolved(var) != product:
                        continue
                    if alias.get(h) == _GOUT or not self.inner.sums_columns(k):
                        alias[k] = h  # else the kernel sums it down the rows as it stores d(product)
            kernel = tuple(w and k not in alias for k, w in enumerate(wants))
            self._aliases[key] = (kernel, alias)
        return self._aliases[key]

    def _needs_product(self, wants: tuple[bool, ...]) -> bool:
        """Whether a backward kernel for these wants (any output) reads the product: if not, the
        forward stores only the outputs (``relu(x @ w + b)`` needs it; ``x @ w + b`` and ``(x @ w) * s`` do not)."""
        key = ("product", wants)
        if key not in self._needs:
            group_wants = self._group_wants(wants)
            needed = False
            for j, output in enumerate(self.group.outputs):
                kernel_wants, _ = self._alias(j, group_wants)
                if any(kernel_wants):
                    body = backward_body(self.merged.group, output, list(kernel_wants))
                    needed = needed or f"x{self.h_index}" in _live_names(body.lines, body.results)
            self._needs[key] = needed
        return self._needs[key]

    def backward_source(self, output_index: int, wants: tuple[bool, ...]) -> str:
        """The group's backward kernel for these wants ("" when the upstream gradient is the product's)."""
        kernel_wants, _ = self._alias(output_index, self._group_wants(wants))
        return self.inner.backward_source(output_index, kernel_wants) if any(kernel_wants) else ""
