"""Exception classes of netcl.core: one line each, a clear message at the raise site."""


class NetclError(Exception):
    """Base class of every error netcl raises on purpose."""


class DeviceError(NetclError):
    """A device spec that names no device, or tensors of two devices in one op."""


class ShapeError(NetclError, ValueError):
    """A shape that is malformed or that cannot broadcast."""


class DTypeError(NetclError, TypeError):
    """A dtype netcl does not support, or one the device lacks."""
