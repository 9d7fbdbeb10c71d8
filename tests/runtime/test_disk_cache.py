"""On-disk binary cache: reuse across processes, corrupt entries, unusable dirs, NETCL_CACHE=0."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from netcl.runtime import disk_cache
from netcl.runtime.cache import ProgramCache

SRC = "__kernel void inc(__global float *x) { x[get_global_id(0)] += DELTA; }\n"
FLAGS = ["-DDELTA=1.0f"]

CHILD = """
import json, sys
import numpy as np, pyopencl as cl
import netcl.core as nc
from netcl.runtime.cache import program_cache
from netcl.runtime.launch import launch
dev = nc.get_device("opencl")
h = program_cache.get_or_compile("disk-test", sys.argv[1], dev.context, ["-DDELTA=1.0f"])
x = nc.tensor(np.zeros(4, np.float32), device=dev)
launch(h.kernel("inc"), 4, None, x)
s = program_cache.stats()
print(json.dumps({"builds": s.builds, "disk_hits": s.disk_hits, "corrupt": program_cache.disk.corrupt,
                  "stores": program_cache.disk.stores, "result": x.to_host().tolist()}))
"""


def run_child(cache: Path, source: str = SRC) -> dict:
    env = {**os.environ, "NETCL_CACHE_DIR": str(cache), "NETCL_DEVICE": "opencl"}
    env.pop("NETCL_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, source], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.bin"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "kernels"
    monkeypatch.setenv("NETCL_CACHE_DIR", str(path))
    monkeypatch.delenv("NETCL_CACHE", raising=False)
    return path


def test_second_process_builds_nothing_and_a_third_survives_corruption(cl_device, cache):
    first = run_child(cache)
    assert first["builds"] == 1 and first["disk_hits"] == 0 and first["stores"] == 1
    assert len(entries(cache)) == 1
    second = run_child(cache)
    assert second["builds"] == 0 and second["disk_hits"] == 1
    assert first["result"] == second["result"] == [1.0] * 4
    # a truncated entry: the next process notices, rebuilds and runs correctly
    (entry,) = entries(cache)
    entry.write_bytes(entry.read_bytes()[:100])
    third = run_child(cache)
    assert third["builds"] == 1 and third["corrupt"] == 1 and third["result"] == [1.0] * 4


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "bad-binary"])
def test_corrupt_entry_is_rebuilt(cl_device, cache, damage):
    ProgramCache().get_or_compile("k", SRC, cl_device.context, FLAGS)
    (entry,) = entries(cache)
    blob = entry.read_bytes()
    if damage == "garbage":
        entry.write_bytes(os.urandom(len(blob)))
    elif damage == "truncated":
        entry.write_bytes(blob[: len(blob) // 2])
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # well-formed file whose payload the driver refuses
        payload = b"not a program binary" * 10
        entry.write_bytes(disk_cache._MAGIC + hashlib.sha256(payload).digest() + payload)
    pc = ProgramCache()
    handle = pc.get_or_compile("k", SRC, cl_device.context, FLAGS)
    assert pc.stats().builds == 1 and pc.stats().disk_hits == 0 and pc.disk.corrupt == 1
    assert handle.kernel_names == ["inc"]
    again = ProgramCache()  # the entry was rewritten with a good binary
    again.get_or_compile("k", SRC, cl_device.context, FLAGS)
    assert again.stats().builds == 0 and again.stats().disk_hits == 1


def test_unusable_directory_warns_once_and_keeps_working(cl_device, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NETCL_CACHE_DIR", str(blocker / "kernels"))
    pc = ProgramCache()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = pc.get_or_compile("k", SRC, cl_device.context, FLAGS)
        b = pc.get_or_compile("k", SRC, cl_device.context, ["-DDELTA=2.0f"])
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1 and "in-memory cache only" in str(runtime[0].message)
    assert a is not b and pc.stats().builds == 2
    assert pc.get_or_compile("k", SRC, cl_device.context, FLAGS) is a


def test_cache_off(cl_device, cache, monkeypatch):
    monkeypatch.setenv("NETCL_CACHE", "0")
    assert disk_cache.cache_dir() is None
    ProgramCache().get_or_compile("k", SRC, cl_device.context, FLAGS)
    pc = ProgramCache()
    pc.get_or_compile("k", SRC, cl_device.context, FLAGS)
    assert pc.stats().builds == 1 and pc.stats().disk_hits == 0 and not cache.exists()


def test_default_directory_is_the_user_cache_dir(monkeypatch):
    monkeypatch.delenv("NETCL_CACHE_DIR", raising=False)
    monkeypatch.delenv("NETCL_CACHE", raising=False)
    import platformdirs

    assert disk_cache.cache_dir() == Path(platformdirs.user_cache_dir("netcl")) / "kernels"


def test_entry_key_names_source_flags_and_device(cl_device):
    dev = cl_device.cl_device
    base = disk_cache.entry_key(SRC, ("-DA",), dev)
    assert base == disk_cache.entry_key(SRC, ("-DA",), dev)
    assert base != disk_cache.entry_key(SRC + " ", ("-DA",), dev)
    assert base != disk_cache.entry_key(SRC, ("-DB",), dev)
