"""``mpirun``: run a case of ``worker.py`` on N MPI ranks and return each rank's results."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("worker.py")


def find_mpiexec() -> str | None:
    """The mpiexec next to this Python (where the mpich wheel installs it), else one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


@pytest.fixture(scope="session")
def mpiexec() -> str:
    pytest.importorskip("mpi4py", reason="the netcl-runtime 'mpi' extra (mpi4py, mpich) is not installed")
    path = find_mpiexec()
    if path is None:
        pytest.skip("no mpiexec (install the mpich wheel)")
    return path


@pytest.fixture(scope="session")
def device_kinds() -> set[str]:
    """``{"cpu"}``, plus ``"opencl"`` when this machine has an OpenCL device."""
    import netcl.core as nc

    return {"cpu"} | ({"opencl"} if nc.usable_opencl_devices() else set())


@pytest.fixture
def mpirun(mpiexec, tmp_path):
    """``mpirun(case, device, ranks=2, timeout=120)`` -> (list of per-rank result dicts, CompletedProcess).

    ``timeout`` is NETCL_DIST_TIMEOUT for the ranks: how long a rank waits in a collective for the
    others. Only the cases that test the timeout itself pass a short one; the default is long enough for
    a rank that builds its kernels cold while the suite runs on every core (`hatch test` is parallel), and
    it costs nothing when the ranks agree. The whole run is bounded at 240 s.
    """

    def run(case: str, device: str, ranks: int = 2, timeout: float = 120.0):
        env = dict(os.environ, NETCL_DIST_TIMEOUT=str(timeout))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), *sys.path) if p)
        command = [mpiexec, "-n", str(ranks), sys.executable, str(WORKER), case, device, str(tmp_path)]
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
        results = []
        for rank in range(ranks):
            path = tmp_path / f"rank{rank}.pkl"
            results.append(pickle.loads(path.read_bytes()) if path.exists() else None)
        return results, proc

    return run
