"""Exception classes of netcl.jit."""

from netcl.core.errors import NetclError


class JitError(NetclError):
    """The JIT was asked for something it cannot do (bad primitive, bad signature)."""


class TracerConversionError(JitError, TypeError):
    """A traced value was asked to become concrete (bool, float, to_host) while tracing."""


class UnwatchedCaptureWarning(UserWarning):
    """A jitted function reads a tensor that is not an argument from a place netcl cannot watch."""


class RetraceWarning(UserWarning):
    """A jitted function keeps being traced again: something it reads without taking it as an argument
    (a captured tensor, a Python number baked into its kernels, a module's mode) changes between calls."""
