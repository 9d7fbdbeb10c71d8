"""A trace rewrite: ``relu(batch_norm(x))`` and ``relu(batch_norm(x) + r)`` become one ``batch_norm_relu`` op.

``jit_compile`` (and so ``fuse_graph``'s captured training step) runs this pass on every trace before
partitioning it. A ``relu`` whose operand is a ``batch_norm``, or an ``add`` of a ``batch_norm`` and a
tensor of the same shape and dtype (no broadcasting), is rewritten in place into autograd's
``batch_norm_relu``: the batch norm's normalize pass applies the add and the ReLU, and its backward kernel
applies the ReLU's mask and stores the residual's gradient, which saves the elementwise launch each way.
Only where the batch norm's output and the add's output have no other use (nor are outputs of the
function): the intermediate values then never exist. The rewritten op is bit for bit the composition (the
add and the ReLU are exact). ``NETCL_JIT_NORM_EPILOGUE=0`` turns the pass off (read at each compile).
"""

from __future__ import annotations

import os
from collections import Counter

from netcl.autograd import engine
from netcl.autograd.ops_norm import batch_norm_rules
from netcl.jit.partition import uses_of
from netcl.jit.tracing import TraceNode

#: Set to ``0`` to keep batch norms and their ReLU epilogues apart (compare the unfused step).
ENV = "NETCL_JIT_NORM_EPILOGUE"
#: batch_norm's operands, as its trace's ``arg_layout`` lists them
_OPERANDS = ("x", "weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def enabled() -> bool:
    """Whether the pass runs (``NETCL_JIT_NORM_EPILOGUE`` unset or not ``0``)."""
    return os.environ.get(ENV, "").strip() != "0"


def fuse_norm_epilogues(outputs: list[TraceNode], wanting: set[int]) -> int:
    """Rewrite each fusible site among the nodes ``outputs`` depend on; returns how many were rewritten.

    ``wanting``: ids of the traced inputs that want gradients (with constants whose Node requires one and
    the ops they reach, they decide which gradients the rewritten op computes).
    """
    if not enabled():
        return 0
    nodes, uses = uses_of(outputs)
    grads = _wanting_grads(nodes, wanting)
    count = 0
    for node in nodes:
        if node.kind == "op" and node.op_name == "relu" and node.arg_layout == [("node", 0)]:
            site = _site(node, uses)
            if site is not None:
                _rewrite(node, *site, grads)
                count += 1
    return count


def _wanting_grads(nodes: list[TraceNode], wanting: set[int]) -> set[int]:
    if not engine.is_grad_enabled():
        return set()
    grads = set(wanting)
    for node in nodes:  # trace order: inputs before their users
        value = node.attrs.get("value") if node.kind == "const" else None
        leaf = isinstance(value, engine.Node) and value.requires_grad
        if leaf or (node.kind == "op" and any(p.id in grads for p in node.inputs)):
            grads.add(node.id)
    return grads


def _is_norm(node: TraceNode, like: TraceNode, uses: Counter[int]) -> bool:
    """A batch_norm used once (by the site), of ``like``'s shape and floating dtype."""
    return (
        node.kind == "op"
        and node.op_name == "batch_norm"
        and len(node.arg_layout) == len(_OPERANDS)
        and uses[node.id] == 1
        and node.shape == like.shape
        and node.dtype == like.dtype
        and node.dtype.kind == "f"
    )


def _site(relu: TraceNode, uses: Counter[int]) -> tuple[TraceNode, TraceNode | None] | None:
    """(batch_norm, residual or None) when ``relu`` ends a fusible site, else None."""
    (operand,) = relu.inputs
    if _is_norm(operand, relu, uses):
        return operand, None
    if (
        operand.kind != "op"
        or operand.op_name != "add"
        or operand.arg_layout != [("node", 0), ("node", 1)]
        or uses[operand.id] != 1
        or operand.shape != relu.shape
        or operand.dtype != relu.dtype
    ):
        return None
    first, second = operand.inputs
    for norm, residual in ((first, second), (second, first)):
        if _is_norm(norm, relu, uses) and residual.shape == relu.shape and residual.dtype == relu.dtype:
            return norm, residual
    return None


def _rewrite(relu: TraceNode, norm: TraceNode, residual: TraceNode | None, grads: set[int]) -> None:
    """Turn ``relu`` (keeping its id, so the trace order holds) into ``batch_norm_relu`` of ``norm``'s operands."""

    def wants(item: tuple[str, object]) -> bool:
        kind, index = item
        return kind == "node" and norm.inputs[index].id in grads

    layout = norm.arg_layout
    needs = (wants(layout[0]), wants(layout[1]), wants(layout[2]), residual is not None and residual.id in grads)
    attrs = norm.attrs
    forward, grad = batch_norm_rules(bool(attrs["training"]), attrs["momentum"], attrs["eps"], True, needs)
    relu.op_name = "batch_norm_relu"
    relu.inputs = [*norm.inputs, *([residual] if residual is not None else [])]
    relu.arg_layout = [*layout, ("node", len(norm.inputs)) if residual is not None else ("value", None)]
    relu.attrs = {**attrs, "residual": residual is not None}
    relu.fn, relu.grad_fn = forward, grad


__all__ = ["ENV", "enabled", "fuse_norm_epilogues"]
