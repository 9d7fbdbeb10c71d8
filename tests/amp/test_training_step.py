"""The API reference's canonical training step ("Putting It Together: Training One Step") as written."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.nn as nn


def _loader(device, batches=6, batch=16, seed=0):
    """Three well separated Gaussian blobs in 4-d, as (x Node, y int array) minibatches."""
    import netcl.autograd as ag

    rng = np.random.default_rng(seed)
    centers = np.eye(3, 4, dtype=np.float32) * 3.0
    data = []
    for _ in range(batches):
        y = rng.integers(0, 3, batch)
        x = centers[y] + rng.normal(scale=0.5, size=(batch, 4)).astype(np.float32)
        data.append((ag.tensor(x, device=device), y))
    return data


def _accuracy(model, loader) -> float:
    import netcl.autograd as ag

    with ag.no_grad():
        return float(np.mean([np.mean(model(x).to_host().argmax(1) == y) for x, y in loader]))


@pytest.mark.filterwarnings("ignore:autocast:RuntimeWarning")  # autocast's note on a device without fp16
def test_canonical_training_step_runs_as_written(device):
    import netcl.autograd as ag

    ag.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32, device=device), nn.ReLU(), nn.Linear(32, 3, device=device))
    batches = _loader(device)
    loader = batches * 15  # 15 epochs
    before = _accuracy(model, batches)
    losses = []

    # ---- the spec's code, verbatim (plus recording the loss) ---------------------------------------
    import netcl.amp as amp
    import netcl.autograd as ag
    from netcl.optim import Adam

    opt = Adam(model.parameters(), lr=1e-3)
    scaler = amp.GradScaler()
    for x, y in loader:
        with ag.Tape() as tape:
            with amp.autocast(enabled=True):
                pred = model(x)
                loss = ag.cross_entropy(pred, y)
            loss = scaler.scale_loss(loss)
            tape.backward(loss)
        scaler.step(opt, model.parameters())
        scaler.update()
        opt.zero_grad()
        # ----------------------------------------------------------------------------------------------
        losses.append(loss.item() / scaler.get_scale())
    assert scaler.get_scale() == 2.0**16  # no step was skipped (fp32 gradients never overflow here)
    assert np.mean(losses[-6:]) < 0.7 * np.mean(losses[:6])
    assert _accuracy(model, batches) >= max(before, 0.9)
    assert opt.steps.to_host().tolist() == [15 * 6] * 4
