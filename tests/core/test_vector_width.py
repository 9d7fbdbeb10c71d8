"""The vector width of CPU OpenCL devices: each width checked in a child process, a crash (a
signal) or an error in the child moves to the next narrower width, the answer is cached on disk.

Fake children stand in for a compiler that crashes (this machine's may not), one real child
aborts to show a signal is read as a failure, and the real check runs on the CPU OpenCL devices
that are present.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

import netcl.core as nc
from netcl.core import vector_width
from netcl.core.vector_width import _run_child, check_width, usable_width

CPU_TYPE = 2  # cl.device_type.CPU
LLVM_CRASH = "35 warnings generated.\nLLVM ERROR: Cannot emit physreg copy instruction\n"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))


def fake_cpu(width: int = 16, driver: str = "3.0-rc2") -> nc.Device:
    cl_device = SimpleNamespace(
        name="pthread-AMD EPYC",
        type=CPU_TYPE,
        version="OpenCL 3.0",
        driver_version=driver,
        preferred_vector_width_float=width,
        platform=SimpleNamespace(name="Portable Computing Language", version="OpenCL 3.0 PoCL 3.0-rc2"),
    )
    return nc.Device("opencl", "0:0", cl_device)  # type: ignore[arg-type]


class Children:
    """A stand-in child runner: crashes (SIGABRT) for the widths in ``crash``, records every call."""

    def __init__(self, crash: set[int]) -> None:
        self.crash = crash
        self.widths: list[int] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        width = int(argv[-1])
        self.widths.append(width)
        return (-6, LLVM_CRASH) if width in self.crash else (0, "")


def test_a_crash_at_the_preferred_width_falls_back_to_the_next() -> None:
    children = Children(crash={16})
    width, failures = usable_width(fake_cpu(16), children)
    assert (width, children.widths) == (8, [16, 8])
    assert failures == ["float16 kernel: killed by signal 6 (LLVM ERROR: Cannot emit physreg copy instruction)"]


def test_the_answer_is_cached_per_device_and_driver() -> None:
    first = usable_width(fake_cpu(16), Children(crash={16}))
    again = Children(crash=set())  # would now say 16 works: the cached answer must win
    assert usable_width(fake_cpu(16), again) == first == (8, [first[1][0]])
    assert again.widths == []  # from the cache: no child ran
    other_driver = Children(crash=set())
    assert usable_width(fake_cpu(16, driver="3.1"), other_driver)[0] == 16
    assert other_driver.widths == [16]


def test_no_working_width_makes_the_device_unusable(monkeypatch: pytest.MonkeyPatch) -> None:
    device = fake_cpu(8)
    monkeypatch.setattr(vector_width, "_run_child", Children(crash={8, 4}))
    assert usable_width(device, vector_width._run_child) == (
        None,
        [f"float{w} kernel: killed by signal 6 (LLVM ERROR: Cannot emit physreg copy instruction)" for w in (8, 4)],
    )


def test_error_exits_everywhere_are_not_cached() -> None:
    """An error exit may be this environment's (a child that cannot import): check again next time."""

    def failing(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        return 1, "ModuleNotFoundError: No module named 'netcl'\n"

    assert usable_width(fake_cpu(8), failing)[0] is None
    again = Children(crash=set())
    assert usable_width(fake_cpu(8), again) == (8, [])
    assert again.widths == [8]  # a child ran: the failure was not cached


def test_a_child_that_errors_reports_its_last_line() -> None:
    def failing(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        return 1, "Traceback ...\nSystemExit: float8 probe kernel returned wrong values (largest error 3)\n"

    why = check_width(fake_cpu(8), 8, failing)
    assert why == "float8 kernel: exit code 1 (SystemExit: float8 probe kernel returned wrong values (largest error 3))"


def test_a_real_child_killed_by_a_signal_is_a_failure() -> None:
    def aborting(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        return _run_child([sys.executable, "-c", "import os; os.abort()"], timeout)

    why = check_width(fake_cpu(8), 8, aborting)
    assert why is not None and why.startswith("float8 kernel: killed by signal 6")


def test_real_cpu_devices_pass_the_check_at_their_width() -> None:
    cpus = [d for d in nc.usable_opencl_devices() if not d.is_gpu]
    if not cpus:
        pytest.skip("no CPU OpenCL device builds programs here")
    for device in cpus:
        assert device.vector_width in (4, 8, 16)
        assert check_width(device, device.vector_width) is None
