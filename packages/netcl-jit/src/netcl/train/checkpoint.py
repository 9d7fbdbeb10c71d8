"""Trainer checkpoints: one safetensors file holding the tensors and, in its metadata, a JSON document
with everything else (positions, RNG states, optimizer groups, scheduler and scaler scalars).

Integrity: the JSON carries the SHA-256 of every tensor's bytes (with its dtype and shape), and a
second metadata entry the SHA-256 of the JSON itself; ``read_checkpoint`` checks both, so a torn,
truncated or bit-flipped file raises ``CheckpointError`` naming what is wrong. Atomicity:
``write_checkpoint`` writes a temporary file in the target's directory, flushes and fsyncs it, then
``os.replace``\\ s the target: a crash at any point leaves the previous checkpoint whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

#: format tag stored in the metadata; a file without it is not a Trainer checkpoint
FORMAT = "netcl.train.checkpoint/1"
_STATE_KEY = "netcl.train.state"
_DIGEST_KEY = "netcl.train.state_sha256"
_FORMAT_KEY = "netcl.train.format"


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, torn, corrupt, or not a Trainer checkpoint."""


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def write_checkpoint(path: str | os.PathLike, tensors: Mapping[str, np.ndarray], state: Mapping[str, Any]) -> None:
    """Write ``tensors`` (name -> host array) and ``state`` (JSON-serializable) to ``path``, atomically."""
    from safetensors.numpy import save_file

    arrays = {str(k): np.array(v, order="C") for k, v in tensors.items()}
    document = dict(state)
    document["tensors"] = {k: {"sha256": _digest(a), "dtype": str(a.dtype), "shape": list(a.shape)}
                           for k, a in arrays.items()}  # fmt: skip
    text = json.dumps(document, sort_keys=True, allow_nan=True)
    metadata = {
        _FORMAT_KEY: FORMAT,
        _STATE_KEY: text,
        _DIGEST_KEY: hashlib.sha256(text.encode()).hexdigest(),
    }
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".netcl-ckpt-", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        _save_file(save_file, arrays, tmp, metadata)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_directory(directory)


def _save_file(save_file: Any, arrays: dict[str, np.ndarray], path: str, metadata: dict[str, str]) -> None:
    """The one write of a checkpoint's bytes (a seam: tests make it fail midway)."""
    save_file(arrays, path, metadata=metadata)


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, state) of a checkpoint ``write_checkpoint`` wrote; ``CheckpointError`` if it is
    missing, unreadable, torn or corrupt (every tensor's digest and the state's digest are checked)."""
    from safetensors import safe_open

    target = os.fspath(path)
    if not os.path.isfile(target):
        raise CheckpointError(f"no checkpoint file at {target!r}")
    try:
        with safe_open(target, framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except Exception as exc:  # safetensors raises its own error types for torn headers and short files
        raise CheckpointError(f"checkpoint {target!r} is torn or not a safetensors file: {exc}") from exc
    if metadata.get(_FORMAT_KEY) != FORMAT:
        raise CheckpointError(
            f"{target!r} is a safetensors file but not a Trainer checkpoint (format {metadata.get(_FORMAT_KEY)!r}, "
            f"expected {FORMAT!r}); a plain state dict loads with netcl.nn.load"
        )
    text = metadata.get(_STATE_KEY, "")
    if hashlib.sha256(text.encode()).hexdigest() != metadata.get(_DIGEST_KEY):
        raise CheckpointError(f"checkpoint {target!r} is corrupt: its state document does not match its digest")
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint {target!r} is corrupt: its state document is not JSON ({exc})") from exc
    expected = state.pop("tensors", {})
    if set(expected) != set(tensors):
        raise CheckpointError(
            f"checkpoint {target!r} is corrupt: tensors {sorted(set(expected) ^ set(tensors))} are listed in its state "
            "document but absent from the file, or the reverse"
        )
    for name, array in tensors.items():
        entry = expected[name]
        if (
            str(array.dtype) != entry["dtype"]
            or list(array.shape) != entry["shape"]
            or _digest(array) != entry["sha256"]
        ):
            raise CheckpointError(f"checkpoint {target!r} is corrupt: tensor {name!r} does not match its digest")
    return tensors, state
