"""Signs of a fused body's values, for cheaper NumPy forms where an operand cannot be negative.

``SIGMOID`` of an arbitrary value takes 7 ufunc passes on the NumPy backend (a branch-free form of
the two-sided formula); of a value that cannot be negative it is ``1 / (1 + exp(-x))``, 4 passes and
the same float32 result. ``chain8``'s ``sigmoid(relu(...) * 0.5)`` is such a case. The analysis is
conservative: a value counts as non-negative only when every path to it keeps it so (NaN stays NaN
through either form).
"""

from __future__ import annotations

import ast

#: calls whose result is never negative (or NaN)
_NONNEGATIVE_CALLS = {"RELU", "ABS", "fabs", "EXP", "exp", "SQRT", "sqrt", "SIGMOID", "SIGMOID_NONNEG"}
#: calls that keep non-negative operands non-negative: all of them must be (MAX: any one)
_CLOSED_CALLS = {"MUL", "DIV", "ADD", "MIN", "fmin"}
_ANY_CALLS = {"MAX", "fmax"}
_CLOSED_OPS = (ast.Mult, ast.Div, ast.Add)


def _nonnegative(node: ast.expr, known: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in known
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool) and node.value >= 0
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        name, args = node.func.id, node.args
        if name in _NONNEGATIVE_CALLS:
            return True
        if name == "MUL" and len(args) == 2 and ast.dump(args[0]) == ast.dump(args[1]):
            return True  # a square
        if name in _CLOSED_CALLS:
            return all(_nonnegative(a, known) for a in args)
        if name in _ANY_CALLS:
            return any(_nonnegative(a, known) for a in args)
        return False
    if isinstance(node, ast.BinOp) and isinstance(node.op, _CLOSED_OPS):
        if isinstance(node.op, ast.Mult) and ast.dump(node.left) == ast.dump(node.right):
            return True
        return _nonnegative(node.left, known) and _nonnegative(node.right, known)
    return False


class _Specialize(ast.NodeTransformer):
    def __init__(self, known: set[str]) -> None:
        self.known = known

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        is_sigmoid = isinstance(node.func, ast.Name) and node.func.id == "SIGMOID" and len(node.args) == 1
        if is_sigmoid and _nonnegative(node.args[0], self.known):
            node.func = ast.Name("SIGMOID_NONNEG", ast.Load())
        return node


def specialize(lines: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``lines`` (variable, Python expression) with ``SIGMOID`` of provably non-negative operands
    turned into ``SIGMOID_NONNEG``."""
    known: set[str] = set()
    out = []
    for var, expr in lines:
        tree = _Specialize(known).visit(ast.parse(expr, mode="eval"))
        if _nonnegative(tree.body, known):
            known.add(var)
        out.append((var, ast.unparse(tree)))
    return out
