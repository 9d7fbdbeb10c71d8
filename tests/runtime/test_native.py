"""netcl.runtime.native: the compiled launch built at first use, its fallback, and the layout it reads."""

from __future__ import annotations

import shutil
import sys
import weakref
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.runtime import native, results
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.memory import DevicePool, pool_for


def _buildable() -> str | None:
    """Why Python's build configuration cannot build an extension here (None when it can)."""
    command = native.build_command(Path("a.c"), Path("a.so"))
    if command is None:
        return "no LDSHARED in Python's build configuration"
    if shutil.which(command[0]) is None:
        return f"no C compiler {command[0]!r}"
    include = Path(command[command.index("-I") + 1])
    if not (include / "Python.h").exists():
        return f"no Python headers in {include}"
    return None


def test_the_compiled_launch_is_built_where_extensions_can_be(monkeypatch):
    monkeypatch.delenv(native.ENV_VAR, raising=False)
    reason = _buildable()
    if reason is not None:
        pytest.skip(reason)
    if native.entry_points() is None:
        pytest.skip("the OpenCL loader pyopencl uses cannot be found")
    assert native.launcher() is not None, native.unavailable()
    assert native.unavailable() is None


def test_a_build_is_reused_and_a_failed_one_says_why(tmp_path):
    if _buildable() is not None:
        pytest.skip(_buildable())
    first = native.build(tmp_path)
    assert first.Launcher.__name__ == "Launcher"
    built = sorted(tmp_path.iterdir())
    assert native.build(tmp_path) is not None and sorted(tmp_path.iterdir()) == built  # the file was reused
    failing = [sys.executable, "-c", "import sys; sys.exit('launcher.c:1: error: no compiler here')", "{source}"]
    with pytest.raises(native.BuildError, match="error: no compiler here"):
        native.build(tmp_path / "other", command=failing)
    assert native.unavailable() is None or "no compiler here" not in native.unavailable()  # this process's own


def test_the_environment_turns_it_off(cl_device, monkeypatch):
    monkeypatch.setenv(native.ENV_VAR, "0")
    assert native.launcher() is None and native.ENV_VAR in native.unavailable()
    handle = nc.Tensor.empty((4,), device=cl_device)
    program = cl.Program(cl_device.context, "__kernel void k(__global float *x) { x[get_global_id(0)] = 2.0f; }")
    prepared = PreparedLaunch(program.build().k, 4, None, {}, [(0, None)])
    assert type(prepared.call).__name__ == "function"  # the generated Python call
    prepared.call(handle.data)
    np.testing.assert_array_equal(handle.to_host(), np.full(4, 2.0, np.float32))


def test_a_pooled_buffer_carries_its_handle_where_the_launcher_reads_it(cl_device):
    """launcher.c reads a pool wrapper's handle as its token's ``block[1]``: the layout it relies on."""
    buffer = nc.Tensor.empty((64,), device=cl_device).data
    token = vars(buffer).get("_netcl_block")
    if token is None:
        pytest.skip("this device's allocator does not pool")
    assert type(token) is pool_for(cl_device)._token
    assert token.block[1] == buffer.int_ptr and token.real.int_ptr == buffer.int_ptr


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
def test_both_hot_paths_hand_out_and_take_back_the_same_blocks(cl_device, monkeypatch, compiled):
    """A pool made with and without ``native``: a cached block is handed out in a tagged wrapper, goes back onto its
    free list when the wrapper dies, and the statistics count both events."""
    monkeypatch.setenv(native.ENV_VAR, "1" if compiled else "0")
    if compiled and native.allocator() is None:
        pytest.skip(f"no compiled launch here: {native.unavailable()}")
    pool = DevicePool(cl_device)
    assert (type(pool.allocate).__name__ == "Allocator") == compiled
    assert pool.allocate.__self__ is pool
    first = pool.allocate(cl_device, 1000)  # fresh
    handle = first.int_ptr
    del first  # back on its list
    again = pool.allocate(cl_device, 1000)  # the hot path: the same block
    assert again.int_ptr == handle and type(again._netcl_block) is pool._token
    stats = pool.stats()
    assert (stats.fresh_allocations, stats.served_from_pool, stats.frees, stats.active_blocks) == (1, 1, 1, 1)
    del again
    assert pool.stats().active_blocks == 0 and pool.stats().cached_blocks == 1
    odd = pool.allocate(cl_device, np.int64(1000))  # not an int: the Python method, the same block
    assert odd.int_ptr == handle


def test_the_maker_of_tensors_makes_what_tensor_init_makes(cl_device):
    """``results.tensor`` (the C ``Maker`` once a pool was made with ``native``): every field of its tensor equals
    the field ``Tensor(...)`` sets, and the tensor is an ordinary one (weak references, attribute writes, views)."""
    if native.launcher() is None:
        pytest.skip(f"no compiled launch here: {native.unavailable()}")
    DevicePool(cl_device)  # a pool made with the extension in use installs the maker
    assert type(results.tensor).__name__ == "Maker"
    data = nc.Tensor.empty((2, 3), device=cl_device).data
    made = results.tensor(data, (2, 3), np.dtype(np.float32), cl_device)
    expected = nc.Tensor(data, (2, 3), np.dtype(np.float32), cl_device)
    for name in nc.Tensor.__slots__:
        if name != "__weakref__":
            assert getattr(made, name) is getattr(expected, name), name
    assert type(made) is nc.Tensor and weakref.ref(made)() is made
    made.grad = expected
    assert made.reshape(3, 2).shape == (3, 2)


def test_a_maker_takes_only_writable_slots_of_a_class_without_new():
    if native.launcher() is None:
        pytest.skip(f"no compiled launch here: {native.unavailable()}")

    class Plain:
        pass

    class Fresh:
        __slots__ = ("a",)

        def __new__(cls):
            return super().__new__(cls)

    with pytest.raises(TypeError, match="'missing' is not a writable __slots__ field of Tensor"):
        native.maker(nc.Tensor, ("data", "missing"), {})
    with pytest.raises(TypeError, match="'a' is not a writable __slots__ field of Plain"):
        native.maker(Plain, ("a",), {})
    with pytest.raises(TypeError, match="has a __new__ of its own"):
        native.maker(Fresh, ("a",), {})
    made = native.maker(nc.Tensor, results.GIVEN, results.constants())
    with pytest.raises(TypeError, match="takes 4 positional arguments, got 2"):
        made(None, ())
