"""netcl.runtime.distributed: collectives on Tensors over MPI (the ``mpi`` extra: mpi4py + mpich).

Run one process per device under an MPI launcher (``mpiexec -n 2 python train.py``)::

    from netcl.runtime import distributed as dist

    info = dist.init()                 # rank, world size, this rank's device (set as default)
    dist.all_reduce(t, op="mean")      # in place, bit-identical on every rank
    work = dist.all_reduce_async(t)    # ... overlap other work ...; work.wait()
    dist.broadcast(t, root=0); everyone = dist.all_gather(t); dist.barrier()

Everything is host-staged through pinned (OpenCL ``ALLOC_HOST_PTR``, mapped) buffers, works on
OpenCL devices and on the NumPy backend, and waits at most ``NETCL_DIST_TIMEOUT`` seconds
(default 300, or ``init(timeout=)``): a rank that died or skipped a collective raises
``DistributedTimeoutError`` on the others instead of hanging them.
"""

from netcl.runtime.distributed.allreduce import AllReduceWork, progress
from netcl.runtime.distributed.collectives import (
    REDUCE_OPS,
    CompletedWork,
    all_gather,
    all_gather_object,
    all_reduce,
    all_reduce_async,
    all_reduce_coalesced_async,
    barrier,
    broadcast,
    broadcast_object,
)
from netcl.runtime.distributed.errors import DistributedError, DistributedTimeoutError
from netcl.runtime.distributed.group import (
    TIMEOUT_ENV,
    DistInfo,
    get_rank,
    get_world_size,
    init,
    is_initialized,
)

__all__ = [
    "REDUCE_OPS",
    "TIMEOUT_ENV",
    "AllReduceWork",
    "CompletedWork",
    "DistInfo",
    "DistributedError",
    "DistributedTimeoutError",
    "all_gather",
    "all_gather_object",
    "all_reduce",
    "all_reduce_async",
    "all_reduce_coalesced_async",
    "barrier",
    "broadcast",
    "broadcast_object",
    "get_rank",
    "get_world_size",
    "init",
    "is_initialized",
    "progress",
]
