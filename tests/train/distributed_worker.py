"""One rank of tests/train/test_trainer_distributed.py: ``mpiexec -n 2 python distributed_worker.py DEVICE OUTDIR``.

Each rank trains the tiny model with a Trainer on the whole data set's loader (the Trainer shards it
with a DistributedSampler and wraps the model in DistributedDataParallel) and pickles its history,
final weights and the shard order it saw.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import netcl.autograd as ag
from netcl.data import DataLoader
from netcl.optim import SGD
from netcl.runtime import distributed as dist
from netcl.train import Callback, Trainer
from tests.train.helpers import make_dataset, make_model


class Orders(Callback):
    def __init__(self) -> None:
        self.orders: list[list[int]] = []

    def on_epoch_end(self, trainer, logs):
        self.orders.append(list(trainer_loader.sampler))


def main() -> None:
    global trainer_loader
    spec, outdir = sys.argv[1], Path(sys.argv[2])
    info = dist.init(device=spec)
    device = info.device
    model = make_model(device, dropout=0.0)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer_loader = DataLoader(make_dataset(), batch_size=8, shuffle=True, seed=5, device=device)
    orders = Orders()
    trainer = Trainer(model, opt, ag.cross_entropy, replay="auto")
    history = trainer.fit(trainer_loader, 2, callbacks=[orders])
    result = {
        "wrapped": type(trainer.network).__name__,
        "loss": history["loss"],
        "orders": orders.orders,
        "weights": [p.value.to_host() for p in model.parameters()],
    }
    (outdir / f"rank{info.rank}.pkl").write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    main()
