"""Split a trace into steps: maximal fused groups of elementwise ops, and ops run eagerly.

A fused group holds fusible float32 ops of one output shape; it is grown greedily in
topological order and never so that a value outside the group lies on a path from the
group back into it (that would need the group to run twice). Reductions along the last axis
first claim their elementwise prologue and epilogue as row groups (``row_group``: one row
kernel each way). Everything else (matmul, other reductions, ops without a primitive or with
``fusible=False``) is an eager step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from netcl.jit.row_group import RowGroup, find_row_groups
from netcl.jit.tracing import TraceNode


@dataclass
class FusedGroup:
    """Ops that become one forward kernel; ``inputs`` are the values it reads from outside."""

    nodes: list[TraceNode]
    shape: tuple[int, ...]
    inputs: list[TraceNode] = field(default_factory=list)
    outputs: list[TraceNode] = field(default_factory=list)


@dataclass
class EagerStep:
    """One op run through autograd's ``apply_op`` as usual."""

    node: TraceNode


Step = FusedGroup | RowGroup | EagerStep


def live_nodes(outputs: list[TraceNode]) -> list[TraceNode]:
    """Nodes the outputs depend on, in trace (topological) order."""
    seen: dict[int, TraceNode] = {}
    stack = list(outputs)
    while stack:
        node = stack.pop()
        if node.id in seen:
            continue
        seen[node.id] = node
        stack.extend(node.inputs)
    return [seen[i] for i in sorted(seen)]


def uses_of(outputs: list[TraceNode]) -> tuple[list[TraceNode], Counter[int]]:
    """``live_nodes(outputs)`` and how many times each node's value is read: as an input of a live node, and
    once for each place among ``outputs`` (a function's result is a use)."""
    nodes = live_nodes(outputs)
    uses: Counter[int] = Counter(o.id for o in outputs)
    for node in nodes:
        uses.update(p.id for p in node.inputs)
    return nodes, uses


def _is_fusible(node: TraceNode) -> bool:
    """A float32 op with a fusible primitive applied to float32 tensors only.

    An op given a Python value in a tensor slot (``where(c, a, 0.0)``, ``clamp(x, lo_tensor, None)``)
    has fewer traced inputs than its primitive's template expects: it runs eagerly. So does one
    reading another dtype (a bool mask of ``where``): the elementwise kernel reads every input as
    float (row groups read masks themselves: ``row_group.READ_AS_FLOAT``).
    """
    return (
        node.fusible
        and node.dtype == np.float32
        and all(kind == "node" for kind, _ in node.arg_layout)
        and all(p.dtype == np.float32 for p in node.inputs)
    )


def partition(outputs: list[TraceNode]) -> list[Step]:
    """The steps that compute ``outputs``, in an order that respects every dependency."""
    nodes = [n for n in live_nodes(outputs) if n.kind == "op"]
    ancestors: dict[int, set[int]] = {}
    for node in live_nodes(outputs):
        acc: set[int] = set()
        for parent in node.inputs:
            acc.add(parent.id)
            acc |= ancestors[parent.id]
        ancestors[node.id] = acc

    group_of: dict[int, int] = {}
    groups: dict[int, list[TraceNode]] = {}
    row_groups = find_row_groups(nodes, ancestors)
    for index, members in enumerate(row_groups):
        gid = -1 - index  # row groups: negative ids, never merged with elementwise groups
        groups[gid] = sorted(members.values(), key=lambda n: n.id)
        group_of.update({i: gid for i in members})
    for node in nodes:
        if node.id in group_of or not _is_fusible(node):
            continue
        candidates = {
            group_of[p.id]
            for p in node.inputs
            if p.id in group_of and group_of[p.id] >= 0 and groups[group_of[p.id]][0].shape == node.shape
        }
        merged = [node]
        for gid in sorted(candidates):
            trial = merged + groups[gid]
            if _acyclic({n.id for n in trial}, ancestors, nodes):
                merged = trial
        gid = min((group_of[n.id] for n in merged if n.id in group_of), default=node.id)
        for n in merged:
            old = group_of.get(n.id)
            if old is not None and old != gid:
                groups.pop(old, None)
            group_of[n.id] = gid
        groups[gid] = sorted(merged, key=lambda n: n.id)

    used_outside = _uses_outside(nodes, group_of, outputs)
    steps: list[Step] = []
    for node in nodes:
        gid = group_of.get(node.id)
        if gid is None:
            steps.append(EagerStep(node))
        elif groups[gid][0] is node:
            members = groups[gid]
            member_ids = {m.id for m in members}
            inputs: list[TraceNode] = []
            for m in members:
                for p in m.inputs:
                    if p.id not in member_ids and all(p is not q for q in inputs):
                        inputs.append(p)
            outs = [m for m in members if m.id in used_outside]
            if gid < 0:
                steps.append(RowGroup(members, _row_shape(members), inputs, outs))
            else:
                steps.append(FusedGroup(members, node.shape, inputs, outs))
    return _order(steps)


def _row_shape(members: list[TraceNode]) -> tuple[int, ...]:
    """The shape ``S`` whose rows a row group reduces (its first reduction's operand)."""
    from netcl.jit.row_group import row_seed_shape

    return next(shape for shape in map(row_seed_shape, members) if shape is not None)


def _acyclic(group: set[int], ancestors: dict[int, set[int]], nodes: list[TraceNode]) -> bool:
    above = set().union(*(ancestors[g] for g in group)) - group
    return not any(n.id in above and ancestors[n.id] & group for n in nodes if n.id not in group)


def _uses_outside(nodes: list[TraceNode], group_of: dict[int, int], outputs: list[TraceNode]) -> set[int]:
    used = {o.id for o in outputs}
    for node in nodes:
        for parent in node.inputs:
            if group_of.get(parent.id) is None or group_of.get(parent.id) != group_of.get(node.id):
                used.add(parent.id)
    return used


def _order(steps: list[Step]) -> list[Step]:
    """Topological order of steps (a group runs once every value it reads exists)."""
    produced_by: dict[int, int] = {}
    for index, step in enumerate(steps):
        for node in [step.node] if isinstance(step, EagerStep) else step.nodes:
            produced_by[node.id] = index
    deps = []
    for index, step in enumerate(steps):
        reads = step.node.inputs if isinstance(step, EagerStep) else step.inputs
        deps.append({produced_by[p.id] for p in reads if p.id in produced_by} - {index})
    ordered: list[Step] = []
    done: set[int] = set()
    while len(ordered) < len(steps):
        progress = False
        for index, step in enumerate(steps):
            if index not in done and deps[index] <= done:
                ordered.append(step)
                done.add(index)
                progress = True
        if not progress:  # cannot happen when groups are acyclic
            raise RuntimeError("internal error: fused groups form a cycle")
    return ordered
