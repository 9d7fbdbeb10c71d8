"""netcl.nn.save / load: safetensors round trips, atomic writes, errors."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.nn as nn


def _model(device):
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, device=device),
        nn.BatchNorm2d(3, device=device),
        nn.Flatten(),
        nn.Linear(12, 2, device=device),
    )


def test_model_round_trip_through_a_file(device, tmp_path):
    ag.manual_seed(5)
    model = _model(device)
    path = tmp_path / "model.safetensors"
    nn.save(model.state_dict(), path)  # an os.PathLike
    loaded = nn.load(str(path))  # a str
    assert sorted(loaded) == sorted(model.state_dict())
    for key, value in model.state_dict().items():
        assert loaded[key].dtype == value.dtype and loaded[key].shape == value.shape
        np.testing.assert_array_equal(loaded[key], value.to_host())
    assert loaded["1.num_batches_tracked"].shape == () and loaded["1.num_batches_tracked"].dtype == np.int64
    ag.manual_seed(6)
    other = _model(device)
    other.load_state_dict(loaded)
    x = ag.tensor(np.random.default_rng(0).normal(size=(2, 1, 4, 4)).astype(np.float32), device=device)
    model.eval(), other.eval()
    if hasattr(ag, "batch_norm"):
        np.testing.assert_array_equal(model(x).to_host(), other(x).to_host())


def test_arrays_of_several_dtypes_and_nodes(tmp_path):
    state = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "f16": np.array([1.5, -2.0], np.float16),
        "i32": np.array([[1, 2]], np.int32),
        "scalar": np.array(7, np.int64),
        "node": ag.tensor(np.ones(4, np.float32), device="cpu"),
    }
    nn.save(state, tmp_path / "mixed.safetensors", metadata={"epoch": "3"})
    loaded = nn.load(tmp_path / "mixed.safetensors")
    for key, value in state.items():
        expected = value.to_host() if isinstance(value, ag.Node) else value
        assert loaded[key].dtype == expected.dtype and loaded[key].shape == expected.shape
        np.testing.assert_array_equal(loaded[key], expected)


def test_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    nn.save({"w": np.zeros(3, np.float32)}, path)
    original = path.read_bytes()

    import safetensors.numpy

    def torn_write(arrays, filename, metadata=None):
        pathlib.Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", torn_write)
    with pytest.raises(OSError, match="disk full"):
        nn.save({"w": np.ones(3, np.float32)}, path)
    assert path.read_bytes() == original  # the old checkpoint survives
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # no temporary file left behind


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint file at"):
        nn.load(tmp_path / "missing.safetensors")
    with pytest.raises(TypeError, match="'w' is a str; a checkpoint holds Tensors, Nodes or NumPy arrays"):
        nn.save({"w": "weights"}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="keys must be str"):
        nn.save({1: np.zeros(2)}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        nn.save([np.zeros(2)], tmp_path / "x.safetensors")
    assert os.listdir(tmp_path) == []
