"""netcl.nn.parallel: data-parallel training over MPI (``DistributedDataParallel``, ``DistributedSampler``).

Collectives live in ``netcl.runtime.distributed`` (the netcl-runtime ``mpi`` extra).
"""

from netcl.nn.parallel.distributed import DistributedDataParallel, SyncStats
from netcl.nn.parallel.sampler import DistributedSampler

__all__ = ["DistributedDataParallel", "DistributedSampler", "SyncStats"]
