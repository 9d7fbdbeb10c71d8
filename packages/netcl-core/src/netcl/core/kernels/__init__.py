"""C source shared by every generated kernel."""

from netcl.core.kernels.primitives import PRIMITIVE_NAMES, PRIMITIVE_PREAMBLE

__all__ = ["PRIMITIVE_NAMES", "PRIMITIVE_PREAMBLE"]
