"""jit_compile / fuse_graph watch a netcl.nn model's parameters: no warning, and a rebound weight retraces."""

from __future__ import annotations

import warnings

import numpy as np

import netcl.autograd as ag
import netcl.nn as nn
from netcl.jit import UnwatchedCaptureWarning, fuse_graph, jit_compile
from netcl.runtime import manual_seed


class Block(nn.Module):
    def __init__(self, device) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(4, 8, device=device), nn.ReLU())
        self.head = nn.Linear(8, 3, device=device)

    def forward(self, x):
        return self.head(self.features(x))


def test_nested_model_parameters_are_watched(device):
    manual_seed(0)  # the weights, not whatever earlier tests left the generator at (some give relu(...) == 0)
    model = Block(device)
    fn = jit_compile(lambda x: ag.relu(model(x)) * 2.0)
    x = ag.tensor(np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32), device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnwatchedCaptureWarning)  # (a driver's build log may warn)
        first = fn(x).to_host()
        fuse_graph(model, x, np.zeros(5, np.int32), ag.cross_entropy)
    assert first.any()  # a rebound weight must be able to change the result
    # rebinding a nested weight (as Module.to does) makes the next call trace again and use it
    weight = model.features[0].weight
    weight.value = ag.tensor(weight.to_host() * 0.0, device=device).value
    second = fn(x).to_host()
    expected = np.maximum(model(x).to_host(), 0) * 2.0
    np.testing.assert_allclose(second, expected, rtol=1e-6)
    assert not np.allclose(first, second)
