"""The eager op library: broadcasting elementwise ops, reductions, matmul, layout and random.

Every function takes ``Tensor``s of one device (and, for elementwise operands, Python or NumPy
scalars) and returns a new ``Tensor`` on that device. On OpenCL each op runs one generated
kernel (built once per op, shapes and dtypes through ``program_cache``, launched through
``launch``); on the NumPy backend (``device.kind == "cpu"``) the same op runs in NumPy.
"""

from netcl.core.tensor import ARITHMETIC as _TENSOR_ARITHMETIC
from netcl.runtime import memory as _memory  # noqa: F401 - installs the caching allocator
from netcl.runtime.ops._common import clear_kernel_memo
from netcl.runtime.ops.conv import conv2d
from netcl.runtime.ops.gathering import gather
from netcl.runtime.ops.indexing import getitem
from netcl.runtime.ops.layout import (
    broadcast_to,
    cast,
    copy,
    full,
    one_hot,
    ones_like,
    sum_to_shape,
    transpose,
    zeros_like,
)
from netcl.runtime.ops.linalg import matmul
from netcl.runtime.ops.pointwise import (
    abs,
    add,
    add_,
    clamp,
    cos,
    div,
    elementwise,
    elu,
    elu_grad,
    eq,
    exp,
    fill_,
    ge,
    gelu,
    gelu_grad,
    gt,
    le,
    leaky_relu,
    leaky_relu_grad,
    log,
    log1p,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pow,
    relu,
    relu_grad,
    rsqrt,
    sigmoid,
    sign,
    silu,
    silu_grad,
    sin,
    softplus,
    softplus_grad,
    sqrt,
    sub,
    tanh,
    where,
)
from netcl.runtime.ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from netcl.runtime.ops.precision import get_float32_matmul_precision, matmul_precision, set_float32_matmul_precision
from netcl.runtime.ops.random import dropout, manual_seed, normal, uniform
from netcl.runtime.ops.reduce import max, mean, sum
from netcl.runtime.ops.rowwise import layer_norm, log_softmax, logsumexp, rms_norm, softmax
from netcl.runtime.ops.selecting import embedding, index_select
from netcl.runtime.ops.shape import concat, narrow, pad

# Tensor operators (grad tensors included: ``w.grad * 0.1``) run these ops.
_TENSOR_ARITHMETIC.update(add=add, sub=sub, mul=mul, div=div, pow=pow, neg=neg)

__all__ = [
    "get_float32_matmul_precision",
    "matmul_precision",
    "set_float32_matmul_precision",
    "softplus_grad",
    "softplus",
    "sin",
    "silu_grad",
    "silu",
    "ne",
    "leaky_relu_grad",
    "leaky_relu",
    "elu_grad",
    "elu",
    "cos",
    "abs",
    "layer_norm",
    "log_softmax",
    "logsumexp",
    "rms_norm",
    "softmax",
    "adaptive_avg_pool2d",
    "avg_pool2d",
    "concat",
    "conv2d",
    "dropout",
    "embedding",
    "gather",
    "getitem",
    "index_select",
    "manual_seed",
    "max_pool2d",
    "narrow",
    "pad",
    "add",
    "add_",
    "broadcast_to",
    "cast",
    "clamp",
    "clear_kernel_memo",
    "copy",
    "div",
    "elementwise",
    "eq",
    "exp",
    "fill_",
    "full",
    "ge",
    "gelu",
    "gelu_grad",
    "gt",
    "le",
    "log",
    "log1p",
    "lt",
    "matmul",
    "max",
    "maximum",
    "mean",
    "minimum",
    "mul",
    "neg",
    "normal",
    "one_hot",
    "ones_like",
    "pow",
    "relu",
    "relu_grad",
    "rsqrt",
    "sigmoid",
    "sign",
    "sqrt",
    "sub",
    "sum",
    "sum_to_shape",
    "tanh",
    "transpose",
    "uniform",
    "where",
    "zeros_like",
]
