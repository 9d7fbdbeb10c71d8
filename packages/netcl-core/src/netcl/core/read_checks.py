"""Checks a read of a device tensor to the host passes before it runs (``Tensor.to_host``).

``CHECKS`` lists functions of the reading queue that raise to refuse the read; it is empty unless a
layer above installs one, and then the only cost on the read path is the test ``if CHECKS``.
netcl-runtime installs the capture's: a read inside a capture (``Graph.capture``, ``CompiledGraph``,
``fuse_graph``) is refused, because a replay re-enqueues the captured kernels only and would never
read the value again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: functions ``check(queue)`` that raise to refuse a host read on ``queue``; empty when none is installed
CHECKS: list[Callable[[Any], None]] = []
