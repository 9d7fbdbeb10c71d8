"""The program cache: built OpenCL programs, LRU in memory per context, backed by disk.

``program_cache.get_or_compile(key, source, ctx, build_flags)`` returns a ``KernelHandle``.
Entries are keyed on the caller's key, a hash of the source and the build flags as an
order-insensitive set, separately for each ``cl.Context``. ``clear_caches()`` empties the
program cache and every other in-memory cache that registered with ``register_cache``.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core.dtypes import REQUIRED_EXTENSION, STORAGE_ONLY, storage_only_message
from netcl.core.errors import DTypeError
from netcl.runtime import ptx_patch
from netcl.runtime.disk_cache import DiskCache, entry_key
from netcl.runtime.errors import CompileError

DEFAULT_MAX_ENTRIES = 1024
_EXTENSION_PRAGMA = re.compile(r"#pragma\s+OPENCL\s+EXTENSION\s+(\w+)\s*:\s*enable")
_KERNEL_NAME = re.compile(r"__kernel\b.*?\bvoid\s+(\w+)\s*\(", re.DOTALL)


def check_extensions(source: str, ctx: cl.Context) -> None:
    """Raise ``DTypeError`` before a build when ``source`` enables a dtype's extension that a device of
    ``ctx`` lacks (a float16 kernel where float16 is storage-only); other extensions are the build's."""
    needed = set(_EXTENSION_PRAGMA.findall(source))
    if not needed:
        return
    for device in ctx.devices:
        missing = needed - set(device.extensions.split())
        for dtype, extension in REQUIRED_EXTENSION.items():
            if extension in missing:
                if dtype in STORAGE_ONLY:
                    kernels = ", ".join(_KERNEL_NAME.findall(source)) or "?"
                    raise DTypeError(f"{storage_only_message(dtype, device.name.strip())} [kernel {kernels}]")
                raise DTypeError(f"dtype {dtype} needs {extension}, which device {device.name.strip()!r} lacks")


class KernelHandle:
    """A built ``cl.Program`` with every ``cl.Kernel`` resolved once, plus its source and flags."""

    __slots__ = ("program", "source", "build_flags", "context", "from_disk", "_kernels", "__weakref__")

    def __init__(self, program: cl.Program, source: str, build_flags: tuple[str, ...], context: cl.Context):
        self.program = program
        self.source = source
        self.build_flags = build_flags
        self.context = context
        self.from_disk = False
        self._kernels: dict[str, cl.Kernel] = {k.function_name: k for k in program.all_kernels()}

    @property
    def kernel_names(self) -> list[str]:
        return sorted(self._kernels)

    def kernel(self, name: str | None = None, scalar_dtypes: Sequence[Any] | None = None) -> cl.Kernel:
        """The resolved kernel ``name`` (the only one when None); optionally declare its arg dtypes.

        ``scalar_dtypes`` has one entry per kernel argument: a numpy dtype for scalars, None for
        buffers. Declared once, ``launch`` then converts Python numbers without guessing.
        """
        if name is None:
            if len(self._kernels) != 1:
                raise KeyError(f"program has kernels {self.kernel_names}; name the one you want")
            name = next(iter(self._kernels))
        try:
            kernel = self._kernels[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in program; it has {self.kernel_names}") from None
        if scalar_dtypes is not None:
            declared = tuple(None if d is None else np.dtype(d) for d in scalar_dtypes)
            kernel.set_scalar_arg_dtypes(list(declared))
            # Remembered on the kernel so a capture can convert Python numbers the same way.
            kernel._netcl_scalar_dtypes = declared
        return kernel

    def __repr__(self) -> str:
        return f"<KernelHandle kernels={self.kernel_names} flags={self.build_flags}>"


def declared_scalar_dtypes(kernel: cl.Kernel) -> tuple[np.dtype | None, ...] | None:
    """The per-argument dtypes declared through ``KernelHandle.kernel(name, scalar_dtypes)``."""
    return getattr(kernel, "_netcl_scalar_dtypes", None)


@dataclass
class CacheStats:
    """Counters of a ``ProgramCache`` (``stats()`` returns a snapshot)."""

    hits: int = 0
    misses: int = 0
    builds: int = 0
    disk_hits: int = 0
    build_seconds: float = 0.0
    evictions: int = 0
    entries: int = 0
    by_context: dict[str, int] = field(default_factory=dict)
    #: misses (builds + disk hits) per kind of key, e.g. ``"netcl.runtime.ops:ew"`` (see ``key_kind``)
    misses_by_kind: dict[str, int] = field(default_factory=dict)


class ProgramCache:
    """LRU cache of built programs, one ordered map per ``cl.Context``; thread-safe.

    ``max_entries`` bounds the entries of each context (least recently used go first).
    Contexts are held by the cache until ``clear()``, so a context's entries cannot be
    mistaken for those of a later context that reuses its address.
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._lock = threading.RLock()
        #: context int_ptr -> (the context, its LRU map of full key -> handle)
        self._by_context: dict[int, tuple[cl.Context, OrderedDict[tuple, KernelHandle]]] = {}
        self._stats = CacheStats()
        self.disk = DiskCache()
        #: bumped by ``clear`` and ``evict`` (not by the LRU's own evictions): a resolved kernel remembered under an
        #: older generation goes back to the cache (``ops._common.get_kernel``)
        self.generation = 0

    def _entries(self, ctx: cl.Context) -> OrderedDict[tuple, KernelHandle]:
        slot = self._by_context.get(ctx.int_ptr)
        if slot is None:
            slot = self._by_context[ctx.int_ptr] = (ctx, OrderedDict())
        return slot[1]

    # ---- public API ------------------------------------------------------------------------
    def get_or_compile(
        self, key: Hashable, source: str, ctx: cl.Context, build_flags: Iterable[str] = ()
    ) -> KernelHandle:
        """The cached program for (key, source, flags) on ``ctx``, building it on a miss."""
        flags = tuple(sorted(set(build_flags)))
        full_key = (key, _source_hash(source), flags)
        with self._lock:
            entries = self._entries(ctx)
            handle = entries.get(full_key)
            if handle is not None:
                entries.move_to_end(full_key)
                self._stats.hits += 1
                return handle
            self._stats.misses += 1
            kind = key_kind(key)
            self._stats.misses_by_kind[kind] = self._stats.misses_by_kind.get(kind, 0) + 1
        check_extensions(source, ctx)
        handle = self._build(source, ctx, flags)
        with self._lock:
            entries = self._entries(ctx)
            entries[full_key] = handle
            entries.move_to_end(full_key)
            while len(entries) > self.max_entries:
                entries.popitem(last=False)
                self._stats.evictions += 1
        return handle

    def evict(self, key: Hashable) -> int:
        """Drop every entry whose caller key is ``key`` (on every context); returns how many."""
        removed = 0
        with self._lock:
            for _, entries in self._by_context.values():
                for full_key in [k for k in entries if k[0] == key]:
                    del entries[full_key]
                    removed += 1
            self.generation += 1
        return removed

    def clear(self) -> None:
        """Drop every in-memory entry (the disk cache is left alone) and reset the stats."""
        with self._lock:
            self._by_context = {}
            self._stats = CacheStats()
            self.generation += 1

    def stats(self) -> CacheStats:
        """Counters since the last ``clear``: hits, misses, builds, disk hits, build seconds."""
        with self._lock:
            snapshot = CacheStats(
                **{k: v for k, v in vars(self._stats).items() if k not in ("by_context", "misses_by_kind")}
            )
            snapshot.misses_by_kind = dict(self._stats.misses_by_kind)
            snapshot.entries = sum(len(e) for _, e in self._by_context.values())
            snapshot.by_context = {
                f"{', '.join(d.name.strip() for d in ctx.devices)} @{ptr:#x}": len(e)
                for ptr, (ctx, e) in self._by_context.items()
            }
            return snapshot

    def __len__(self) -> int:
        with self._lock:
            return sum(len(e) for _, e in self._by_context.values())

    # ---- building --------------------------------------------------------------------------
    def _build(self, source: str, ctx: cl.Context, flags: tuple[str, ...]) -> KernelHandle:
        if not BUILD_LISTENERS:
            return self._build_program(source, ctx, flags)
        for listener in list(BUILD_LISTENERS):
            listener("start")
        try:
            return self._build_program(source, ctx, flags)
        finally:
            for listener in list(BUILD_LISTENERS):
                listener("end")

    def _build_program(self, source: str, ctx: cl.Context, flags: tuple[str, ...]) -> KernelHandle:
        devices = ctx.devices
        disk_key = entry_key(source, flags, devices[0]) if len(devices) == 1 else None
        if disk_key is not None:
            binary = self.disk.load(disk_key)
            if binary is not None:
                try:
                    program = cl.Program(ctx, devices, [binary]).build(options=list(flags))
                    handle = KernelHandle(program, source, flags, ctx)
                    handle.from_disk = True
                    with self._lock:
                        self._stats.disk_hits += 1
                    return handle
                except cl.Error:  # a binary the driver refuses is as good as corrupt
                    self.disk.corrupt += 1
                    self.disk.discard(disk_key)
        start = time.perf_counter()
        program = cl.Program(ctx, source)
        try:
            program.build(options=list(flags))
        except cl.RuntimeError as exc:
            raise CompileError(_compile_message(program, source, flags, exc)) from None
        if ptx_patch.needed(source):
            program = _patched(program, source, ctx, flags)
        handle = KernelHandle(program, source, flags, ctx)
        with self._lock:
            self._stats.builds += 1
            self._stats.build_seconds += time.perf_counter() - start
        if disk_key is not None:
            self.disk.store(disk_key, program.get_info(cl.program_info.BINARIES)[0])
        return handle


def _patched(program: cl.Program, source: str, ctx: cl.Context, flags: tuple[str, ...]) -> cl.Program:
    """``program`` rebuilt from its PTX after ``ptx_patch.patch`` (instructions OpenCL C cannot reach)."""
    try:
        binaries = [ptx_patch.patch(b.decode()).encode() for b in program.get_info(cl.program_info.BINARIES)]
    except (UnicodeDecodeError, ValueError) as exc:
        raise CompileError(f"PTX patch failed: {exc}") from None
    patched = cl.Program(ctx, ctx.devices, binaries)
    try:
        patched.build(options=list(flags))
    except cl.RuntimeError as exc:
        raise CompileError(_compile_message(patched, source, flags, exc)) from None
    return patched


def key_kind(key: Hashable) -> str:
    """A short label of a cache key: its leading strings, ``"netcl.runtime.ops:reduce"`` for
    ``("netcl.runtime.ops", ("reduce", ...))``, ``"jit"`` for ``("jit", label)``."""
    if isinstance(key, str):
        return key
    if not isinstance(key, tuple) or not key or not isinstance(key[0], str):
        return type(key).__name__
    inner = key[1] if len(key) > 1 else None
    if isinstance(inner, tuple) and inner and isinstance(inner[0], str):
        return f"{key[0]}:{inner[0]}"
    return key[0]


@functools.lru_cache(maxsize=4096)
def _source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


_LINE_REF = re.compile(r":(\d+):\d+:")


def _compile_message(program: cl.Program, source: str, flags: tuple[str, ...], exc: Exception) -> str:
    """Build log plus numbered source lines around each line the log points at."""
    logs = []
    for device in program.get_info(cl.program_info.DEVICES):
        try:
            log = program.get_build_info(device, cl.program_build_info.LOG)
        except cl.Error:
            log = ""
        logs.append(f"--- build log ({device.name.strip()}) ---\n{(log or str(exc)).strip()}")
    text_log = "\n".join(logs)
    lines = source.splitlines()
    wanted = sorted({int(m) for m in _LINE_REF.findall(text_log) if 0 < int(m) <= len(lines)})
    if not wanted:
        wanted = [len(lines)] if lines else []
    shown = sorted({n for w in wanted for n in range(max(1, w - 3), min(len(lines), w + 3) + 1)})
    excerpt = "\n".join(f"{'>' if n in wanted else ' '}{n:5d} | {lines[n - 1]}" for n in shown)
    return f"OpenCL build failed (flags {list(flags)}):\n{text_log}\n--- source ---\n{excerpt}"


#: Called with ``"start"`` and ``"end"`` around every program build or disk load, on the thread
#: that builds (``netcl.runtime.perf`` keeps builds out of timed regions through this).
BUILD_LISTENERS: list[Callable[[str], None]] = []

#: The process-wide program cache every netcl layer builds through.
program_cache = ProgramCache()

_CLEAR_HOOKS: list[Callable[[], None]] = []


def register_cache(clear: Callable[[], None]) -> None:
    """Register another in-memory cache's clear function with ``clear_caches``."""
    if clear not in _CLEAR_HOOKS:
        _CLEAR_HOOKS.append(clear)


def clear_caches() -> None:
    """Empty every in-memory cache: the program cache and all registered ones (not the disk)."""
    program_cache.clear()
    for clear in list(_CLEAR_HOOKS):
        clear()
