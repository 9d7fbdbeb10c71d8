"""netcl.data datasets and samplers: Subset, random_split, ConcatDataset, the samplers, DistributedSampler."""

from __future__ import annotations

import numpy as np
import pytest

from netcl.data import (
    BatchSampler,
    ConcatDataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    Subset,
    TensorDataset,
    random_split,
)


def test_subset_maps_indices():
    data = TensorDataset(np.arange(10) * 2)
    subset = Subset(data, [7, 2, 2, 9])
    assert len(subset) == 4
    assert [int(subset[i][0]) for i in range(4)] == [14, 4, 4, 18]
    with pytest.raises(IndexError, match=r"indices \[10\] are outside the dataset's range \[0, 10\)"):
        Subset(data, [1, 10])


def test_random_split_is_deterministic_and_complete():
    data = TensorDataset(np.arange(50))
    parts = random_split(data, [20, 20, 10], seed=3)
    assert [len(p) for p in parts] == [20, 20, 10]
    seen = [int(p[i][0]) for p in parts for i in range(len(p))]
    assert sorted(seen) == list(range(50))  # disjoint and covering
    again = random_split(data, [20, 20, 10], seed=3)
    assert [p.indices for p in again] == [p.indices for p in parts]
    assert random_split(data, [20, 20, 10], seed=4)[0].indices != parts[0].indices
    fractions = random_split(data, [0.5, 0.3, 0.2], seed=3)
    assert [len(p) for p in fractions] == [25, 15, 10]
    odd = random_split(TensorDataset(np.arange(11)), [0.5, 0.5], seed=0)
    assert [len(p) for p in odd] == [6, 5]  # the remainder goes round-robin from the first split


@pytest.mark.parametrize(
    "lengths, match",
    [
        ([20, 20], "lengths \\[20, 20\\] sum to 40, but the dataset has 50 items"),
        ([60, -10], "lengths must be >= 0"),
        ([0.5, 0.2], "fractions must lie in \\[0, 1\\] and sum to 1"),
        ([], "lengths is empty"),
    ],
)
def test_random_split_bad_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        random_split(TensorDataset(np.arange(50)), lengths, seed=0)


def test_concat_dataset():
    both = TensorDataset(np.arange(3)) + TensorDataset(np.arange(10, 14))
    assert isinstance(both, ConcatDataset) and len(both) == 7
    assert [int(both[i][0]) for i in range(7)] == [0, 1, 2, 10, 11, 12, 13]
    assert int(both[-1][0]) == 13
    with pytest.raises(IndexError, match="index 7 out of range for 7 items"):
        both[7]


def test_tensor_dataset_bad_arrays():
    with pytest.raises(ValueError, match=r"same first dimension, got \[3, 4\]"):
        TensorDataset(np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="array 0 is 0-d"):
        TensorDataset(np.float32(1))


def test_random_sampler_epochs_and_replacement():
    sampler = RandomSampler(30, seed=9)
    first = list(sampler)
    assert sorted(first) == list(range(30)) and list(sampler) == first
    sampler.set_epoch(1)
    assert list(sampler) != first and sorted(sampler) == list(range(30))
    drawn = RandomSampler(5, replacement=True, num_samples=40, seed=1)
    values = list(drawn)
    assert len(drawn) == 40 and len(values) == 40 and set(values) <= set(range(5))
    with pytest.raises(ValueError, match="num_samples=6 exceeds the dataset's 5 items"):
        RandomSampler(5, num_samples=6)
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        sampler.set_epoch(-1)


def test_batch_sampler():
    assert list(BatchSampler(SequentialSampler(7), 3, drop_last=False)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(BatchSampler(range(7), 3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]
    assert len(BatchSampler(range(7), 3, drop_last=False)) == 3
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        BatchSampler(range(7), 0, drop_last=False)


@pytest.mark.parametrize("n, replicas", [(10, 3), (12, 4), (5, 2)])
def test_distributed_sampler_shards_disjoint_and_covering(n, replicas):
    padded = [DistributedSampler(n, num_replicas=replicas, rank=r, seed=2).indices() for r in range(replicas)]
    assert set(np.concatenate(padded).tolist()) == set(range(n))  # covering (padded by repeats)
    assert sum(map(len, padded)) == -(-n // replicas) * replicas
    cut = [
        DistributedSampler(n, num_replicas=replicas, rank=r, seed=2, drop_last=True).indices() for r in range(replicas)
    ]
    merged = np.concatenate(cut).tolist()
    assert len(set(merged)) == len(merged) == n // replicas * replicas  # disjoint


def test_distributed_sampler_old_import_path():
    from netcl.nn.parallel import DistributedSampler as from_parallel
    from netcl.nn.parallel.sampler import DistributedSampler as from_module

    assert from_parallel is DistributedSampler and from_module is DistributedSampler
