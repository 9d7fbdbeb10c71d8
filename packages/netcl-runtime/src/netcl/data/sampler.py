"""Samplers: which dataset indices an epoch visits, in which order (torch.utils.data's samplers).

Every order is a function of ``(seed, epoch)`` only: ``set_epoch`` picks the epoch, nothing depends
on threads, workers or time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import numpy as np


def _length(dataset: Any) -> int:
    """``len(dataset)``, or ``dataset`` itself when it is an int (a length)."""
    length = dataset if isinstance(dataset, (int, np.integer)) else len(dataset)
    if length < 0:
        raise ValueError(f"dataset length must be >= 0, got {length}")
    return int(length)


def check_epoch(epoch: Any) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    return int(epoch)


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return int(seed)


def permutation(length: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(length)`` that depends only on ``(seed, epoch)`` (int64)."""
    return np.random.default_rng([seed, epoch]).permutation(length).astype(np.int64)


class Sampler:
    """Base class: an iterable of dataset indices with a length (torch.utils.data.Sampler)."""

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Samplers without randomness ignore the epoch."""
        check_epoch(epoch)


class SequentialSampler(Sampler):
    """``0, 1, ..., len(dataset) - 1``."""

    def __init__(self, data_source: Sized | int) -> None:
        self.length = _length(data_source)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.length))

    def __len__(self) -> int:
        return self.length


class RandomSampler(Sampler):
    """A permutation of the dataset's indices, a function of ``(seed, epoch)`` (``set_epoch``).

    ``replacement=True`` draws ``num_samples`` indices with replacement instead (same seeding).
    """

    def __init__(
        self,
        data_source: Sized | int,
        replacement: bool = False,
        num_samples: int | None = None,
        seed: int = 0,
    ) -> None:
        self.length = _length(data_source)
        self.replacement = bool(replacement)
        if num_samples is not None and (
            isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 0
        ):
            raise ValueError(f"num_samples must be an int >= 0 or None, got {num_samples!r}")
        if num_samples is not None and not self.replacement and num_samples > self.length:
            raise ValueError(
                f"num_samples={num_samples} exceeds the dataset's {self.length} items; "
                "pass replacement=True to draw more"
            )
        self.num_samples = self.length if num_samples is None else int(num_samples)
        self.seed = check_seed(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = check_epoch(epoch)

    def indices(self) -> np.ndarray:
        """The current epoch's indices (int64)."""
        if self.replacement:
            rng = np.random.default_rng([self.seed, self.epoch])
            return rng.integers(0, self.length, size=self.num_samples, dtype=np.int64)
        return permutation(self.length, self.seed, self.epoch)[: self.num_samples]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Group the indices of ``sampler`` into lists of ``batch_size`` (the last one shorter unless ``drop_last``)."""

    def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(int(index))
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        count = len(self.sampler)  # type: ignore[arg-type]
        return count // self.batch_size if self.drop_last else -(-count // self.batch_size)


class DistributedSampler(Sampler):
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
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, (int, np.integer)) or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}")
        self.length = _length(dataset)
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
        self.epoch = check_epoch(epoch)

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
