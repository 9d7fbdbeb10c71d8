"""Map-style datasets: ``Dataset``, ``TensorDataset``, ``Subset``, ``random_split`` (torch.utils.data's)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Tensor
from netcl.data.collate import Alloc, batch_dtype
from netcl.data.sampler import check_seed, permutation

#: dtype kinds ``gather_batch`` stacks itself (bool, integers, floats, complex); others go item by item
_GATHER_KINDS = "biufc"


class Dataset:
    """A map-style dataset: ``dataset[i]`` for ``0 <= i < len(dataset)``.

    Subclasses define ``__getitem__`` and ``__len__``. An item is a NumPy array, a number, or a
    tuple / list / dict of those (nested); ``DataLoader`` stacks items field by field.
    """

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class TensorDataset(Dataset):
    """Item ``i`` is ``tuple(t[i] for t in tensors)``: the first axis of every array is the sample axis.

    Arrays may be NumPy arrays (or anything ``np.asarray`` takes) or netcl ``Tensor`` s, which are
    read to the host once here (a ``DataLoader`` uploads the batches it builds from them).
    """

    def __init__(self, *tensors: Any) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one array")
        arrays = [t.to_host() if isinstance(t, Tensor) else np.asarray(t) for t in tensors]
        for k, array in enumerate(arrays):
            if array.ndim == 0:
                raise ValueError(f"TensorDataset: array {k} is 0-d; every array needs a first (sample) axis")
        lengths = [a.shape[0] for a in arrays]
        if len(set(lengths)) != 1:
            raise ValueError(f"TensorDataset: every array must have the same first dimension, got {lengths}")
        self.tensors = tuple(arrays)

    def __getitem__(self, index: int) -> tuple[np.ndarray, ...]:
        return tuple(a[index] for a in self.tensors)

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])

    def gather_batch(self, indices: Sequence[int], alloc: Alloc) -> tuple[np.ndarray, ...] | None:
        """The default collation of the items at ``indices``, each array gathered into ``alloc``'s arrays.

        Equal to ``default_collate([self[i] for i in indices])`` (float64 arrives as float32) in
        one ``np.take`` per array, which runs without the GIL. None when an array's dtype is not
        numeric (strings, objects): the loader then collates item by item. ``indices`` must lie in
        ``[-len(self), len(self))``; anything else raises ``IndexError``.
        """
        if any(a.dtype.kind not in _GATHER_KINDS for a in self.tensors):
            return None
        index = np.asarray(indices, dtype=np.intp)
        n = len(self)
        if index.ndim != 1 or not index.size:
            raise ValueError(f"TensorDataset.gather_batch: indices must be a non-empty 1-d sequence, got {indices!r}")
        if index.min() < -n or index.max() >= n:
            bad = index[(index < -n) | (index >= n)][0]
            raise IndexError(f"TensorDataset: index {bad} is out of range for {n} items")
        batch = []
        for array in self.tensors:
            out = alloc((index.size, *array.shape[1:]), batch_dtype(array.dtype))
            if out.dtype == array.dtype:
                np.take(array, index, axis=0, out=out, mode="wrap")  # in range (checked): "wrap" copies once
            else:
                np.copyto(out, np.take(array, index, axis=0, mode="wrap"), casting="same_kind")
            batch.append(out)
        return tuple(batch)


class Subset(Dataset):
    """The items of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = [int(i) for i in indices]
        n = len(dataset)
        bad = [i for i in self.indices if not 0 <= i < n]
        if bad:
            raise IndexError(f"Subset: indices {bad[:5]} are outside the dataset's range [0, {n})")

    def __getitem__(self, index: int) -> Any:
        if isinstance(index, (list, tuple)):
            return [self.dataset[self.indices[i]] for i in index]
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)

    def gather_batch(self, indices: Sequence[int], alloc: Alloc) -> Any:
        """The wrapped dataset's ``gather_batch`` of the mapped indices; None when it has none."""
        gather = getattr(self.dataset, "gather_batch", None)
        if gather is None:
            return None
        return gather([self.indices[i] for i in indices], alloc)


class ConcatDataset(Dataset):
    """The items of several datasets, one after the other."""

    def __init__(self, datasets: Sequence[Any]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset needs at least one dataset")
        self.cumulative_sizes = np.cumsum([len(d) for d in self.datasets]).tolist()

    def __len__(self) -> int:
        return int(self.cumulative_sizes[-1])

    def __getitem__(self, index: int) -> Any:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"ConcatDataset index {index} out of range for {n} items")
        which = int(np.searchsorted(self.cumulative_sizes, index, side="right"))
        start = 0 if which == 0 else self.cumulative_sizes[which - 1]
        return self.datasets[which][index - start]


def _split_lengths(total: int, lengths: Sequence[float]) -> list[int]:
    """Integer lengths summing to ``total``; fractions (summing to 1) as torch rounds them."""
    if not lengths:
        raise ValueError("random_split: lengths is empty")
    if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in lengths):
        counts = [int(x) for x in lengths]
        if any(c < 0 for c in counts):
            raise ValueError(f"random_split: lengths must be >= 0, got {counts}")
        if sum(counts) != total:
            raise ValueError(f"random_split: lengths {counts} sum to {sum(counts)}, but the dataset has {total} items")
        return counts
    fractions = [float(x) for x in lengths]
    if any(not 0 <= f <= 1 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise ValueError(f"random_split: fractions must lie in [0, 1] and sum to 1, got {fractions}")
    counts = [math.floor(total * f) for f in fractions]
    for k in range(total - sum(counts)):  # the remainder, one each, round-robin (torch's rule)
        counts[k % len(counts)] += 1
    return counts


def random_split(dataset: Any, lengths: Sequence[float], seed: int | None = None) -> list[Subset]:
    """Split ``dataset`` into non-overlapping ``Subset`` s of the given lengths (or fractions summing to 1).

    The split is a permutation that depends only on ``seed``; ``seed=None`` draws it from netcl's
    global generator (``netcl.runtime.manual_seed`` makes that repeatable).
    """
    if seed is None:
        from netcl.runtime.ops.random import next_seed

        seed = next_seed()
    seed = check_seed(seed)
    total = len(dataset)
    counts = _split_lengths(total, lengths)
    order = permutation(total, seed, 0).tolist()
    subsets, start = [], 0
    for count in counts:
        subsets.append(Subset(dataset, order[start : start + count]))
        start += count
    return subsets
