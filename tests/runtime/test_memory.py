"""The caching allocator: size classes, reuse, steady loops, stats, empty_cache, limits, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import empty_cache, memory, memory_stats, ops
from netcl.runtime.memory import DevicePool, install_caching_allocator, size_class


def test_size_classes() -> None:
    assert size_class(0) == size_class(1) == size_class(512) == 512
    assert size_class(513) == 1024
    assert size_class(1 << 20) == 1 << 20
    assert size_class((1 << 20) + 1) == (1 << 20) + (1 << 18)  # quarter-octave steps above 1 MiB
    for n in (1, 1000, 5000, 3 << 20, 123456789):
        assert n <= size_class(n) <= max(512, 2 * n)
        if n > 1 << 20:
            assert size_class(n) <= 1.25 * n


def test_installed_on_opencl_devices(cl_device: nc.Device) -> None:
    assert getattr(cl_device.allocator, "__self__", None).__class__ is DevicePool
    t = nc.Tensor.empty((10,), np.float32, cl_device)
    assert t.data.size >= 40


def _step(x: nc.Tensor, w: nc.Tensor) -> nc.Tensor:
    h = ops.relu(ops.add(ops.matmul(x, w), 1.0))
    return ops.sum(ops.mul(h, h), axis=0)


def test_steady_loop_allocates_nothing_new(cl_device: nc.Device, settled_memory) -> None:
    x = nc.tensor(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32), device=cl_device)
    w = nc.tensor(np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32), device=cl_device)
    # Warm-up with the loop's own pattern: step 1 runs with nothing alive, step 2 while step 1's
    # result is alive (one block more). From then on the pool holds every block the loop needs.
    for _ in range(2):
        result = _step(x, w)
    expected = result.to_host()
    before = settled_memory(cl_device)
    for _ in range(20):
        result = _step(x, w)
    np.testing.assert_array_equal(result.to_host(), expected)
    after = settled_memory(cl_device)
    assert after.fresh_allocations == before.fresh_allocations
    assert after.served_from_pool - before.served_from_pool >= 20 * 5  # five results per step
    assert after.reserved_bytes == before.reserved_bytes
    assert after.allocated_bytes == before.allocated_bytes


def test_buffer_returns_only_when_unreachable(cl_device: nc.Device, settled_memory) -> None:
    settled_memory(cl_device)  # earlier tests' garbage back in the pool first, then out: other's block is fresh
    empty_cache(cl_device)
    t = nc.tensor(np.arange(1000, dtype=np.float32), device=cl_device)
    view = t.reshape(10, 100)
    raw = t.data
    before = settled_memory(cl_device)
    del t
    assert settled_memory(cl_device).cached_blocks == before.cached_blocks  # the view keeps the buffer
    del view
    assert settled_memory(cl_device).cached_blocks == before.cached_blocks  # so does a bare reference
    other = nc.Tensor.empty((1000,), np.float32, cl_device)
    assert other.data.int_ptr != raw.int_ptr
    del raw
    stats = settled_memory(cl_device)
    assert stats.cached_blocks == before.cached_blocks + 1
    assert stats.allocated_bytes == before.allocated_bytes  # t's block is free, other's is new
    del other


def test_stats_and_empty_cache(cl_device: nc.Device, settled_memory) -> None:
    settled_memory(cl_device)  # earlier tests' garbage back in the pool first, then out: the three blocks are fresh
    empty_cache(cl_device)
    start = settled_memory(cl_device)
    tensors = [nc.Tensor.empty((n,), np.float32, cl_device) for n in (100, 1000, 300000)]
    held = settled_memory(cl_device)
    expected = sum(size_class(4 * n) for n in (100, 1000, 300000))
    assert held.allocated_bytes - start.allocated_bytes == expected
    assert held.requested_bytes - start.requested_bytes == 4 * (100 + 1000 + 300000)
    assert held.peak_allocated_bytes >= held.allocated_bytes
    del tensors
    freed = settled_memory(cl_device)
    assert freed.cached_bytes - start.cached_bytes == expected
    assert freed.allocated_bytes == start.allocated_bytes
    assert freed.frees - start.frees == 3
    again = nc.Tensor.empty((1000,), np.float32, cl_device)
    assert settled_memory(cl_device).served_from_pool == freed.served_from_pool + 1
    assert empty_cache(cl_device) == freed.cached_bytes - size_class(4000)
    assert settled_memory(cl_device).cached_bytes == 0
    del again


@pytest.mark.parametrize("fold_every", [5, 4096], ids=["loop-folds", "array-folds"])
def test_statistics_follow_the_allocation_history(
    cl_device: nc.Device, monkeypatch: pytest.MonkeyPatch, fold_every: int
) -> None:
    """A pool's statistics equal a model replayed from its requests and frees, the peak exactly, whether its events
    are folded a few at a time (a loop) or thousands at once (NumPy): 3,000 random requests (empty ones too) and frees
    of four size classes, the statistics read every 250 steps."""
    pool = DevicePool(cl_device)  # its own statistics; the wrappers below die at their ``del``/``pop``
    monkeypatch.setattr(pool, "_FOLD_EVERY", fold_every)
    rng = np.random.default_rng(7)
    requests = [0, 100, 4000, 3000, 70000, (1 << 20) + 4]  # 0 and 100 share a class, as do 4000 and 3000
    live: list[tuple[object, int]] = []
    cached: dict[int, int] = {}  # size class -> free blocks
    model = dict(allocated=0, requested=0, peak=0, served=0, fresh=0, frees=0)
    for step in range(3000):
        if live and rng.random() < 0.45:
            nbytes = live.pop(int(rng.integers(len(live))))[1]  # the wrapper dies here
            size = size_class(nbytes)
            cached[size] = cached.get(size, 0) + 1
            model["allocated"] -= size
            model["requested"] -= nbytes
            model["frees"] += 1
        else:
            nbytes = requests[int(rng.integers(len(requests)))]
            size = size_class(nbytes)
            if cached.get(size):
                cached[size] -= 1
                model["served"] += 1
            else:
                model["fresh"] += 1
            live.append((pool.allocate(cl_device, nbytes), nbytes))
            model["allocated"] += size
            model["requested"] += nbytes
            model["peak"] = max(model["peak"], model["allocated"])
        if step % 250 == 249:
            stats = pool.stats()
            assert stats.allocated_bytes == model["allocated"] and stats.requested_bytes == model["requested"]
            assert stats.peak_allocated_bytes == model["peak"]
            assert stats.served_from_pool == model["served"] and stats.fresh_allocations == model["fresh"]
            assert stats.frees == model["frees"] and stats.active_blocks == len(live)
            assert stats.cached_blocks == sum(cached.values())
            assert stats.cached_bytes == sum(size * n for size, n in cached.items())
    live.clear()
    pool.empty_cache()


def test_numpy_backend_has_empty_stats() -> None:
    stats = memory_stats("cpu")
    assert stats.allocated_bytes == 0 and stats.fresh_allocations == 0
    assert empty_cache("cpu") == 0


def test_too_large_names_bytes_and_limit(device: nc.Device) -> None:
    limit = min(device.max_alloc_size, device.global_mem_size)
    with pytest.raises(MemoryError) as info:
        nc.Tensor.empty((limit // 4 + 1024,), np.float32, device)
    message = str(info.value)
    assert str((limit // 4 + 1024) * 4) in message and str(limit) in message


def test_a_large_request_is_classed_once_per_pool(cl_device: nc.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """The size class of a request above the shared memo's 64 KiB is worked out (and checked against the device's
    limit) once per pool; a request past the limit is refused every time."""
    pool = DevicePool(cl_device)
    classed: list[int] = []
    real = memory.size_class
    monkeypatch.setattr(memory, "size_class", lambda nbytes: classed.append(nbytes) or real(nbytes))
    first, again = pool.allocate(cl_device, (3 << 20) + 4), pool.allocate(cl_device, (3 << 20) + 4)
    assert classed == [(3 << 20) + 4] and first.size == again.size == size_class((3 << 20) + 4)
    for _ in range(2):
        with pytest.raises(MemoryError, match="bytes"):
            pool.allocate(cl_device, cl_device.max_alloc_size + 1)


def test_threads_share_the_pool_safely(cl_device: nc.Device) -> None:
    errors: list[BaseException] = []
    expected = np.arange(256, dtype=np.float32)

    def work(seed: int) -> None:
        try:
            for i in range(30):
                t = nc.tensor(expected + seed + i, device=cl_device)
                np.testing.assert_array_equal(t.to_host(), expected + seed + i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(1000 * k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    stats = memory_stats(cl_device)
    assert stats.allocated_bytes >= 0 and stats.cached_bytes >= 0


def test_can_be_switched_off(cl_device: nc.Device, settled_memory) -> None:
    try:
        assert install_caching_allocator(False) is False
        before = settled_memory(cl_device)
        t = nc.Tensor.empty((10,), np.float32, cl_device)
        assert settled_memory(cl_device).fresh_allocations == before.fresh_allocations
        del t
    finally:
        assert install_caching_allocator(True) is True
    assert getattr(cl_device.allocator, "__self__", None).__class__ is DevicePool
