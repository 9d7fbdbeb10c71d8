"""On-disk cache of built program binaries, so a new process does not rebuild.

Entries live under ``NETCL_CACHE_DIR`` (default: the platform's user cache dir), keyed on
the source, the build flags, the platform, the device name and the driver version. Each
file is ``MAGIC | sha256(payload) | payload`` and is written atomically (temp + rename):
a truncated or corrupt entry fails its checksum and is rebuilt. ``NETCL_CACHE=0`` turns
the cache off; a directory that cannot be written degrades to memory-only with one warning.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from pathlib import Path

import pyopencl as cl

_MAGIC = b"NETCLBIN1\n"
_DIGEST = 32


def cache_dir() -> Path | None:
    """The directory in use, or None when the disk cache is off."""
    if os.environ.get("NETCL_CACHE", "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    configured = os.environ.get("NETCL_CACHE_DIR")
    if configured:
        return Path(configured)
    import platformdirs

    return Path(platformdirs.user_cache_dir("netcl")) / "kernels"


def entry_key(source: str, flags: tuple[str, ...], device: cl.Device) -> str:
    """Hex key naming everything that changes the binary."""
    parts = [
        source,
        "\0".join(flags),
        device.platform.name,
        device.platform.version,
        device.name,
        device.driver_version,
        device.version,
        cl.VERSION_TEXT,
    ]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


class DiskCache:
    """Reads and writes program binaries; every failure degrades to "not cached"."""

    def __init__(self) -> None:
        self._warned = False
        self.loads = 0
        self.stores = 0
        self.corrupt = 0

    def load(self, key: str) -> bytes | None:
        directory = cache_dir()
        if directory is None:
            return None
        path = directory / key[:2] / f"{key}.bin"
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        header = len(_MAGIC) + _DIGEST
        payload = blob[header:]
        if blob[: len(_MAGIC)] != _MAGIC or hashlib.sha256(payload).digest() != blob[len(_MAGIC) : header]:
            self.corrupt += 1
            self.discard(key)
            return None
        self.loads += 1
        return payload

    def store(self, key: str, binary: bytes) -> None:
        directory = cache_dir()
        if directory is None or not binary:
            return
        target = directory / key[:2] / f"{key}.bin"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".bin")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(_MAGIC + hashlib.sha256(binary).digest() + binary)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            self.stores += 1
        except OSError as exc:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"netcl kernel disk cache at {directory} is not writable ({exc}); "
                    "continuing with the in-memory cache only",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def discard(self, key: str) -> None:
        directory = cache_dir()
        if directory is not None:
            (directory / key[:2] / f"{key}.bin").unlink(missing_ok=True)
