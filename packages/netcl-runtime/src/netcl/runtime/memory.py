"""A caching device allocator: buffers are taken from and returned to a pool keyed by size class.

Importing ``netcl.runtime`` installs it on every OpenCL ``Device`` (``device.allocator``, which
core's ``Tensor.empty`` calls), unless ``NETCL_CACHING_ALLOCATOR=0``.

How a buffer comes back: the pool owns one reference to each device allocation (``cl_mem``)
and hands out a *second* ``cl.Buffer`` wrapper of it, tagged with a small block token. When
that wrapper is garbage collected - that is, when no tensor, view, captured launch or user
variable holds it any more - the token returns the block to the pool. So a buffer is never
reused while anything in Python can still reach it (a ``Graph`` that recorded it keeps it).

Size classes: at most 512 bytes -> 512; up to 1 MiB -> the next power of two; above that,
steps of a quarter octave (1, 1.25, 1.5, 1.75 x 2**k), so at most 25% is wasted. A request
is served by a cached block of exactly its class, else by a fresh device allocation. If a
fresh allocation fails, or would take the pool past the device's global memory, the cached
blocks are released first and it is tried again. A request larger than the device allows
raises ``MemoryError`` naming the bytes asked for and the limit (core's ``check_allocation``).

On a CPU device whose memory the host shares (``host_views.coherent``) each block is mapped once, when it is
allocated, for as long as it lives; ``host_view`` gives a host array over a pooled buffer for ``host_blas``.

Reuse and queues: a block freed while kernels that use it are still queued is handed out
again at once. That is safe on one in-order queue (the device's default queue, which every
eager op uses): later work on that queue runs after the earlier work. Work on other queues
(``Stream``) that uses a tensor must be finished or waited for before the tensor is dropped.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat, starmap

import numpy as np
import pyopencl as cl

from netcl.core import Device, devices, get_device
from netcl.core.devices import check_allocation, raw_allocate
from netcl.runtime import host_views, native, results

_from_int_ptr = cl.Buffer.from_int_ptr

ENV_VAR = "NETCL_CACHING_ALLOCATOR"
MIN_BLOCK = 512
POW2_LIMIT = 1 << 20
#: nbytes -> the event base of its size class (``_base_of``), for requests up to 64 KiB (below any device's
#: allocation limit)
_CLASSES: dict[int, int] = {}
_MEMO_LIMIT = 1 << 16
_MEMO_ENTRIES = 4096


def size_class(nbytes: int) -> int:
    """The block size a request of ``nbytes`` is served from."""
    if nbytes <= MIN_BLOCK:
        return MIN_BLOCK
    if nbytes <= POW2_LIMIT:
        return 1 << (nbytes - 1).bit_length()
    step = (1 << (nbytes.bit_length() - 1)) // 4
    return -(-nbytes // step) * step


@dataclass
class MemoryStats:
    """A snapshot of one device's pool (all sizes in bytes)."""

    allocated_bytes: int = 0  #: held by live buffers (block sizes)
    requested_bytes: int = 0  #: what the live buffers were asked for
    cached_bytes: int = 0  #: free blocks kept for reuse
    reserved_bytes: int = 0  #: allocated + cached: what the pool holds on the device
    peak_allocated_bytes: int = 0
    served_from_pool: int = 0  #: requests served by a cached block
    fresh_allocations: int = 0  #: requests that needed a new device allocation
    frees: int = 0  #: blocks returned to the pool
    active_blocks: int = 0
    cached_blocks: int = 0


#: A pool event is one int: ``base + requested``, positive for a block taken from the free lists, negative for a
#: block returned to them (an int, not a tuple: making it starts no collection). ``base`` is the block size's code
#: shifted past the requested bytes (``_base_of``), so that every event fits a signed 64-bit integer and the
#: statistics fold a long queue of them in a few NumPy calls (``_fold_array``).
_EVENT_BITS = 44  # requests of up to 16 TiB
_EVENT_MASK = (1 << _EVENT_BITS) - 1
_MAX_CODES = 1 << (63 - _EVENT_BITS)
#: block size -> its base (code << _EVENT_BITS), and code -> block size, shared by every pool; grown under the lock
_BASES: dict[int, int] = {}
_CODE_SIZES: list[int] = [0]  # code 0 unused: an event is never 0, even for a request of 0 bytes
_BASES_LOCK = threading.Lock()


def _base_of(size: int) -> int:
    """The event base of blocks of ``size`` bytes (a new code for a size not seen before)."""
    base = _BASES.get(size)
    if base is None:
        with _BASES_LOCK:
            base = _BASES.get(size)
            if base is None:
                if len(_CODE_SIZES) >= _MAX_CODES:
                    raise MemoryError(
                        f"the device pools track at most {_MAX_CODES - 1} block sizes; {size} is one more"
                    )
                base = _BASES[size] = len(_CODE_SIZES) << _EVENT_BITS
                _CODE_SIZES.append(size)
    return base


def _size_of(base: int) -> int:
    """The block size of event base ``base``."""
    return _CODE_SIZES[base >> _EVENT_BITS]


#: folds of at most this many events run a loop, longer ones NumPy: below it NumPy's fixed cost is more than the
#: loop's (benchmarks/RESULTS.md, "Forty-fifth session")
_LOOP_FOLD_MAX = 16
_SIZES_ARRAY: list[np.ndarray] = [np.zeros(0, np.int64)]  # _CODE_SIZES as an array, remade when it grows


def _fold_loop(events: Iterable[int], allocated: int, peak: int) -> tuple[int, int, int, int, int]:
    """(allocated, requested change, peak, taken, returned) after ``events`` (in order) from ``allocated`` bytes
    held and a peak of ``peak``; ``_fold_array``'s result for a few events."""
    requested = taken = returned = 0
    for event in events:
        if event > 0:
            allocated += _CODE_SIZES[event >> _EVENT_BITS]
            requested += event & _EVENT_MASK
            taken += 1
            if allocated > peak:
                peak = allocated
        else:
            allocated -= _CODE_SIZES[-event >> _EVENT_BITS]
            requested -= -event & _EVENT_MASK
            returned += 1
    return allocated, requested, peak, taken, returned


def _fold_array(events: np.ndarray, allocated: int, peak: int) -> tuple[int, int, int, int, int]:
    """``_fold_loop``'s result for ``events`` as an int64 array: the running sum of the signed block sizes gives the
    exact peak."""
    sizes = _SIZES_ARRAY[0]
    if len(sizes) != len(_CODE_SIZES):
        sizes = _SIZES_ARRAY[0] = np.array(_CODE_SIZES, dtype=np.int64)
    taken_mask = events > 0
    magnitudes = np.abs(events)
    block_sizes = sizes[magnitudes >> _EVENT_BITS]
    held = np.cumsum(np.where(taken_mask, block_sizes, -block_sizes))
    held += allocated
    requested = magnitudes & _EVENT_MASK
    taken = int(np.count_nonzero(taken_mask))
    change = int(np.where(taken_mask, requested, -requested).sum())
    return int(held[-1]), change, max(peak, int(held.max())), taken, len(events) - taken


class BlockToken(tuple):
    """``(free, events, block, event)``, riding on a handed-out buffer wrapper: returns the block (``(real, ptr)``:
    the pool's ``cl.Buffer`` and its ``int_ptr``) when the wrapper dies, straight onto its size class's free list
    ``free`` (``list.append`` is atomic), and appends the opposite of ``event`` to ``events`` for the statistics.
    A tuple, not a class with fields: it is made for every eager op's output, and a tuple is the cheapest object
    to make (see benchmarks/RESULTS.md, "Forty-sixth session"). ``native``'s ``Token`` is this in C, with no
    Python ``__del__`` (a pool made where ``native`` is built uses it: ``DevicePool._token``)."""

    __slots__ = ()

    @property
    def real(self) -> cl.Buffer:
        """The pool's own ``cl.Buffer`` of the block (the wrapper it rides on is a second handle of it)."""
        return self[2][0]

    def __del__(self) -> None:
        # not contextlib.suppress: it costs more on every free (see benchmarks/RESULTS.md, "Measurements
        # moved out of source docstrings", memory.py)
        try:
            self[0].append(self[2])
            self[1].append(-self[3])
        except Exception:  # at interpreter shutdown there is nothing to return to
            pass


class _CountToken:
    """Rides on an unpooled buffer; takes its bytes off the statistics when the buffer dies."""

    __slots__ = ("released", "size", "requested")

    def __init__(self, released: deque, size: int, requested: int) -> None:
        self.released = released
        self.size = size
        self.requested = requested

    def __del__(self) -> None:
        try:  # noqa: SIM105
            self.released.append((self.size, self.requested))
        except Exception:
            pass


class DevicePool:
    """The pool of one OpenCL device; thread-safe.

    The hot path (a cached block of the size class) takes no lock: it pops the block from its size
    class's free list (atomic) and appends one event to a queue; a dying wrapper's token puts its block
    back on that list and appends the opposite event. The statistics fold the events in order (so the
    peak is exact) when they are read, when an allocation needs a fresh block, and every
    ``_FOLD_EVERY`` events; everything else (fresh blocks, releases, statistics) holds the lock.
    """

    _FOLD_EVERY = 4096

    def __init__(self, device: Device) -> None:
        self.device = device
        self._lock = threading.Lock()
        #: event base of a block size (``_base_of``) -> its free blocks as ``(real, real.int_ptr)`` (the pointer read
        #: once, not at every allocation); a list is never replaced (tokens of live wrappers hold it)
        self._free: dict[int, list[tuple[cl.Buffer, int]]] = {}
        self._events: deque[int] = deque()
        self._released: deque[tuple[int, int]] = deque()  # (size, requested) of dead unpooled buffers
        self._stats = MemoryStats()
        self._limit: int | None = None  # min(max alloc, global memory), read once
        self._taggable = True  # False on a pyopencl whose buffers take no attributes: no pooling
        self._views: bool | None = None  # whether fresh blocks are mapped for host views (asked at the first)
        self._classes: dict[int, int] = {}  # nbytes -> event base of requests above _MEMO_LIMIT
        #: the token type of handed-out wrappers, and ``allocate``'s hot path in C, where ``native`` is built (the
        #: ``Allocator`` instance shadows the method, which it calls for everything but a cached block)
        self._token: type = BlockToken
        compiled = native.allocator()
        if compiled is not None:
            results.install()  # the outputs' tensors made in C too
            allocator, self._token = compiled
            fallback = DevicePool.allocate.__get__(self)
            self.allocate = allocator(  # type: ignore[method-assign]
                self, self._free, _CLASSES, self._classes, self._events, _from_int_ptr, fallback
            )

    def allocate(self, device: Device, nbytes: int) -> cl.Buffer:
        """A buffer of at least ``nbytes`` (signature of ``Device.allocator``).

        The common case (a cached block of the size class) takes no lock and makes one wrapper: this
        is on the path of every op's output, a cache-hit jit call included.
        """
        if type(nbytes) is not int:
            nbytes = int(nbytes)
        base = _CLASSES.get(nbytes)
        if base is None:
            base = self._classes.get(nbytes)
            if base is None:
                base = self._base_for(device, nbytes)
        blocks = self._free.get(base)
        if blocks:
            try:
                block = blocks.pop()
            except IndexError:  # another thread took the last one
                pass
            else:
                event = base + nbytes
                events = self._events
                events.append(event)
                wrapper = _from_int_ptr(block[1], retain=True)
                wrapper._netcl_block = self._token((blocks, events, block, event))
                if len(events) > self._FOLD_EVERY:
                    self._fold()
                return wrapper
        return self._allocate_fresh(base, nbytes)

    def _allocate_fresh(self, base: int, nbytes: int) -> cl.Buffer:
        """A new device block of the size of event base ``base`` for a request of ``nbytes`` (the free list of its
        class is empty)."""
        size = _size_of(base)
        real = self._fresh(size, nbytes)
        wrapper = self._wrap(real, base, nbytes)
        if wrapper is None:  # a pyopencl without dynamic attributes: no pooling
            wrapper, size = real, 0
        with self._lock:
            self._account(size, nbytes)
        return wrapper

    def allocate_unpooled(self, device: Device, nbytes: int) -> cl.Buffer:
        """A fresh device buffer, released to the driver when it dies, still counted in the statistics
        (allocated and peak bytes): the allocator while the pool is switched off."""
        buffer = raw_allocate(device, nbytes)
        size = max(int(nbytes), 4)
        try:
            buffer._netcl_count = _CountToken(self._released, size, int(nbytes))
        except (AttributeError, TypeError):  # a pyopencl without dynamic attributes: not counted
            return buffer
        with self._lock:
            self._stats.allocated_bytes += size
            self._stats.requested_bytes += int(nbytes)
            if self._stats.allocated_bytes > self._stats.peak_allocated_bytes:
                self._stats.peak_allocated_bytes = self._stats.allocated_bytes
        return buffer

    def _account(self, size: int, nbytes: int) -> None:
        """Count a handed-out block of ``size`` (0: an unpooled buffer); the caller holds the lock."""
        stats = self._stats
        stats.allocated_bytes += size
        stats.requested_bytes += nbytes
        stats.active_blocks += 1 if size else 0
        if stats.allocated_bytes > stats.peak_allocated_bytes:
            stats.peak_allocated_bytes = stats.allocated_bytes

    def _base_for(self, device: Device, nbytes: int) -> int:
        """The event base of the block size for ``nbytes`` (checked against the device's limits; memoized when
        small)."""
        limit = self._limit
        if limit is None:
            limit = self._limit = min(device.max_alloc_size, device.global_mem_size)
        if nbytes > limit:
            check_allocation(device, nbytes)  # raises MemoryError naming the bytes and the limit
        size = size_class(nbytes)
        if size > limit:
            return _base_of(max(nbytes, 4))
        base = _base_of(size)
        if nbytes <= _MEMO_LIMIT:
            if len(_CLASSES) < _MEMO_ENTRIES:
                _CLASSES[nbytes] = base  # under every device's limit, so shared by all pools
        elif len(self._classes) < _MEMO_ENTRIES:
            self._classes[nbytes] = base  # checked against this device's limit: this pool's own
        return base

    def _wrap(self, real: cl.Buffer, base: int, nbytes: int) -> cl.Buffer | None:
        """A second wrapper of ``real`` that returns the block when it dies (None if it cannot be tagged)."""
        if not self._taggable:
            return None
        blocks = self._free.setdefault(base, [])
        try:
            block = (real, real.int_ptr)
            wrapper = _from_int_ptr(block[1], retain=True)
            wrapper._netcl_block = self._token((blocks, self._events, block, base + nbytes))
        except (AttributeError, TypeError):
            self._taggable = False
            return None
        return wrapper

    def _fresh(self, size: int, nbytes: int) -> cl.Buffer:
        with self._lock:
            self._drain()
            self._stats.fresh_allocations += 1
            over = self._stats.allocated_bytes + self._stats.cached_bytes + size > self.device.global_mem_size
        if over:
            self.empty_cache()
        try:
            return self._mapped(cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size=size), size)
        except (cl.MemoryError, cl.RuntimeError, cl.LogicError):
            self.empty_cache()
            try:
                return self._mapped(cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size=size), size)
            except (cl.MemoryError, cl.RuntimeError, cl.LogicError) as exc:
                raise MemoryError(
                    f"cannot allocate {nbytes} bytes (block of {size}) on {self.device.name!r}: {exc}; "
                    f"device global memory is {self.device.global_mem_size} bytes, "
                    f"{self._stats.allocated_bytes} held by live tensors"
                ) from None

    def _mapped(self, real: cl.Buffer, size: int) -> cl.Buffer:
        """``real``, mapped for the block's life where the device's pool keeps host views (``host_views``)."""
        if self._views is None:
            self._views = host_views.coherent(self.device)
        if self._views:  # enqueued, not waited for: ``host_view`` waits for it the first time it is asked
            real._netcl_host, real._netcl_mapping = host_views.map_block(self.device.queue, real, size, blocking=False)
        return real

    def _fold(self) -> None:
        """Fold the queued events now (the hot path's call every ``_FOLD_EVERY`` events)."""
        with self._lock:
            self._drain()

    def _drain(self) -> None:
        """Fold queued events into the statistics (caller holds the lock).

        A taken block moves its bytes from cached to allocated, a returned one back; a block released
        by ``empty_cache`` before its return event was folded was already taken off the cached bytes there.
        """
        stats = self._stats
        released = self._released
        while released:
            size, requested = released.popleft()
            stats.allocated_bytes -= size
            stats.requested_bytes -= requested
        events = self._events
        count = len(events)  # events appended meanwhile wait for the next fold
        if not count:
            return
        popleft = events.popleft
        start = stats.allocated_bytes
        taken_off = starmap(popleft, repeat((), count))
        if count <= _LOOP_FOLD_MAX:
            folded = _fold_loop(taken_off, start, stats.peak_allocated_bytes)
        else:
            folded = _fold_array(np.fromiter(taken_off, np.int64, count), start, stats.peak_allocated_bytes)
        allocated, requested, stats.peak_allocated_bytes, taken, returned = folded
        # a taken block moves its bytes from cached to allocated, a returned one back: cached moves opposite
        stats.allocated_bytes = allocated
        stats.requested_bytes += requested
        stats.cached_bytes -= allocated - start
        stats.cached_blocks += returned - taken
        stats.active_blocks += taken - returned
        stats.served_from_pool += taken
        stats.frees += returned

    def empty_cache(self) -> int:
        """Release every cached block to the device; returns the bytes released."""
        released = 0
        with self._lock:
            self._drain()
            for base, blocks in self._free.items():
                size = _size_of(base)
                while True:  # pop, not clear: a token may append to the list meanwhile
                    try:
                        blocks.pop()
                    except IndexError:
                        break
                    released += size
                    # a block whose return event is not folded yet: the fold adds it back
                    self._stats.cached_bytes -= size
                    self._stats.cached_blocks -= 1
        return released

    def stats(self) -> MemoryStats:
        with self._lock:
            self._drain()
            snapshot = MemoryStats(**vars(self._stats))
        snapshot.reserved_bytes = snapshot.allocated_bytes + snapshot.cached_bytes
        return snapshot

    def reset_peak(self) -> None:
        with self._lock:
            self._drain()
            self._stats.peak_allocated_bytes = self._stats.allocated_bytes


_POOLS: dict[Device, DevicePool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(device: Device | str | None = None) -> DevicePool | None:
    """The pool of ``device`` (None for the NumPy backend)."""
    target = get_device(device)
    if target.kind != "opencl":
        return None
    with _POOLS_LOCK:
        pool = _POOLS.get(target)
        if pool is None:
            pool = _POOLS[target] = DevicePool(target)
        return pool


def host_view(buffer: cl.Buffer, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """A host array of ``shape`` and ``dtype`` over the start of ``buffer``, a pooled block of a device whose pool
    keeps host views (``host_views``), else None (other devices, unpooled buffers, sub-buffers). The block's map
    has run when it returns; the caller finishes the queue of the commands that write the block before it reads or
    writes the view, and writes it before it enqueues the block's readers."""
    token = getattr(buffer, "_netcl_block", None)
    real = buffer if token is None else token.real
    host = getattr(real, "_netcl_host", None)
    if host is None:
        return None
    if real._netcl_mapping is not None:  # the block's map, enqueued when it was allocated: done once waited for
        real._netcl_mapping.wait()
        real._netcl_mapping = None
    nbytes = math.prod(shape) * dtype.itemsize
    return host[:nbytes].view(dtype).reshape(shape)


def install_caching_allocator(enabled: bool | None = None) -> bool:
    """Install the pool as ``device.allocator`` on every OpenCL device (``False``: raw allocation).

    ``enabled=None`` reads ``NETCL_CACHING_ALLOCATOR`` (default on). A custom allocator a user
    set on a device is left alone. Returns whether the pool is installed.
    """
    if enabled is None:
        enabled = os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "off", "no")
    for device in devices():
        if device.kind != "opencl":
            continue
        pool = pool_for(device)
        assert pool is not None
        current = device.allocator
        ours = current is raw_allocate or getattr(current, "__self__", None) is pool
        if ours:
            device.allocator = pool.allocate if enabled else pool.allocate_unpooled
    return bool(enabled)


def memory_stats(device: Device | str | None = None) -> MemoryStats:
    """Pool statistics of ``device`` (default device); all zero on the NumPy backend."""
    pool = pool_for(device)
    return pool.stats() if pool is not None else MemoryStats()


def empty_cache(device: Device | str | None = None) -> int:
    """Release cached blocks of ``device`` (None: every device) to the driver; returns bytes released."""
    if device is None:
        with _POOLS_LOCK:
            pools = list(_POOLS.values())
        return sum(p.empty_cache() for p in pools)
    pool = pool_for(device)
    return pool.empty_cache() if pool is not None else 0


def reset_peak_memory_stats(device: Device | str | None = None) -> None:
    """Set the peak of ``device``'s pool to what is allocated now."""
    pool = pool_for(device)
    if pool is not None:
        pool.reset_peak()


def max_allocated(device: Device | str | None = None) -> int:
    """The most bytes live tensors of ``device`` held at once since the last ``reset_peak`` (torch's
    ``max_memory_allocated``): counted through the pool (block sizes) and, with the pool switched off,
    per raw allocation; 0 on the NumPy backend."""
    return memory_stats(device).peak_allocated_bytes


def reset_peak(device: Device | str | None = None) -> None:
    """Start a new peak for ``max_allocated``: set it to the bytes allocated now (torch's
    ``reset_peak_memory_stats``; this module's ``reset_peak_memory_stats`` is the same)."""
    reset_peak_memory_stats(device)


install_caching_allocator()
