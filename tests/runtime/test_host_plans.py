"""Per-signature host plans of the transformer ops and the shared eager path (issues 32 and 33: eager host cost).

Each cache keeps what a first call of one signature derived (checks, kernel choice, sizes, bound scalar
arguments) and a repeat call only allocates and launches. These tests hold every cache to a fresh
computation: a repeated signature reuses its one plan and returns the bytes a call with every cache
cleared returns; a change of shape, options or precision makes a new plan whose result equals a fresh
computation's (and a float64 NumPy reference within the kernel's rounding); bad inputs on a known
signature still raise before any launch; a capture records planned calls and a profiler reports them.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.core import Tensor
from netcl.core.errors import ShapeError
from netcl.profiler import profile
from netcl.runtime import synchronize
from netcl.runtime.cache import clear_caches
from netcl.runtime.graph import Graph
from netcl.runtime.ops import attention, class_loss, gemm, rowwise, selecting, strided
from netcl.runtime.ops.precision import matmul_precision

# float32 row kernels against float64 NumPy: mean/variance/exp/log sums round a few ulps per element
TOL = {"rtol": 2e-5, "atol": 2e-6}


def _floats(device: nc.Device, shape: tuple[int, ...], seed: int) -> Tensor:
    return Tensor.from_host(device, np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _layer_norm64(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _fresh(fn):
    """``fn()`` with every in-memory cache emptied first: what a first call computes."""
    clear_caches()
    return fn()


# ---- layer_norm ----------------------------------------------------------------------------------
def test_layer_norm_forward_and_backward_reuse_one_plan_per_signature(cl_device) -> None:
    x, w, b = _floats(cl_device, (6, 40), 0), _floats(cl_device, (40,), 1), _floats(cl_device, (40,), 2)
    g = _floats(cl_device, (6, 40), 3)
    axes = (1,)

    def run(xv: Tensor) -> list[np.ndarray]:
        out, mean, rstd = rowwise.norm_forward(xv, axes, w, b, 1e-5, rowwise.LAYER)
        gx = rowwise.norm_backward(g, xv, w, mean, rstd, axes, rowwise.LAYER)
        return [t.to_host() for t in (out, mean, rstd, gx)]

    first = _fresh(lambda: run(x))
    plans = (len(rowwise._NORM_PLANS), len(rowwise._NORM_BACKWARD_PLANS))
    for _ in range(3):
        for got, want in zip(run(x), first, strict=True):
            np.testing.assert_array_equal(got, want)  # the planned call: the fresh call's bytes
    assert (len(rowwise._NORM_PLANS), len(rowwise._NORM_BACKWARD_PLANS)) == plans == (1, 1)
    np.testing.assert_allclose(first[0], _layer_norm64(x.to_host(), w.to_host(), b.to_host()), **TOL)


@pytest.mark.parametrize(
    "change",
    ["shape", "no bias", "rms", "eps"],
)
def test_layer_norm_a_changed_signature_equals_a_fresh_computation(cl_device, change: str) -> None:
    x, w, b = _floats(cl_device, (6, 40), 0), _floats(cl_device, (40,), 1), _floats(cl_device, (40,), 2)
    rowwise.norm_forward(x, (1,), w, b, 1e-5, rowwise.LAYER)  # the known signature
    args = {
        "shape": (_floats(cl_device, (3, 40), 4), (1,), w, b, 1e-5, rowwise.LAYER),
        "no bias": (x, (1,), w, None, 1e-5, rowwise.LAYER),
        "rms": (x, (1,), w, None, 1e-5, rowwise.RMS),
        "eps": (x, (1,), w, b, 0.25, rowwise.LAYER),  # eps is a per-call argument of the same plan
    }[change]
    planned = [t.to_host() for t in rowwise.norm_forward(*args)]
    fresh = _fresh(lambda: [t.to_host() for t in rowwise.norm_forward(*args)])
    for got, want in zip(planned, fresh, strict=True):
        np.testing.assert_array_equal(got, want)
    if change == "eps":
        np.testing.assert_allclose(planned[0], _layer_norm64(x.to_host(), w.to_host(), b.to_host(), 0.25), **TOL)


def test_layer_norm_bad_inputs_on_a_known_signature_still_raise(device) -> None:
    x, w = _floats(device, (6, 40), 0), _floats(device, (40,), 1)
    rowwise.layer_norm(x, 40, w, w)
    with pytest.raises(ShapeError, match="normalized_shape"):
        rowwise.layer_norm(x, 39, w, w)
    with pytest.raises(ShapeError, match="weight must have shape"):
        rowwise.layer_norm(x, 40, _floats(device, (39,), 2), w)
    with pytest.raises(TypeError, match=r"normalized_shape must be an int or a tuple / list of ints .*, got Tensor$"):
        rowwise.layer_norm(x, w, w, w)  # the weight in normalized_shape's place: named, not printed element by element


# ---- cross_entropy (class-loss rows) -------------------------------------------------------------
def _cross_entropy64(x: np.ndarray, t: np.ndarray) -> float:
    x = x.astype(np.float64)
    z = x - x.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return float(-logp[np.arange(len(t)), t].mean())


def test_cross_entropy_reuses_its_plans_and_matches_a_fresh_computation(cl_device) -> None:
    t = Tensor.from_host(cl_device, np.array([0, 3, 7, 1, 2, 9], np.int32))

    def step(seed: int, **kw) -> list[np.ndarray]:
        x = ag.tensor(_floats(cl_device, (6, 10), seed), requires_grad=True)
        with ag.Tape() as tape:
            loss = ag.cross_entropy(x, t, **kw)
        tape.backward(loss)
        return [loss.to_host(), x.grad.to_host()]

    first = _fresh(lambda: step(0))
    plans = (len(class_loss._FORWARD_PLANS), len(class_loss._REDUCE_PLANS), len(class_loss._BACKWARD_PLANS))
    for _ in range(2):
        for got, want in zip(step(0), first, strict=True):
            np.testing.assert_array_equal(got, want)
    assert plans == (1, 1, 1)
    assert (len(class_loss._FORWARD_PLANS), len(class_loss._REDUCE_PLANS), len(class_loss._BACKWARD_PLANS)) == plans
    np.testing.assert_allclose(first[0], _cross_entropy64(_floats(cl_device, (6, 10), 0).to_host(), t.to_host()),
                               **TOL)  # fmt: skip
    # options of the signature: a new plan each, the fresh call's bytes
    for kw in ({"ignore_index": 3}, {"label_smoothing": 0.1}, {"reduction": "sum"}):
        planned = step(1, **kw)
        fresh = _fresh(lambda kw=kw: step(1, **kw))
        for got, want in zip(planned, fresh, strict=True):
            np.testing.assert_array_equal(got, want)


def test_cross_entropy_a_planned_call_still_reports_a_bad_target(cl_device) -> None:
    x = _floats(cl_device, (4, 5), 0)
    good = Tensor.from_host(cl_device, np.array([0, 1, 2, 3], np.int32))
    bad = Tensor.from_host(cl_device, np.array([0, 1, 7, 3], np.int32))
    ag.cross_entropy(x, good).to_host()  # makes the plans
    assert len(class_loss._FORWARD_PLANS) >= 1
    ag.cross_entropy(x, bad)
    with pytest.raises(IndexError, match="cross_entropy"):
        synchronize(cl_device)
    with pytest.raises((ShapeError, ValueError)):  # checked on the host before any launch
        ag.cross_entropy(x, Tensor.from_host(cl_device, np.zeros(3, np.int32)))


# ---- attention -----------------------------------------------------------------------------------
def _attention64(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_attention_launches_are_prepared_once_per_signature(cl_device) -> None:
    q, k, v = (_floats(cl_device, (2, 3, 16, 8), s) for s in range(3))
    first = _fresh(lambda: attention.scaled_dot_product_attention(q, k, v, is_causal=True).to_host())
    launches = len(attention._LAUNCHES)
    for _ in range(2):
        np.testing.assert_array_equal(attention.scaled_dot_product_attention(q, k, v, is_causal=True).to_host(), first)
    assert len(attention._LAUNCHES) == launches == 1
    np.testing.assert_allclose(first, _attention64(q.to_host(), k.to_host(), v.to_host(), True), **TOL)
    plain = attention.scaled_dot_product_attention(q, k, v)  # a new signature: its own launch
    assert len(attention._LAUNCHES) == 2
    np.testing.assert_allclose(plain.to_host(), _attention64(q.to_host(), k.to_host(), v.to_host(), False), **TOL)


def test_attention_dropout_seed_stays_a_per_call_argument(cl_device) -> None:
    q, k, v = (_floats(cl_device, (1, 2, 16, 8), s) for s in range(3))

    def run(seed: int) -> np.ndarray:
        return attention.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=seed).to_host()

    a, b, a_again = run(1), run(2), run(1)
    assert len([key for key in attention._LAUNCHES if key[3].dropout_p == 0.5]) == 1
    np.testing.assert_array_equal(a, a_again)
    assert not np.array_equal(a, b)  # the seed reaches the kernel on the planned launch
    np.testing.assert_array_equal(_fresh(lambda: run(2)), b)


def test_attention_bad_inputs_on_a_known_signature_still_raise(cl_device) -> None:
    q, k, v = (_floats(cl_device, (1, 2, 16, 8), s) for s in range(3))
    attention.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ShapeError):
        attention.scaled_dot_product_attention(q, _floats(cl_device, (1, 2, 16, 7), 4), v)
    with pytest.raises(ValueError, match="dropout_p"):
        attention.scaled_dot_product_attention(q, k, v, dropout_p=1.5)


# ---- strided views --------------------------------------------------------------------------------
def test_strided_views_reuse_their_launch_and_bounds_check(cl_device) -> None:
    x = _floats(cl_device, (6, 40), 0)
    h = x.to_host()
    view = ((6, 7), (40, 2), 3)  # columns 3, 5, ..., 15
    first = _fresh(lambda: strided.strided_copy(x, *view).to_host())
    np.testing.assert_array_equal(first, h[:, 3:17:2])
    launches, checked = len(strided._LAUNCHES), len(strided._IN_BOUNDS)
    for _ in range(2):
        np.testing.assert_array_equal(strided.strided_copy(x, *view).to_host(), first)
    assert (len(strided._LAUNCHES), len(strided._IN_BOUNDS)) == (launches, checked) == (1, 1)
    # the same view shape at another offset reaches past the end: checked in full, raises before a launch
    with pytest.raises(IndexError, match="outside a tensor of 240 elements"):
        strided.strided_copy(x, (6, 7), (40, 2), 30)
    with pytest.raises(IndexError, match="outside"):
        strided.strided_write(x, _floats(cl_device, (6, 7), 1), (40, 2), 30)
    np.testing.assert_array_equal(x.to_host(), h)  # nothing was written
    src = _floats(cl_device, (6, 7), 2)
    for _ in range(2):
        strided.strided_write(x, src, (40, 2), 3)
    expected = h.copy()
    expected[:, 3:17:2] = src.to_host()
    np.testing.assert_array_equal(x.to_host(), expected)


# ---- matmul plans: precision and options ---------------------------------------------------------
@pytest.mark.parametrize("precision", ["high", "medium"])
def test_gemm_a_new_precision_makes_a_new_plan_equal_to_a_fresh_one(cl_device, precision: str) -> None:
    a, b = _floats(cl_device, (24, 40), 0), _floats(cl_device, (40, 16), 1)
    base = gemm.gemm(a, b, precision="highest").to_host()
    before = len(gemm._PLANS)
    with matmul_precision(precision):
        planned = gemm.gemm(a, b).to_host()
        again = gemm.gemm(a, b).to_host()
    assert len(gemm._PLANS) == before + 1  # the precision is part of the signature; the repeat reused it
    np.testing.assert_array_equal(planned, again)
    with matmul_precision(precision):
        fresh = _fresh(lambda: gemm.gemm(a, b).to_host())
    np.testing.assert_array_equal(planned, fresh)
    np.testing.assert_array_equal(gemm.gemm(a, b, precision="highest").to_host(), base)
    want = a.to_host().astype(np.float64) @ b.to_host()
    np.testing.assert_allclose(base, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="inner dimensions"):  # a known shape pair, a bad third operand
        gemm.gemm(a, _floats(cl_device, (41, 16), 2), precision=precision)


# ---- the shared eager path -----------------------------------------------------------------------
def test_tensor_empty_checks_a_shape_by_identity(device) -> None:
    shape = (3, 4)
    assert Tensor.empty(shape, np.float32, device).shape == (3, 4)
    assert Tensor.empty(shape, np.float32, device).shape is shape  # the checked tuple, by identity
    with pytest.raises(ShapeError, match="non-integer"):
        Tensor.empty((True, 4), np.float32, device)  # equal to (1, 4) and hashes alike: still checked
    with pytest.raises(ShapeError, match="negative"):
        Tensor.empty((3, -4), np.float32, device)
    with pytest.raises(ShapeError, match="non-integer dimension None"):
        Tensor.empty(None, np.float32, device)  # a miss of the identity lookup is not a hit
    assert Tensor.empty((np.int64(3), 4), np.float32, device).shape == (3, 4)
    assert all(type(d) is int for d in Tensor.empty((np.int64(3), 4), np.float32, device).shape)


def test_reshape_fast_path_keeps_its_checks(device) -> None:
    x = _floats(device, (6, 40), 0)
    assert x.reshape(240).shape == (240,)
    assert x.reshape((4, 60)).shape == (4, 60)
    assert x.reshape(-1, 8).shape == (30, 8)
    with pytest.raises(ShapeError, match="cannot reshape"):
        x.reshape(7, 40)
    with pytest.raises(ShapeError):
        x.reshape(True, 240)


def test_row_format_is_memoized_per_signature(cl_device) -> None:
    x = _floats(cl_device, (6, 40), 0)
    fmt = rowwise.row_format(x, rowwise.LAYER, has_w=1)
    assert rowwise.row_format(x, rowwise.LAYER, has_w=1) is fmt
    assert fmt.key == ("rowwise", *sorted(fmt.items()))
    other = rowwise.row_format(x, rowwise.LAYER, has_w=0)
    assert other is not fmt and other["has_w"] == 0


def test_a_capture_records_and_a_profiler_reports_planned_calls(cl_device) -> None:
    w, b = _floats(cl_device, (40,), 1), _floats(cl_device, (40,), 2)
    t = Tensor.from_host(cl_device, np.array([0, 3, 7, 1, 2, 9], np.int32))

    def step(x: Tensor) -> tuple[Tensor, Tensor]:
        y = rowwise.layer_norm(x, 40, w, b)
        loss, _, _ = class_loss.class_loss_forward(strided.strided_copy(y, (6, 10), (40, 1), 0), t, -100, 0.0)
        return y, loss

    step(_floats(cl_device, (6, 40), 0))  # plans made outside the capture
    x = _floats(cl_device, (6, 40), 1)
    graph = Graph()
    with graph.capture(cl_device.queue, inputs=[x]):
        graph.outputs = step(x)
    assert len(graph.launches) == 3
    fresh = _floats(cl_device, (6, 40), 2)
    y, loss = graph.execute(fresh)
    eager_y, eager_loss = step(fresh)
    np.testing.assert_array_equal(y.to_host(), eager_y.to_host())
    np.testing.assert_array_equal(loss.to_host(), eager_loss.to_host())
    synchronize(cl_device)
    with profile(cl_device) as prof:
        step(x)
        synchronize(cl_device)
    names = [e.name for e in prof.events() if e.kind == "kernel"]
    assert names == ["netcl_norm_rows", "netcl_strided", "netcl_class_loss_rows"]


# ---- embedding and index_select's gradient ------------------------------------------------------
def test_embedding_and_its_gradient_reuse_their_plans(cl_device) -> None:
    table = _floats(cl_device, (10, 6), 0)
    ids = Tensor.from_host(cl_device, np.array([[1, 3, 3], [9, 0, 1]], np.int32))
    g = _floats(cl_device, (6, 6), 1)

    def run(t: Tensor) -> list[np.ndarray]:
        rows = selecting.embedding(t, table)
        grad = selecting.index_select_backward(g, 0, t.reshape(t.size), table.shape)
        return [rows.to_host(), grad.to_host()]

    first = _fresh(lambda: run(ids))
    plans = (len(selecting._PLANS), len(selecting._BACKWARD_PLANS))
    for _ in range(2):
        for got, want in zip(run(ids), first, strict=True):
            np.testing.assert_array_equal(got, want)
    assert (len(selecting._PLANS), len(selecting._BACKWARD_PLANS)) == plans == (1, 1)
    h = table.to_host()
    np.testing.assert_array_equal(first[0], h[ids.to_host()])
    want = np.zeros((10, 6))
    np.add.at(want, ids.to_host().reshape(-1), g.to_host().astype(np.float64))
    np.testing.assert_allclose(first[1], want, rtol=1e-6, atol=1e-6)
    # another ids shape: a new plan, the fresh call's bytes
    other = Tensor.from_host(cl_device, np.array([4, 4, 2], np.int32))
    planned = selecting.embedding(other, table).to_host()
    np.testing.assert_array_equal(planned, _fresh(lambda: selecting.embedding(other, table).to_host()))


def test_embedding_a_planned_call_still_reports_a_bad_id(cl_device) -> None:
    table = _floats(cl_device, (10, 6), 0)
    good = Tensor.from_host(cl_device, np.array([1, 2, 3], np.int32))
    selecting.embedding(good, table).to_host()  # makes the plan
    selecting.embedding(Tensor.from_host(cl_device, np.array([1, 12, 3], np.int32)), table)
    with pytest.raises(IndexError, match="embedding"):
        synchronize(cl_device)
    with pytest.raises(ShapeError, match="2-d"):  # a known ids signature, a bad table: checked on the host
        selecting.embedding(good, _floats(cl_device, (10,), 1))


# ---- elementwise autograd ops: one resolved definition per name ----------------------------------
def test_elementwise_ops_resolve_their_definition_once(device) -> None:
    from netcl.autograd import elementwise

    x = ag.tensor(_floats(device, (4, 5), 0), requires_grad=True)
    with ag.Tape() as tape:
        y = ag.mul(ag.add(x, x), 3.0)
    entries = {name: elementwise._ENTRIES[name] for name in ("add", "mul_scalar_right")}
    with ag.Tape():
        ag.mul(ag.add(x, x), 3.0)
    assert all(elementwise._ENTRIES[name] is entry for name, entry in entries.items())
    np.testing.assert_array_equal(y.to_host(), (x.to_host() + x.to_host()) * np.float32(3.0))
    with ag.Tape() as tape:
        loss = ag.sum(ag.mul(ag.add(x, x), 3.0))
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.to_host(), np.full((4, 5), 6.0, np.float32))
    with pytest.raises(KeyError):
        elementwise.apply_elementwise("no_such_op", (x,))
