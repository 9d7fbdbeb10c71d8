"""``DistributedSampler`` moved to ``netcl.data`` (netcl-runtime); this path re-exports it."""

from netcl.data.sampler import DistributedSampler

__all__ = ["DistributedSampler"]
