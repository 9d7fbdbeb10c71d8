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
from netcl.nn.layers import Conv1d, Conv2d, ConvTranspose2d, Embedding, Linear
from netcl.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from netcl.nn.module import IncompatibleKeys, Module
from netcl.nn.normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm, RMSNorm
from netcl.nn.parameter import Parameter
from netcl.nn.recurrent import GRU, LSTM, RNN
from netcl.nn.simple import (
    ELU,
    GELU,
    GLU,
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AvgPool1d,
    AvgPool2d,
    Dropout,
    Dropout2d,
    Flatten,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    Identity,
    LeakyReLU,
    LogSigmoid,
    LogSoftmax,
    MaxPool1d,
    MaxPool2d,
    Mish,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softmin,
    Softplus,
    Softsign,
    Tanh,
    Upsample,
)
from netcl.nn.transformer import TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AvgPool1d",
    "AvgPool2d",
    "BCELoss",
    "BCEWithLogitsLoss",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv1d",
    "Conv2d",
    "ConvTranspose2d",
    "CrossEntropyLoss",
    "Dropout",
    "Dropout2d",
    "ELU",
    "Embedding",
    "Flatten",
    "GELU",
    "GLU",
    "GRU",
    "GroupNorm",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "HuberLoss",
    "Identity",
    "IncompatibleKeys",
    "KLDivLoss",
    "KVCache",
    "L1Loss",
    "LSTM",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "LogSigmoid",
    "LogSoftmax",
    "MSELoss",
    "MaxPool1d",
    "MaxPool2d",
    "Mish",
    "Module",
    "ModuleDict",
    "ModuleList",
    "MultiheadAttention",
    "NLLLoss",
    "Parameter",
    "RMSNorm",
    "RNN",
    "ReLU",
    "ReLU6",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "SmoothL1Loss",
    "Softmax",
    "Softmin",
    "Softplus",
    "Softsign",
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
