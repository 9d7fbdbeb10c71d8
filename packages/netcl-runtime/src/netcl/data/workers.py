"""Who builds host batches: the main thread, a pool of threads, or worker processes.

Each producer takes tickets in order (``submit(ticket, indices)``) and hands back the host batch
of a ticket (``result(ticket)``), whichever worker built it, so batches leave in sampler order and
their contents never depend on the number of workers. A batch is built by ``build_batch``:
``dataset[i]`` for each index, then collation into buffers from ``alloc_factory``.

A worker process sends a batch as a pickle (protocol 5) whose array data travel out of band: the
raw bytes follow the pickle on the same pipe and the main process reads them straight into the
batch's (pinned) buffers, so each array is copied once on each side and never pickled.

A worker process that dies is noticed through its sentinel: waiting for a batch waits on its
worker's pipe and that process's sentinel together (``multiprocessing.connection.wait``), so it
returns when the result arrives or the process exits, never on a clock. A death is reported when
a batch of that worker is waited for, so earlier batches are all delivered first.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import multiprocessing.reduction
import os
import pickle
import signal
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from netcl.data.collate import Alloc, collate, empty_host, to_batch
from netcl.data.errors import BatchBuildError, WorkerDiedError

#: ``(batch, buffers)``: the collated batch and the pinned buffers it lives in (None: plain NumPy memory).
HostBatch = tuple[Any, Any]


def _failure(
    stage: str, indices: list[int], index: int | None, exc: BaseException, worker: str, remote: bool
) -> BatchBuildError:
    return BatchBuildError(
        stage=stage,
        indices=list(indices),
        index=index,
        type_name=type(exc).__name__,
        message=str(exc),
        error=exc,
        traceback="".join(traceback.format_exception(exc)) if remote else "",
        worker=worker,
    )


def build_batch(
    dataset: Any,
    indices: list[int],
    collate_fn: Callable[[list[Any]], Any] | None,
    alloc_factory: Callable[[], Any],
    worker: str,
    remote: bool = False,
) -> HostBatch:
    """Fetch and collate one batch; a failure raises ``BatchBuildError`` naming the stage and the index.

    Without a ``collate_fn``, a dataset with ``gather_batch(indices, alloc)`` (``TensorDataset``,
    ``Subset`` of one) builds the whole batch in one call; when that raises, or returns None, the
    batch is built item by item, which names the failing index.
    """
    gathered = _gather(dataset, indices, alloc_factory) if collate_fn is None else None
    if gathered is not None:
        return gathered
    items = []
    for index in indices:
        try:
            items.append(dataset[index])
        except Exception as exc:
            raise _failure("dataset", indices, index, exc, worker, remote) from exc
    buffers = alloc_factory()
    alloc: Alloc | None = buffers
    try:
        if collate_fn is None:
            batch = collate(items, indices, alloc) if alloc is not None else collate(items, indices)
            return batch, buffers
        stage = "collate_fn"
        try:
            result = collate_fn(items)
        except Exception as exc:
            raise _failure(stage, indices, None, exc, worker, remote) from exc
        return (to_batch(result, alloc) if alloc is not None else to_batch(result)), buffers
    except BatchBuildError:
        if buffers is not None:
            buffers.release()
        raise
    except Exception as exc:
        if buffers is not None:
            buffers.release()
        raise _failure("collate", indices, None, exc, worker, remote) from exc


def _gather(dataset: Any, indices: list[int], alloc_factory: Callable[[], Any]) -> HostBatch | None:
    """The batch from ``dataset.gather_batch``, or None (no such method, it declined, or it raised)."""
    gather = getattr(dataset, "gather_batch", None)
    if gather is None:
        return None
    buffers = alloc_factory()
    try:
        batch = gather(indices, buffers if buffers is not None else empty_host)
    except Exception:  # the item-by-item build reports the error with the index that caused it
        batch = None
    if batch is None and buffers is not None:
        buffers.release()
    return None if batch is None else (batch, buffers)


class InlineProducer:
    """Builds each batch in the main thread when it is asked for (``num_workers=0``)."""

    def __init__(self, build: Callable[[list[int], str], HostBatch]) -> None:
        self.build = build
        self.tickets: dict[int, list[int]] = {}

    def submit(self, ticket: int, indices: list[int]) -> None:
        self.tickets[ticket] = indices

    def ready(self, ticket: int) -> bool:
        return True

    def result(self, ticket: int) -> HostBatch:
        return self.build(self.tickets.pop(ticket), "the main thread")

    def close(self) -> list[HostBatch]:
        self.tickets.clear()
        return []


class ThreadProducer:
    """``num_workers`` threads; each task builds one whole batch."""

    def __init__(self, build: Callable[[list[int], str], HostBatch], num_workers: int) -> None:
        self.build = build
        self.pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="netcl-data")
        self.futures: dict[int, Future] = {}

    def submit(self, ticket: int, indices: list[int]) -> None:
        self.futures[ticket] = self.pool.submit(self.build, indices, "a worker thread")

    def ready(self, ticket: int) -> bool:
        return self.futures[ticket].done()

    def result(self, ticket: int) -> HostBatch:
        return self.futures.pop(ticket).result()

    def close(self) -> list[HostBatch]:
        """Cancel what has not started, wait for what has; the finished batches (to free their buffers)."""
        for future in self.futures.values():
            future.cancel()
        self.pool.shutdown(wait=True)
        done = [f.result() for f in self.futures.values() if not f.cancelled() and f.exception() is None]
        self.futures.clear()
        return done


def _process_main(dataset: Any, collate_fn: Any, conn: multiprocessing.connection.Connection, name: str) -> None:
    """A worker process: build the batches it is sent until it receives None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    while True:
        task = conn.recv()
        if task is None:
            return
        ticket, indices = task
        raw: list[memoryview] = []
        try:
            batch = build_batch(dataset, indices, collate_fn, lambda: None, name, remote=True)[0]
            out_of_band: list[pickle.PickleBuffer] = []
            meta = pickle.dumps(batch, protocol=5, buffer_callback=out_of_band.append)
            raw = [buffer.raw() for buffer in out_of_band]
            message = (ticket, meta, [view.nbytes for view in raw], None)
        except BatchBuildError as failure:
            try:  # the original exception travels only when it pickles
                multiprocessing.reduction.ForkingPickler.dumps(failure.error)
            except Exception:
                failure.error = None
            message = (ticket, None, [], failure)
        except Exception as exc:  # the batch does not pickle
            message = (ticket, None, [], _failure("collate", indices, None, exc, name, remote=True))
        conn.send(message)
        for view in raw:
            _write_all(conn.fileno(), view)


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < view.nbytes:
        done += os.write(fd, view[done:])


def _read_into(fd: int, target: np.ndarray) -> None:
    """Fill ``target`` (a uint8 array) from ``fd``; EOFError when the writer is gone first."""
    view = memoryview(target).cast("B")
    done = 0
    while done < view.nbytes:
        count = os.readv(fd, [view[done:]])
        if count == 0:
            raise EOFError("the worker closed its pipe in the middle of a batch")
        done += count


class ProcessProducer:
    """``num_workers`` processes; ticket t goes to worker ``t % num_workers`` over its own pipe."""

    def __init__(
        self, dataset: Any, collate_fn: Any, num_workers: int, context: Any, alloc_factory: Callable[[], Any]
    ) -> None:
        if context is None:
            methods = multiprocessing.get_all_start_methods()
            context = "fork" if "fork" in methods else "spawn"
        ctx = multiprocessing.get_context(context) if isinstance(context, str) else context
        self.processes: list[Any] = []
        self.conns: list[multiprocessing.connection.Connection] = []
        self.alloc_factory = alloc_factory
        self.owned: dict[int, tuple[int, list[int]]] = {}
        self.done: dict[int, tuple[HostBatch | None, BatchBuildError | None]] = {}
        # A forked child must never free what it inherited: collecting an inherited OpenCL object (an event,
        # a buffer) calls into a driver whose state belongs to the parent (a segfault on NVIDIA's). Objects
        # frozen before the fork are outside the child's garbage collector (``gc.freeze``'s documented use).
        forking = ctx.get_start_method() == "fork"
        if forking:
            gc.freeze()
        try:
            for w in range(num_workers):
                parent, child = ctx.Pipe(duplex=True)
                name = f"worker process {w}"
                process = ctx.Process(
                    target=_process_main, args=(dataset, collate_fn, child, name), name=f"netcl-data-{w}", daemon=True
                )
                process.start()
                child.close()
                self.processes.append(process)
                self.conns.append(parent)
        finally:
            if forking:
                gc.unfreeze()

    def submit(self, ticket: int, indices: list[int]) -> None:
        worker = ticket % len(self.processes)
        self.owned[ticket] = (worker, indices)
        with contextlib.suppress(OSError):  # a dead worker: reported when its batch is waited for
            self.conns[worker].send((ticket, indices))

    def _drain(self, worker: int) -> None:
        """Receive every message worker ``worker`` has sent so far."""
        conn = self.conns[worker]
        try:
            while conn.poll():
                ticket, meta, sizes, failure = conn.recv()
                self.done[ticket] = (None, failure) if failure is not None else (self._receive(conn, meta, sizes), None)
        except (EOFError, OSError):  # the worker is gone; what it sent before is kept
            pass

    def _receive(self, conn: multiprocessing.connection.Connection, meta: bytes, sizes: list[int]) -> HostBatch:
        """Read a batch's array data into fresh (pinned) buffers and rebuild the batch around them."""
        buffers = self.alloc_factory()
        try:
            targets = []
            for nbytes in sizes:
                target = buffers((nbytes,), np.dtype(np.uint8)) if buffers is not None else np.empty(nbytes, np.uint8)
                _read_into(conn.fileno(), target)
                targets.append(target)
            return pickle.loads(meta, buffers=targets), buffers
        except BaseException:
            if buffers is not None:
                buffers.release()
            raise

    def _died(self, worker: int) -> WorkerDiedError:
        process = self.processes[worker]
        process.join()
        code = process.exitcode
        how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        pending = sorted(t for t, (w, _) in self.owned.items() if w == worker and t not in self.done)
        where = f" while building batch {pending[0]} (dataset indices {self.owned[pending[0]][1]})" if pending else ""
        return WorkerDiedError(
            f"DataLoader worker process {worker} (pid {process.pid}) {how}{where}; the epoch cannot finish "
            "(a crash in native code or the system's out-of-memory killer are the usual causes; "
            "num_workers=0 runs the dataset in this process, where the error shows)"
        )

    def ready(self, ticket: int) -> bool:
        """Whether ``result(ticket)`` returns (or raises) without waiting."""
        if ticket not in self.done:
            worker = self.owned[ticket][0]
            self._drain(worker)
            if ticket not in self.done:
                return not self.processes[worker].is_alive()
        return True

    def result(self, ticket: int) -> HostBatch:
        """Batch ``ticket``, waiting on its worker's pipe and its liveness (its sentinel) together."""
        worker = self.owned[ticket][0]
        process, conn = self.processes[worker], self.conns[worker]
        while ticket not in self.done:
            ready = multiprocessing.connection.wait([conn, process.sentinel])
            self._drain(worker)
            if ticket not in self.done and process.sentinel in ready:
                raise self._died(worker)
        self.owned.pop(ticket, None)
        batch, failure = self.done.pop(ticket)
        if failure is not None:
            raise failure
        return batch

    def close(self) -> list[HostBatch]:
        """Stop every worker (those still busy are terminated) and wait for them to exit."""
        for conn, process in zip(self.conns, self.processes, strict=True):
            if process.is_alive():
                with contextlib.suppress(OSError):  # BrokenPipeError, ConnectionResetError: it just died
                    conn.send(None)
        for process in self.processes:
            if process.is_alive():
                process.terminate()
            process.join()
        for conn in self.conns:
            conn.close()
        received = [batch for batch, _ in self.done.values() if batch is not None]
        self.processes, self.conns = [], []
        self.owned.clear()
        self.done.clear()
        return received
