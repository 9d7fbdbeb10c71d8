"""netcl.runtime: how code runs on a device (program cache, launch, eager kernels, capture)."""

from netcl.runtime.__about__ import __version__
from netcl.runtime.cache import KernelHandle, ProgramCache, program_cache
from netcl.runtime.capture import get_capture
from netcl.runtime.errors import (
    CompileError,
    HostReadInCaptureError,
    LaunchError,
    ReplayError,
    StaleCaptureError,
    StaleResultError,
)
from netcl.runtime.launch import launch

__all__ = [
    "CompileError",
    "KernelHandle",
    "HostReadInCaptureError",
    "LaunchError",
    "ProgramCache",
    "ReplayError",
    "StaleCaptureError",
    "StaleResultError",
    "__version__",
    "get_capture",
    "launch",
    "program_cache",
]

# Cache extras, capture/replay, streams and perf counters (also at their submodule paths).
from netcl.runtime.cache import CacheStats, clear_caches, register_cache
from netcl.runtime.capture import capture_graph
from netcl.runtime.graph import Command, Graph, Launch
from netcl.runtime.launch import enqueue_copy, enqueue_fill
from netcl.runtime.perf import (
    PerfCounter,
    SectionStats,
    TimingRegion,
    enable_profiling,
    event_based_timing,
    timing_region,
)
from netcl.runtime.replay_results import ReplayResult
from netcl.runtime.scheduler import Stream
from netcl.runtime.sync import synchronize
from netcl.runtime.variable import Variable

__all__ += [
    "CacheStats",
    "Command",
    "Graph",
    "Launch",
    "PerfCounter",
    "ReplayResult",
    "SectionStats",
    "Stream",
    "TimingRegion",
    "Variable",
    "capture_graph",
    "clear_caches",
    "enqueue_copy",
    "enable_profiling",
    "enqueue_fill",
    "event_based_timing",
    "register_cache",
    "synchronize",
    "timing_region",
]

# Eager kernel library and the caching allocator (importing memory installs it on OpenCL devices).
from netcl.runtime import ops  # noqa: E402
from netcl.runtime.memory import MemoryStats, empty_cache, memory_stats, reset_peak_memory_stats  # noqa: E402

__all__ += ["MemoryStats", "empty_cache", "memory_stats", "ops", "reset_peak_memory_stats"]

# The global random generator (dropout masks draw their seeds from it).
from netcl.runtime.ops.random import initial_seed, manual_seed  # noqa: E402

__all__ += ["initial_seed", "manual_seed"]

# torch.use_deterministic_algorithms's names (netcl has no top-level namespace module to hold them).
from netcl.runtime.determinism import (  # noqa: E402
    are_deterministic_algorithms_enabled,
    is_deterministic_algorithms_warn_only_enabled,
    use_deterministic_algorithms,
)

__all__ += [
    "are_deterministic_algorithms_enabled",
    "is_deterministic_algorithms_warn_only_enabled",
    "use_deterministic_algorithms",
]
