"""The row-op registry: op name -> every rule the JIT has for an op that reduces rows along the last axis.

A row op is an op a row group is grown around (``row_group``): the reductions ``sum``/``mean``/``max``/
``min``/``var``/``std`` along the last axis, the softmax family, the norms, ``cross_entropy``. Each is ONE
``RowOp`` entry holding its shape rule (tracing), its seed test and its decomposition into row-IR
statements (``row_group``), how the row kernel reads its inputs after the first, the class target a
row step checks before its forward (``row_step``) and the eager provider that serves the autograd op
on the fused row kernels (``row_eager``). The built-in entries are in ``builtin_row_ops``; adding a
row op is one ``register_row_op`` call there (and its test, ``tests/jit/test_row_ops_registry.py``).
Registering bumps ``primitive_registry.registry_version()``, part of every JIT cache key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from netcl.autograd.row_hook import forget_declined
from netcl.jit import primitive_registry
from netcl.jit.row_ir import COL, Builder

#: ``shape(input shapes, attrs)`` -> output shape
ShapeRule = Callable[[list[tuple[int, ...]], dict], tuple[int, ...]]
#: ``dtype(input dtypes)`` -> output dtype (None on the entry: NumPy's result type of the inputs)
DtypeRule = Callable[[list[np.dtype]], np.dtype]
#: ``seed(node)``: whether a traced node of this op (float32, its first input a float32 value of shape
#: ``full`` with rows of >= 2 elements) reduces rows along its last axis, so a row group can grow around it
SeedRule = Callable[[Any], bool]
#: ``emit(builder, argument variables, attrs, var)`` -> the variable holding the result (named ``var``)
EmitRule = Callable[[Builder, list[str], dict, str], str]
#: ``cached(key, make)``: the JIT-compiled function ``make()`` returns, compiled once per key
Cached = Callable[[tuple, Callable[[], Callable]], Callable]
#: ``provide(args, attrs, cached)`` -> the op's Node on the fused row kernels, or None to decline
Provider = Callable[[tuple, dict, Cached], Any]


@dataclass(frozen=True)
class RowOp:
    """One row op's rules, side by side."""

    name: str
    #: output shape of the input shapes and the attributes (``shapes.infer_shape``)
    shape: ShapeRule
    #: whether a traced node seeds a row group (``row_group.row_seed_shape``)
    seed: SeedRule
    #: its statements in a row program (``row_group.build_program``)
    emit: EmitRule
    #: attribute names the op's node carries (read by ``seed``, ``emit`` and ``provider``)
    attrs: tuple[str, ...] = ()
    #: how the row kernel reads every input after the first (``row_ir.COL``: a per-column weight;
    #: ``row_ir.INDEX``: one int32 per row, a class target)
    operand_kind: str = COL
    #: output dtype rule; None: NumPy's result type of the inputs
    dtype: DtypeRule | None = None
    #: position of an input holding class indices, checked against the row length before the forward
    #: (the node's ``ignore_index`` attribute names the ignored class); None: no class target
    class_target: int | None = None
    #: serves the eager autograd op on the fused row kernels (``row_eager``); None: the op has none
    provider: Provider | None = None


#: name -> row op. Add through ``register_row_op``; tests that register throwaway row ops pop them again
#: (``unregister_row_op``).
ROW_OPS: dict[str, RowOp] = {}
_lock = threading.Lock()


def register_row_op(op: RowOp) -> RowOp:
    """Register (or replace) ``op`` under its name; bumps the JIT's registry version. Returns ``op``."""
    if not isinstance(op, RowOp):
        raise TypeError(f"register_row_op: expected a RowOp, got {type(op).__name__}")
    for rule in ("shape", "seed", "emit"):
        if not callable(getattr(op, rule)):
            raise TypeError(f"register_row_op: {op.name!r}: {rule} must be callable, got {getattr(op, rule)!r}")
    with _lock:
        ROW_OPS[op.name] = op
    primitive_registry.bump_version()
    forget_declined()  # the eager provider's declines reads the registry
    return op


def unregister_row_op(name: str) -> None:
    """Remove the row op ``name`` (KeyError when none is registered); bumps the registry version."""
    with _lock:
        del ROW_OPS[name]
    primitive_registry.bump_version()
    forget_declined()


def get_row_op(name: str) -> RowOp | None:
    """The registered row op ``name``, or None."""
    return ROW_OPS.get(name)
