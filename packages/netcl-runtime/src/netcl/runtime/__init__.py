"""netcl.runtime: how code runs on a device (program cache, launch, eager kernels, capture)."""

from netcl.runtime.__about__ import __version__
from netcl.runtime.cache import KernelHandle, ProgramCache, program_cache
from netcl.runtime.capture import get_capture
from netcl.runtime.errors import CompileError, LaunchError, ReplayError
from netcl.runtime.launch import launch

__all__ = [
    "CompileError",
    "KernelHandle",
    "LaunchError",
    "ProgramCache",
    "ReplayError",
    "__version__",
    "get_capture",
    "launch",
    "program_cache",
]
