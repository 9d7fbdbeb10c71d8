"""Per-element bodies of fused kernels, as (variable, expression) pairs.

The same body renders to OpenCL C (``opencl_source``) and to Python over NumPy arrays
(``numpy_source``). External input ``k`` is read into ``x{k}``; op nodes become ``v{id}``;
gradients ``g{id}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from netcl.jit.errors import JitError
from netcl.jit.partition import FusedGroup
from netcl.jit.primitive_registry import get_primitive
from netcl.jit.tracing import TraceNode

Line = tuple[str, str]


@dataclass
class Body:
    """Statements of one element's work and the variables holding each result."""

    lines: list[Line]
    results: list[str]


def _value_names(group: FusedGroup) -> dict[int, str]:
    names = {p.id: f"x{k}" for k, p in enumerate(group.inputs)}
    names.update({n.id: f"v{n.id}" for n in group.nodes})
    return names


def _primitive(node: TraceNode):
    primitive = get_primitive(node.op_name)
    if primitive is None:
        raise JitError(f"no primitive registered for {node.op_name!r}")
    return primitive


def forward_lines(group: FusedGroup, upto: TraceNode | None = None) -> list[Line]:
    """The forward statements of ``group`` (all of them, or those up to and including ``upto``)."""
    names = _value_names(group)
    lines = []
    for node in group.nodes:
        expr = _primitive(node).forward([names[p.id] for p in node.inputs], node.attrs)
        if not isinstance(expr, str):
            raise JitError(
                f"primitive {node.op_name!r} forward returned {type(expr).__name__}, expected a C expression"
            )
        lines.append((names[node.id], expr))
        if node is upto:
            break
    return lines


def forward_body(group: FusedGroup) -> Body:
    names = _value_names(group)
    return Body(forward_lines(group), [names[o.id] for o in group.outputs])


def _is_zero(expr: str) -> bool:
    return expr.strip() in ("0.0f", "0", "0.0")


def reached_inputs(group: FusedGroup, output: TraceNode) -> list[bool]:
    """Per external input: does ``output``'s gradient reach it through a term that is not a literal 0?

    Inputs it does not reach (the condition of ``where``, operands of comparisons only) get no
    gradient at all, as on the un-fused path: a zero would still turn into NaN upstream (0 * inf).
    """
    names = _value_names(group)
    reached = {output.id}
    for node in reversed([n for n in group.nodes if n.id <= output.id]):
        if node.id not in reached:
            continue
        grads = _primitive(node).backward([names[p.id] for p in node.inputs], f"g{node.id}", node.attrs, names[node.id])
        reached.update(p.id for p, expr in zip(node.inputs, grads, strict=False) if not _is_zero(expr))
    return [p.id in reached for p in group.inputs]


def backward_body(group: FusedGroup, output: TraceNode, wants_grad: list[bool]) -> Body:
    """Recompute the forward, then push ``gout`` from ``output`` back to the inputs that want it.

    ``wants_grad[k]`` says whether external input ``k`` gets a gradient. Gradients of a value
    with several consumers are folded with ``+``. Results are one gradient per wanted input.
    """
    names = _value_names(group)
    needs: dict[int, bool] = {p.id: wants_grad[k] for k, p in enumerate(group.inputs)}
    for node in group.nodes:
        needs[node.id] = any(needs.get(p.id, False) for p in node.inputs)

    lines = forward_lines(group, upto=output)
    contributions: dict[int, list[str]] = {output.id: ["gout"]}
    order = [n for n in group.nodes if n.id <= output.id]
    for node in reversed(order):
        terms = contributions.get(node.id)
        if not terms or not needs[node.id]:
            continue
        grad_var = f"g{node.id}"
        lines.append((grad_var, " + ".join(terms)))
        parent_exprs = [names[p.id] for p in node.inputs]
        grads = _primitive(node).backward(parent_exprs, grad_var, node.attrs, names[node.id])
        if len(grads) != len(node.inputs):
            raise JitError(
                f"primitive {node.op_name!r} backward returned {len(grads)} expressions for {len(node.inputs)} inputs"
            )
        for parent, expr in zip(node.inputs, grads, strict=True):
            if needs.get(parent.id, False) and not _is_zero(expr):
                contributions.setdefault(parent.id, []).append(expr)
    results = []
    for k, parent in enumerate(group.inputs):
        if wants_grad[k]:
            var = f"gin{k}"
            terms = contributions.get(parent.id) or ["0.0f"]
            lines.append((var, " + ".join(f"({t})" for t in terms) if len(terms) > 1 else terms[0]))
            results.append(var)
    return Body(lines, results)
