"""Row groups: reductions along the last axis with their elementwise prologue and epilogue.

``find_row_groups`` grows one group around each row op (``row_ops``: ``sum``/``mean``/``max``/``min``/
``var``/``std``, ``softmax``, ``log_softmax``, ``logsumexp``, ``layer_norm``, ``rms_norm``,
``cross_entropy``) that reduces a float32 value of shape ``full`` along its last axis: elementwise ops of
shape ``full`` that feed it (prologue), ops that consume its result broadcast back over the row or
per row (epilogue), and further reductions of the same rows. The group's values read from outside
are ``full``-shaped, per column (``(C,)``), per row (``(*full[:-1], 1)``) or Python scalars. A group
never reads a value that depends on itself (it would have to run twice). ``build_program`` writes a
group as a ``row_ir.RowProgram``, each row op through its entry's ``emit``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from netcl.jit.row_ir import COL, ELEM, INDEX, PARAM, ROW, Builder, RowInput, RowProgram
from netcl.jit.row_ops import get_row_op
from netcl.jit.tracing import TraceNode

_F32 = np.dtype(np.float32)
#: other dtypes a row program reads (a mask, integer codes), by their C type, converting each value to float
READ_AS_FLOAT = {np.dtype(np.bool_): "uchar", np.dtype(np.uint8): "uchar", np.dtype(np.int32): "int"}


@dataclass
class RowGroup:
    """Ops that become one row kernel forward (and one per output backward)."""

    nodes: list[TraceNode]
    shape: tuple[int, ...]
    inputs: list[TraceNode] = field(default_factory=list)
    outputs: list[TraceNode] = field(default_factory=list)
    program: RowProgram | None = None


def _all_nodes(node: TraceNode) -> bool:
    return all(kind == "node" for kind, _ in node.arg_layout)


def row_seed_shape(node: TraceNode) -> tuple[int, ...] | None:
    """``full`` when ``node`` is a row op (``row_ops``) reducing a float32 value of shape ``full`` along its
    last axis (its entry's ``seed`` rule), else None."""
    if node.kind != "op" or not node.inputs or node.dtype != _F32:
        return None
    x = node.inputs[0]
    if x.dtype != _F32 or not x.shape or x.shape[-1] < 2 or 0 in x.shape:
        return None
    row_op = get_row_op(node.op_name)
    return x.shape if row_op is not None and row_op.seed(node) else None


def _fusible(node: TraceNode) -> bool:
    return node.fusible and node.dtype == _F32 and _all_nodes(node)


class _Finder:
    def __init__(self, nodes: list[TraceNode], ancestors: dict[int, set[int]]) -> None:
        self.nodes = nodes
        self.ancestors = ancestors
        self.claimed: set[int] = set()

    def external_kind(self, p: TraceNode, full: tuple[int, ...]) -> str | None:
        """How a value from outside the group is read, or None when it cannot be."""
        if p.kind == "param":
            return PARAM
        if p.dtype == np.int32 and p.shape == full[:-1] and len(full) == 2:
            return INDEX
        if p.dtype != _F32 and np.dtype(p.dtype) not in READ_AS_FLOAT:
            return None
        if p.shape == full:
            return ELEM
        C = full[-1]
        if p.shape and p.shape[-1] == C and len(p.shape) <= len(full) and all(d == 1 for d in p.shape[:-1]):
            return COL
        if p.shape == (*full[:-1], 1):
            return ROW
        return "flat" if p.shape == full[:-1] else None

    def value_kind(self, p: TraceNode, full: tuple[int, ...], group: dict[int, TraceNode]) -> str | None:
        if p.id not in group:
            return self.external_kind(p, full)
        if p.shape == full:
            return ELEM
        return ROW if p.shape == (*full[:-1], 1) else "flat"

    def eligible(self, node: TraceNode, full: tuple[int, ...], group: dict[int, TraceNode]) -> bool:
        """Whether ``node`` can be computed inside a group of rows of shape ``full`` holding ``group``."""
        if node.id in self.claimed or node.kind != "op":
            return False
        kinds = [self.value_kind(p, full, group) for p in node.inputs]
        if any(k is None for k in kinds):
            return False
        keep, flat = (*full[:-1], 1), full[:-1]
        seed = row_seed_shape(node)
        if seed is not None:  # a row op: its first input the row's elements, the others as its entry reads them
            operand_kind = get_row_op(node.op_name).operand_kind
            return seed == full and kinds[0] == ELEM and all(k == operand_kind for k in kinds[1:])
        if not _fusible(node):
            return False
        if node.shape == full:
            # a per-row value without the kept axis would broadcast along columns: not a row value
            return all(k != "flat" or len(full) == 1 for k in kinds) and any(k in (ELEM, COL) for k in kinds)
        if node.shape == keep:
            return all(k in (ROW, PARAM) or (k == "flat" and len(full) == 1) for k in kinds)
        if node.shape == flat:
            return all(k in ("flat", PARAM) for k in kinds)
        return False

    def _acyclic(self, ids: set[int]) -> bool:
        above = set().union(*(self.ancestors[g] for g in ids)) - ids
        return not any(n.id in above and self.ancestors[n.id] & ids for n in self.nodes if n.id not in ids)

    def grow(self, seed: TraceNode, full: tuple[int, ...]) -> dict[int, TraceNode]:
        group = {seed.id: seed}
        changed = True
        while changed:
            changed = False
            for member in list(group.values()):  # prologue: what the group reads
                for p in member.inputs:
                    if p.id in group or p.kind != "op" or p.shape != full or not self.eligible(p, full, group):
                        continue
                    if self._acyclic(set(group) | {p.id}):
                        group[p.id] = p
                        changed = True
            for node in self.nodes:  # epilogue: what reads the group
                if node.id in group or not any(p.id in group for p in node.inputs):
                    continue
                if not self.eligible(node, full, group):
                    continue
                outside = [p for p in node.inputs if p.id not in group]
                if any(self.ancestors[p.id] & set(group) for p in outside):
                    continue
                group[node.id] = node
                changed = True
        return group


def find_row_groups(nodes: list[TraceNode], ancestors: dict[int, set[int]]) -> list[dict[int, TraceNode]]:
    """Groups (id -> node) around every reduction along a last axis, in trace order of their seeds."""
    finder = _Finder(nodes, ancestors)
    groups = []
    for node in nodes:
        if node.id in finder.claimed:
            continue
        full = row_seed_shape(node)
        if full is None:
            continue
        group = finder.grow(node, full)
        finder.claimed |= set(group)
        groups.append((group, full))
    return [group for group, _ in _merge_connected(groups, finder)]


def _merge_connected(
    groups: list[tuple[dict[int, TraceNode], tuple[int, ...]]], finder: _Finder
) -> list[tuple[dict[int, TraceNode], tuple[int, ...]]]:
    """Merge groups over the same rows where one reads the other (a LayerNorm's mean and variance, each grown
    from its own reduction), as long as the union stays acyclic: one row kernel computes both."""
    merged = True
    while merged:
        merged = False
        pairs = [(a, b) for a in range(len(groups)) for b in range(a + 1, len(groups))]
        for i, j in pairs:
            (first, full), (second, other) = groups[i], groups[j]
            reads = any(p.id in first for n in second.values() for p in n.inputs) or any(
                p.id in second for n in first.values() for p in n.inputs
            )
            if full == other and reads and finder._acyclic(set(first) | set(second)):
                groups[i] = ({**first, **second}, full)
                del groups[j]
                merged = True
                break
    return groups


def external_kind(p: TraceNode, full: tuple[int, ...]) -> str:
    """How the row program reads the outside value ``p`` (a value without the kept axis is per row too)."""
    kind = _Finder([], {}).external_kind(p, full)
    if kind is None:
        raise AssertionError(f"internal error: {p} cannot be read by a row group of shape {full}")
    return ROW if kind == "flat" else kind


def build_program(group: RowGroup) -> RowProgram:
    """The group as a row program: inputs ``x{k}``, op node ``n`` as ``v{n.id}``."""
    full = group.shape
    C = full[-1]
    inputs = [
        RowInput(f"x{k}", kind, "int" if kind == INDEX else READ_AS_FLOAT.get(np.dtype(p.dtype), "float"))
        for k, p in enumerate(group.inputs)
        for kind in [external_kind(p, full)]
    ]
    b = Builder(C, inputs)
    names = {p.id: f"x{k}" for k, p in enumerate(group.inputs)}
    for node in group.nodes:
        args = [names[p.id] for p in node.inputs]
        var = f"v{node.id}"
        names[node.id] = _emit(b, node, args, var)
    return RowProgram(C, inputs, b.stmts, [names[o.id] for o in group.outputs])


def _emit(b: Builder, node: TraceNode, args: list[str], var: str) -> str:
    row_op = get_row_op(node.op_name)
    if row_op is not None:
        return row_op.emit(b, args, node.attrs, var)
    return b.prim(node.op_name, args, node.attrs, var=var)
