"""Small JSON files of per-machine facts (the engine choice, the CPU vector width) in the cache directory.

The directory is ``NETCL_CACHE_DIR``, else ``~/.cache/netcl``. Each file maps a fingerprint string to
an entry; a missing, unreadable or corrupt file reads as empty, and a read-only directory just means
the fact is found again next time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_file(name: str) -> Path:
    """``name`` in the cache directory."""
    base = os.environ.get("NETCL_CACHE_DIR", "").strip()
    root = Path(base) if base else Path.home() / ".cache" / "netcl"
    return root / name


def read_entries(path: Path) -> dict:
    """The file's entries ({} when it is missing, unreadable or not a JSON object)."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def write_entries(path: Path, entries: dict) -> None:
    """Replace the file atomically (a temporary file, then ``os.replace``); silent where it cannot."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache directory
