"""What needs no MPI: device choice per rank, argument checks before any communication."""

from __future__ import annotations

import pytest

import netcl.autograd as ag
from netcl.core import Tensor
from netcl.nn.parallel import DistributedDataParallel
from netcl.runtime import distributed as dist
from netcl.runtime.distributed import group


class FakeDevice:
    def __init__(self, name: str, gpu: bool) -> None:
        self.name, self.is_gpu = name, gpu

    def __repr__(self) -> str:
        return self.name


@pytest.mark.parametrize("env", ["", "gpu", "opencl"])
def test_each_local_rank_takes_gpu_rank_mod_count(monkeypatch, env):
    gpus = [FakeDevice("gpu0", True), FakeDevice("gpu1", True)]
    monkeypatch.setattr(group, "devices", lambda: [FakeDevice("cpu-cl", False), *gpus, FakeDevice("numpy", False)])
    monkeypatch.setenv("NETCL_DEVICE", env)
    assert [group._pick_device(None, r).name for r in range(5)] == ["gpu0", "gpu1", "gpu0", "gpu1", "gpu0"]


def test_without_gpus_or_with_an_explicit_device_the_default_is_used(monkeypatch):
    default = FakeDevice("default", False)
    monkeypatch.setattr(group, "get_device", lambda spec=None: default if spec is None else FakeDevice(spec, False))
    monkeypatch.setattr(group, "devices", lambda: [FakeDevice("cpu-cl", False), FakeDevice("numpy", False)])
    monkeypatch.delenv("NETCL_DEVICE", raising=False)
    assert group._pick_device(None, 1) is default
    monkeypatch.setattr(group, "devices", lambda: [FakeDevice("gpu0", True)])
    monkeypatch.setenv("NETCL_DEVICE", "cpu")  # the user's choice wins over one GPU per rank
    assert group._pick_device(None, 0) is default
    assert group._pick_device("0:1", 0).name == "0:1"


@pytest.mark.parametrize("value", ["abc", "0", "-3", "inf"])
def test_bad_timeout_variable_is_named(monkeypatch, value):
    monkeypatch.setenv("NETCL_DIST_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"NETCL_DIST_TIMEOUT='{value}': expected a number of seconds > 0"):
        group.timeout_from_env()


def test_collectives_before_init_say_so(monkeypatch):
    monkeypatch.setattr(group, "_world", None)
    t = Tensor.from_host("cpu", [1.0, 2.0])
    for call in (lambda: dist.all_reduce(t), lambda: dist.broadcast(t), lambda: dist.barrier()):
        with pytest.raises(dist.DistributedError, match=r"not initialized: call init\(\) first"):
            call()
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0, got 0"):
        dist.init(timeout=0)


class NoParams:
    def parameters(self):
        return iter(())


class NonLeaf:
    def __init__(self) -> None:
        w = ag.tensor([1.0], requires_grad=True, device="cpu")
        self.p = w * 2.0

    def named_parameters(self):
        return iter([("p", self.p)])


@pytest.mark.parametrize(
    "module, kwargs, error, match",
    [
        (NoParams(), {"bucket_cap_mb": 0}, ValueError, "bucket_cap_mb must be a number > 0, got 0"),
        (NoParams(), {}, ValueError, "module NoParams has no parameters to synchronize"),
        (object(), {}, TypeError, "module must have parameters"),
        (NonLeaf(), {}, ValueError, "parameter 'p' is not a leaf"),
    ],
)
def test_ddp_bad_modules_fail_before_any_communication(monkeypatch, module, kwargs, error, match):
    monkeypatch.setattr(group, "_world", None)
    with pytest.raises(error, match=match):
        DistributedDataParallel(module, **kwargs)
    assert group._world is None  # MPI was never started


def test_reducer_threads_are_stopped_and_joined_at_exit(monkeypatch):
    """The atexit hook stops every live reducer and waits until its exchange has freed what it holds
    (a communicator that is torn down while the process exits aborts it)."""
    from types import SimpleNamespace

    from netcl.runtime.distributed import overlap

    stopped: list[bool] = []

    class Recording:
        what = "recording exchange"

        def run(self, work) -> None:
            raise AssertionError("no work was submitted")

        def stopped(self, failed: bool) -> None:
            stopped.append(failed)

    info = SimpleNamespace(timeout=30.0, rank=0, world_size=1)
    monkeypatch.setattr(overlap, "world", lambda: SimpleNamespace(info=info))
    reducer = overlap.ThreadedReducer()
    reducer._start(Tensor.from_host("cpu", [0.0]).device, "test-reducer", Recording())
    assert reducer.thread.is_alive() and reducer in overlap._LIVE
    overlap._close_live_reducers()
    assert not reducer.thread.is_alive() and stopped == [False]
