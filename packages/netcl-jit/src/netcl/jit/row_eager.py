"""The built-in row ops run eagerly on the JIT's fused row kernels (installed in autograd's row hook).

``ag.softmax``, ``ag.log_softmax``, ``ag.layer_norm``, ``ag.rms_norm`` and ``ag.cross_entropy`` of a
float32 tensor of at least ``MIN_ELEMENTS`` elements along its last axis call a cached
``jit_compile`` of the op itself: ONE row kernel forward and ONE backward (plus one small
reduction per weight gradient, and for cross_entropy's "sum"/"mean" the sum over rows). Smaller
tensors, other axes and dtypes keep the runtime's row kernels (no build per new row length).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import netcl.autograd as ag
from netcl.autograd.engine import Node, apply_op
from netcl.autograd.row_hook import set_row_provider
from netcl.core import Tensor
from netcl.jit.compiler import JitFunction, jit_compile
from netcl.runtime.ops import layout, pointwise, reduce

#: Below this many elements the runtime's row kernels (row length a kernel argument) are used.
MIN_ELEMENTS = 1 << 16
_F32 = np.dtype(np.float32)
_functions: dict[tuple, JitFunction] = {}
_lock = threading.Lock()


def _value(x: Any) -> Any:
    return x.value if isinstance(x, Node) else x


def _cached(key: tuple, make) -> JitFunction:
    with _lock:
        fn = _functions.get(key)
        if fn is None:
            fn = _functions[key] = jit_compile(make())
        return fn


def _float_tensor(x: Any) -> bool:
    v = _value(x)
    return isinstance(v, Tensor) and v.dtype == _F32 and v.device.kind in ("opencl", "cpu")


def provide(name: str, args: tuple, attrs: dict) -> Any:
    """The op on the fused row kernels, or None to let it run its own kernels."""
    x = args[0]
    if not _float_tensor(x):
        return None
    v = _value(x)
    if v.ndim < 1 or v.size < MIN_ELEMENTS or v.shape[-1] < 2:
        return None
    if name in ("softmax", "log_softmax"):
        if attrs["axis"] != v.ndim - 1:
            return None
        op = getattr(ag, name)
        return _cached((name,), lambda: lambda x: op(x, -1))(x)
    if name in ("layer_norm", "rms_norm"):
        params = [p for p in args[1:] if p is not None]
        if tuple(attrs["normalized_shape"]) != (v.shape[-1],) or not all(_float_tensor(p) for p in params):
            return None
        eps, has_w, has_b = attrs["eps"], args[1] is not None, args[2] is not None
        key = (name, eps, has_w, has_b)
        if name == "layer_norm":

            def make():
                def layer_norm(x, *p):
                    w = p[0] if has_w else None
                    b = p[-1] if has_b else None
                    return ag.layer_norm(x, x.shape[-1], w, b, eps)

                return layer_norm
        else:

            def make():
                return lambda x, *p: ag.rms_norm(x, x.shape[-1], p[0] if p else None, eps)

        return _cached(key, make)(x, *params)
    if name == "cross_entropy":
        return _cross_entropy(x, args[1], attrs)
    return None


def _cross_entropy(x: Any, target: Any, attrs: dict) -> Any:
    t = _value(target)
    v = _value(x)
    if v.ndim != 2 or not isinstance(t, Tensor) or t.dtype != np.int32 or t.shape != v.shape[:1]:
        return None
    ignore, reduction, smoothing = attrs["ignore_index"], attrs["reduction"], attrs["label_smoothing"]
    # (ag.cross_entropy checked the target values before asking: an IndexError names a bad one)
    rows = _cached(
        ("cross_entropy", ignore, smoothing),
        lambda: lambda x, t: ag.cross_entropy(x, t, ignore_index=ignore, reduction="none", label_smoothing=smoothing),
    )(x, t)
    if reduction == "none":
        return rows
    total = ag.sum(rows)
    if reduction == "sum":
        return total
    valid = reduce.sum(pointwise.ne(t, ignore))
    count = layout.cast(valid, np.float32) if valid.dtype != _F32 else valid
    safe = pointwise.maximum(count, 1.0)
    # every target ignored: the mean is 0/0 = NaN (PyTorch), but no position gets a gradient
    return apply_op(
        lambda s: pointwise.div(s, count),
        lambda g, values, out: [pointwise.div(g, safe)],
        total,
        op_name="cross_entropy_mean",
    )


set_row_provider(provide)
