"""The caching allocator's lock-free hot path (issue 33, eager fast path): a block taken from a free list
and a dying wrapper's return are queued as events and folded into the statistics in order, so the counts,
the bytes and the peak stay exact across folds (more events than ``DevicePool._FOLD_EVERY``), and
``empty_cache`` releases blocks whose return is not folded yet without miscounting them."""

from __future__ import annotations

import numpy as np

import netcl.core as nc
from netcl.runtime.memory import DevicePool, memory_stats, pool_for, size_class

NBYTES = 3000  # one size class (4096), requested bytes differ from the block size


def test_counts_bytes_and_peak_stay_exact_across_folds(cl_device: nc.Device, settled_memory) -> None:
    pool = pool_for(cl_device)
    block = size_class(NBYTES)
    before = settled_memory(cl_device)
    held = [pool.allocate(cl_device, NBYTES) for _ in range(3)]  # 3 live at once: the peak of this test
    del held
    rounds = DevicePool._FOLD_EVERY + 10  # each round takes and returns one block: two events
    for _ in range(rounds):
        pool.allocate(cl_device, NBYTES)  # dies at once: straight back onto its free list
    after = settled_memory(cl_device)
    assert after.allocated_bytes == before.allocated_bytes
    assert after.requested_bytes == before.requested_bytes
    assert after.active_blocks == before.active_blocks
    assert after.frees - before.frees == rounds + 3
    assert after.served_from_pool - before.served_from_pool + after.fresh_allocations - before.fresh_allocations == (
        rounds + 3
    )
    assert after.cached_bytes - before.cached_bytes == block * (after.cached_blocks - before.cached_blocks)
    assert after.peak_allocated_bytes >= before.allocated_bytes + 3 * block


def test_peak_is_the_running_maximum(cl_device: nc.Device, settled_memory) -> None:
    pool = pool_for(cl_device)
    block = size_class(NBYTES)
    settled_memory(cl_device)
    warm = [pool.allocate(cl_device, NBYTES) for _ in range(5)]  # five cached blocks: the loop takes no fresh one
    del warm
    base = settled_memory(cl_device).allocated_bytes
    pool.reset_peak()
    live = []
    for count in (2, 5, 1, 4):  # live blocks go 2 -> 5 -> 1 -> 4: the peak is 5 blocks, folded or not
        while len(live) < count:
            live.append(pool.allocate(cl_device, NBYTES))
        del live[count:]
    assert memory_stats(cl_device).peak_allocated_bytes == base + 5 * block
    assert memory_stats(cl_device).allocated_bytes == base + 4 * block
    del live


def test_empty_cache_with_unfolded_returns(cl_device: nc.Device, settled_memory) -> None:
    pool = pool_for(cl_device)
    settled_memory(cl_device)
    buffers = [pool.allocate(cl_device, NBYTES) for _ in range(4)]
    del buffers  # four returns queued, not folded
    released = pool.empty_cache()
    assert released >= 4 * size_class(NBYTES)
    stats = settled_memory(cl_device)
    assert stats.cached_bytes == 0 and stats.cached_blocks == 0
    # the pool still serves (fresh blocks now) and the next values are right
    x = nc.Tensor.from_host(cl_device, np.arange(700, dtype=np.float32))
    np.testing.assert_array_equal(x.to_host(), np.arange(700, dtype=np.float32))
