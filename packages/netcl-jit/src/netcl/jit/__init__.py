"""netcl.jit: fuse chains of elementwise ops into one forward and one backward kernel."""

from netcl.jit.__about__ import __version__
from netcl.jit.builtin_primitives import register_builtins
from netcl.jit.builtin_row_ops import register_builtin_row_ops
from netcl.jit.compiler import JitFunction, jit_compile
from netcl.jit.errors import JitError, RetraceWarning, TracerConversionError, UnwatchedCaptureWarning
from netcl.jit.primitive_registry import PRIMITIVES
from netcl.jit.primitives import AutogradPrimitive, get_primitive, register_primitive, registry_version
from netcl.jit.tracing import TraceNode, TracingContext

#: The primitive registry (``primitive_registry.PRIMITIVES``) under its older name.
_PRIMITIVES = PRIMITIVES

register_builtins()
register_builtin_row_ops()

from netcl.jit import row_eager  # noqa: E402,F401  (the built-in row ops on the fused row kernels)

__all__ = [
    "_PRIMITIVES",
    "AutogradPrimitive",
    "JitError",
    "JitFunction",
    "RetraceWarning",
    "TraceNode",
    "TracerConversionError",
    "TracingContext",
    "UnwatchedCaptureWarning",
    "__version__",
    "get_primitive",
    "jit_compile",
    "register_primitive",
    "registry_version",
]

# Fused training patterns (the detection loss) and fuse_graph (spec path netcl.runtime.graph_fusion).
from netcl.jit.graph_fusion import FusedGraph, fuse_graph  # noqa: E402
from netcl.jit.training_compiler import (  # noqa: E402
    FusedDetectionLossPlan,
    TrainingGraphCompiler,
    TrainingPattern,
    fused_weighted_bce_smooth_l1_loss,
    get_training_compiler,
)

__all__ += [
    "FusedDetectionLossPlan",
    "FusedGraph",
    "TrainingGraphCompiler",
    "TrainingPattern",
    "fuse_graph",
    "fused_weighted_bce_smooth_l1_loss",
    "get_training_compiler",
]
