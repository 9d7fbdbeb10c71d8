"""The engine: graph building, backward, accumulation, grad mode, anomaly detection, threads."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.autograd import engine
from netcl.core import Tensor


def host(x):
    return x.to_host() if hasattr(x, "to_host") else np.asarray(x)


# ---- Node and tensor() -----------------------------------------------------------------------
def test_tensor_and_node_surface(device):
    x = ag.tensor([[1.0, 2.0, 3.0]], requires_grad=True, device=device)
    assert isinstance(x.value, Tensor) and x.value.device is device
    assert x.shape == (1, 3) and x.dtype == np.float32 and x.device is device and x.is_leaf
    np.testing.assert_array_equal(x.to_host(), [[1, 2, 3]])
    assert {x: 1}[x] == 1  # hashable by identity
    y = ag.tensor(x.value)  # wrapping a Tensor shares it
    assert y.value is x.value and not y.requires_grad
    assert ag.tensor(np.array([1, 2], dtype=np.int32), device=device).dtype == np.int32
    with pytest.raises(TypeError, match="floating-point"):
        ag.tensor(np.array([1, 2], dtype=np.int32), requires_grad=True, device=device)


def test_tensor_device_spec_string():
    x = ag.tensor([1.0, 2.0], device="cpu")
    assert x.device.kind == "cpu"


# ---- backward basics -------------------------------------------------------------------------
def test_multiple_use_accumulates(device):
    x = ag.tensor([1.0, -2.0, 3.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        loss = ag.sum(x * x + x * 3.0 + x)
    tape.backward(loss)
    np.testing.assert_allclose(x.grad.to_host(), 2 * x.to_host() + 4.0)


def test_accumulation_does_not_corrupt_aliased_gradients(device):
    # add() hands the same upstream tensor to both inputs; accumulating into x's gradient must
    # not change z's.
    x = ag.tensor([1.0, 2.0], requires_grad=True, device=device)
    z = ag.tensor([3.0, 4.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        y = x + z
        loss = ag.sum(y + x)
    tape.backward(loss)
    np.testing.assert_allclose(x.grad.to_host(), [2.0, 2.0])
    np.testing.assert_allclose(z.grad.to_host(), [1.0, 1.0])
    np.testing.assert_allclose(y.grad.to_host(), [1.0, 1.0])


def test_leaf_gradients_accumulate_across_backward_calls(device):
    a = ag.tensor([1.0, 2.0], requires_grad=True, device=device)
    b = ag.tensor([5.0, 6.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        loss = ag.sum(a + b)  # a.grad and b.grad start as the same upstream tensor
    tape.backward(loss)
    for _ in range(2):
        with ag.Tape() as tape:
            loss = ag.sum(a * 3.0)
        tape.backward(loss)
    np.testing.assert_allclose(a.grad.to_host(), [7.0, 7.0])
    np.testing.assert_allclose(b.grad.to_host(), [1.0, 1.0])
    assert a.value.grad is a.grad


def test_each_leaf_gets_its_gradient_in_its_own_dtype(device):
    """A float64 term promotes the loss; the float16 and float32 leaves still get their own dtype (torch's
    engine casts each gradient to its tensor's dtype; the optimizers refuse any other)."""
    if not (device.computes(np.float64) and device.supports(np.float16)):
        pytest.skip("needs float64 kernels and float16 tensors")
    values = {np.float16: [0.5, -1.25, 2.0], np.float32: [1.5, 0.25, -3.0], np.float64: [0.1, 0.2, -0.7]}
    leaves = {k: ag.tensor(np.array(v, k), requires_grad=True, dtype=k, device=device) for k, v in values.items()}
    with ag.Tape():
        loss = ag.sum(leaves[np.float32] * leaves[np.float32]) + ag.sum(leaves[np.float16] * leaves[np.float16])
        loss = loss + ag.sum(leaves[np.float64] * leaves[np.float64])
        assert loss.dtype == np.float64
        loss.backward()
    for dtype, leaf in leaves.items():
        assert leaf.grad.dtype == dtype
        # d/dx sum(x * x) = 2x: exact in every dtype (x is representable, doubling is exact)
        np.testing.assert_array_equal(leaf.grad.to_host(), 2 * np.array(values[dtype], dtype))


def test_non_scalar_loss_needs_grad(device):
    x = ag.tensor([1.0, 2.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        y = x * 2.0
    with pytest.raises(RuntimeError, match=r"non-scalar loss of shape \(2,\).*grad="):
        tape.backward(y)
    tape.backward(y, grad=np.array([1.0, 10.0], dtype=np.float32))
    np.testing.assert_allclose(x.grad.to_host(), [2.0, 20.0])


def test_loss_without_grad_is_an_error(device):
    x = ag.tensor([1.0], device=device)
    with ag.Tape() as tape:
        loss = ag.sum(x * 2.0)
    with pytest.raises(RuntimeError, match="does not require grad"):
        tape.backward(loss)


def test_backward_twice_needs_retain_graph(device):
    x = ag.tensor([1.0, 2.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        loss = ag.sum(x * x)
    tape.backward(loss, retain_graph=True)
    tape.backward(loss)
    np.testing.assert_allclose(x.grad.to_host(), [4.0, 8.0])
    with pytest.raises(RuntimeError, match=r"second time.*retain_graph=True"):
        tape.backward(loss)


def test_failed_backward_writes_nothing_and_leaves_the_tape_usable(device):
    x = ag.tensor([1.0, 2.0], requires_grad=True, device=device)

    def broken(g, values, out):
        raise ValueError("boom")

    with ag.Tape() as tape:
        bad = ag.apply_op(lambda v: v, broken, x * 2.0, op_name="broken")
        loss = ag.sum(bad + x)
    with pytest.raises(ValueError, match="boom"):
        tape.backward(loss)
    assert x.grad is None and loss.grad is None
    assert ag.get_current_tape() is None and tape.enabled
    with tape:
        good = ag.sum(x * 3.0)
    tape.backward(good)
    np.testing.assert_allclose(x.grad.to_host(), [3.0, 3.0])


def test_deep_chain_has_no_recursion_limit():
    x = ag.tensor([0.0], requires_grad=True, device="cpu")
    y = x
    with ag.Tape() as tape:
        for _ in range(sys.getrecursionlimit() + 500):
            y = y + 1.0
    tape.backward(ag.sum(y))
    np.testing.assert_allclose(x.grad.to_host(), [1.0])


def test_node_backward_uses_current_or_throwaway_tape(device):
    x = ag.tensor([3.0], requires_grad=True, device=device)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.to_host(), [6.0])


# ---- apply_op ----------------------------------------------------------------------------------
def test_apply_op_default_name_is_the_callers_function(device):
    def my_square(v):
        return ag.apply_op(lambda t: t, lambda g, values, out: [g], v)

    x = ag.tensor([1.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        y = my_square(x)
    assert y.op_name == "my_square" and tape.nodes == [y] and y.parents == [x]


def test_apply_op_records_on_an_explicit_tape(device):
    x = ag.tensor([1.0], requires_grad=True, device=device)
    other = ag.Tape()
    with ag.Tape() as current:
        y = ag.apply_op(lambda t: t, lambda g, v, o: [g], x, tape=other, op_name="ident")
    assert other.nodes == [y] and current.nodes == []


def test_apply_op_without_grad_fn_is_not_differentiable(device):
    x = ag.tensor([1.0], requires_grad=True, device=device)
    y = ag.apply_op(lambda t: t, None, x, op_name="stop")
    assert not y.requires_grad and y.grad_fn is None


def test_tracer_hook_takes_the_call_first(device):
    calls = []

    class FakeTracer:
        def trace(self, op_name, fn, grad_fn, args, attrs, folds_addends=False):
            calls.append((op_name, args, attrs, folds_addends))
            return "traced"

    x = ag.tensor([1.0], requires_grad=True, device=device)
    m = ag.tensor([[1.0]], requires_grad=True, device=device)
    ag.set_tracer(FakeTracer())
    try:
        assert ag.add(x, 2.0) == "traced"
        assert ag.sum(x, axis=0) == "traced"
        assert ag.matmul(m, m) == "traced"
    finally:
        ag.set_tracer(None)
    assert calls[0] == ("add_scalar_right", (x,), {"scalar": 2.0}, False)
    assert calls[1][0] == "sum" and calls[1][2] == {"axis": 0, "keepdims": False}
    assert calls[2][0] == "matmul" and calls[2][3] is True  # a product takes the sums of its inputs' other uses
    assert ag.get_tracer() is None


# ---- grad mode -----------------------------------------------------------------------------------
def test_no_grad_records_nothing(device):
    x = ag.tensor([1.0, 2.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        with ag.no_grad():
            assert not ag.is_grad_enabled()
            y = x * 2.0 + 1.0
        assert ag.is_grad_enabled()
    assert tape.nodes == [] and not y.requires_grad and y.parents == []
    np.testing.assert_allclose(y.to_host(), [3.0, 5.0])


def test_no_grad_decorator_and_set_grad_enabled(device):
    x = ag.tensor([1.0], requires_grad=True, device=device)

    @ag.no_grad()
    def f(v):
        return v * 2.0

    assert not f(x).requires_grad and ag.is_grad_enabled()
    ag.set_grad_enabled(False)
    try:
        assert not (x * 2.0).requires_grad
    finally:
        ag.set_grad_enabled(True)
    assert (x * 2.0).requires_grad


def test_disabled_tape_builds_no_graph(device):
    x = ag.tensor([1.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        tape.enabled = False
        y = x * 2.0
    assert tape.nodes == [] and not y.requires_grad


# ---- anomaly detection ---------------------------------------------------------------------------
def test_detect_anomaly_names_the_op_that_produced_nan(device):
    x = ag.tensor([-1.0, 4.0], requires_grad=True, device=device)
    with ag.detect_anomaly():
        assert ag.is_anomaly_enabled()
        with ag.Tape() as tape:
            root = ag.sqrt(x)  # NaN at -1, and so is its gradient
            loss = ag.sum(root * 2.0)
        assert root.creation_trace and any("test_engine.py" in line for line in root.creation_trace)
        with pytest.raises(RuntimeError, match=r"op 'sqrt' produced NaN(.|\n)*test_engine\.py"):
            tape.backward(loss)
    assert not ag.is_anomaly_enabled()
    assert x.grad is None


def test_without_anomaly_detection_nan_passes_silently(device):
    x = ag.tensor([-1.0, 4.0], requires_grad=True, device=device)
    with ag.Tape() as tape:
        root = ag.sqrt(x)
        loss = ag.sum(root)
    assert root.creation_trace is None
    tape.backward(loss)
    grad = x.grad.to_host()
    assert np.isnan(grad[0]) and grad[1] == pytest.approx(0.25)


def test_set_detect_anomaly_and_inf(device):
    x = ag.tensor([0.0, 1.0], requires_grad=True, device=device)
    ag.set_detect_anomaly(True)
    try:
        with ag.Tape() as tape:
            loss = ag.sum(ag.log(x))  # d log / dx = 1/0 = inf
        with pytest.raises(RuntimeError, match="op 'log' produced Inf"):
            tape.backward(loss)
    finally:
        ag.set_detect_anomaly(False)


# ---- thread-local tapes --------------------------------------------------------------------------
def test_tapes_in_two_threads_do_not_see_each_other():
    barrier = threading.Barrier(2)
    results = {}

    def worker(name, factor):
        x = ag.tensor([1.0, 2.0], requires_grad=True, device="cpu")
        with ag.Tape() as tape:
            barrier.wait()
            y = x * factor
            barrier.wait()
            loss = ag.sum(y)
            barrier.wait()
            results[name] = (tape, ag.get_current_tape(), [y, loss])
        tape.backward(loss)
        results[name + "_grad"] = x.grad.to_host()

    threads = [threading.Thread(target=worker, args=(n, f)) for n, f in (("a", 2.0), ("b", 5.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in "ab":
        tape, current, nodes = results[name]
        assert current is tape and tape.nodes == nodes
    assert results["a"][0] is not results["b"][0]
    np.testing.assert_allclose(results["a_grad"], [2.0, 2.0])
    np.testing.assert_allclose(results["b_grad"], [5.0, 5.0])
    assert ag.get_current_tape() is None


def test_set_current_tape_and_debug_tape(device):
    tape = ag.Tape()
    ag.set_current_tape(tape)
    try:
        assert ag.get_current_tape() is tape
    finally:
        ag.set_current_tape(None)
    x = ag.tensor([1.0], requires_grad=True, device=device)
    with ag.debug_tape(tape) as t:
        assert t is tape and ag.get_current_tape() is tape
        y = x * 2.0
        assert len(t.nodes) == 1
        ag.mse_loss(y, x)
        assert len(t.nodes) == 2 and t.nodes[-1].op_name == "mse_loss"
    assert ag.get_current_tape() is None


# ---- queue bookkeeping ---------------------------------------------------------------------------
def test_steps_enqueue_back_to_back_and_stay_correct(cl_device):
    """No Tape waits for the device: five gradient steps enqueue without a read in between (pooled
    buffers are reused while earlier kernels may still be queued) and match float64 NumPy."""
    rng = np.random.default_rng(3)
    x64, w64 = rng.standard_normal((64, 8)), rng.standard_normal(8)
    x = ag.tensor(x64.astype(np.float32), device=cl_device)
    w = ag.tensor(w64.astype(np.float32), requires_grad=True, device=cl_device)
    for _ in range(5):
        with ag.Tape() as tape:
            loss = ag.sum((x * w) ** 2.0)
        tape.backward(loss)
        w = ag.tensor((w - w.grad * 0.01).value, requires_grad=True)
        w64 = w64 - 0.01 * np.sum(2.0 * x64**2 * w64, axis=0)
    # five steps of float32 sums of 64 terms: a few ulps of |w| <= ~3 each step
    np.testing.assert_allclose(w.to_host(), w64, rtol=1e-5, atol=1e-5)


# ---- gradcheck -----------------------------------------------------------------------------------
def test_gradcheck_catches_a_wrong_gradient(device):
    from netcl.runtime import ops as R

    def bad_square(v):
        return ag.apply_op(lambda t: R.mul(t, t), lambda g, vals, out: [R.mul(g, R.mul(vals[0], 3.0))], v)

    x = ag.tensor([0.5, -1.0, 2.0], requires_grad=True, device=device)
    with pytest.raises(ag.GradcheckError, match="input 0"):
        ag.gradcheck(bad_square, x)
    assert ag.gradcheck(lambda v: v * v, x) and x.grad is None


# ---- lazy netcl.jit names ------------------------------------------------------------------------
def test_jit_names_raise_an_import_error_naming_netcl_jit_when_absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "netcl.jit", None)
    monkeypatch.delitem(sys.modules, "netcl.autograd.compiler", raising=False)
    monkeypatch.delitem(sys.modules, "netcl.autograd.training_compiler", raising=False)
    with pytest.raises(ImportError, match="netcl-jit"):
        ag.jit_compile  # noqa: B018
    with pytest.raises(ImportError, match="netcl-jit"):
        import netcl.autograd.compiler
    with pytest.raises(ImportError, match="netcl-jit"):
        import netcl.autograd.training_compiler  # noqa: F401
    with pytest.raises(AttributeError):
        ag.not_a_name  # noqa: B018


def test_engine_module_exposes_the_spec_names():
    for name in (
        "Node",
        "Tape",
        "apply_op",
        "no_grad",
        "set_grad_enabled",
        "is_grad_enabled",
        "set_detect_anomaly",
        "detect_anomaly",
        "set_current_tape",
        "get_current_tape",
    ):
        assert getattr(engine, name) is getattr(ag, name)


def test_jit_names_resolve_from_netcl_jit_when_installed():
    jit = pytest.importorskip("netcl.jit")
    if not hasattr(jit, "jit_compile"):
        pytest.skip("netcl.jit does not provide jit_compile yet")
    assert ag.jit_compile is jit.jit_compile
    from netcl.autograd import compiler

    assert compiler.jit_compile is jit.jit_compile and "add" in compiler._PRIMITIVES


def test_node_repr_tolerates_a_value_without_device():
    class Symbolic:
        shape, dtype = (2,), np.dtype(np.float32)

    assert "device=None" in repr(ag.Node(Symbolic()))
    assert "device=cpu" in repr(ag.tensor([1.0], device="cpu"))
