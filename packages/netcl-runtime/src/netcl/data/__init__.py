"""netcl.data: datasets, samplers and the ``DataLoader`` (torch.utils.data's names and arguments).

Batches arrive as netcl Tensors on the loader's device; on OpenCL they are staged in pinned host
memory and copied on a copy Stream while the previous step computes. Docs: docs/data.md.
"""

from netcl.data.collate import default_collate
from netcl.data.dataset import ConcatDataset, Dataset, Subset, TensorDataset, random_split
from netcl.data.errors import DataLoaderError, WorkerDiedError
from netcl.data.loader import DataLoader
from netcl.data.sampler import BatchSampler, DistributedSampler, RandomSampler, Sampler, SequentialSampler

__all__ = [
    "BatchSampler",
    "ConcatDataset",
    "DataLoader",
    "DataLoaderError",
    "Dataset",
    "DistributedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "Subset",
    "TensorDataset",
    "WorkerDiedError",
    "default_collate",
    "random_split",
]
