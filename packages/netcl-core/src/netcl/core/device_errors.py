"""The per-device error word: kernels record the first out-of-range index (or another fault) there; the host
raises at its next wait.

An index-taking kernel (gather, index_select, embedding, class-loss targets, ...) gets two extra arguments, the
device's error word (``__global int*``, ``ERROR_WORDS`` ints) and a code naming the op and argument
(``index_error_code``). For an index outside its bound it calls ``netcl_index_error`` (``INDEX_CHECK_C``): the
first such index since the word was last read wins an atomic compare-and-swap and stores the code, the value and
the bound; the kernel goes on with a defined value. Nothing reads the word until the host waits for the device
anyway (``Tensor.to_host`` and what is built on it, ``netcl.runtime.synchronize``): the word is read on the same
in-order queue just before the wait's own read, cleared when set, and an ``IndexError`` naming the op, the value
and the bound is raised. A device whose kernels never took the word never reads it.

Other faults only a kernel sees (a peer rank that never reached an all-reduce, say) take a code of their own
(``fault_code``, with the exception the host raises) and record it through ``netcl_record_error``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl

#: Ints in the word: code, value (low, high 32 bits), bound (low, high 32 bits), one spare.
ERROR_WORDS = 6

#: OpenCL C helpers an index-checking kernel includes (before its kernel).
INDEX_CHECK_C = r"""
/* Record a fault (the first one since the host last read the word wins): its code, a value and a bound. */
inline void netcl_record_error(__global int* err, const int code, const long v, const long bound) {
    if (atomic_cmpxchg((volatile __global int*)err, 0, code) == 0) {
        err[1] = (int)(v & 0xffffffffL);
        err[2] = (int)(v >> 32);
        err[3] = (int)(bound & 0xffffffffL);
        err[4] = (int)(bound >> 32);
    }
}

/* Record an out-of-range index and return 0, a defined position to read instead. */
inline long netcl_index_error(__global int* err, const int code, const long v, const long bound) {
    netcl_record_error(err, code, v, bound);
    return 0;
}
"""

_codes: dict[tuple[str, str, int | None, str], int] = {}
_messages: list[tuple[str, str, int | None, str]] = [("", "", None, "")]
_codes_lock = threading.Lock()
#: code -> the exception a fault that is not an index raises, made from the recorded value and bound
_faults: dict[int, Callable[[int, int], BaseException]] = {}


def index_error_code(op: str, arg: str = "index", axis: int | None = None, allowed: str = "") -> int:
    """The code kernels store for an out-of-range ``arg`` of ``op`` (``allowed``: text appended to the
    expectation, e.g. "or target == ignore_index (-100)"). Codes are small positive ints, one per distinct
    message, given out in first-use order; kernels take them as an argument, so no source depends on them."""
    key = (op, arg, axis, allowed)
    code = _codes.get(key)
    if code is None:
        with _codes_lock:
            code = _codes.get(key)
            if code is None:
                code = len(_messages)
                _messages.append(key)
                _codes[key] = code
    return code


def fault_code(name: str, make: Callable[[int, int], BaseException]) -> int:
    """The code of fault ``name`` (one per name, the first ``make`` kept): a kernel records it with
    ``netcl_record_error(err, code, value, bound)`` and the host raises ``make(value, bound)`` at its next wait."""
    code = index_error_code(name, "fault")
    _faults.setdefault(code, make)
    return code


def device_error(code: int, value: int, bound: int) -> BaseException:
    """The exception for a recorded ``code``: the fault's own, else an IndexError (``index_error_message``)."""
    make = _faults.get(code)
    return make(value, bound) if make is not None else IndexError(index_error_message(code, value, bound))


def index_error_message(code: int, value: int, bound: int) -> str:
    """The IndexError text for ``code`` (as a host check of the same index says it)."""
    if not 0 < code < len(_messages):
        return f"a kernel recorded an out-of-range index {value} (bound {bound}) under unknown code {code}"
    op, arg, axis, allowed = _messages[code]
    where = f" along axis {axis}" if axis is not None else ""
    tail = f" {allowed}" if allowed else ""
    return f"{op}: {arg} value {value} is out of range{where}: expected 0 <= {arg} < {bound}{tail}"


class ErrorWord:
    """One device's error word: a small buffer kernels write and the host reads at its waits."""

    __slots__ = ("_buffer", "_context", "_lock")

    def __init__(self, context: cl.Context) -> None:
        self._context = context
        self._buffer: cl.Buffer | None = None
        self._lock = threading.Lock()

    def buffer(self, queue: cl.CommandQueue) -> cl.Buffer:
        """The word to pass to a kernel (made and zeroed on ``queue`` on first use)."""
        if self._buffer is None:
            with self._lock:
                if self._buffer is None:
                    zeros = np.zeros(ERROR_WORDS, np.int32)
                    buffer = cl.Buffer(self._context, cl.mem_flags.READ_WRITE, zeros.nbytes)
                    cl.enqueue_copy(queue, buffer, zeros, is_blocking=True)
                    self._buffer = buffer
        return self._buffer

    @property
    def in_use(self) -> bool:
        """Whether some kernel was given the word (only then do waits read it)."""
        return self._buffer is not None

    def enqueue_read(self, queue: cl.CommandQueue) -> tuple[np.ndarray, Any] | None:
        """Start reading the word on ``queue`` (no wait); pass the result to ``raise_if_set`` after a wait.

        The result holds the copy's event as well: pyopencl waits for a dropped read event, so the caller keeps
        it until its own wait has covered the read."""
        if self._buffer is None:
            return None
        host = np.empty(ERROR_WORDS, np.int32)
        return host, cl.enqueue_copy(queue, host, self._buffer, is_blocking=False)

    def raise_if_set(self, pending: tuple[np.ndarray, Any] | None, queue: cl.CommandQueue) -> None:
        """IndexError (or a fault's own exception) when ``pending`` (a finished ``enqueue_read``) holds a record;
        the word is cleared."""
        if pending is None or pending[0][0] == 0:
            return
        host = pending[0]
        with self._lock:
            cl.enqueue_copy(queue, self._buffer, np.zeros(ERROR_WORDS, np.int32), is_blocking=True)
        words = host.astype(np.int64)
        value = int(words[1] & 0xFFFFFFFF | (words[2] << 32))
        bound = int(words[3] & 0xFFFFFFFF | (words[4] << 32))
        raise device_error(int(host[0]), value, bound)

    def check(self, queue: cl.CommandQueue) -> None:
        """Wait for ``queue`` and raise what the word holds (a no-op read-free wait when unused)."""
        pending = self.enqueue_read(queue)
        queue.finish()
        self.raise_if_set(pending, queue)
