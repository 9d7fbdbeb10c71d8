"""The eager fast paths: ops under ``no_grad`` that run their forward alone (``engine.forward_only``), and
elementwise ops that record their Node without ``apply_op``. Each must build exactly what ``apply_op``
builds (values, Node fields, tape records, gradients); the tests count the Python-level work skipped."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.autograd import elementwise, engine, ops, ops_index, ops_softmax

RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 6)).astype(np.float32)
Y = RNG.standard_normal((4, 6)).astype(np.float32)
IDX = np.array([3, 0, 3, 1], dtype=np.int32)
GIDX = RNG.integers(0, 6, (4, 2)).astype(np.int32)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


#: name -> (op on (x node, index tensors), float64 NumPy reference on (x, idx, gidx))
FRONTS: dict[str, tuple[Callable[..., Any], Callable[..., np.ndarray]]] = {
    "sum": (lambda x, i, g: ag.sum(x, axis=1), lambda x, i, g: x.sum(1)),
    "mean": (lambda x, i, g: ag.mean(x), lambda x, i, g: x.mean()),
    "max": (lambda x, i, g: ag.max(x, axis=0, keepdims=True), lambda x, i, g: x.max(0, keepdims=True)),
    "transpose": (lambda x, i, g: ag.transpose(x), lambda x, i, g: x.T),
    "softmax": (lambda x, i, g: ag.softmax(x, axis=0), lambda x, i, g: _softmax(x, 0)),
    "log_softmax": (lambda x, i, g: ag.log_softmax(x), lambda x, i, g: np.log(_softmax(x))),
    "index_select": (lambda x, i, g: ag.index_select(x, 1, i), lambda x, i, g: x[:, i]),
    "gather": (lambda x, i, g: ag.gather(x, 1, g), lambda x, i, g: np.take_along_axis(x, g, 1)),
    "reshape": (lambda x, i, g: ag.reshape(x, (3, -1)), lambda x, i, g: x.reshape(3, 8)),
}


@pytest.fixture
def apply_op_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The op names of every call of the engine's recorders (``apply_op``, and ``record_one``, which records a
    one-argument op whose forward ran already) made through the fronts' modules during the test."""
    calls: list[str] = []

    def counting(real: Callable[..., Any], name_at: int | None) -> Callable[..., Any]:
        def recorder(*args: Any, **kwargs: Any) -> Any:  # the op name: a keyword, or record_one's fifth argument
            calls.append(kwargs.get("op_name", None if name_at is None else args[name_at]))
            return real(*args, **kwargs)

        return recorder

    for module in (ops, ops_index, ops_softmax, elementwise):
        monkeypatch.setattr(module, "apply_op", counting(engine.apply_op, None))
        if hasattr(module, "record_one"):
            monkeypatch.setattr(module, "record_one", counting(engine.record_one, 4))
    return calls


@pytest.fixture
def row_provider() -> Iterator[Callable[..., None]]:
    """``install(provider, declines=None)``: the row hook's provider for the test (``row_hook.set_row_provider``),
    whether another test imported netcl.jit or not; the one installed before comes back after the test."""
    from netcl.autograd import row_hook

    before = (row_hook._provider, row_hook._declines)
    row_hook.set_row_provider(None)
    yield row_hook.set_row_provider
    row_hook.set_row_provider(*before)


def _inputs(device: Any, grad: bool) -> tuple[Any, Any, Any]:
    x = ag.tensor(X, device=device, requires_grad=grad)
    idx = ag.tensor(IDX, device=device, dtype=np.int32).value
    gidx = ag.tensor(GIDX, device=device, dtype=np.int32).value
    return x, idx, gidx


def test_forward_only_says_when_nothing_is_recorded() -> None:
    assert not engine.forward_only()  # grad mode on
    with ag.no_grad():
        assert engine.forward_only()
        engine.set_tracer(object())  # type: ignore[arg-type]
        try:
            assert not engine.forward_only()  # a tracer takes every op, grad mode or not
        finally:
            engine.set_tracer(None)


def test_an_untracked_node_has_the_fields_of_a_plain_node(device: Any) -> None:
    """``untracked`` (the Node every no_grad op returns) sets what ``Node(value, op_name=...)`` sets, and reads the
    same class defaults (no gradient, no trace, nothing freed)."""
    value = ag.tensor(X, device=device).value
    made, plain = engine.untracked(value, "add"), engine.Node(value, op_name="add")
    assert type(made) is engine.Node and vars(made) == vars(plain)
    assert made.parents is not plain.parents  # a list of its own
    assert (made.grad, made.creation_trace, made._freed, made.requires_grad) == (None, None, False, False)


@pytest.mark.parametrize("name", sorted(FRONTS))
def test_no_grad_fronts_skip_apply_op(device: Any, name: str, apply_op_calls: list[str]) -> None:
    op, reference = FRONTS[name]
    x, idx, gidx = _inputs(device, grad=False)
    with ag.no_grad():
        out = op(x, idx, gidx)
    assert apply_op_calls == []
    assert isinstance(out, ag.Node) and out.grad_fn is None and not out.requires_grad and out.parents == []
    assert out.op_name == name
    # float32 kernels against a float64 reference: a few ulps of the largest magnitude (exp/log in softmax)
    np.testing.assert_allclose(out.to_host(), reference(X.astype(np.float64), IDX, GIDX), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(FRONTS))
def test_recording_fronts_still_record_through_the_engine(device: Any, name: str, apply_op_calls: list[str]) -> None:
    op, reference = FRONTS[name]
    x, idx, gidx = _inputs(device, grad=True)
    with ag.Tape() as tape:
        out = op(x, idx, gidx)
    assert apply_op_calls == [name]
    assert out.requires_grad and out.parents == [x] and tape.nodes == [out]
    np.testing.assert_allclose(out.to_host(), reference(X.astype(np.float64), IDX, GIDX), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_a_planned_softmax_under_no_grad_is_its_launch_alone(
    cl_device: Any, name: str, monkeypatch, row_provider: Callable[..., None]
) -> None:
    """Once a shape, dtype and axis were planned, a no_grad call makes no checks and no layout work again
    (``rowwise.one_axis`` is not reached), and returns what the checked path returns; with a row provider
    installed that cannot say which signatures it declines, every call still asks it first."""
    from netcl.runtime.ops import rowwise

    op, reference = FRONTS[name]
    x, idx, gidx = _inputs(cl_device, grad=False)
    with ag.no_grad():
        first = op(x, idx, gidx).to_host()
        checked = rowwise.one_axis
        monkeypatch.setattr(rowwise, "one_axis", lambda *a: pytest.fail("the planned call checked again"))
        again = op(x, idx, gidx)
        asked: list[str] = []
        row_provider(lambda op_name, args, attrs: asked.append(op_name))
        monkeypatch.setattr(rowwise, "one_axis", checked)
        op(x, idx, gidx)
    assert asked == [name]
    assert again.op_name == name and again.grad_fn is None and again.parents == []
    np.testing.assert_array_equal(again.to_host(), first)
    # float32 kernels against a float64 reference: a few ulps of the largest magnitude (exp/log)
    np.testing.assert_allclose(first, reference(X.astype(np.float64), IDX, GIDX), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_a_planned_softmax_records_without_its_checks(
    cl_device: Any, name: str, monkeypatch, row_provider: Callable[..., None]
) -> None:
    """Recording a call on a planned shape, dtype and axis skips the checks and records what the checked call
    records: the same Node, and the gradient against float64."""
    from netcl.runtime.ops import rowwise

    op, reference = FRONTS[name]
    x, idx, gidx = _inputs(cl_device, grad=True)
    with ag.Tape():
        op(x, idx, gidx)  # plans
    monkeypatch.setattr(rowwise, "one_axis", lambda *a: pytest.fail("the planned call checked again"))
    w = RNG.standard_normal(X.shape)
    with ag.Tape() as tape:
        out = op(x, idx, gidx)
    assert out.op_name == name and out.parents == [x] and tape.nodes == [out]
    tape.backward(out, grad=ag.tensor(w.astype(np.float32), device=cl_device))
    x64 = X.astype(np.float64)
    if name == "softmax":  # along axis 0: d/dx sum(w * s) = s * (w - sum(w * s))
        s = reference(x64, IDX, GIDX)
        expected = s * (w - (w * s).sum(axis=0, keepdims=True))
    else:  # along the last axis: w - softmax * sum(w)
        expected = w - _softmax(x64) * w.sum(axis=-1, keepdims=True)
    # float32 kernels, values of magnitude <= a few: a few ulps
    np.testing.assert_allclose(x.grad.to_host(), expected, rtol=1e-5, atol=1e-5)


def test_a_planned_softmax_rebinds_its_statistics_scratch_when_it_grows(
    cl_device: Any, row_provider: Callable[..., None]
) -> None:
    """A planned call that drops its statistics writes them into the device's scratch pair through a launch with
    that pair set once; a larger call in between grows the pair, and the next planned call binds the new pair
    (the old one may be gone) and returns the same values."""
    from netcl.runtime.ops import rowwise

    small = ag.tensor(X.astype(np.float32), device=cl_device)
    large = ag.tensor(RNG.standard_normal((4096, 8)).astype(np.float32), device=cl_device)
    with ag.no_grad():
        ag.softmax(small, axis=-1)  # plans
        first = ag.softmax(small, axis=-1).to_host()
        ag.softmax(large, axis=-1)
        ag.softmax(large, axis=-1)  # grows the scratch pair past the small call's
        again = ag.softmax(small, axis=-1).to_host()
    plan = rowwise.softmax_plan(small.value, -1, rowwise.SOFTMAX)[1]
    pair, bound = rowwise._STAT_SCRATCH[cl_device], rowwise._SCRATCH_BOUND[plan[0]]
    assert pair[0] == 4096 * 4 and bound._static[2] is pair[1] and bound._static[3] is pair[2]
    np.testing.assert_array_equal(again, first)
    np.testing.assert_allclose(first, _softmax(X.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_a_planned_softmax_skips_a_provider_that_declines_its_signature(
    cl_device: Any, monkeypatch, row_provider: Callable[..., None]
) -> None:
    """With a row provider whose ``declines`` says it returns None for a signature (netcl.jit's, for tensors under
    its size floor and on CPU devices), no call of that signature asks the provider (the first, checked one
    neither) and a planned call does not check again; ``declines`` is asked once per signature; a signature it
    takes asks the provider on every call."""
    from netcl.runtime import clear_caches
    from netcl.runtime.ops import rowwise

    clear_caches()  # no plan left by other tests: the first call of each shape is the checked one
    asked: list[tuple] = []
    declines_asked: list[tuple] = []

    def declines(op_name: str, value: Any) -> bool:
        declines_asked.append(value.shape)
        return value.shape == X.shape

    row_provider(lambda op_name, args, attrs: asked.append(args[0].shape), declines)
    x = ag.tensor(X.astype(np.float32), device=cl_device)
    other = ag.tensor(X[:, :5].astype(np.float32), device=cl_device)
    checked = rowwise.one_axis
    with ag.no_grad():
        first = ag.softmax(x).to_host()  # checks, asks declines (not the provider), plans
        monkeypatch.setattr(rowwise, "one_axis", lambda *a: pytest.fail("the planned call checked again"))
        again = [ag.softmax(x).to_host() for _ in range(2)]
        monkeypatch.setattr(rowwise, "one_axis", checked)
        for _ in range(3):
            ag.softmax(other)
    assert asked == [other.shape] * 3
    assert declines_asked == [X.shape, other.shape]
    for values in again:
        np.testing.assert_array_equal(values, first)
    np.testing.assert_allclose(first, _softmax(X.astype(np.float64)), rtol=1e-5, atol=1e-6)


LABELS = np.array([0, 5, 2, 3], dtype=np.int32)
#: the row ops that ask the row hook, each on X (labels for cross_entropy), with its float64 reference
ROW_HOOK_OPS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[np.ndarray], np.ndarray]]] = {
    "layer_norm": (
        lambda x, labels: ag.layer_norm(x, X.shape[-1]),
        lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
    ),
    "rms_norm": (
        lambda x, labels: ag.rms_norm(x, X.shape[-1], eps=1e-6),
        lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6),
    ),
    "cross_entropy": (
        lambda x, labels: ag.cross_entropy(x, labels),
        lambda x: -np.log(_softmax(x)[np.arange(len(LABELS)), LABELS]).mean(),
    ),
}


@pytest.mark.parametrize("name", sorted(ROW_HOOK_OPS))
def test_row_ops_skip_a_provider_that_declines_their_signature(
    cl_device: Any, name: str, row_provider: Callable[..., None]
) -> None:
    """layer_norm, rms_norm and cross_entropy do not call a row provider whose ``declines`` says it returns None
    for their first argument's signature (``declines`` asked once per signature) and run their own kernels; a
    provider without ``declines`` is called on every call."""
    op, reference = ROW_HOOK_OPS[name]
    asked: list[str] = []
    declines_asked: list[tuple] = []

    def declines(op_name: str, value: Any) -> bool:
        declines_asked.append((op_name, value.shape))
        return True

    x = ag.tensor(X, device=cl_device)
    labels = ag.tensor(LABELS, device=cl_device, dtype=np.int32)
    row_provider(lambda op_name, args, attrs: asked.append(op_name), declines)
    results = [op(x, labels).to_host() for _ in range(3)]
    assert asked == [] and declines_asked == [(name, X.shape)]
    row_provider(lambda op_name, args, attrs: asked.append(op_name))
    op(x, labels)
    op(x, labels)
    assert asked == [name, name]
    for values in results:
        # float32 row kernels against float64: a few ulps of values of magnitude <= a few
        np.testing.assert_allclose(values, reference(X.astype(np.float64)), rtol=1e-5, atol=1e-5)


def test_bad_inputs_still_raise_under_no_grad(device: Any) -> None:
    x, idx, _ = _inputs(device, grad=False)
    with ag.no_grad():
        with pytest.raises(Exception, match="axis"):
            ag.sum(x, axis=5)
        with pytest.raises(Exception, match=r"axis|dimension"):
            ag.index_select(x, 3, idx)
        with pytest.raises(Exception, match="permutation"):
            ag.transpose(x, (0, 0))


#: bad calls of the index ops, whose no_grad front leaves every check to the runtime op
BAD_INDEX_CALLS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "axis": lambda x, i, f: ag.index_select(x, 5, i),
    "bool axis": lambda x, i, f: ag.gather(x, True, i.reshape(1, 4)),
    "float index": lambda x, i, f: ag.index_select(x, 0, f),
    "2-d index": lambda x, i, f: ag.index_select(x, 0, i.reshape(2, 2)),
    "gather float index": lambda x, i, f: ag.gather(x, 1, f.reshape(4, 1)),
    "out of range": lambda x, i, f: ag.index_select(x, 0, ag.tensor(IDX + 4, device=x.device).value).to_host(),
    "not a tensor": lambda x, i, f: ag.index_select([[1.0]], 0, i),
}


@pytest.mark.parametrize("name", sorted(BAD_INDEX_CALLS))
def test_index_ops_raise_the_same_under_no_grad(device: Any, name: str) -> None:
    x, idx, _ = _inputs(device, grad=False)
    floats = ag.tensor(IDX.astype(np.float32), device=device).value
    raised = []
    for context in (ag.Tape, ag.no_grad):
        with context(), pytest.raises(Exception) as caught:
            BAD_INDEX_CALLS[name](x, idx, floats)
        raised.append((type(caught.value), str(caught.value)))
    assert raised[0] == raised[1]


# ---- elementwise ops recorded without apply_op ------------------------------------------------
ELEMENTWISE: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "add": (lambda a, b: ag.add(a, b), lambda a, b: a + b),
    "mul_scalar_right": (lambda a, b: ag.mul(a, 2.5), lambda a, b: a * 2.5),
    "sub_scalar_left": (lambda a, b: ag.sub(1.5, a), lambda a, b: 1.5 - a),
    "exp": (lambda a, b: ag.exp(a), lambda a, b: np.exp(a)),
    "leaky_relu": (lambda a, b: ag.leaky_relu(a, 0.1), lambda a, b: np.where(a > 0, a, 0.1 * a)),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_records_like_apply_op(device: Any, name: str, apply_op_calls: list[str]) -> None:
    """The directly recorded Node has apply_op's fields and tape record, and its gradient is the
    same as that of the call made through apply_op (``_through_apply_op``, the tracer's path)."""
    op, _ = ELEMENTWISE[name]
    a = ag.tensor(X, device=device, requires_grad=True)
    b = ag.tensor(Y, device=device, requires_grad=True)
    seed = ag.tensor(Y, device=device).value
    with ag.Tape() as tape:
        out = op(a, b)
        out.backward(seed)
    assert apply_op_calls == []
    assert isinstance(out.grad_fn, elementwise._Recorded) or out.grad_fn is None  # freed by the backward
    assert tape.nodes == [out] and out.requires_grad and out.op_name is not None
    direct = {id(n): None if n.grad is None else n.grad.to_host() for n in (a, b)}

    a2 = ag.tensor(X, device=device, requires_grad=True)
    b2 = ag.tensor(Y, device=device, requires_grad=True)
    with ag.Tape() as tape2:
        node = op(a2, b2)  # to learn the call's op name, inputs and attributes; then made through apply_op
        parents, grad = list(node.parents), node.grad_fn
        tape2.nodes.clear()
        entry = elementwise._ENTRIES[node.op_name]
        via = elementwise._through_apply_op(entry, node.op_name, grad.inputs, grad.attrs or None)
        assert via.parents == parents and all(p is a2 or p is b2 for p in parents)  # before backward frees them
        via.backward(seed)
    assert apply_op_calls == [node.op_name]
    assert tape2.nodes == [via] and via.requires_grad and via.op_name == out.op_name == node.op_name
    np.testing.assert_array_equal(via.to_host(), out.to_host())
    for direct_node, via_node in ((a, a2), (b, b2)):
        if direct[id(direct_node)] is None:
            assert via_node.grad is None
        else:
            np.testing.assert_array_equal(via_node.grad.to_host(), direct[id(direct_node)])


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_gradients_against_float64(device: Any, name: str) -> None:
    """Gradients of the directly recorded ops against central finite differences of a float64 NumPy
    forward (a smooth point: |x| > 0.05 keeps leaky_relu away from its kink)."""
    op, reference = ELEMENTWISE[name]
    x = np.where(np.abs(X) < 0.05, 0.5, X).astype(np.float32)
    a = ag.tensor(x, device=device, requires_grad=True)
    b = ag.tensor(Y, device=device, requires_grad=True)
    with ag.Tape():
        out = op(a, b)
        out.backward(ag.tensor(np.ones_like(Y), device=device).value)
    eps = 1e-6
    x64, y64 = x.astype(np.float64), Y.astype(np.float64)
    expected_a = (reference(x64 + eps, y64) - reference(x64 - eps, y64)) / (2 * eps)
    # float32 kernels: a few float32 ulps of the derivative's magnitude (at most e**2.5 here)
    np.testing.assert_allclose(a.grad.to_host(), expected_a, rtol=1e-5, atol=1e-5)
    if name == "add":
        np.testing.assert_allclose(b.grad.to_host(), np.ones_like(Y), rtol=0, atol=0)
    else:
        assert b.grad is None


def test_elementwise_record_rules(device: Any) -> None:
    """apply_op's rules: no input requiring grad or a disabled tape -> a bare Node (recorded only on an
    enabled tape); a non-differentiable op (a comparison) -> a bare Node."""
    plain = ag.tensor(X, device=device)
    tracked = ag.tensor(X, device=device, requires_grad=True)
    with ag.Tape() as tape:
        bare = ag.add(plain, plain)
        compared = ag.lt(tracked, 0.0)
    assert bare.grad_fn is None and not bare.requires_grad and bare.parents == []
    assert compared.grad_fn is None and not compared.requires_grad
    assert tape.nodes == [bare, compared]
    with ag.Tape() as off:
        off.enabled = False
        untracked = ag.mul(tracked, 3.0)
    assert off.nodes == [] and untracked.grad_fn is None and not untracked.requires_grad
    np.testing.assert_allclose(untracked.to_host(), X.astype(np.float64) * 3.0, rtol=1e-6)


@pytest.mark.parametrize("name", ["index_select", "gather"])
def test_index_checks_memo(device: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated (shape, axis, index shape, index dtype) skips the shape checks; anything else they read
    is checked again: an index of another dtype, and ``True`` for the axis (equal to 1 as a dict key)."""
    x, idx, gidx = _inputs(device, grad=False)
    index = idx if name == "index_select" else gidx
    module, check = (
        (ops_index.selecting, "check_index_select_shapes")
        if name == "index_select"
        else (ops_index.gathering, "check_gather_shapes")
    )
    op = getattr(ag, name)
    ops_index._CHECKED.clear()
    calls: list[Any] = []
    real = getattr(module, check)

    def counting(*args: Any) -> int:
        if sys._getframe(1).f_globals["__name__"] == ops_index.__name__:  # the front's check, not the runtime's
            calls.append(args)
        return real(*args)

    monkeypatch.setattr(module, check, counting)
    first = op(x, 1, index)
    second = op(x, 1, index)
    assert len(calls) == 1
    np.testing.assert_array_equal(first.to_host(), second.to_host())
    with pytest.raises(TypeError, match="axis must be an int"):
        op(x, True, index)
    floats = ag.tensor(index.to_host().astype(np.float32), device=device).value
    with pytest.raises(Exception, match="integer"):
        op(x, 1, floats)
