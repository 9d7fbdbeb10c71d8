"""Shared pieces of the Trainer tests (tests.train.helpers): a tiny data set and model, a hand-written loop."""

from __future__ import annotations

import numpy as np

import netcl.autograd as ag
import netcl.nn as nn
from netcl.data import DataLoader, TensorDataset
from netcl.jit import fuse_graph
from netcl.optim import SGD, StepLR


def make_dataset() -> TensorDataset:
    """70 items: 6 standard-normal features, class 1 where they sum above 0."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((70, 6)).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.int32)
    return TensorDataset(x, y)


def make_model(device, dropout: float = 0.2, hidden: int = 16) -> nn.Module:
    ag.manual_seed(1)
    layers = [nn.Linear(6, hidden, device=device), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(hidden, 2, device=device))


def make_parts(device, dataset, seed: int = 3, batch_size: int = 16, dropout: float = 0.2, hidden: int = 16):
    """(model, SGD with momentum, StepLR, shuffled loader): 70 items in batches of 16 (the last one short)."""
    model = make_model(device, dropout, hidden)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = StepLR(opt, step_size=1, gamma=0.5)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, seed=seed, device=device)
    return model, opt, sched, loader


def hand_written_loop(model, opt, sched, loader, epochs: int, replay: bool) -> list[float]:
    """What a user writes: eager Tape steps, or (replay) the first repeated batch shape captured with
    fuse_graph and replayed, other shapes eager; the scheduler stepped per epoch; loss.item() per step."""
    losses, graph, shape, seen = [], None, None, set()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for xb, yb in loader:
            signature = (xb.shape, yb.shape)
            if replay and graph is not None and signature == shape:
                losses.append(graph.execute(xb, yb).item())
                continue
            if replay and graph is None and signature in seen:
                graph, shape = fuse_graph(model, xb, yb, ag.cross_entropy, optimizer_step=opt.step), signature
                losses.append(graph.outputs.item())
                continue
            seen.add(signature)
            opt.zero_grad()
            with ag.Tape() as tape:
                loss = ag.cross_entropy(model(xb), yb)
            tape.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        sched.step()
    return losses
