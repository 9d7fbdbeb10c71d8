"""``Parameter``: a leaf ``Node`` that requires grad and that a ``Module`` registers as trainable."""

from __future__ import annotations

from typing import Any

import numpy as np

from netcl.autograd.engine import Node
from netcl.core import Device, Tensor, get_device
from netcl.core.dtypes import is_floating


class Parameter(Node):
    """A trainable tensor: a leaf ``Node`` with ``requires_grad=True`` (PyTorch's ``nn.Parameter``).

    ``data`` is a ``Tensor``, a ``Node`` (its value is shared, not copied; a strided view such as ``w.T`` is
    gathered into memory of its own) or host data (NumPy array, list, scalar), uploaded to ``device``
    (default: the default device). Assigning a
    Parameter to a ``Module`` attribute registers it; optimizers update ``value`` in place, so the
    same object stays valid across steps, checkpoints loads and captured replays.
    """

    def __init__(self, data: Any, requires_grad: bool = True, device: Device | str | None = None) -> None:
        if isinstance(data, Node):
            data = data.value
        if isinstance(data, Tensor) and data.strided:  # optimizers write a parameter in place: not a view
            data = data.contiguous()
        if not isinstance(data, Tensor):
            data = Tensor.from_host(get_device(device), np.asarray(data))
        elif device is not None:
            data = data.to(device)
        if requires_grad and not is_floating(data.dtype):
            raise TypeError(f"Parameter: only floating-point tensors can require grad, got dtype {data.dtype}")
        super().__init__(data, requires_grad=requires_grad, op_name="parameter")

    def __repr__(self) -> str:
        return f"Parameter(shape={self.shape}, dtype={self.dtype}, device={self.device.spec})"
