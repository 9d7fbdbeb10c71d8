"""The row ops with an eager provider run eagerly on the JIT's fused row kernels (installed in autograd's row hook).

``ag.softmax``, ``ag.log_softmax``, ``ag.layer_norm`` and ``ag.rms_norm`` of a float32 tensor of at least
``MIN_ELEMENTS`` elements along its last axis ask the row hook first; ``provide`` hands the call to the
``provider`` of the op's ``row_ops`` entry, which calls a cached ``jit_compile`` of the op itself: ONE row kernel
forward and ONE backward (plus one small reduction per weight gradient). Smaller tensors, other axes and dtypes
keep the runtime's row kernels (no build per new row length), and so do the built-in row ops on CPU OpenCL
devices, where the runtime takes a row per work-item in float vectors and the fused kernels' work-group trees ran
1.1-4.7x slower (PoCL, (1024, 1024) float32; benchmarks/RESULTS.md, "isnan on PoCL"). ``ag.cross_entropy`` asks
the hook too, but its built-in entry has no provider: the runtime's class-loss kernels took less device time and
less host time than the fused row kernels at every shape measured on the H200 (benchmarks/RESULTS.md,
"Forty-fourth session"), so ``declines`` says so for every signature (as for any registered op without a
provider). A row op registered by a user has no runtime kernel: its provider serves it everywhere.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from netcl.autograd.row_hook import set_row_provider
from netcl.jit.builtin_row_ops import BUILTIN_ROW_OPS, is_float32_tensor, value_of
from netcl.jit.compiler import JitFunction, jit_compile
from netcl.jit.row_ops import RowOp, get_row_op

#: Below this many elements the runtime's row kernels (row length a kernel argument) are used.
MIN_ELEMENTS = 1 << 16
#: The built-in row ops with a provider: the eager ops that ask the hook, each with runtime kernels of its own
#: (``netcl.runtime.ops.rowwise``), which they keep on CPU devices.
RUNTIME_ROW_OPS = frozenset(op.name for op in BUILTIN_ROW_OPS if op.provider is not None)
_functions: dict[tuple, JitFunction] = {}
_lock = threading.Lock()


def _cached(key: tuple, make: Callable[[], Callable]) -> JitFunction:
    """``jit_compile(make())``, compiled once per ``key``."""
    with _lock:
        fn = _functions.get(key)
        if fn is None:
            fn = _functions[key] = jit_compile(make())
        return fn


def declines(name: str, value: Any) -> bool:
    """Whether ``provide`` returns None for every call of op ``name`` whose first argument's value is ``value``,
    whatever the other arguments: decided by the registered entry of ``name`` (True for none, or one without a
    provider) and value's dtype, shape and device alone (so the row hook asks once per such signature,
    ``row_hook.declined``; registering a row op makes it ask again)."""
    return _declines(get_row_op(name), name, value)


def _declines(row_op: RowOp | None, name: str, value: Any) -> bool:
    """``declines`` with the registered entry of ``name`` already looked up (``row_op``)."""
    if row_op is None or row_op.provider is None:
        return True
    if not is_float32_tensor(value) or value.ndim < 1 or value.size < MIN_ELEMENTS or value.shape[-1] < 2:
        return True
    return name in RUNTIME_ROW_OPS and value.device.is_opencl and not value.device.is_gpu


def provide(name: str, args: tuple, attrs: dict) -> Any:
    """The op on the fused row kernels (its row op's ``provider``), or None to let it run its own kernels."""
    row_op = get_row_op(name)
    if _declines(row_op, name, value_of(args[0])):
        return None
    return row_op.provider(args, attrs, _cached)


set_row_provider(provide, declines)
