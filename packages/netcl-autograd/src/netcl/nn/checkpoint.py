"""Checkpoints: ``save(state_dict, path)`` and ``load(path)`` in the safetensors format.

Files are written through the ``safetensors`` package's NumPy API, so PyTorch
(``safetensors.torch.load_file``) and other tools read them, and safetensors files written
elsewhere load here. Writes are atomic: the data goes to a temporary file in the target's
directory, which then replaces the target (``os.replace``), so a crash never leaves a torn file.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from netcl.autograd.engine import Node
from netcl.core import Tensor


def _host(value: Any, key: str) -> np.ndarray:
    if isinstance(value, Node):
        value = value.value
    if isinstance(value, Tensor):
        return value.to_host()
    if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
        return np.asarray(value)
    raise TypeError(f"save: {key!r} is a {type(value).__name__}; a checkpoint holds Tensors, Nodes or NumPy arrays")


def save(state_dict: Mapping[str, Any], path: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``state_dict`` (name -> Tensor, Node or NumPy array) to ``path`` as safetensors, atomically."""
    from safetensors.numpy import save_file

    if not isinstance(state_dict, Mapping):
        raise TypeError(f"save: state_dict must be a mapping of name -> tensor, got {type(state_dict).__name__}")
    arrays = {}
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f"save: keys must be str, got {key!r}")
        arrays[key] = np.array(_host(value, key), order="C")  # ascontiguousarray would make 0-d 1-d
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".netcl-", suffix=".safetensors.tmp", dir=directory)
    os.close(fd)
    try:
        save_file(arrays, tmp, metadata=dict(metadata) if metadata else None)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load(path: str | os.PathLike) -> OrderedDict[str, np.ndarray]:
    """The arrays of a safetensors file, by name (pass the result to ``Module.load_state_dict``)."""
    from safetensors.numpy import load_file

    target = os.fspath(path)
    if not os.path.isfile(target):
        raise FileNotFoundError(f"load: no checkpoint file at {target!r}")
    return OrderedDict(load_file(target))
