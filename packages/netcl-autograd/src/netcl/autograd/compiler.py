"""Spec path ``netcl.autograd.compiler``: a re-export of the JIT compiler from ``netcl.jit``.

Needs the ``netcl-jit`` distribution; without it importing this module raises ImportError.
"""

from netcl.autograd import import_jit

_jit = import_jit("netcl.jit")

AutogradPrimitive = _jit.AutogradPrimitive
TraceNode = _jit.TraceNode
TracingContext = _jit.TracingContext
jit_compile = _jit.jit_compile
register_primitive = _jit.register_primitive
get_primitive = _jit.get_primitive
_PRIMITIVES = getattr(_jit, "_PRIMITIVES", None)
if _PRIMITIVES is None:
    _PRIMITIVES = import_jit("netcl.jit.primitive_registry").PRIMITIVES

__all__ = [
    "_PRIMITIVES",
    "AutogradPrimitive",
    "TraceNode",
    "TracingContext",
    "get_primitive",
    "jit_compile",
    "register_primitive",
]
