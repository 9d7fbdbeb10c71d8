"""Shared fixtures: every device-facing test runs on OpenCL (PoCL here) and on the NumPy backend."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import file_modules
import pytest

import netcl.core as nc


def _register_hypothesis_profiles() -> None:
    """tests/reliability's hypothesis profiles, registered before hypothesis reads --hypothesis-profile."""
    file_modules.load("tests/reliability/profiles.py", "netcl_reliability_profiles").register()


_register_hypothesis_profiles()

# The GEMM tile search (netcl.runtime.tune) stays off in tests: defaults only, fast and deterministic.
os.environ.setdefault("NETCL_TUNE", "0")
# The suite runs the JIT strict: a jitted function that would fall back raises JitError with the reason
# (tests of the fallback itself pass strict=False).
os.environ.setdefault("NETCL_JIT_STRICT", "1")


def _opencl_device() -> nc.Device:
    """``get_device("opencl")``, or a skip saying why there is none that builds programs here."""
    try:
        return nc.get_device("opencl")
    except nc.DeviceError as exc:
        pytest.skip(f"no usable OpenCL device on this machine: {exc}")


@pytest.fixture(autouse=True)
def no_index_error_left_behind() -> Iterator[None]:
    """A test that leaves an out-of-range index recorded on the device (never waited for) fails here,
    instead of the next test's first read raising it (``netcl.core.device_errors``)."""
    yield
    from netcl.runtime import synchronize

    for device in nc.devices():
        word = getattr(device, "__dict__", {}).get("error_word")  # only devices whose word was made
        if word is not None and word.in_use:
            try:
                synchronize(device)
            except IndexError as exc:
                pytest.fail(f"the test left an out-of-range index recorded on {device.name}: {exc}")


@pytest.fixture(params=["opencl", "cpu"])
def device(request: pytest.FixtureRequest) -> nc.Device:
    """The OpenCL device ``get_device("opencl")`` picks (a GPU, else a CPU device that builds), then NumPy."""
    return _opencl_device() if request.param == "opencl" else nc.get_device("cpu")


@pytest.fixture
def cl_device() -> nc.Device:
    """An OpenCL device only (tests of OpenCL-specific machinery)."""
    return _opencl_device()


@pytest.fixture
def settled_memory() -> Iterator[Callable[[nc.Device], object]]:
    """Allocator statistics that only the code under test can change.

    Automatic garbage collection is off for the test (a collection between two readings would
    return blocks of objects that earlier tests left in reference cycles), and each reading
    first collects the garbage that exists and finishes the device's queue:
    ``before = settled_memory(device); ...; after = settled_memory(device)``.
    """
    from netcl.runtime import memory

    def read(device: nc.Device) -> object:
        gc.collect()
        if device.queue is not None:
            device.queue.finish()
        return memory.memory_stats(device)

    enabled = gc.isenabled()
    gc.disable()
    try:
        yield read
    finally:
        if enabled:
            gc.enable()


class LaunchCounter:
    """The kernels launched on a queue inside the ``with`` block, through a runtime ``Graph`` capture."""

    def __init__(self, queue) -> None:
        from netcl.runtime.graph import Graph

        self.graph = Graph()
        self._capture = self.graph.capture(queue)

    @property
    def names(self) -> list[str]:
        return [launch.name for launch in self.graph.launches]

    def __enter__(self) -> LaunchCounter:
        self._capture.__enter__()
        return self

    def __exit__(self, *exc: object) -> object:
        return self._capture.__exit__(*exc)


@pytest.fixture
def launch_counter() -> type[LaunchCounter]:
    """``with launch_counter(queue) as launches: ...``, then ``launches.names``: the kernels launched."""
    return LaunchCounter


@contextlib.contextmanager
def _counting_host_reads() -> Iterator[list[int]]:
    """Byte counts of the device-to-host copies made inside the block: every buffer read pyopencl makes
    (``cl.enqueue_copy`` into host memory, whatever module imported it, goes through
    ``pyopencl._cl._enqueue_read_buffer`` / ``_enqueue_read_buffer_rect``)."""
    import pyopencl._cl as _cl

    reads: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in ("_enqueue_read_buffer", "_enqueue_read_buffer_rect"):
            original = getattr(_cl, name)

            def counting(queue, mem, hostbuf, *args, _original=original, **kwargs):
                reads.append(memoryview(hostbuf).nbytes)
                return _original(queue, mem, hostbuf, *args, **kwargs)

            patch.setattr(_cl, name, counting)
        yield reads


@pytest.fixture
def host_reads() -> Callable[[], AbstractContextManager[list[int]]]:
    """``with host_reads() as reads: ...``, then ``reads``: the byte counts of the device-to-host copies."""
    return _counting_host_reads
