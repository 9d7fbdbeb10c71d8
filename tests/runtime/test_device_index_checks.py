"""Index checks on the device (issue 33): a kernel records an out-of-range index in the device's error word
and the host raises ``IndexError`` naming the op and the value at its next wait; no index op reads its
indices back; the same in replayed steps. On the NumPy backend the indices are on the host and the check
is immediate; each case below reads the result, so it holds on both backends."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
import netcl.optim as optim
from netcl.core import device_errors
from netcl.jit import fuse_graph, jit_compile
from netcl.runtime import Stream, synchronize
from netcl.runtime.cache import program_cache
from netcl.runtime.launch import launch
from netcl.runtime.ops import gathering, selecting


def _ints(device: nc.Device, values) -> nc.Tensor:
    return nc.Tensor.from_host(device, np.asarray(values, np.int32))


def _floats(device: nc.Device, shape: tuple[int, ...], seed: int = 0) -> nc.Tensor:
    return nc.Tensor.from_host(device, np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _value(out) -> np.ndarray:
    return (out.value if isinstance(out, ag.Node) else out).to_host()


# (name, call(device, bad) -> result, message fragment naming the op and the argument)
CASES: list[tuple[str, Callable[[nc.Device, int], object], str]] = [
    (
        "gather",
        lambda d, bad: gathering.gather(_floats(d, (3, 5)), 1, _ints(d, [[0, bad], [1, 2], [4, 4]])),
        "gather: index value {bad} is out of range along axis 1: expected 0 <= index < 5",
    ),
    (
        "index_select",
        lambda d, bad: selecting.index_select(_floats(d, (6, 2)), 0, _ints(d, [5, bad, 0])),
        "index_select: index value {bad} is out of range along axis 0: expected 0 <= index < 6",
    ),
    (
        "index_select of vectors",  # rows of 8 floats: copied as 16-byte vectors
        lambda d, bad: selecting.index_select(_floats(d, (6, 8)), 0, _ints(d, [5, bad, 0])),
        "index_select: index value {bad} is out of range along axis 0: expected 0 <= index < 6",
    ),
    (
        "embedding",
        lambda d, bad: nn.Embedding(5, 3).to(d)(_ints(d, [[1, 2], [bad, 0]])),
        "embedding: ids value {bad} is out of range: expected 0 <= ids < 5",
    ),
    (
        "cross_entropy",
        lambda d, bad: ag.cross_entropy(ag.tensor(_floats(d, (4, 3))), _ints(d, [0, 2, bad, 1])),
        "cross_entropy: target value {bad} is out of range: expected 0 <= target < 3 or target == ignore_index",
    ),
    (
        "cross_entropy_nd",
        lambda d, bad: ag.cross_entropy(ag.tensor(_floats(d, (2, 3, 2))), _ints(d, [[0, bad], [1, 2]])),
        "cross_entropy: target value {bad} is out of range: expected 0 <= target < 3",
    ),
    (
        "nll_loss",
        lambda d, bad: ag.nll_loss(ag.tensor(_floats(d, (4, 3))), _ints(d, [bad, 2, 0, 1])),
        "nll_loss: target value {bad} is out of range: expected 0 <= target < 3",
    ),
    (
        "jit_cross_entropy",
        lambda d, bad: jit_compile(lambda x, t: ag.cross_entropy(x * 2.0, t))(
            ag.tensor(_floats(d, (4, 3)), requires_grad=True), _ints(d, [0, bad, 2, 1])
        ),
        "cross_entropy: target value {bad} is out of range: expected 0 <= target < 3",
    ),
    (
        "gather_node",
        lambda d, bad: ag.gather(ag.tensor(_floats(d, (2, 4)), requires_grad=True), 1, _ints(d, [[bad], [3]])),
        "gather: index value {bad} is out of range along axis 1: expected 0 <= index < 4",
    ),
]


@pytest.mark.parametrize("bad", [7, 1_000_000, -3])
@pytest.mark.parametrize(("name", "call", "message"), CASES, ids=[c[0] for c in CASES])
def test_out_of_range_index_raises_at_the_next_wait(device, name, call, message, bad: int) -> None:
    with pytest.raises(IndexError, match=message.format(bad=bad)):
        _value(call(device, bad))
    # the word was cleared: the same op with good indices runs and reads back
    assert np.all(np.isfinite(_value(call(device, 1))))


@pytest.mark.parametrize("bad", [2**40, -(2**40) - 5])
def test_a_64_bit_index_is_reported_whole(device, bad: int) -> None:
    index = nc.Tensor.from_host(device, np.array([[0, bad]], np.int64))
    with pytest.raises(IndexError, match=f"gather: index value {bad} is out of range along axis 1"):
        gathering.gather(_floats(device, (1, 3)), 1, index).to_host()


@pytest.mark.parametrize(("name", "call", "message"), CASES, ids=[c[0] for c in CASES])
def test_index_ops_read_nothing_back(cl_device, host_reads, name, call, message) -> None:
    """An index op with good or bad device indices makes no device-to-host copy: the check waits for a wait."""
    with host_reads() as reads:
        call(cl_device, 2)
        call(cl_device, 99)
    assert reads == []
    with pytest.raises(IndexError, match="99"):
        synchronize(cl_device)


def test_first_recorded_index_wins_and_a_stream_finish_raises(cl_device) -> None:
    x = _floats(cl_device, (4, 4))
    gathering.gather(x, 0, _ints(cl_device, [[11, 0, 0, 0]]))
    selecting.index_select(x, 1, _ints(cl_device, [22]))
    with pytest.raises(IndexError, match="gather: index value 11"):
        synchronize(cl_device)
    synchronize(cl_device)  # cleared
    stream = Stream(device=cl_device)
    gathering.gather(x, 0, _ints(cl_device, [[0, 33, 0, 0]]))  # on the device's default queue
    # the stream's wait reads the word after what it is ordered behind: without this barrier its read may run
    # before the gather on the other queue (it did on an H200 under -n 8 load) and find the word still clear
    stream.wait_for(cl_device.queue)
    with pytest.raises(IndexError, match="33"):
        stream.finish()


class _Fault(RuntimeError):
    pass


def test_a_fault_code_raises_its_own_exception_at_the_next_wait(cl_device) -> None:
    """A fault that is not an index (the peer all-reduce's meet records one) takes the same word with a code
    of its own: the wait raises the fault's exception, made from the recorded value and bound, and clears the
    word."""
    code = device_errors.fault_code("test fault", lambda value, bound: _Fault(f"value {value} bound {bound}"))
    record = "__kernel void record(__global int* err, const int code) { netcl_record_error(err, code, 7L << 33, -5); }"
    handle = program_cache.get_or_compile("test_fault_code", device_errors.INDEX_CHECK_C + record, cl_device.context)
    kernel = handle.kernel("record", [None, np.int32])
    launch(kernel, (1,), None, cl_device.error_word.buffer(cl_device.queue), np.int32(code), queue=cl_device.queue)
    with pytest.raises(_Fault, match=f"value {7 << 33} bound -5"):
        synchronize(cl_device)
    synchronize(cl_device)  # cleared


def _classifier(device: nc.Device) -> tuple[nn.Module, optim.Optimizer]:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    return model, optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize("bad", [7, 1_000_000, -3])
def test_replayed_training_step_with_a_bad_label_raises(device, bad: int) -> None:
    """The issue's case: a step captured by fuse_graph on a 4-class model, replayed with labels out of range."""
    model, opt = _classifier(device)
    rng = np.random.default_rng(1)
    x = nc.Tensor.from_host(device, rng.standard_normal((32, 8)).astype(np.float32))
    y = _ints(device, rng.integers(0, 4, 32))
    step = fuse_graph(model, x, y, ag.cross_entropy, optimizer_step=opt.step)
    first = float(_value(step.execute(x, y)))
    with pytest.raises(IndexError, match=f"cross_entropy: target value {bad} is out of range"):
        _value(step.execute(x, _ints(device, np.full(32, bad))))
    weights = [p.value.to_host() for p in model.parameters()]
    assert all(np.all(np.isfinite(w)) for w in weights)  # a bad row added nothing
    again = float(_value(step.execute(x, y)))  # the step goes on replaying
    assert np.isfinite(again) and again != first


def test_replayed_embedding_with_a_bad_id_raises(device) -> None:
    emb = nn.Embedding(10, 4).to(device)
    ids = _ints(device, [1, 2, 3])
    step = fuse_graph(emb, ids)
    np.testing.assert_array_equal(_value(step.execute(ids)), emb.weight.value.to_host()[[1, 2, 3]])
    with pytest.raises(IndexError, match="embedding: ids value 1000000 is out of range"):
        _value(step.execute(_ints(device, [1, 1_000_000, 3])))
    np.testing.assert_array_equal(_value(step.execute(_ints(device, [4, 5, 6]))), emb.weight.value.to_host()[4:7])


def test_numpy_indices_keep_their_immediate_check(device) -> None:
    x = ag.tensor(_floats(device, (3, 5)))
    with pytest.raises(IndexError, match="gather: index value 5"):
        ag.gather(x, 1, np.array([[5], [0], [1]]))
    with pytest.raises(IndexError, match="cross_entropy: target value 9"):
        ag.cross_entropy(x, np.array([0, 9, 1]))


def test_the_docs_example_runs() -> None:
    """docs/index-checks.md's example as written (on the default device)."""
    page = Path(__file__).resolve().parents[2] / "docs" / "index-checks.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(page), "exec"), {"__name__": "docs_example"})
