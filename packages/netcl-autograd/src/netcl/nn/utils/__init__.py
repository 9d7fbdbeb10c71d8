"""``netcl.nn.utils``: torch's ``torch.nn.utils``: ``clip_grad_norm_`` and ``clip_grad_value_``, and ``rnn``'s
``pad_sequence``."""

from netcl.nn.utils import rnn
from netcl.nn.utils.clip_grad import clip_grad_norm_, clip_grad_value_

__all__ = ["clip_grad_norm_", "clip_grad_value_", "rnn"]
