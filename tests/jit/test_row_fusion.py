"""jit_compile of reductions along the last axis: one row kernel forward, one backward.

Each program runs fused (``jit_compile``) on the OpenCL device and the NumPy backend; its output
and the gradient of every input (upstream gradient random) are compared with float64 NumPy:
the output with the reference function, the gradients with central differences of
``sum(upstream * reference(...))`` in float64 (step 1e-6: truncation error ~1e-12, far below the
tolerance). float32 kernels sum rows of <= 67 elements of O(1) values: each result is within a few
ulps times the row length of the exact value, so 1e-4 relative + 1e-5 absolute is ample, while a
wrong formula, index or lost gradient term is off by more than 1e-2.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.jit import jit_compile
from netcl.jit.row_step import RowStep

RTOL, ATOL = 1e-4, 1e-5


def _softmax64(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm64(x, w=None, b=None, eps=1e-5):
    d = x - x.mean(-1, keepdims=True)
    y = d / np.sqrt((d * d).mean(-1, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def _masked_softmax(x, m):
    e = ag.exp(x - ag.max(x, -1, keepdims=True)) * m
    return e / ag.sum(e, -1, keepdims=True)


def _masked_softmax64(x, m):
    e = np.exp(x - x.max(-1, keepdims=True)) * m
    return e / e.sum(-1, keepdims=True)


def _user_layer_norm(x, w, b):
    mu = ag.mean(x, -1, keepdims=True)
    d = x - mu
    return d * ag.rsqrt(ag.mean(d * d, -1, keepdims=True) + 1e-5) * w + b


def _mask(shape, seed):
    return (np.random.default_rng(seed).uniform(size=shape) > 0.3).astype(np.float32) + 0.0


#: name -> (netcl function, float64 reference, input shapes, which inputs get a gradient, input maker)
PROGRAMS = {
    "softmax": (lambda x: ag.softmax(x, -1), _softmax64, [(5, 33)], [True]),
    "log_softmax": (lambda x: ag.log_softmax(x, -1), lambda x: np.log(_softmax64(x)), [(4, 40)], [True]),
    "logsumexp": (
        lambda x: ag.logsumexp(x, -1),
        lambda x: np.log(np.exp(x).sum(-1)),
        [(6, 17)],
        [True],
    ),
    "layer_norm_affine": (
        lambda x, w, b: ag.layer_norm(x, 24, w, b),
        _layer_norm64,
        [(7, 24), (24,), (24,)],
        [True, True, True],
    ),
    "rms_norm": (
        lambda x, w: ag.rms_norm(x, 20, w, eps=1e-6),
        lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
        [(3, 20), (20,)],
        [True, True],
    ),
    "masked_softmax": (_masked_softmax, _masked_softmax64, [(4, 36), (4, 36)], [True, False]),
    "user_layer_norm": (_user_layer_norm, _layer_norm64, [(5, 67), (67,), (67,)], [True, True, True]),
    "prologue_epilogue": (
        lambda x, a, b: ag.softmax(ag.tanh(x * a) + b, -1) * 2.0 + x,
        lambda x, a, b: _softmax64(np.tanh(x * a) + b) * 2.0 + x,
        [(3, 2, 16), (3, 2, 16), (16,)],
        [True, True, True],
    ),
    "row_statistic_output": (
        lambda x, r: ag.sum(ag.exp(x) * r, -1) + 1.0,
        lambda x, r: (np.exp(x) * r).sum(-1) + 1.0,
        [(6, 9), (6, 1)],
        [True, True],
    ),
    "cross_entropy_one_hot": (
        lambda x, q: -ag.sum(ag.log_softmax(x, -1) * q, -1),
        lambda x, q: -(np.log(_softmax64(x)) * q).sum(-1),
        [(6, 10), (6, 10)],
        [True, False],
    ),
    "max_with_ties": (
        lambda x: ag.max(ag.relu(x), -1, keepdims=True) * x,
        lambda x: np.maximum(x, 0).max(-1, keepdims=True) * x,
        [(4, 8)],
        [True],
    ),
}


def _inputs(shapes, name):
    rng = np.random.default_rng(len(name))
    arrays = [rng.uniform(-2, 2, size=s).astype(np.float32) for s in shapes]
    if name == "masked_softmax":
        arrays[1] = _mask(shapes[1], 3)
        arrays[1][:, 0] = 1.0  # no row fully masked
    if name == "cross_entropy_one_hot":
        arrays[1] = np.eye(shapes[1][1], dtype=np.float32)[[3, 0, 9, 9, 1, 4]]
    if name == "max_with_ties":
        arrays[0] = np.round(arrays[0]).astype(np.float32)  # ties of the maximum
    return arrays


def _fd_grads(reference, arrays, upstream, wants, eps=1e-6):
    arrays64 = [a.astype(np.float64) for a in arrays]
    grads = []
    for k, a in enumerate(arrays64):
        if not wants[k]:
            grads.append(None)
            continue
        grad = np.zeros_like(a)
        for index in np.ndindex(a.shape):
            plus = [x.copy() for x in arrays64]
            minus = [x.copy() for x in arrays64]
            plus[k][index] += eps
            minus[k][index] -= eps
            delta = np.sum(upstream * (reference(*plus) - reference(*minus)))
            grad[index] = delta / (2 * eps)
        grads.append(grad)
    return grads


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_row_program_matches_float64(device, name):
    if name == "max_with_ties":  # ties: central differences see one side; the gradient is shared
        pytest.skip("checked by test_max_ties_share_the_gradient")
    _check_program(device, name)


@pytest.fixture
def other_row_mode(cl_device, monkeypatch):
    """The OpenCL device with its row programs in the mode it does not run by default (a work-group a row
    on a CPU, a work-item a row on a GPU), so that both kernel generators run on every device."""
    monkeypatch.setenv("NETCL_ROW_MODE", "serial" if cl_device.is_gpu else "group")
    return cl_device


@pytest.mark.parametrize("name", ["softmax", "user_layer_norm", "masked_softmax", "row_statistic_output"])
def test_row_program_in_the_other_mode(other_row_mode, name):
    _check_program(other_row_mode, name)


def test_weight_gradients_in_the_other_mode(other_row_mode):
    test_weight_gradients_over_many_rows(other_row_mode)


def test_serial_rows_compute_an_exponential_once(cl_device, monkeypatch):
    """A work-item a row: softmax's exponentials, summed in one loop and divided in the next, are computed once
    and kept in a private row (values: test_row_program_matches_float64 on CPU devices)."""
    monkeypatch.setenv("NETCL_ROW_MODE", "serial")
    x = ag.tensor(_inputs([(4, 40)], "exp")[0], device=cl_device)
    fused = jit_compile(lambda x: ag.softmax(x, -1))
    np.testing.assert_allclose(fused(x).to_host(), _softmax64(x.to_host().astype(np.float64)), rtol=RTOL, atol=ATOL)
    body = fused.plan_for(x).steps[0].forward_source.split("#define C ")[-1]
    assert "float row_" in body and body.count("EXP(") == 2, body  # the summing loop's vector body and its tail


def test_user_c_primitive_in_a_row_program(cl_device, c_only_step):
    """A prologue the vector twins cannot express (a primitive's own C) runs element by element (on a CPU
    device, whose row kernels otherwise evaluate their bodies on float vectors)."""
    device = cl_device
    x = _inputs([(5, 37)], "c")[0]
    node = ag.tensor(x, requires_grad=True, device=device)
    fused = jit_compile(lambda x: ag.softmax(c_only_step(x), -1))
    with ag.Tape() as tape:
        out = fused(node)
    stepped = np.where(x > 0, 2.0 * x, 0.5 * x).astype(np.float64)
    y = _softmax64(stepped)
    np.testing.assert_allclose(out.to_host(), y, rtol=RTOL, atol=ATOL)
    upstream = np.random.default_rng(2).uniform(-1, 1, size=x.shape)
    tape.backward(out, grad=ag.tensor(upstream.astype(np.float32), device=device).value)
    dy = y * (upstream - (upstream * y).sum(-1, keepdims=True))
    np.testing.assert_allclose(node.grad.to_host(), dy * np.where(x > 0, 2.0, 0.5), rtol=RTOL, atol=ATOL)
    steps = fused.plan_for(node).steps
    assert [type(s).__name__ for s in steps] == ["RowStep"]
    lines = steps[0].forward_source.splitlines()
    conditional = [line for line in lines if "2.0f *" in line and "?" in line]  # the primitive's own C
    assert conditional and not any("VF " in line for line in conditional), conditional


def _check_program(device, name):
    fn, reference, shapes, wants = PROGRAMS[name]
    arrays = _inputs(shapes, name)
    fused = jit_compile(fn)
    nodes = [ag.tensor(a, requires_grad=w, device=device) for a, w in zip(arrays, wants, strict=True)]
    with ag.Tape() as tape:
        out = fused(*nodes)
    expected = reference(*[a.astype(np.float64) for a in arrays])
    np.testing.assert_allclose(out.to_host(), expected, rtol=RTOL, atol=ATOL)
    upstream = np.random.default_rng(7).uniform(-1, 1, size=out.shape).astype(np.float32)
    tape.backward(out, grad=ag.tensor(upstream, device=device).value)
    for k, (node, grad) in enumerate(zip(nodes, _fd_grads(reference, arrays, upstream, wants), strict=True)):
        if grad is None:
            assert node.grad is None
            continue
        np.testing.assert_allclose(node.grad.to_host(), grad, rtol=RTOL, atol=ATOL, err_msg=f"{name}: input {k}")
    plan = fused.plan_for(*nodes)
    assert [type(s).__name__ for s in plan.steps] == ["RowStep"], f"{name}: {plan.steps}"


def test_max_ties_share_the_gradient(device):
    fn = PROGRAMS["max_with_ties"][0]
    x = np.array([[1, 3, 3, 0, -1, 3, 2, 1], [0, 0, 0, 0, -1, -2, -3, -4]], np.float32)
    node = ag.tensor(x, requires_grad=True, device=device)
    with ag.Tape() as tape:
        out = jit_compile(fn)(node)
    tape.backward(out, grad=ag.tensor(np.ones_like(x), device=device).value)
    m = np.maximum(x, 0).max(-1, keepdims=True)
    hit = (np.maximum(x, 0) == m) * (x > 0)
    ties = (np.maximum(x, 0) == m).sum(-1, keepdims=True)
    expected = m + hit * x.sum(-1, keepdims=True) / ties
    np.testing.assert_allclose(node.grad.to_host(), expected, rtol=RTOL, atol=ATOL)


def test_fused_equals_unfused_on_large_rows(device):
    """Rows longer than a work-group's register slice (re-read passes) and not a multiple of 4."""
    x = np.random.default_rng(1).uniform(-3, 3, size=(3, 4099)).astype(np.float32)
    fn = PROGRAMS["masked_softmax"][0]
    m = _mask(x.shape, 2)
    results = []
    for f in (fn, jit_compile(fn)):
        node = ag.tensor(x, requires_grad=True, device=device)
        with ag.Tape() as tape:
            out = f(node, ag.tensor(m, device=device))
        tape.backward(out, grad=ag.tensor(np.cos(x), device=device).value)
        results.append((out.to_host(), node.grad.to_host()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=RTOL, atol=1e-7)


def test_weight_gradients_over_many_rows(device):
    """Per-column gradients summed over blocks of rows (per-group partial sums on OpenCL)."""
    fn = PROGRAMS["layer_norm_affine"][0]
    arrays = _inputs([(300, 24), (24,), (24,)], "many")
    nodes = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
    with ag.Tape() as tape:
        out = jit_compile(fn)(*nodes)
    upstream = np.random.default_rng(3).uniform(-1, 1, size=out.shape)
    tape.backward(out, grad=ag.tensor(upstream.astype(np.float32), device=device).value)
    x64 = arrays[0].astype(np.float64)
    xhat = _layer_norm64(x64)
    np.testing.assert_allclose(nodes[1].grad.to_host(), (upstream * xhat).sum(0), rtol=RTOL, atol=1e-4)
    np.testing.assert_allclose(nodes[2].grad.to_host(), upstream.sum(0), rtol=RTOL, atol=1e-4)


@pytest.mark.parametrize("name", ["softmax", "layer_norm"])
def test_one_kernel_each_way(cl_device, launch_counter, name):
    x = np.random.default_rng(0).uniform(-2, 2, size=(64, 256)).astype(np.float32)
    w, b = (np.random.default_rng(s).uniform(0.5, 1.5, size=256).astype(np.float32) for s in (1, 2))
    if name == "softmax":
        fused = jit_compile(lambda x: ag.softmax(x, -1))
        consts = []
    else:
        fused = jit_compile(lambda x, w, b: ag.layer_norm(x, 256, w, b))
        consts = [ag.tensor(w, device=cl_device), ag.tensor(b, device=cl_device)]
    node = ag.tensor(x, requires_grad=True, device=cl_device)
    upstream = ag.tensor(np.ones_like(x), device=cl_device).value
    for _ in range(2):  # the first run builds the kernels
        node.grad = None  # no accumulation kernel into the last step's gradient
        with launch_counter(cl_device.queue) as counter:
            with ag.Tape() as tape:
                out = fused(node, *consts)
            tape.backward(out, grad=upstream)
    # cross_entropy's targets are checked on the device by a kernel of their own (no host read)
    checks = ["netcl_check_class_targets"] if name == "cross_entropy" else []
    assert counter.names == [*checks, "row_forward", "row_backward"]
    with launch_counter(cl_device.queue) as counter, ag.no_grad():
        fused(node, *consts)
    assert counter.names == ["row_forward"]
    plan = fused.plan_for(node, *consts)
    assert len(plan.steps) == 1 and isinstance(plan.steps[0], RowStep)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_of_logits_with_integer_targets(device, smoothing):
    """One row kernel forward (per-row losses and an epilogue), one backward: (softmax - q) * upstream."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((9, 12)) * 3).astype(np.float32)
    t = rng.integers(0, 12, 9).astype(np.int32)
    t[4] = -100  # ignored: no loss, no gradient
    upstream = np.linspace(-1, 1, 9).astype(np.float32)

    def loss(x, t):
        return ag.cross_entropy(x, t, reduction="none", label_smoothing=smoothing) * 2.0

    fused = jit_compile(loss)
    node, targets = ag.tensor(x, requires_grad=True, device=device), ag.tensor(t, device=device)
    with ag.Tape() as tape:
        out = fused(node, targets)
    tape.backward(out, grad=ag.tensor(upstream, device=device).value)
    x64 = x.astype(np.float64)
    valid = (t != -100).astype(np.float64)
    q = np.eye(12)[np.where(t < 0, 0, t)] * (1 - smoothing) + smoothing / 12
    logp = np.log(_softmax64(x64))
    np.testing.assert_allclose(out.to_host(), -2.0 * (q * logp).sum(-1) * valid, rtol=RTOL, atol=ATOL)
    expected = 2.0 * (np.exp(logp) - q) * (valid * upstream)[:, None]
    np.testing.assert_allclose(node.grad.to_host(), expected, rtol=RTOL, atol=ATOL)
    assert [type(s).__name__ for s in fused.plan_for(node, targets).steps] == ["RowStep"]


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "cross_entropy"])
def test_eager_built_ins_run_the_row_kernels(cl_device, launch_counter, name):
    """ag.softmax / ag.layer_norm (no jit_compile) of >= 64K float32 elements: on a GPU the fused row kernels, on a
    CPU device the runtime's (a row a work-item, faster there: row_eager's docstring); ag.cross_entropy the
    runtime's class-loss kernels on every device (faster than the row kernels on the H200, row_eager's docstring)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(128, 512)).astype(np.float32)
    node = ag.tensor(x, requires_grad=True, device=cl_device)
    w = ag.tensor(rng.uniform(0.5, 1.5, 512).astype(np.float32), device=cl_device)
    t = ag.tensor(rng.integers(0, 512, 128).astype(np.int32), device=cl_device)
    ops = {
        "softmax": lambda: ag.softmax(node, -1),
        "layer_norm": lambda: ag.layer_norm(node, 512, w, w),
        "cross_entropy": lambda: ag.cross_entropy(node, t, reduction="none"),
    }
    for _ in range(2):  # the first call builds the kernels
        node.grad = None
        with launch_counter(cl_device.queue) as counter:
            with ag.Tape() as tape:
                out = ops[name]()
            tape.backward(out, grad=ag.tensor(np.ones(out.shape, np.float32), device=cl_device).value)
    if not cl_device.is_gpu or name == "cross_entropy":
        runtime = {"softmax": "softmax_rows", "layer_norm": "norm_rows", "cross_entropy": "class_loss_rows"}[name]
        assert counter.names[:1] == [f"netcl_{runtime}"] and f"netcl_{runtime}_backward" in "".join(counter.names)
        return
    assert counter.names == ["row_forward", "row_backward"]


def test_eager_cross_entropy_of_many_logits_checks_targets(device):
    """A bad class index is named, also for >= 64K logits (where a row provider could serve the others): on the
    host at once, on OpenCL at the next wait (the loss's read)."""
    x = ag.tensor(np.zeros((128, 1024), np.float32), requires_grad=True, device=device)
    t = ag.tensor(np.full(128, 5000, np.int32), device=device)
    with pytest.raises(IndexError, match="target value 5000 is out of range"):
        ag.cross_entropy(x, t).item()


def _residual_and_norm(x, y, w, b):
    """A pre-norm block's row group with two outputs: the residual sum and its layer norm."""
    h = x + y
    return h, ag.layer_norm(h, 48, w, b)


def test_two_outputs_fold_their_gradients_in_the_kernels_store(device, monkeypatch):
    """The second output's backward kernel adds the first's gradient of x and y in its store (the engine's
    ``folds_addends``): the bits of the unfolded backward with its add kernels, within float64's tolerance."""
    arrays = _inputs([(6, 48), (6, 48), (48,), (48,)], "residual")
    up_h, up_n = (np.random.default_rng(s).uniform(-1, 1, size=(6, 48)).astype(np.float32) for s in (5, 6))
    fused = jit_compile(_residual_and_norm)

    def grads() -> list[np.ndarray]:
        nodes = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
        with ag.Tape() as tape:
            h, n = fused(*nodes)
            loss = ag.sum(h * ag.tensor(up_h, device=device)) + ag.sum(n * ag.tensor(up_n, device=device))
        tape.backward(loss)
        return [node.grad.to_host() for node in nodes]

    folded = grads()
    monkeypatch.setattr(RowStep, "_foldable", lambda self, addends, wants: ())
    for got, want in zip(folded, grads(), strict=True):
        np.testing.assert_array_equal(got, want)

    def reference_loss(x, y, w, b):  # summed by _fd_grads against an upstream of ones
        return _layer_norm64(x + y, w, b) * up_n + (x + y) * up_h

    reference = _fd_grads(reference_loss, arrays, 1.0, [True] * 4)
    for got, want in zip(folded, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-4)


def test_folded_gradients_launch_no_add_kernel(cl_device, launch_counter, monkeypatch):
    """Folding saves the two add kernels (x's and y's gradients from both outputs) and nothing else; the residual
    sum's own gradients are the upstream one (no kernel), so one backward kernel runs for the two outputs."""
    arrays = _inputs([(64, 48), (64, 48), (48,), (48,)], "residual")
    fused = jit_compile(_residual_and_norm)

    def backward_launches() -> list[str]:
        nodes = [ag.tensor(a, requires_grad=True, device=cl_device) for a in arrays]
        for _ in range(2):  # the first run builds the kernels
            with ag.Tape() as tape:
                h, n = fused(*nodes)
                loss = ag.sum(h) + ag.sum(n)
            for node in nodes:
                node.grad = None
            with launch_counter(cl_device.queue) as counter:
                tape.backward(loss)
        return counter.names

    folded = backward_launches()
    monkeypatch.setattr(RowStep, "_foldable", lambda self, addends, wants: ())
    unfolded = backward_launches()
    assert len(unfolded) - len(folded) == 2
    assert sorted(set(unfolded) - set(folded)) in ([], ["netcl_ew"])
    assert unfolded.count("netcl_ew") - folded.count("netcl_ew") == 2
    assert folded.count("row_backward") == 1


def test_a_norms_weight_and_bias_gradients_take_one_reduction(device, launch_counter, monkeypatch):
    """Both column gradients of an affine layer norm come out in one (2, rows, C) tensor and one reduction sums
    them: the bits of a reduction each, over many rows (partial sums of row groups where the kernel makes them)."""
    fn = jit_compile(lambda x, w, b: ag.layer_norm(x, 128, w, b))
    arrays = _inputs([(600, 128), (128,), (128,)], "stacked")
    upstream = ag.tensor(np.random.default_rng(4).uniform(-1, 1, (600, 128)).astype(np.float32), device=device)

    def run() -> tuple[list[np.ndarray], list[str]]:
        nodes = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
        with ag.Tape() as tape:
            out = fn(*nodes)
        if device.kind != "opencl":
            tape.backward(out, grad=upstream.value)
            return [n.grad.to_host() for n in nodes], []
        with launch_counter(device.queue) as counter:
            tape.backward(out, grad=upstream.value)
        return [n.grad.to_host() for n in nodes], counter.names

    stacked, names = run()
    monkeypatch.setattr(RowStep, "_column_stack", lambda self, shapes, columns: (None, {}))
    separate, separate_names = run()
    for got, want in zip(stacked, separate, strict=True):
        np.testing.assert_array_equal(got, want)
    if device.kind == "opencl":
        assert names.count("netcl_reduce") == 1 and separate_names.count("netcl_reduce") == 2
        assert "netcl_cast" not in names  # blocks of one buffer are distinct leaves' memory: no copy
