"""netcl.optim: optimizers (``SGD``, ``Adam``, ``AdamW``, ``RMSprop``, ``Adagrad``) and LR schedulers, as
``torch.optim``.

Each parameter's update is one fused in-place kernel; step counts and hyperparameters live on the
device, so an optimizer step captured with ``fuse_graph`` / ``CompiledGraph`` replays correctly.
"""

from netcl.optim import lr_scheduler
from netcl.optim.adagrad import Adagrad
from netcl.optim.adam import Adam, AdamW
from netcl.optim.lr_scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    OneCycleLR,
    PolynomialLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)
from netcl.optim.optimizer import Optimizer
from netcl.optim.rmsprop import RMSprop
from netcl.optim.sgd import SGD

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "Optimizer",
    "PolynomialLR",
    "RMSprop",
    "ReduceLROnPlateau",
    "SequentialLR",
    "StepLR",
    "lr_scheduler",
]
