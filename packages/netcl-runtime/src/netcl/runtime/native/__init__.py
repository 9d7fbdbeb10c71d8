"""netcl's compiled launch, built at first use: ``launcher()`` is the C ``Launcher`` type or None.

``PreparedLaunch`` calls a kernel through it where it exists (one C function sets the per-call arguments and
enqueues, see ``launcher.c``) and through its generated Python function where it does not; both set the same
arguments on the same kernel, so results do not depend on which ran. ``allocator()`` gives a ``DevicePool`` its
hot path the same way (a cached block popped, wrapped and tagged in C; the Python method for everything else).

The extension is compiled from ``launcher.c`` (beside this file) with the compiler and flags Python was built
with (``sysconfig``'s ``LDSHARED``, ``CCSHARED`` and include directory) into ``<NETCL_CACHE_DIR>/native/`` (a
temporary directory while the disk cache is off), named by a hash of the source, the interpreter's ABI and the
command, written atomically (two processes building at once both load a whole file). No OpenCL header or library
is needed: the OpenCL entry points come in as addresses of the loader pyopencl loaded (``enqueue``).

``NETCL_NATIVE=0`` turns it off (read when a launch is prepared); where it cannot be built (no C compiler, no
Python headers, Windows without ``LDSHARED``) or loaded, netcl runs the Python path and ``unavailable()`` says
why. The choice is per process and does not change numbers (docs/eager.md, "Compiled launch").
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV_VAR = "NETCL_NATIVE"
SOURCE = Path(__file__).with_name("launcher.c")
#: seconds a build may take before it counts as failed
BUILD_TIMEOUT = 120


class BuildError(Exception):
    """Why the extension could not be built or loaded here (its message says what failed)."""


def enabled() -> bool:
    """Whether ``NETCL_NATIVE`` allows the compiled launch (unset, ``1``, ``auto``: yes; ``0``/``off``: no)."""
    return os.environ.get(ENV_VAR, "auto").strip().lower() not in ("0", "false", "off", "no")


def launcher() -> type | None:
    """The compiled ``Launcher`` type, or None where ``NETCL_NATIVE`` is off or it cannot be built or loaded."""
    module = _loaded()
    return None if module is None else module.Launcher


def allocator() -> tuple[type, type] | None:
    """The compiled ``(Allocator, Token)`` types of a ``DevicePool``'s hot path, or None as for ``launcher``."""
    module = _loaded()
    return None if module is None else (module.Allocator, module.Token)


def maker(cls: type, given: Sequence[str], constants: Mapping[str, Any]) -> Any:
    """A C callable making instances of ``cls`` (a class of ``__slots__`` without a ``__new__``) without its
    ``__init__``: ``maker(*values)`` is ``object.__new__(cls)`` with the slots ``given`` set to ``values`` in order and
    each slot of ``constants`` to its value; None as for ``launcher``. That this is what ``cls(*values)`` makes is
    the caller's to keep (TypeError for a name that is not a writable slot)."""
    module = _loaded()
    return None if module is None else module.Maker(cls, tuple(given), dict(constants))


def unavailable() -> str | None:
    """Why the compiled launch is not in use (None when it is)."""
    return f"{ENV_VAR} is off" if not enabled() else _module()[1]


def _loaded() -> ModuleType | None:
    """The extension where ``NETCL_NATIVE`` allows it and it is built, else None."""
    return _module()[0] if enabled() else None


@functools.cache
def entry_points() -> tuple[int, int] | None:
    """The addresses of ``clSetKernelArg`` and ``clEnqueueNDRangeKernel`` in the loader pyopencl uses (None where
    it cannot be found)."""
    from netcl.runtime.enqueue import loaded_opencl

    lib = loaded_opencl()
    if lib is None or not hasattr(lib, "clSetKernelArg") or not hasattr(lib, "clEnqueueNDRangeKernel"):
        return None
    return (
        ctypes.cast(lib.clSetKernelArg, ctypes.c_void_p).value,
        ctypes.cast(lib.clEnqueueNDRangeKernel, ctypes.c_void_p).value,
    )


@functools.cache
def _module() -> tuple[ModuleType | None, str | None]:
    """This process's extension, built once: (the module, None) or (None, why not)."""
    from netcl.runtime.disk_cache import cache_dir

    if entry_points() is None:
        return None, "the OpenCL loader pyopencl uses cannot be found"
    root = cache_dir()
    try:
        if root is None:
            with tempfile.TemporaryDirectory(prefix="netcl-native-") as scratch:
                return build(Path(scratch)), None  # the loaded library stays mapped after its file is gone
        return build(root / "native"), None
    except BuildError as exc:
        return None, str(exc)


def build_command(source: Path, target: Path) -> list[str] | None:
    """The command that compiles ``source`` into extension module ``target`` (None where Python's build
    configuration names no shared-library linker, as on Windows)."""
    linker = sysconfig.get_config_var("LDSHARED")
    include = sysconfig.get_paths().get("include")
    if not linker or not include:
        return None
    shared = sysconfig.get_config_var("CCSHARED") or ""
    return [*shlex.split(linker), *shlex.split(shared), "-O2", "-I", include, str(source), "-o", str(target)]


def build(directory: Path, command: list[str] | None = None) -> ModuleType:
    """The extension built from ``SOURCE`` into ``directory`` (reused when already there) and loaded; ``BuildError``
    saying why where it cannot be. ``command``: the compile command to use, ``{source}`` and ``{target}`` filled in
    (tests); default ``build_command``."""
    text = SOURCE.read_bytes()
    template = command if command is not None else build_command(Path("{source}"), Path("{target}"))
    if template is None:
        raise BuildError("Python's build configuration names no C compiler (sysconfig LDSHARED)")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256(b"\0".join([text, sys.version.encode(), suffix.encode(), *map(str.encode, template)]))
    target = directory / f"_launcher-{key.hexdigest()[:24]}{suffix}"
    if not target.exists():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as scratch:
                partial = Path(scratch) / target.name
                filled = [part.format(source=SOURCE, target=partial) for part in template]
                done = subprocess.run(filled, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
                if done.returncode != 0 or not partial.exists():
                    raise BuildError(f"building {SOURCE.name} failed ({filled[0]}): {_first_error(done)}")
                os.replace(partial, target)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BuildError(f"building {SOURCE.name} failed: {exc}") from exc
    return _load(target)


def _first_error(done: subprocess.CompletedProcess) -> str:
    """The compiler's first error line (else its last line, else its exit status)."""
    lines = (done.stderr or done.stdout or "").strip().splitlines()
    errors = [line.strip() for line in lines if "error" in line.lower()]
    return (errors or lines[-1:] or [f"exit status {done.returncode}"])[0]


def _load(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader("_launcher", str(path))
    spec = importlib.util.spec_from_file_location("_launcher", path, loader=loader)
    try:
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        loader.exec_module(module)
    except (ImportError, OSError) as exc:
        raise BuildError(f"loading {path.name} failed: {exc}") from exc
    return module
