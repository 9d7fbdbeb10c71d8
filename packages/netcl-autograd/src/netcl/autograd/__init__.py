"""netcl.autograd: tape-based reverse-mode autodiff for netcl.

``import netcl.autograd as ag`` gives the engine (``Tape``, ``Node``, ``apply_op``, grad mode,
anomaly detection), the differentiable ops and losses, ``gradcheck`` and ``debug_tape``.
The JIT names (``jit_compile``, ``TraceNode``, ``TrainingGraphCompiler``, ...) live in the
``netcl-jit`` distribution and resolve lazily from ``netcl.jit`` when it is installed.
"""

from __future__ import annotations

import importlib
from typing import Any

from netcl.autograd import (
    elementwise,
    node_methods,  # noqa: F401  (installs Node's operators and op methods)
)
from netcl.autograd.__about__ import __version__
from netcl.autograd.debug import debug_tape
from netcl.autograd.engine import (
    Node,
    Tape,
    apply_op,
    detect_anomaly,
    get_current_tape,
    get_tracer,
    is_anomaly_enabled,
    is_grad_enabled,
    no_grad,
    set_current_tape,
    set_detect_anomaly,
    set_grad_enabled,
    set_tracer,
    tensor,
)
from netcl.autograd.gradcheck import GradcheckError, gradcheck
from netcl.autograd.losses import binary_cross_entropy, nll_loss
from netcl.autograd.ops import (
    abs,
    add,
    bce_with_logits,
    broadcast_to,
    clamp,
    cross_entropy,
    div,
    exp,
    ge,
    gelu,
    gelu_erf,
    gt,
    le,
    log,
    lt,
    matmul,
    max,
    maximum,
    mean,
    minimum,
    mse_loss,
    mul,
    neg,
    pow,
    relu,
    reshape,
    sigmoid,
    smooth_l1,
    sqrt,
    sub,
    sum,
    tanh,
    transpose,
    weighted_bce,
    weighted_smooth_l1,
    where,
)
from netcl.autograd.ops_activation import cos, elu, eq, leaky_relu, log1p, ne, rsqrt, silu, sin, softplus
from netcl.autograd.ops_attention import packed_self_attention, scaled_dot_product_attention
from netcl.autograd.ops_conv import adaptive_avg_pool2d, avg_pool2d, conv2d, conv_transpose2d, max_pool2d
from netcl.autograd.ops_index import embedding, gather, index_select
from netcl.autograd.ops_norm import batch_norm, batch_norm_relu, group_norm, layer_norm, rms_norm
from netcl.autograd.ops_random import dropout, manual_seed
from netcl.autograd.ops_reduce import argmax, argmin, cumsum, flip, min, prod, std, var
from netcl.autograd.ops_resize import interpolate
from netcl.autograd.ops_shape import (
    cast,
    cat,
    concat,
    flatten,
    getitem,
    pad,
    permute,
    split,
    squeeze,
    stack,
    unsqueeze,
)
from netcl.autograd.ops_softmax import log_softmax, logsumexp, softmax
from netcl.autograd.saved_values import ModifiedInPlaceError

#: Names provided by the netcl-jit distribution: name -> module to import it from.
JIT_NAMES = {
    "jit_compile": "netcl.jit",
    "TraceNode": "netcl.jit",
    "TracingContext": "netcl.jit",
    "AutogradPrimitive": "netcl.jit",
    "register_primitive": "netcl.jit",
    "get_primitive": "netcl.jit",
    "TrainingGraphCompiler": "netcl.jit.training_compiler",
    "TrainingPattern": "netcl.jit.training_compiler",
    "get_training_compiler": "netcl.jit.training_compiler",
    "fused_weighted_bce_smooth_l1_loss": "netcl.jit.training_compiler",
    "fuse_graph": "netcl.jit",
}


def import_jit(module: str) -> Any:
    """Import ``module`` from netcl-jit, or raise an ImportError that says to install netcl-jit."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name in ("netcl", "netcl.jit", module):
            raise ImportError(
                f"{module} is not available: it is part of the 'netcl-jit' distribution; "
                "install it with `pip install netcl-jit`"
            ) from exc
        raise


def __getattr__(name: str) -> Any:
    module = JIT_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'netcl.autograd' has no attribute {name!r}")
    jit = import_jit("netcl.jit")
    if hasattr(jit, name):
        return getattr(jit, name)
    return getattr(import_jit(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(JIT_NAMES))


__all__ = [
    "GradcheckError",
    "ModifiedInPlaceError",
    "Node",
    "Tape",
    "__version__",
    "abs",
    "adaptive_avg_pool2d",
    "add",
    "apply_op",
    "argmax",
    "argmin",
    "avg_pool2d",
    "batch_norm",
    "batch_norm_relu",
    "bce_with_logits",
    "binary_cross_entropy",
    "broadcast_to",
    "cast",
    "cat",
    "clamp",
    "concat",
    "conv2d",
    "conv_transpose2d",
    "interpolate",
    "cos",
    "cross_entropy",
    "cumsum",
    "debug_tape",
    "detect_anomaly",
    "div",
    "dropout",
    "elu",
    "embedding",
    "eq",
    "exp",
    "flatten",
    "flip",
    "gather",
    "ge",
    "gelu",
    "gelu_erf",
    "get_current_tape",
    "get_tracer",
    "getitem",
    "gradcheck",
    "gt",
    "index_select",
    "is_anomaly_enabled",
    "is_grad_enabled",
    "layer_norm",
    "le",
    "leaky_relu",
    "log",
    "log1p",
    "log_softmax",
    "logsumexp",
    "lt",
    "manual_seed",
    "matmul",
    "max",
    "max_pool2d",
    "maximum",
    "mean",
    "min",
    "minimum",
    "mse_loss",
    "mul",
    "ne",
    "neg",
    "nll_loss",
    "no_grad",
    "packed_self_attention",
    "pad",
    "permute",
    "pow",
    "prod",
    "relu",
    "reshape",
    "rms_norm",
    "group_norm",
    "rsqrt",
    "scaled_dot_product_attention",
    "set_current_tape",
    "set_detect_anomaly",
    "set_grad_enabled",
    "set_tracer",
    "sigmoid",
    "silu",
    "sin",
    "smooth_l1",
    "softmax",
    "softplus",
    "split",
    "sqrt",
    "squeeze",
    "stack",
    "std",
    "sub",
    "sum",
    "tanh",
    "tensor",
    "transpose",
    "unsqueeze",
    "var",
    "weighted_bce",
    "weighted_smooth_l1",
    "where",
]

# Elementwise ops defined in netcl.runtime.ops.elementwise_defs and not imported above by name.
for _name, _op in elementwise.fronts().items():
    if _name not in globals():
        globals()[_name] = _op
        __all__.append(_name)
