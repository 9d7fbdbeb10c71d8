"""``DistributedSampler``: the indices of a dataset that one rank trains on, as torch's."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np


class DistributedSampler:
    """Shard ``range(len(dataset))`` over ``num_replicas`` ranks (torch.utils.data.DistributedSampler).

    Each epoch: the indices, permuted with ``seed + epoch`` when ``shuffle`` (call ``set_epoch``
    before each epoch so the order changes and stays the same on every rank); then either padded
    by repeating the first indices so every rank gets ``ceil(n / num_replicas)`` samples
    (``drop_last=False``) or cut to ``floor(n / num_replicas)`` per rank (``drop_last=True``);
    rank r takes every ``num_replicas``-th index starting at r. ``num_replicas`` and ``rank``
    default to the ``netcl.runtime.distributed`` group (``init()`` first).
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None or rank is None:
            from netcl.runtime import distributed as dist  # raises naming init() when not initialized

            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if not isinstance(num_replicas, (int, np.integer)) or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}")
        length = dataset if isinstance(dataset, (int, np.integer)) else len(dataset)
        if length < 0:
            raise ValueError(f"dataset length must be >= 0, got {length}")
        self.length = int(length)
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0
        if self.drop_last:
            self.num_samples = self.length // self.num_replicas
        else:
            self.num_samples = math.ceil(self.length / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Use ``seed + epoch`` for the next iteration's shuffle (the same on every rank)."""
        if not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch (int64)."""
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(self.length)
        else:
            order = np.arange(self.length)
        if self.total_size > self.length:  # pad by repeating from the start (several times if needed)
            repeats = math.ceil((self.total_size - self.length) / max(self.length, 1))
            order = np.concatenate([order, *([order] * repeats)])
        order = order[: self.total_size]
        return order[self.rank : self.total_size : self.num_replicas].astype(np.int64)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (
            f"DistributedSampler(length={self.length}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, epoch={self.epoch})"
        )
