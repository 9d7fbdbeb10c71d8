"""Spec path ``netcl.runtime.graph_fusion``: ``fuse_graph`` re-exported from ``netcl.jit``.

``fuse_graph`` traces and fuses with the JIT, which sits above the runtime (core <- runtime <-
autograd <- jit), so it lives in the ``netcl-jit`` distribution; this module only forwards to
it when that is installed. Without netcl-jit, importing it raises an ImportError that says so.
"""

from __future__ import annotations

import importlib
from typing import Any


def _jit() -> Any:
    try:
        return importlib.import_module("netcl.jit")
    except ModuleNotFoundError as exc:
        if exc.name in ("netcl", "netcl.jit", "netcl.autograd"):
            raise ImportError(
                "netcl.runtime.graph_fusion.fuse_graph is part of the 'netcl-jit' distribution (it needs the JIT, "
                "a layer above the runtime); install it from this repository: pip install ./packages/netcl-jit"
            ) from exc
        raise


_module = _jit()
fuse_graph = _module.fuse_graph
FusedGraph = _module.FusedGraph

__all__ = ["FusedGraph", "fuse_graph"]
