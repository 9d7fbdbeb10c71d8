"""Batches and loaders as the Trainer sees them: (input, target) pairs, signatures, shuffle seeds, and
the distributed wrapping (DistributedDataParallel, a DistributedSampler) under MPI."""

from __future__ import annotations

from typing import Any


def split_batch(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise TypeError(
        f"Trainer: a batch must be an (input, target) pair, got {type(batch).__name__}"
        + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    )


def batch_size(x: Any) -> int:
    shape = getattr(x, "shape", None)
    return int(shape[0]) if shape else 1


def signature(x: Any, target: Any) -> str:
    def one(v: Any) -> str:
        return f"{tuple(getattr(v, 'shape', ()))}:{getattr(v, 'dtype', type(v).__name__)}"

    return f"{one(x)}|{one(target)}"


def check_loader(loader: Any, name: str) -> None:
    for attr in ("__iter__", "__len__", "set_epoch"):
        if not hasattr(loader, attr):
            raise TypeError(
                f"fit: {name} must be a netcl.data.DataLoader (or have __iter__, __len__ and set_epoch); "
                f"{type(loader).__name__} lacks {attr}"
            )


def get_seed(loader: Any) -> int | None:
    sampler = getattr(loader, "sampler", None)
    seed = getattr(sampler, "seed", getattr(loader, "seed", None))
    return None if seed is None else int(seed)


def set_seed(loader: Any, seed: int) -> None:
    if hasattr(loader, "seed"):
        loader.seed = seed
    sampler = getattr(loader, "sampler", None)
    if sampler is not None and hasattr(sampler, "seed"):
        sampler.seed = seed


def wrap_distributed(model: Any) -> Any:
    from netcl.runtime import distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    from netcl.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


def shard(loader: Any) -> None:
    """Under MPI, give a DataLoader that owns its sampler a ``DistributedSampler`` (same seed and shuffle)."""
    from netcl.runtime import distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    from netcl.data import BatchSampler, DataLoader, DistributedSampler

    if not isinstance(loader, DataLoader) or isinstance(loader.sampler, DistributedSampler):
        return
    sampler = DistributedSampler(len(loader.dataset), shuffle=loader.shuffle, seed=loader.seed,
                                 drop_last=loader.drop_last)  # fmt: skip
    loader.sampler = sampler
    loader.batch_sampler = BatchSampler(sampler, loader.batch_size, loader.drop_last)
    loader._owns_sampler = False  # set_epoch now reaches the sampler
