"""Host threads for the NumPy backend: run independent blocks of elementwise work on every core.

NumPy releases the GIL inside ufunc loops, so blocks of a fused body evaluated by several
threads run in parallel. Blocks must be independent (each writes only its own slice); then the
result does not depend on the thread count or on which thread ran which block. Work is handed
out dynamically (the next free thread takes the next block), which keeps both cores busy when
another process steals one.

``NETCL_HOST_THREADS`` sets the thread count (default: the CPUs this process may run on);
``1`` runs every block on the calling thread.

Each helper thread is pinned to its own CPU, and the calling thread to the first CPU for the duration of a
multi-threaded call (its own CPU set is restored afterwards): unpinned, the scheduler may put both threads on one
CPU, since every GIL handoff between ufunc calls wakes the other thread beside its waker (see
benchmarks/RESULTS.md, "Measurements moved out of source docstrings", host_pool.py). ``NETCL_HOST_PIN=0`` leaves
every thread's CPU set alone.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

ENV_VAR = "NETCL_HOST_THREADS"
PIN_ENV = "NETCL_HOST_PIN"
_DEFAULT_L2_BYTES = 1 << 20

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_cpus: list[int] | None = None
#: whether a caller is pinned right now (``_pin_caller``)
_pinned_caller = False


def host_threads() -> int:
    """Threads the NumPy backend uses: ``NETCL_HOST_THREADS`` or the CPUs available to this process."""
    text = os.environ.get(ENV_VAR, "").strip()
    if text:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{ENV_VAR} must be a positive integer, got {text!r}") from None
        if value < 1:
            raise ValueError(f"{ENV_VAR} must be a positive integer, got {text!r}")
        return value
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@functools.cache
def _cache_bytes(level: int, default: int) -> int:
    """cpu0's cache of ``level`` (index2 = L2, index3 = L3) from sysfs, ``default`` when not said
    (read once per process: ``block_elements`` runs on every fused detection-loss call)."""
    path = f"/sys/devices/system/cpu/cpu0/cache/index{level}/size"
    try:
        with open(path) as handle:
            text = handle.read().strip().upper()
    except OSError:
        return default
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    return int(digits) * scale if digits.isdigit() else default


def l2_cache_bytes() -> int:
    """The per-core L2 cache size from sysfs (1 MiB when the system does not say)."""
    return _cache_bytes(2, _DEFAULT_L2_BYTES)


def l3_share_bytes() -> int:
    """The shared L3 cache divided by the machine's CPU count (0 when the system does not say)."""
    return _cache_bytes(3, 0) // max(1, os.cpu_count() or 1)


def block_elements(live_arrays: int, itemsize: int = 4, lo: int = 1 << 14, hi: int = 1 << 20) -> int:
    """Elements per block so that ``live_arrays`` block-sized arrays fit in one core's share of the
    cache: its share of the L3, or twice its L2 where that is larger.

    A power of two between ``lo`` and ``hi``. Small blocks pay NumPy's per-ufunc-call cost, and
    with threads every ufunc call of a block re-takes the GIL, so blocks are as large as the cache
    share allows (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", host_pool.py). The
    block depends only on the machine, never on the thread count, so that blockwise sums (the
    detection loss) are the same for any ``NETCL_HOST_THREADS``.
    """
    budget = max(2 * l2_cache_bytes(), l3_share_bytes()) // max(1, live_arrays * itemsize)
    size = 1 << max(0, budget.bit_length() - 1)
    return max(lo, min(hi, size))


def pinning_cpus(threads: int) -> list[int] | None:
    """The CPUs to pin the calling thread (first) and ``threads - 1`` helpers to, or None when
    pinning is off (``NETCL_HOST_PIN=0``), unsupported, or there are fewer CPUs than threads."""
    if os.environ.get(PIN_ENV, "1").strip() == "0" or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except OSError:
        return None
    return cpus[:threads] if 1 < threads <= len(cpus) else None


def _pin_worker(cpus: list[int] | None, counter: list[int]) -> None:
    """Pool thread initializer: pin this helper to the next CPU after the caller's."""
    if not cpus:
        return
    with _pool_lock:
        index = counter[0]
        counter[0] += 1
    with contextlib.suppress(OSError):  # not permitted here: run unpinned
        os.sched_setaffinity(0, {cpus[1 + index % (len(cpus) - 1)]})


def _executor(workers: int, cpus: list[int] | None) -> ThreadPoolExecutor:
    """The helper pool: at least ``workers`` threads, pinned as ``cpus`` says (a new pool when either changes)."""
    global _pool, _pool_size, _pool_cpus
    with _pool_lock:
        if _pool is None or _pool_size < workers or _pool_cpus != cpus:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="netcl-host", initializer=_pin_worker, initargs=(cpus, [0])
            )
            _pool_size, _pool_cpus = workers, cpus
        return _pool


def _pin_caller(cpus: list[int] | None) -> set[int] | None:
    """Pin the calling thread to ``cpus[0]``; its previous CPU set (None when left alone).

    Only the one caller at a time: threads calling in concurrently would all share ``cpus[0]``.
    """
    global _pinned_caller
    if not cpus:
        return None
    with _pool_lock:
        if _pinned_caller:
            return None
        _pinned_caller = True
    try:
        previous = os.sched_getaffinity(0)
        if cpus[0] in previous:
            os.sched_setaffinity(0, {cpus[0]})
            return previous
    except OSError:
        pass
    _unpin_caller(None)
    return None


def _unpin_caller(previous: set[int] | None) -> None:
    """Undo ``_pin_caller``: restore the caller's CPU set, free the slot."""
    global _pinned_caller
    if previous is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, previous)
    with _pool_lock:
        _pinned_caller = False


def run_blocks(total: int, block: int, body: Callable[[int, int], None], threads: int | None = None) -> None:
    """Call ``body(start, stop)`` for every ``block``-sized slice of ``range(total)``, on ``threads`` threads.

    The calling thread works too. Floating-point errors are ignored in every thread (the fused
    bodies produce inf/NaN as IEEE arithmetic says, as the OpenCL kernels do). The first
    exception raised by a block is re-raised here after every thread has stopped.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    count = -(-total // block)
    threads = min(host_threads() if threads is None else threads, count)
    if threads <= 1:
        with np.errstate(all="ignore"):
            for start in range(0, total, block):
                body(start, min(start + block, total))
        return
    starts = iter(range(0, total, block))
    counter_lock = threading.Lock()
    failed = threading.Event()

    def worker() -> None:
        with np.errstate(all="ignore"):
            while not failed.is_set():
                with counter_lock:
                    start = next(starts, None)
                if start is None:
                    return
                try:
                    body(start, min(start + block, total))
                except BaseException:
                    failed.set()
                    raise

    cpus = pinning_cpus(threads)
    pool = _executor(threads - 1, cpus)
    previous = _pin_caller(cpus)
    futures: list[Future] = [pool.submit(worker) for _ in range(threads - 1)]
    error: BaseException | None = None
    try:
        worker()
    except BaseException as exc:  # re-raised below, after the helpers stopped
        error = exc
    finally:
        if previous is not None:
            _unpin_caller(previous)
    for future in futures:
        # A helper that never started (the pool busy, e.g. this call runs on a pool thread)
        # is cancelled: the calling thread already did its share.
        if future.cancel():
            continue
        exc = future.exception()
        if exc is not None and error is None:
            error = exc
    if error is not None:
        raise error


# ---- matrix products on the pool ------------------------------------------------------------------
#: Below this many multiply-adds a product runs as one call (splitting costs more than it saves).
MATMUL_SPLIT_MACS = 1 << 22


@functools.cache
def _blas_controller() -> Any:
    """threadpoolctl's view of the BLAS libraries NumPy loaded (None without threadpoolctl)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a dependency of netcl-core
        return None
    return ThreadpoolController()


@functools.cache
def _blas_libraries() -> tuple[Any, ...]:
    """threadpoolctl's controllers of the BLAS libraries (``user_api == "blas"``), found once."""
    controller = _blas_controller()
    return () if controller is None else tuple(lib for lib in controller.lib_controllers if lib.user_api == "blas")


def blas_info() -> list[dict[str, Any]] | None:
    """threadpoolctl's description of each BLAS library NumPy loaded (``internal_api``, ``version``,
    ``architecture``, ``num_threads``, ...), None without threadpoolctl."""
    if _blas_controller() is None:
        return None
    return [lib.info() for lib in _blas_libraries()]


class _OneBlasThread:
    """``ThreadpoolController.limit(limits=1, user_api="blas")`` for one product, without its per-call
    bookkeeping: each BLAS library's thread count is read, set to 1, and set back on exit."""

    __slots__ = ("saved",)

    def __enter__(self) -> None:
        libraries = _blas_libraries()
        self.saved = [lib.get_num_threads() for lib in libraries]
        for lib in libraries:
            lib.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        for lib, threads in zip(_blas_libraries(), self.saved, strict=True):
            lib.set_num_threads(threads)


def matmul(x: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(x, y, out=out)`` with single-threaded BLAS, the rows (or batch entries) of the
    product split over the pool's threads.

    BLAS's own worker threads keep spinning for a while after every product, which beside the pool's pinned threads
    takes a CPU away from fused work (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings",
    host_pool.py). Here BLAS runs one thread per call (threadpoolctl; the previous setting is restored), so its
    workers never wake and the pool supplies the parallelism. Every element is still one BLAS dot product over K,
    so results agree with ``np.matmul`` to float rounding.
    """
    if _blas_controller() is None:
        return np.matmul(x, y, out=out)
    with _OneBlasThread():
        if x.ndim < 2 or y.ndim < 2:
            return np.matmul(x, y, out=out)
        shape = (*np.broadcast_shapes(x.shape[:-2], y.shape[:-2]), x.shape[-2], y.shape[-1])
        if out is None:
            out = np.empty(shape, dtype=np.result_type(x, y))
        threads = host_threads()
        if threads == 1 or out.size * x.shape[-1] < MATMUL_SPLIT_MACS:
            return np.matmul(x, y, out=out)
        batch = shape[:-2]
        count = int(np.prod(batch, dtype=np.int64))
        xs = np.broadcast_to(x, (*batch, *x.shape[-2:]))  # views: nothing is copied
        ys = np.broadcast_to(y, (*batch, *y.shape[-2:]))
        if count < threads:  # split the rows of each product
            rows = shape[-2]

            def row_blocks(start: int, stop: int) -> None:
                for k in range(count):
                    index = np.unravel_index(k, batch)
                    np.matmul(xs[index][start:stop], ys[index], out=out[index][start:stop])

            run_blocks(rows, max(1, -(-rows // threads)), row_blocks)
        else:  # hand out whole products of the batch, a run along the last batch axis per np.matmul call

            def products(start: int, stop: int) -> None:
                inner = batch[-1]
                while start < stop:
                    lead, first = divmod(start, inner)
                    end = min(stop, (lead + 1) * inner)
                    index = (*np.unravel_index(lead, batch[:-1]), slice(first, first + end - start))
                    np.matmul(xs[index], ys[index], out=out[index])
                    start = end

            run_blocks(count, max(1, -(-count // threads)), products)
    return out
