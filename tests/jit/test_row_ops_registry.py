"""The row-op registry (``netcl.jit.row_ops``): one entry per row op, and nothing else needed to fuse one.

``CASES`` holds, for every registered row op, a netcl function and its float64 NumPy reference; a row op
registered without a case fails ``test_every_row_op_has_a_case``. Each case runs fused (``jit_compile``)
on the OpenCL device and the NumPy backend: it must be ONE row step, its traced node must satisfy its
entry's rules (seed, shape, attribute names), and its output and the gradient of every float input
(random upstream) must match float64: the output the reference, the gradients central differences of
``sum(upstream * reference)`` in float64 (step 1e-6: truncation error ~1e-12). float32 rows of 17 O(1)
values are within a few ulps times the row length of exact, so 1e-4 relative + 1e-5 absolute is ample,
while a wrong formula, index or lost gradient term is off by more than 1e-2.

A made-up row op, ``softmax_temperature`` (``softmax(x / T)``), is registered at test time: an entry
alone (no change to row_group, row_step, row_eager or shapes) makes a traced call fuse into one row
kernel and the eager op run on the fused row kernels through its provider.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.autograd.engine import apply_op
from netcl.autograd.row_hook import provided
from netcl.jit import jit_compile
from netcl.jit.builtin_row_ops import reduction_seed
from netcl.jit.row_eager import MIN_ELEMENTS, RUNTIME_ROW_OPS, declines, provide
from netcl.jit.row_group import row_seed_shape
from netcl.jit.row_ir import COL, INDEX, Builder
from netcl.jit.row_ops import ROW_OPS, RowOp, get_row_op, register_row_op, unregister_row_op
from netcl.jit.row_step import RowStep
from netcl.jit.shapes import same_shape
from netcl.runtime.ops import pointwise, rowwise

RTOL, ATOL = 1e-4, 1e-5
R, C = 5, 17
SMOOTHING, IGNORE = 0.1, 3


def _softmax64(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm64(x, w, b):
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w + b


def _cross_entropy64(x, t):
    q = np.eye(C)[np.where(t == IGNORE, 0, t)] * (1 - SMOOTHING) + SMOOTHING / C
    return -(q * np.log(_softmax64(x))).sum(-1) * (t != IGNORE)


#: row op -> (netcl function, float64 reference, input kinds: "x" (R, C) float, "w" (C,) float, "t" (R,) int32)
CASES = {
    "sum": (lambda x: ag.sum(x, -1), lambda x: x.sum(-1), "x"),
    "mean": (lambda x: ag.mean(x, -1, keepdims=True), lambda x: x.mean(-1, keepdims=True), "x"),
    "max": (lambda x: ag.max(x, -1), lambda x: x.max(-1), "x"),
    "min": (lambda x: ag.min(x, -1, keepdims=True), lambda x: x.min(-1, keepdims=True), "x"),
    "var": (lambda x: ag.var(x, -1, unbiased=True), lambda x: x.var(-1, ddof=1), "x"),
    "std": (lambda x: ag.std(x, -1), lambda x: x.std(-1), "x"),
    "softmax": (lambda x: ag.softmax(x, -1), _softmax64, "x"),
    "log_softmax": (lambda x: ag.log_softmax(x, -1), lambda x: np.log(_softmax64(x)), "x"),
    "logsumexp": (lambda x: ag.logsumexp(x, -1), lambda x: np.log(np.exp(x).sum(-1)), "x"),
    "layer_norm": (lambda x, w, b: ag.layer_norm(x, C, w, b), _layer_norm64, "xww"),
    "rms_norm": (
        lambda x, w: ag.rms_norm(x, C, w, eps=1e-6),
        lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
        "xw",
    ),
    "cross_entropy": (
        lambda x, t: ag.cross_entropy(x, t, reduction="none", label_smoothing=SMOOTHING, ignore_index=IGNORE),
        _cross_entropy64,
        "xt",
    ),
}


def _arrays(kinds: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    make = {
        "x": lambda: rng.uniform(-2, 2, size=(R, C)).astype(np.float32),
        "w": lambda: rng.uniform(0.5, 1.5, size=(C,)).astype(np.float32),
        "t": lambda: np.array([0, IGNORE, 16, 7, 3], np.int32),  # row 1 and 4 ignored
    }
    return [make[k]() for k in kinds]


def _fd_grads(reference, arrays, upstream, eps=1e-6):
    """Central differences of ``sum(upstream * reference(...))`` in float64 (None for integer inputs)."""
    arrays64 = [a.astype(np.float64) if a.dtype == np.float32 else a for a in arrays]
    grads = []
    for k, a in enumerate(arrays64):
        if a.dtype != np.float64:
            grads.append(None)
            continue
        grad = np.zeros_like(a)
        for index in np.ndindex(a.shape):
            plus, minus = list(arrays64), list(arrays64)
            plus[k], minus[k] = a.copy(), a.copy()
            plus[k][index] += eps
            minus[k][index] -= eps
            grad[index] = np.sum(upstream * (reference(*plus) - reference(*minus))) / (2 * eps)
        grads.append(grad)
    return grads


def _check_fused(device, fn, reference, arrays) -> tuple[object, list]:
    """Run ``jit_compile(fn)`` forward and backward; compare with float64; return (plan, nodes)."""
    fused = jit_compile(fn)
    nodes = [ag.tensor(a, requires_grad=a.dtype == np.float32, device=device) for a in arrays]
    with ag.Tape() as tape:
        out = fused(*nodes)
    expected = reference(*[a.astype(np.float64) if a.dtype == np.float32 else a for a in arrays])
    np.testing.assert_allclose(out.to_host(), expected, rtol=RTOL, atol=ATOL)
    upstream = np.random.default_rng(7).uniform(-1, 1, size=out.shape)
    tape.backward(out, grad=ag.tensor(upstream.astype(np.float32), device=device).value)
    for k, (node, grad) in enumerate(zip(nodes, _fd_grads(reference, arrays, upstream), strict=True)):
        if grad is not None:
            np.testing.assert_allclose(node.grad.to_host(), grad, rtol=RTOL, atol=ATOL, err_msg=f"input {k}")
    return fused.plan_for(*nodes), nodes


def test_every_row_op_has_a_case():
    """Adding a row op means adding its case here (and the case runs through every rule below)."""
    assert sorted(ROW_OPS) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(ROW_OPS))
def test_every_row_op_has_each_rule(name):
    op = get_row_op(name)
    assert op.name == name
    for rule in (op.shape, op.seed, op.emit):
        assert callable(rule), f"{name}: {rule!r}"
    assert op.provider is None or callable(op.provider)
    assert op.dtype is None or callable(op.dtype)
    assert op.operand_kind in (COL, INDEX)
    assert all(isinstance(a, str) for a in op.attrs) and op.attrs
    kinds = CASES[name][2]
    assert op.class_target is None or kinds[op.class_target] == "t"
    assert all({"w": COL, "t": INDEX}[k] == op.operand_kind for k in kinds[1:])


@pytest.mark.parametrize("name", sorted(CASES))
def test_row_op_fuses_through_its_entry(device, name):
    fn, reference, kinds = CASES[name]
    arrays = _arrays(kinds, seed=len(name))
    plan, _ = _check_fused(device, fn, reference, arrays)
    assert [type(s).__name__ for s in plan.steps] == ["RowStep"], plan.steps
    (node,) = [n for n in plan.steps[0].group.nodes if n.op_name == name]
    op = get_row_op(name)
    assert op.seed(node) and row_seed_shape(node) == (R, C)
    assert op.shape([p.shape for p in node.inputs], node.attrs) == node.shape
    assert set(node.attrs) == set(op.attrs), f"{name}: the node carries {sorted(node.attrs)}"
    assert any(s.reduce for s in plan.steps[0].program.stmts)


# ---- a row op registered at test time: softmax(x / T) along the last axis ---------------------------
def _softmax_t_emit(b: Builder, args: list[str], attrs: dict, var: str) -> str:
    x = b.scalar("mul", args[0], 1.0 / attrs["temperature"])
    shift = b.reduce("max", x, grad=False)
    e = b.prim("exp", [b.prim("sub", [x, shift])])
    return b.prim("div", [e, b.reduce("sum", e)], var=var)


def _softmax_t_provider(args: tuple, attrs: dict, cached) -> object:
    t = attrs["temperature"]
    return cached(("softmax_temperature", t), lambda: lambda x: softmax_temperature(x, t))(args[0])


SOFTMAX_T = RowOp(
    "softmax_temperature",
    same_shape,
    reduction_seed,
    _softmax_t_emit,
    ("axis", "temperature"),
    provider=_softmax_t_provider,
)


def softmax_temperature(x, temperature: float):
    """The autograd op: asks the row hook first, else runs the runtime's softmax kernels on ``x / T``."""
    attrs = {"axis": -1, "temperature": float(temperature)}
    fused = provided("softmax_temperature", (x,), attrs)
    if fused is not None:
        return fused
    axes = (len(x.shape) - 1,)

    def forward(v):
        return rowwise.softmax_forward(pointwise.mul(v, 1.0 / temperature), axes, rowwise.SOFTMAX)[0]

    def grad(g, values, out):
        (v,) = values
        scaled = pointwise.mul(v, 1.0 / temperature)
        _, rowmax, rowsum = rowwise.softmax_forward(scaled, axes, rowwise.SOFTMAX)
        gs = rowwise.softmax_backward(g, scaled, rowmax, rowsum, axes, rowwise.SOFTMAX)
        return [pointwise.mul(gs, 1.0 / temperature)]

    return apply_op(forward, grad, x, op_name="softmax_temperature", attrs=attrs)


def _softmax_t64(x, y, temperature=2.5):
    return _softmax64(x * y / temperature) * 3.0 + x


@pytest.fixture
def softmax_t() -> Iterator[RowOp]:
    register_row_op(SOFTMAX_T)
    yield SOFTMAX_T
    unregister_row_op(SOFTMAX_T.name)


def _program(x, y):
    return softmax_temperature(x * y, 2.5) * 3.0 + x


def test_an_unregistered_op_runs_eagerly(device):
    """Without the entry the op is an eager step between elementwise kernels (same values)."""
    plan, _ = _check_fused(device, _program, _softmax_t64, _arrays("xx", seed=1))
    assert "EagerStep" in [type(s).__name__ for s in plan.steps]


def test_a_registered_row_op_fuses_into_one_row_kernel(device, softmax_t):
    arrays = _arrays("xx", seed=1)
    plan, _ = _check_fused(device, _program, _softmax_t64, arrays)
    assert [type(s).__name__ for s in plan.steps] == ["RowStep"]
    names = [n.op_name for n in plan.steps[0].group.nodes]
    assert "softmax_temperature" in names and "mul" in names and "add" in names


def test_registering_recompiles_a_function_compiled_before(device):
    """The entry bumps the registry version (part of every JIT cache key): a compiled function re-plans."""
    fused = jit_compile(_program)
    nodes = [ag.tensor(a, device=device) for a in _arrays("xx", seed=2)]
    before = fused(*nodes).to_host()
    assert "EagerStep" in [type(s).__name__ for s in fused.plan_for(*nodes).steps]
    register_row_op(SOFTMAX_T)
    try:
        after = fused(*nodes).to_host()
        assert [type(s).__name__ for s in fused.plan_for(*nodes).steps] == ["RowStep"]
    finally:
        unregister_row_op(SOFTMAX_T.name)
    np.testing.assert_allclose(after, before, rtol=RTOL, atol=ATOL)


def test_a_registered_row_ops_provider_serves_the_eager_op(device, launch_counter, softmax_t):
    """>= MIN_ELEMENTS float32 elements: the eager op runs as the provider's fused function, on OpenCL one
    row kernel each way."""
    x = np.random.default_rng(3).uniform(-4, 4, size=(128, MIN_ELEMENTS // 128 + 3)).astype(np.float32)
    upstream = np.random.default_rng(4).uniform(-1, 1, size=x.shape).astype(np.float32)
    node = ag.tensor(x, requires_grad=True, device=device)
    for _ in range(2):  # the first call builds the kernels
        node.grad = None
        with launch_counter(device.queue) if device.kind == "opencl" else nullcontext() as counter:
            with ag.Tape() as tape:
                out = softmax_temperature(node, 0.5)
            tape.backward(out, grad=ag.tensor(upstream, device=device).value)
    assert out.op_name.startswith("jit:"), out.op_name  # the jitted function's row step, not the eager op
    if counter is not None:
        assert counter.names == ["row_forward", "row_backward"]
    s = _softmax64(x.astype(np.float64) / 0.5)
    np.testing.assert_allclose(out.to_host(), s, rtol=RTOL, atol=ATOL)
    expected = s * (upstream - (upstream * s).sum(-1, keepdims=True)) / 0.5
    np.testing.assert_allclose(node.grad.to_host(), expected, rtol=RTOL, atol=ATOL)


def test_a_bad_entry_is_refused():
    with pytest.raises(TypeError, match="'broken': emit must be callable"):
        register_row_op(RowOp("broken", same_shape, reduction_seed, None))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a RowOp"):
        register_row_op({"name": "softmax"})  # type: ignore[arg-type]
    assert get_row_op("broken") is None


def test_row_step_reads_class_targets_from_the_entry(cl_device):
    """cross_entropy's entry names input 1 as a class target: the row step checks it before the forward."""
    fused = jit_compile(CASES["cross_entropy"][0])
    x = ag.tensor(np.zeros((R, C), np.float32), device=cl_device)
    t = ag.tensor(np.array([0, 1, 2, C + 4, 0], np.int32), device=cl_device)
    with pytest.raises(IndexError, match=f"target value {C + 4} is out of range"):
        fused(x, t).to_host()
    step = fused.plan_for(x, t).steps[0]
    assert isinstance(step, RowStep) and step.target_checks == [(1, IGNORE, "cross_entropy")]


@pytest.mark.parametrize("name", sorted(RUNTIME_ROW_OPS))
def test_row_eager_declines_only_what_it_never_provides(device, name):
    """``row_eager.declines`` (which the row hook asks once per signature, letting a planned eager call skip the
    hook) says True only where ``provide`` returns None whatever the other arguments, and False for a float32
    tensor past ``MIN_ELEMENTS`` on a device whose runtime kernels it replaces (a GPU, the NumPy backend)."""
    big = np.random.default_rng(5).uniform(-1, 1, size=(128, MIN_ELEMENTS // 128 + 3))
    cases = [big.astype(np.float32), big.astype(np.float16), big[:4].astype(np.float32), big[:, :1].astype(np.float32)]
    for host in cases:
        x = ag.tensor(host, device=device, dtype=host.dtype)
        if declines(name, x.value):
            assert provide(name, (x,), {}) is None
    runtime_kernels_kept = device.is_opencl and not device.is_gpu
    assert declines(name, ag.tensor(cases[0], device=device).value) == runtime_kernels_kept
    assert all(declines(name, ag.tensor(h, device=device, dtype=h.dtype).value) for h in cases[1:])


def test_row_eager_declines_every_cross_entropy(device):
    """cross_entropy asks the row hook, but its entry has no provider (the runtime's class-loss kernels are faster):
    ``declines`` is True for every signature, and ``provide`` returns None for float32 logits past the floor."""
    assert get_row_op("cross_entropy").provider is None
    logits = ag.tensor(np.zeros((128, MIN_ELEMENTS // 128 + 3), np.float32), device=device)
    targets = ag.tensor(np.zeros(128, np.int32), device=device)
    assert declines("cross_entropy", logits.value)
    attrs = {"ignore_index": -100, "reduction": "mean", "label_smoothing": 0.0}
    assert provide("cross_entropy", (logits, targets), attrs) is None


def test_registering_a_row_op_makes_the_hook_ask_declines_again(device, softmax_t):
    """The row hook keeps ``declines``' answer per signature; ``declines`` reads the registry (an op without a
    provider is declined), so registering or removing a row op forgets those answers."""
    from netcl.autograd import row_hook

    x = ag.tensor(np.zeros((128, MIN_ELEMENTS // 128 + 3), np.float32), device=device).value
    entry = get_row_op(softmax_t.name)
    unregister_row_op(softmax_t.name)
    try:
        assert row_hook.declined(softmax_t.name, x)  # no entry: declined, and remembered
    finally:
        register_row_op(entry)
    assert not row_hook.declined(softmax_t.name, x)  # asked again: the entry's provider serves it
