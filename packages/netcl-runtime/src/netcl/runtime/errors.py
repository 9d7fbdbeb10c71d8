"""Exception classes of netcl.runtime."""

from netcl.core.errors import NetclError


class CompileError(NetclError):
    """An OpenCL program failed to build; the message holds the build log and the source lines."""


class ReplayError(NetclError):
    """A captured graph was replayed with buffers that do not match what was captured."""


class LaunchError(NetclError, ValueError):
    """A kernel launch was asked for with arguments that cannot work."""


class StaleResultError(ReplayError):
    """A replay's result was read after a later replay of the same graph overwrote its buffer."""


class StaleCaptureError(ReplayError):
    """A captured step was replayed after something it baked in changed: a module whose training flag
    it read is in the other mode (``train()`` / ``eval()``); capture the step again in the new mode."""
