"""netcl.amp: mixed precision (``autocast``) and dynamic loss scaling (``GradScaler``), as ``torch.amp``."""

from netcl.amp.autocast import autocast
from netcl.amp.grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast"]
