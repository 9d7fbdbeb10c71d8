"""netcl.train: the ``Trainer`` (fit / evaluate / save / resume), its callbacks and metrics.

Part of the netcl-jit distribution (it captures steps with ``netcl.jit.fuse_graph``); see
docs/training.md.
"""

from netcl.train.callbacks import Callback, Checkpoint
from netcl.train.checkpoint import CheckpointError
from netcl.train.metrics import accuracy
from netcl.train.trainer import Trainer

__all__ = ["Callback", "Checkpoint", "CheckpointError", "Trainer", "accuracy"]
