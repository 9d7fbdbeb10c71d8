"""ProgramCache: hits and misses, flag order, per-context entries, LRU, evict/clear, stats, CompileError."""

from __future__ import annotations

import re

import pyopencl as cl
import pytest

from netcl.runtime import cache as cache_mod
from netcl.runtime.cache import KernelHandle, ProgramCache, clear_caches, program_cache, register_cache
from netcl.runtime.errors import CompileError

SRC = """
__kernel void fill(__global float *x, float v) { x[get_global_id(0)] = v * SCALE; }
__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }
"""


@pytest.fixture(autouse=True)
def private_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path / "kernels"))


@pytest.fixture
def ctx(cl_device):
    return cl_device.context


def test_hit_after_miss_returns_the_same_handle(ctx):
    pc = ProgramCache()
    first = pc.get_or_compile("k", SRC, ctx, ["-DSCALE=1"])
    second = pc.get_or_compile("k", SRC, ctx, ["-DSCALE=1"])
    assert second is first and isinstance(first, KernelHandle)
    s = pc.stats()
    assert (s.hits, s.misses, s.builds, s.disk_hits, s.entries) == (1, 1, 1, 0, 1)
    assert s.build_seconds > 0
    assert first.kernel_names == ["fill", "twice"] and first.kernel("twice") is first.kernel("twice")
    assert first.source == SRC and first.build_flags == ("-DSCALE=1",) and first.context == ctx


def test_flags_are_an_order_insensitive_set(ctx):
    pc = ProgramCache()
    a = pc.get_or_compile("k", SRC, ctx, ("-DSCALE=2", "-cl-fast-relaxed-math"))
    b = pc.get_or_compile("k", SRC, ctx, ["-cl-fast-relaxed-math", "-DSCALE=2", "-DSCALE=2"])
    c = pc.get_or_compile("k", SRC, ctx, ("-DSCALE=2",))
    assert a is b and c is not a
    assert pc.stats().misses == 2 and pc.stats().hits == 1


def test_source_and_key_are_part_of_the_key(ctx):
    pc = ProgramCache()
    a = pc.get_or_compile("k", SRC, ctx, ["-DSCALE=1"])
    assert pc.get_or_compile("k", SRC + "\n", ctx, ["-DSCALE=1"]) is not a
    assert pc.get_or_compile("other", SRC, ctx, ["-DSCALE=1"]) is not a
    assert len(pc) == 3


def test_each_context_has_its_own_entries(cl_device):
    pc = ProgramCache()
    ctx1, ctx2 = cl.Context([cl_device.cl_device]), cl.Context([cl_device.cl_device])
    h1 = pc.get_or_compile("k", SRC, ctx1, ["-DSCALE=1"])
    h2 = pc.get_or_compile("k", SRC, ctx2, ["-DSCALE=1"])
    assert h1 is not h2 and h1.context == ctx1 and h2.context == ctx2
    assert h1.kernel("fill").context == ctx1 and h2.kernel("fill").context == ctx2
    assert pc.get_or_compile("k", SRC, ctx1, ["-DSCALE=1"]) is h1
    s = pc.stats()
    assert s.entries == 2 and sorted(s.by_context.values()) == [1, 1] and len(s.by_context) == 2


def test_lru_eviction_with_a_small_bound(ctx):
    pc = ProgramCache(max_entries=2)
    a = pc.get_or_compile("a", SRC, ctx, ["-DSCALE=1"])
    pc.get_or_compile("b", SRC, ctx, ["-DSCALE=1"])
    assert pc.get_or_compile("a", SRC, ctx, ["-DSCALE=1"]) is a  # a is now most recent
    pc.get_or_compile("c", SRC, ctx, ["-DSCALE=1"])  # evicts b
    s = pc.stats()
    assert s.evictions == 1 and s.entries == 2
    assert pc.get_or_compile("a", SRC, ctx, ["-DSCALE=1"]) is a
    misses = pc.stats().misses
    pc.get_or_compile("b", SRC, ctx, ["-DSCALE=1"])
    assert pc.stats().misses == misses + 1


def test_evict_and_clear(ctx):
    pc = ProgramCache()
    a = pc.get_or_compile("a", SRC, ctx, ["-DSCALE=1"])
    pc.get_or_compile("a", SRC, ctx, ["-DSCALE=3"])
    pc.get_or_compile("b", SRC, ctx, ["-DSCALE=1"])
    assert pc.evict("a") == 2 and pc.evict("a") == 0 and len(pc) == 1
    again = pc.get_or_compile("a", SRC, ctx, ["-DSCALE=1"])
    assert again is not a and again.from_disk  # the disk cache is left alone by evict
    pc.clear()
    s = pc.stats()
    assert len(pc) == 0 and (s.hits, s.misses, s.builds, s.entries) == (0, 0, 0, 0)


def test_clear_caches_clears_registered_caches():
    memo = {"x": 1}
    register_cache(memo.clear)
    register_cache(memo.clear)  # registering twice is harmless
    clear_caches()
    assert memo == {} and len(program_cache) == 0
    cache_mod._CLEAR_HOOKS.remove(memo.clear)


def test_kernel_lookup_errors(ctx):
    handle = ProgramCache().get_or_compile("k", SRC, ctx, ["-DSCALE=1"])
    with pytest.raises(KeyError, match="name the one you want"):
        handle.kernel()
    with pytest.raises(KeyError, match=r"no kernel 'nope'.*\['fill', 'twice'\]"):
        handle.kernel("nope")


def test_compile_error_has_log_and_numbered_source(ctx):
    bad = "__kernel void k(__global float *x) {\n    int i = get_global_id(0);\n    x[i] = undefined_name;\n}\n"
    with pytest.raises(CompileError) as info:
        ProgramCache().get_or_compile("bad", bad, ctx, ["-DX=1"])
    text = str(info.value)
    assert "build log" in text and "undefined_name" in text and "-DX=1" in text
    marked = [line for line in text.splitlines() if line.startswith(">")]
    assert marked and re.match(r">\s+3 \|\s+x\[i\] = undefined_name;", marked[0])
    assert re.search(r"^ \s+2 \|\s+int i = get_global_id\(0\);$", text, re.M)  # context lines, unmarked


def test_a_remembered_kernel_outlives_the_lru_but_not_clear_or_evict(cl_device, monkeypatch):
    """``ops._common.get_kernel``: a kernel it remembers keeps its program when the program cache's LRU drops it
    (a process that built more programs than the cache holds: the next call loads nothing), while
    ``program_cache.clear()`` and ``evict`` send the next call back to the cache (a miss there)."""
    from netcl.runtime.ops._common import clear_kernel_memo, get_kernel

    clear_kernel_memo()
    monkeypatch.setattr(program_cache, "max_entries", 1)

    def resolve(scale: int):
        source = SRC.replace("SCALE", str(scale))
        return get_kernel(("lru-test", scale), cl_device, lambda: source, "fill", [None, None])

    first = resolve(1)
    resolve(2)  # the LRU of one entry drops the first program
    misses = program_cache.stats().misses
    assert resolve(1) is first and program_cache.stats().misses == misses
    program_cache.evict(("netcl.runtime.ops", ("lru-test", 2)))
    again = resolve(1)
    assert again is not first and program_cache.stats().misses == misses + 1
    program_cache.clear()
    assert resolve(1) is not again and program_cache.stats().misses == 1
    clear_kernel_memo()
