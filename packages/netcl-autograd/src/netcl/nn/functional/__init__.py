"""``netcl.nn.functional``: ``torch.nn.functional``'s names, argument order and defaults over netcl's ops.

``import netcl.nn.functional as F`` reads as torch code does: ``F.relu(x)``, ``F.gelu(x)`` (exact, torch's
default), ``F.softmax(x, dim=-1)``, ``F.conv2d(x, weight, bias, stride=2)``, ``F.cross_entropy(logits, y,
weight=w)``, ``F.binary_cross_entropy_with_logits(z, t, pos_weight=pw)``. Each function is a thin adapter: the
op it calls (``netcl.autograd``) defines the computation, its derivative and its kernels; the modules of
``netcl.nn`` call these functions, so a default lives in one place. What netcl does not implement (torch's
``return_indices``, ``divisor_override``, ``max_norm``, ...) is refused by name; ``inplace=True`` is accepted
and computed out of place (torch documents it as optional). See docs/nn-optim-amp.md.
"""

from netcl.autograd.ops_attention import scaled_dot_product_attention
from netcl.autograd.ops_resize import interpolate
from netcl.nn.functional.activations import (
    elu,
    gelu,
    glu,
    hardsigmoid,
    hardswish,
    hardtanh,
    leaky_relu,
    log_softmax,
    logsigmoid,
    mish,
    relu,
    relu6,
    sigmoid,
    silu,
    softmax,
    softmin,
    softplus,
    softsign,
    tanh,
)
from netcl.nn.functional.layers import (
    adaptive_avg_pool2d,
    avg_pool2d,
    batch_norm,
    conv2d,
    conv_transpose2d,
    dropout,
    dropout2d,
    embedding,
    group_norm,
    layer_norm,
    max_pool2d,
    normalize,
    pad,
    rms_norm,
)
from netcl.nn.functional.losses import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cross_entropy,
    huber_loss,
    kl_div,
    l1_loss,
    mse_loss,
    nll_loss,
    smooth_l1_loss,
)
from netcl.nn.functional.products import linear

__all__ = [
    "adaptive_avg_pool2d",
    "avg_pool2d",
    "batch_norm",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "conv2d",
    "conv_transpose2d",
    "cross_entropy",
    "dropout",
    "dropout2d",
    "elu",
    "embedding",
    "gelu",
    "glu",
    "group_norm",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "huber_loss",
    "interpolate",
    "kl_div",
    "l1_loss",
    "layer_norm",
    "leaky_relu",
    "linear",
    "log_softmax",
    "logsigmoid",
    "max_pool2d",
    "mish",
    "mse_loss",
    "nll_loss",
    "normalize",
    "pad",
    "relu",
    "relu6",
    "rms_norm",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "smooth_l1_loss",
    "softmax",
    "softmin",
    "softplus",
    "softsign",
    "tanh",
]
