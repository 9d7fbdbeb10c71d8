"""netcl.nn: PyTorch-style modules and layers, and safetensors checkpoints.

``Module`` and the layers follow ``torch.nn``: same class names, constructor arguments, parameter
names, shapes and default initialization, so ``model.load_state_dict({k: v.numpy() for k, v in
torch_model.state_dict().items()})`` loads a PyTorch model's weights. ``save`` / ``load`` write
and read state dicts as safetensors files.
"""

from netcl.nn import functional, generation, init, utils
from netcl.nn.attention import MultiheadAttention
from netcl.nn.checkpoint import load, save
from netcl.nn.containers import ModuleDict, ModuleList, Sequential
from netcl.nn.kv_cache import KVCache
from netcl.nn.layers import Conv2d, ConvTranspose2d, Embedding, Linear
from netcl.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from netcl.nn.module import IncompatibleKeys, Module
from netcl.nn.normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from netcl.nn.parameter import Parameter
from netcl.nn.simple import (
    ELU,
    GELU,
    AdaptiveAvgPool2d,
    AvgPool2d,
    Dropout,
    Dropout2d,
    Flatten,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    Identity,
    LeakyReLU,
    LogSoftmax,
    MaxPool2d,
    Mish,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
    Upsample,
)
from netcl.nn.transformer import TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer

__all__ = [
    "BCELoss",
    "BCEWithLogitsLoss",
    "CrossEntropyLoss",
    "HuberLoss",
    "L1Loss",
    "MSELoss",
    "NLLLoss",
    "SmoothL1Loss",
    "Dropout2d",
    "ELU",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "Mish",
    "ModuleDict",
    "ReLU6",
    "GELU",
    "GroupNorm",
    "LeakyReLU",
    "LogSoftmax",
    "Softmax",
    "Softplus",
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv2d",
    "ConvTranspose2d",
    "Dropout",
    "Embedding",
    "Flatten",
    "Identity",
    "IncompatibleKeys",
    "KVCache",
    "LayerNorm",
    "Linear",
    "MaxPool2d",
    "Module",
    "MultiheadAttention",
    "ModuleList",
    "Parameter",
    "ReLU",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Tanh",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "Upsample",
    "functional",
    "generation",
    "init",
    "load",
    "save",
    "utils",
]
