"""The NumPy backend's fused path on the host thread pool: blocks cover every element once, and
results are bit-identical to one thread (elementwise blocks are independent; the detection loss's
block sums are combined in block order), at block edges, for broadcasting and 0-d outputs.

Blocks are shrunk to a few dozen elements so small, fast tensors span many blocks and partial
last blocks. Values are also checked against float64 NumPy (tolerances as in test_jit_compile).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core import host_pool
from netcl.core.host_pool import host_threads, run_blocks
from netcl.jit import detection_loss_numpy, jit_compile, numpy_helpers, numpy_ranges, numpy_source, workloads

BLOCK = 48


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numpy_source, "block_elements", lambda live: BLOCK)
    monkeypatch.setattr(detection_loss_numpy, "block_size", lambda: BLOCK)


def _run(fn, arrays, threads: int, monkeypatch: pytest.MonkeyPatch, upstream=None):
    """Forward and gradients of a freshly jitted ``fn`` with ``threads`` host threads."""
    monkeypatch.setenv(host_pool.ENV_VAR, str(threads))
    jitted = jit_compile(fn)
    nodes = [ag.tensor(a, requires_grad=True, device="cpu") for a in arrays]
    with ag.Tape() as tape:
        out = jitted(*nodes)
    grad = np.ones(out.shape, np.float32) if upstream is None else upstream
    tape.backward(out, grad=ag.tensor(grad, device="cpu").value)
    assert jitted.cache_info()["fallbacks"] == 0
    return out.value.to_host(), [n.grad.to_host() for n in nodes]


def _chain8_64(x, a, b):
    h = np.maximum(x * a + b, 0) * 0.5
    h = 1 / (1 + np.exp(-h)) - x
    h = np.tanh(h)
    return h * h


@pytest.mark.parametrize("n", [1, BLOCK - 1, BLOCK, BLOCK + 1, 7 * BLOCK - 5])
def test_chain8_threads_bit_identical(n: int, small_blocks, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(n)
    arrays = [rng.uniform(-3, 3, n).astype(np.float32) for _ in range(3)]
    arrays[0][:3] = [np.nan, np.inf, -np.inf][: min(3, n)]  # NaN/inf travel the same way in every block
    upstream = rng.uniform(-1, 1, n).astype(np.float32)
    one = _run(workloads.chain8, arrays, 1, monkeypatch, upstream)
    four = _run(workloads.chain8, arrays, 4, monkeypatch, upstream)
    np.testing.assert_array_equal(four[0], one[0])
    for got, want in zip(four[1], one[1], strict=True):
        np.testing.assert_array_equal(got, want)
    finite = np.isfinite(arrays[0])
    ref = _chain8_64(*(a.astype(np.float64) for a in arrays))
    # float32 chain of 8 ops incl. exp/tanh: a few ulps each
    np.testing.assert_allclose(one[0][finite], ref[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 5, 13])
def test_broadcast_rows_threads_bit_identical(rows: int, small_blocks, monkeypatch: pytest.MonkeyPatch) -> None:
    """bias_gelu with x (rows, 7) and b (1, 7): blocks of rows (48 // 7 = 6 rows), the last one partial."""
    rng = np.random.default_rng(rows)
    arrays = [rng.uniform(-4, 4, (rows, 7)).astype(np.float32), rng.uniform(-1, 1, (1, 7)).astype(np.float32)]
    one = _run(workloads.bias_gelu, arrays, 1, monkeypatch)
    three = _run(workloads.bias_gelu, arrays, 3, monkeypatch)
    np.testing.assert_array_equal(three[0], one[0])
    for got, want in zip(three[1], one[1], strict=True):
        np.testing.assert_array_equal(got, want)
    v = arrays[0].astype(np.float64) + arrays[1]
    ref = 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3)))
    np.testing.assert_allclose(one[0], ref, rtol=1e-5, atol=1e-6)  # GELU: a handful of float32 ops


def test_zero_dim_output(monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = [np.float32(0.25).reshape(()), np.float32(-2.0).reshape(()), np.float32(1.5).reshape(())]
    one = _run(workloads.chain8, arrays, 1, monkeypatch)
    two = _run(workloads.chain8, arrays, 2, monkeypatch)
    assert one[0].shape == () and np.array_equal(one[0], two[0])
    np.testing.assert_allclose(one[0], _chain8_64(*(np.float64(a) for a in arrays)), rtol=1e-5)


def test_generated_source_writes_into_scratch() -> None:
    """The fused forward reuses out= buffers: no op of chain8 allocates a result of its own, and the
    last one writes straight into the output block."""
    jitted = jit_compile(workloads.chain8)
    nodes = [ag.tensor(np.ones(10, np.float32), device="cpu") for _ in range(3)]
    forward, _ = jitted.source(*nodes)
    body = [line.strip() for line in forward.splitlines() if line.strip().startswith("v")]
    assert len(body) == 8 and all("out=S" in line or "SIGMOID_NONNEG_OUT(" in line for line in body[:-1]), forward
    assert body[-1] == "v10 = np.multiply(v9, v9, out=O0)", forward


@pytest.mark.parametrize(
    ("expr", "nonnegative"),
    [
        ("SIGMOID(x0)", False),  # an input: any sign
        ("SIGMOID(MUL(RELU(x0), 0.5))", True),  # chain8's
        ("SIGMOID(MUL(RELU(x0), -0.5))", False),
        ("SIGMOID(MUL(x0, x0))", True),  # a square
        ("SIGMOID(x0 * x0 + EXP(x1))", True),
        ("SIGMOID(SUB(EXP(x0), 1.0))", False),
        ("SIGMOID(MAX(x0, 0.0))", True),
        ("SIGMOID(MIN(x0, 0.0))", False),
        ("SIGMOID(DIV(ABS(x0), SQRT(x1)))", True),
        ("SIGMOID(v1)", True),  # through a variable
        ("SIGMOID(v2)", False),
    ],
)
def test_sigmoid_of_a_nonnegative_value_takes_the_short_form(expr: str, nonnegative: bool) -> None:
    lines = numpy_ranges.specialize([("v1", "RELU(x1)"), ("v2", "NEG(v1)"), ("v3", expr)])
    assert lines[-1][1].startswith("SIGMOID_NONNEG(") == nonnegative, lines


def test_short_sigmoid_equals_sigmoid_where_it_is_used() -> None:
    """SIGMOID_NONNEG_OUT gives SIGMOID's float32 values on x >= 0, -0.0, inf and NaN, also in place."""
    rng = np.random.default_rng(8)
    special = np.float32([0.0, -0.0, 1e-30, 1e-45, 17.0, 40.0, 88.0, 1e30, np.inf, np.nan])
    x = np.concatenate([np.abs(rng.standard_normal(4099).astype(np.float32)) * 6, special])
    with np.errstate(all="ignore"):
        want = numpy_helpers.SIGMOID(x)
        np.testing.assert_array_equal(numpy_helpers.SIGMOID_NONNEG_OUT(x, np.empty_like(x)), want)
        aliased = x.copy()
        numpy_helpers.SIGMOID_NONNEG_OUT(aliased, aliased)
    np.testing.assert_array_equal(aliased, want)
    np.testing.assert_array_equal(numpy_helpers.SIGMOID_NONNEG(x), want)


@pytest.mark.parametrize("name", ["SIGMOID", "GELU"])
def test_out_twins_are_bit_identical_to_the_eager_helpers(name: str) -> None:
    """The fused path's out= twins give the eager NumPy helpers' float32 values, also written in place."""
    rng = np.random.default_rng(7)
    special = np.float32([0.0, -0.0, 1e-30, -1e-30, 40.0, -40.0, 1e30, -1e30, np.inf, -np.inf, np.nan])
    x = np.concatenate([rng.standard_normal(4099).astype(np.float32) * 6, special])
    eager, twin = getattr(numpy_helpers, name), getattr(numpy_helpers, f"{name}_OUT")
    scratch = [np.empty_like(x) for _ in range(2 if name == "GELU" else 1)]
    with np.errstate(all="ignore"):
        want = eager(x)
        out = twin(x, np.empty_like(x), *scratch)
        aliased = x.copy()
        twin(aliased, aliased, *scratch)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(aliased, want)


@pytest.mark.parametrize("beta", [0.05, 0.0])
def test_detection_loss_threads_bit_identical(beta: float, small_blocks, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    n = 11 * BLOCK + 3
    x = rng.uniform(-8, 8, n).astype(np.float32)
    t = (rng.uniform(0, 1, n) > 0.6).astype(np.float32)
    hw, rw = rng.uniform(0, 1, n).astype(np.float32), rng.uniform(0, 1, n).astype(np.float32)
    x[:BLOCK] = t[:BLOCK] + rng.uniform(-0.1, 0.1, BLOCK).astype(np.float32)  # inside and outside the beta band
    results = {}
    for threads in (1, 4):
        monkeypatch.setenv(host_pool.ENV_VAR, str(threads))
        sums = detection_loss_numpy.partials(x, t, hw, rw, 0.7, 1.3, beta)
        grad = detection_loss_numpy.backward(np.float32(2.0), x, t, hw, rw, 0.7, 1.3, beta)
        results[threads] = (sums, detection_loss_numpy.reduce(sums), grad)
    assert results[1][0].shape == (12,)
    for got, want in zip(results[4], results[1], strict=True):
        np.testing.assert_array_equal(got, want)
    loss, grad64 = detection_loss_numpy.detection_loss_reference(x, t, hw, rw, 0.7, 1.3, beta)
    np.testing.assert_allclose(float(results[1][1]), loss, rtol=1e-5)  # float32 terms, float64 sums
    np.testing.assert_allclose(results[1][2], 2.0 * grad64, rtol=1e-5, atol=1e-6)


# ---- the pool itself ------------------------------------------------------------------------------
@pytest.mark.parametrize(("total", "block"), [(0, 4), (3, 4), (4, 4), (17, 4), (1000, 7)])
def test_run_blocks_covers_every_index_once(total: int, block: int) -> None:
    hits = np.zeros(total, np.int64)
    seen = []

    def body(start: int, stop: int) -> None:
        assert 0 <= start < stop <= total and stop - start <= block
        hits[start:stop] += 1
        seen.append((start, stop))

    run_blocks(total, block, body, threads=3)
    assert (hits == 1).all() and len(seen) == -(-total // block)


@pytest.mark.parametrize(
    ("l2", "l3", "cpus", "live", "expected"),
    [
        (1 << 20, 32 << 20, 2, 7, 1 << 19),  # the Zen 5 CI VM: 16 MiB of L3 per core / 28 bytes -> 512K
        (1 << 20, 32 << 20, 2, 20, 1 << 17),  # more live arrays, smaller blocks
        (1 << 20, 0, 2, 7, 1 << 16),  # no L3 reported: twice the L2 (2 MiB / 28 bytes -> 64K)
        (1 << 20, 8 << 20, 16, 7, 1 << 16),  # a 512 KiB L3 share is less than twice the L2
        (1 << 20, 1 << 30, 1, 1, 1 << 20),  # capped at 1M elements
        (1 << 10, 0, 64, 100, 1 << 14),  # at least 16K elements
    ],
)
def test_block_elements_fit_one_cores_cache_share(l2, l3, cpus, live, expected, monkeypatch) -> None:
    monkeypatch.setattr(host_pool, "_cache_bytes", lambda level, default: {2: l2, 3: l3}[level])
    monkeypatch.setattr(host_pool.os, "cpu_count", lambda: cpus)
    monkeypatch.setenv(host_pool.ENV_VAR, "3")  # the thread count never changes the block
    assert host_pool.block_elements(live) == expected


def test_run_blocks_really_runs_threads_at_once() -> None:
    """Three blocks wait for each other: this returns only if three threads run them concurrently."""
    barrier = threading.Barrier(3, timeout=30)
    threads = set()

    def body(start: int, stop: int) -> None:
        threads.add(threading.get_ident())
        barrier.wait()

    run_blocks(3, 1, body, threads=3)
    assert len(threads) == 3


def _affinities_during_a_call() -> dict[str, set[int]]:
    """Each thread's CPU set while two threads run one block each."""
    barrier = threading.Barrier(2, timeout=30)
    seen: dict[str, set[int]] = {}
    caller = threading.get_ident()

    def body(start: int, stop: int) -> None:
        seen["caller" if threading.get_ident() == caller else "helper"] = os.sched_getaffinity(0)
        barrier.wait()

    run_blocks(2, 1, body, threads=2)
    return seen


needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs and affinity"
)


@needs_two_cpus
def test_run_blocks_pins_the_helper_and_the_caller_and_restores_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(host_pool.PIN_ENV, raising=False)
    before = os.sched_getaffinity(0)
    first, second = sorted(before)[:2]
    assert _affinities_during_a_call() == {"caller": {first}, "helper": {second}}
    assert os.sched_getaffinity(0) == before


@needs_two_cpus
def test_only_one_caller_at_a_time_is_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread calling in while another's call runs keeps its CPU set (both on one CPU would be slower)."""
    monkeypatch.delenv(host_pool.PIN_ENV, raising=False)
    caller = threading.get_ident()
    seen: dict[str, object] = {}

    def other() -> None:
        seen["other"] = host_pool._pin_caller(host_pool.pinning_cpus(2))

    caller_ran = threading.Event()

    def body(start: int, stop: int) -> None:
        if threading.get_ident() == caller:
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
            caller_ran.set()
        else:
            # The helper holds its block until the caller has run one: whichever thread starts
            # first, the caller always runs a block (and so calls in while pinned).
            caller_ran.wait()

    run_blocks(2, 1, body, threads=2)
    assert seen["other"] is None
    previous = host_pool._pin_caller(host_pool.pinning_cpus(2))  # free again once the call is over
    assert previous is not None
    host_pool._unpin_caller(previous)
    assert os.sched_getaffinity(0) == previous


@needs_two_cpus
def test_pinning_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(host_pool.PIN_ENV, "0")
    before = os.sched_getaffinity(0)
    assert host_pool.pinning_cpus(2) is None
    assert _affinities_during_a_call() == {"caller": before, "helper": before}


def test_run_blocks_reraises_and_nests() -> None:
    def bad(start: int, stop: int) -> None:
        if start == 8:
            raise KeyError("block 8")

    with pytest.raises(KeyError, match="block 8"):
        run_blocks(20, 4, bad, threads=2)
    out = np.zeros(64)

    def outer(start: int, stop: int) -> None:  # a pool thread running blocks of its own
        run_blocks(stop - start, 2, lambda s, e: out[start + s : start + e].__iadd__(1), threads=2)

    run_blocks(64, 16, outer, threads=2)
    assert (out == 1).all()


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_thread_count_is_named(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(host_pool.ENV_VAR, value)
    with pytest.raises(ValueError, match=f"NETCL_HOST_THREADS must be a positive integer, got '{value}'"):
        host_threads()


@pytest.mark.parametrize(
    ("x_shape", "y_shape"),
    [
        ((300, 70), (70, 50)),  # rows split over the threads
        ((3, 5, 90, 64), (5, 64, 33)),  # whole products of a broadcast batch
        ((1, 256, 128), (128, 129)),  # one product: rows split
        ((7, 3), (3, 2)),  # below the split size: one call
        ((64,), (64, 8)),  # vector @ matrix
    ],
)
@pytest.mark.parametrize("threads", ["1", "2"])
def test_host_matmul_equals_numpy(x_shape, y_shape, threads: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Single-threaded BLAS per block gives each row what one np.matmul call gives it."""
    from threadpoolctl import threadpool_info

    monkeypatch.setenv(host_pool.ENV_VAR, threads)
    monkeypatch.setattr(host_pool, "MATMUL_SPLIT_MACS", 1000)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(y_shape).astype(np.float32)
    before = [lib["num_threads"] for lib in threadpool_info()]
    got = host_pool.matmul(x, y)
    np.testing.assert_allclose(got, x.astype(np.float64) @ y.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert got.shape == np.matmul(x, y).shape and got.dtype == np.float32
    assert [lib["num_threads"] for lib in threadpool_info()] == before  # BLAS threads restored
