"""Errors of netcl.runtime.distributed."""


class DistributedError(RuntimeError):
    """A collective could not complete (a peer failed, the group is unusable, ranks disagree)."""


class DistributedTimeoutError(DistributedError):
    """A collective did not complete within the timeout (a peer died, hangs or skipped it)."""
