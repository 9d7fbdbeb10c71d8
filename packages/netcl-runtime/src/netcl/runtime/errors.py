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
    it read is in the other mode (``train()`` / ``eval()``), a parameter was frozen or unfrozen
    (``requires_grad``) or holds another tensor (``Module.to``); capture the step again."""


class HostReadInCaptureError(ReplayError, RuntimeError):
    """A device value was read to the host while a step was being captured: the replays would not read it
    again, so what the host decided from it would stay as captured (torch refuses a sync in a CUDA graph
    capture alike)."""
