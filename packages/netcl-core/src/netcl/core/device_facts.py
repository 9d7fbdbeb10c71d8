"""``DeviceFacts``: what the device probes (``engine_choice``, ``vector_width``) read of a device.

``netcl.core.devices.Device`` has every attribute here; the probes take this Protocol instead of
``Device`` so that ``devices`` (which calls them) is the only one of the three that knows ``Device``.
"""

from __future__ import annotations

from typing import Any, Protocol


class DeviceFacts(Protocol):
    """The attributes of a ``Device`` the probes read (``cl_device``, ``context`` and ``queue`` are None,
    or pyopencl's objects, for an OpenCL device)."""

    @property
    def spec(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def cl_device(self) -> Any: ...

    @property
    def platform_name(self) -> str: ...

    @property
    def driver_version(self) -> str: ...

    @property
    def vector_width(self) -> int: ...

    @property
    def context(self) -> Any: ...

    @property
    def queue(self) -> Any: ...
