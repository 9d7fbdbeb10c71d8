"""Spec path ``netcl.autograd.training_compiler``: a re-export of ``netcl.jit.training_compiler``.

Needs the ``netcl-jit`` distribution; without it importing this module raises ImportError.
"""

from netcl.autograd import import_jit

import_jit("netcl.jit")  # the distribution itself first: a cached submodule alone does not prove it
_tc = import_jit("netcl.jit.training_compiler")

TrainingGraphCompiler = _tc.TrainingGraphCompiler
TrainingPattern = _tc.TrainingPattern
fused_weighted_bce_smooth_l1_loss = _tc.fused_weighted_bce_smooth_l1_loss
get_training_compiler = _tc.get_training_compiler

__all__ = [
    "TrainingGraphCompiler",
    "TrainingPattern",
    "fused_weighted_bce_smooth_l1_loss",
    "get_training_compiler",
]
