"""The eager op library: broadcasting elementwise ops, reductions, matmul, layout and random.

Every function takes ``Tensor``s of one device (and, for elementwise operands, Python or NumPy
scalars) and returns a new ``Tensor`` on that device. On OpenCL each op runs one generated
kernel (built once per op, shapes and dtypes through ``program_cache``, launched through
``launch``); on the NumPy backend the same op runs its NumPy twin (``netcl.runtime.numpy_twins``),
chosen once per call by ``ops.backend.backend_op``.
"""

from netcl.core.tensor import ARITHMETIC as _TENSOR_ARITHMETIC
from netcl.runtime import memory as _memory  # noqa: F401 - installs the caching allocator
from netcl.runtime.ops import (
    attention_blocked,  # noqa: F401  registers the blocked, then quad attention kernels
    attention_mma,  # noqa: F401  registers the tensor-core attention kernels before them
    attention_mma_tf32,  # noqa: F401  registers the float32 (tf32) tensor-core attention kernels before those
)
from netcl.runtime.ops import views as _views  # noqa: F401 - installs the gather of strided views
from netcl.runtime.ops._common import clear_kernel_memo
from netcl.runtime.ops.attention import scaled_dot_product_attention
from netcl.runtime.ops.batchnorm import batch_norm
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
    elu_backward,
    elu_grad,
    eq,
    exp,
    fill_,
    ge,
    gelu,
    gelu_backward,
    gelu_grad,
    gt,
    le,
    leaky_relu,
    leaky_relu_backward,
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
    relu_backward,
    relu_grad,
    rsqrt,
    scaled_difference,
    sigmoid,
    sigmoid_backward,
    sign,
    silu,
    silu_backward,
    silu_grad,
    sin,
    softplus,
    softplus_grad,
    sqrt,
    squared_difference,
    sub,
    tanh,
    tanh_backward,
    where,
)
from netcl.runtime.ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from netcl.runtime.ops.precision import (
    at_matmul_precision,
    get_float32_matmul_precision,
    matmul_precision,
    set_float32_matmul_precision,
)
from netcl.runtime.ops.random import dropout, manual_seed, normal, uniform
from netcl.runtime.ops.reduce import max, mean, min, prod, sum
from netcl.runtime.ops.rowwise import layer_norm, log_softmax, logsumexp, rms_norm, softmax
from netcl.runtime.ops.scan import argmax, argmax_into, argmin, cumsum, flip
from netcl.runtime.ops.selecting import embedding, index_select
from netcl.runtime.ops.shape import concat, narrow, pad

# Tensor operators (grad tensors included: ``w.grad * 0.1``) run these ops.
_TENSOR_ARITHMETIC.update(add=add, sub=sub, mul=mul, div=div, pow=pow, neg=neg)

__all__ = [
    "abs",
    "adaptive_avg_pool2d",
    "add",
    "add_",
    "argmax",
    "argmax_into",
    "argmin",
    "at_matmul_precision",
    "avg_pool2d",
    "batch_norm",
    "broadcast_to",
    "cast",
    "clamp",
    "clear_kernel_memo",
    "concat",
    "conv2d",
    "copy",
    "cos",
    "cumsum",
    "div",
    "dropout",
    "elementwise",
    "elu",
    "elu_backward",
    "elu_grad",
    "embedding",
    "eq",
    "exp",
    "fill_",
    "flip",
    "full",
    "gather",
    "ge",
    "gelu",
    "gelu_backward",
    "gelu_grad",
    "get_float32_matmul_precision",
    "getitem",
    "gt",
    "index_select",
    "layer_norm",
    "le",
    "leaky_relu",
    "leaky_relu_backward",
    "leaky_relu_grad",
    "log",
    "log1p",
    "log_softmax",
    "logsumexp",
    "lt",
    "manual_seed",
    "matmul",
    "matmul_precision",
    "max",
    "max_pool2d",
    "maximum",
    "mean",
    "min",
    "minimum",
    "mul",
    "narrow",
    "ne",
    "neg",
    "normal",
    "one_hot",
    "ones_like",
    "pad",
    "pow",
    "prod",
    "relu",
    "relu_backward",
    "relu_grad",
    "rms_norm",
    "rsqrt",
    "scaled_difference",
    "scaled_dot_product_attention",
    "set_float32_matmul_precision",
    "sigmoid",
    "sigmoid_backward",
    "sign",
    "silu",
    "silu_backward",
    "silu_grad",
    "sin",
    "softmax",
    "softplus",
    "softplus_grad",
    "sqrt",
    "squared_difference",
    "sub",
    "sum",
    "sum_to_shape",
    "tanh",
    "tanh_backward",
    "transpose",
    "uniform",
    "where",
    "zeros_like",
]
