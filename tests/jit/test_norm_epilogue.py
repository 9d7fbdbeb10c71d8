"""The JIT's batch norm epilogue pass: ``relu(batch_norm(x))`` and ``relu(batch_norm(x) + r)`` become one
``batch_norm_relu`` op in a traced step, saving one elementwise launch forward and one backward per site.

The replayed ResNet-8 training step of examples/resnet.py (a narrow copy, small batch) must launch exactly
two kernels fewer per site than with the pass off (``NETCL_JIT_NORM_EPILOGUE=0``): the sites are the stem's
conv-bn-relu and each basic block's bn1-relu and bn2-add-relu. The fused op is bit for bit the composition
(add and ReLU are exact, the ReLU's mask a product by 0 or 1), so the losses, the parameters, their
gradients and the running statistics after several steps equal those of the unfused replay and of the
eager step exactly, on PoCL (captured and replayed) and on the NumPy backend (the jitted step run eagerly).
"""

from __future__ import annotations

from typing import Any

import file_modules
import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core import Tensor
from netcl.jit import conv_moments, jit_compile
from netcl.jit.norm_epilogue import ENV
from netcl.jit.partition import EagerStep

WIDTH = 0.125
steps = file_modules.load("tests/jit/resnet8_steps.py", "netcl_test_resnet8_steps")


def _sites(model: Any) -> int:
    """BN+ReLU sites of a ResNet: the stem's, and per basic block bn1 -> relu and bn2 -> add -> relu."""
    blocks = sum(isinstance(m, steps.resnet().BasicBlock) for m in model.modules())
    return 1 + 2 * blocks


def _fused_ops(graph: Any) -> int:
    (plan,) = graph.step._plans.values()
    return sum(isinstance(s, EagerStep) and s.node.op_name == "batch_norm_relu" for s in plan.steps)


def _bits(t: Any) -> np.ndarray:
    """A tensor's (or Node's, or host array's) values, float32 as its bits."""
    host = np.ascontiguousarray(t if isinstance(t, np.ndarray) else getattr(t, "value", t).to_host())
    return host.view(np.uint32) if host.dtype == np.float32 else host


def _replayed(device: Any, state: dict, fused: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, dict]:
    monkeypatch.setenv(ENV, "1" if fused else "0")
    monkeypatch.setenv(conv_moments.ENV, "0")  # the batch norms' own statistics, bit for bit the eager step's
    model, graph, results = steps.replayed_results(device, WIDTH, state)
    return model, graph, {k: _bits(v) for k, v in results.items()}


def _eager(device: Any, state: dict) -> dict:
    return {k: _bits(v) for k, v in steps.eager_results(device, WIDTH, state).items()}


def _assert_same(got: dict, ref: dict, what: str) -> None:
    assert got.keys() == ref.keys()
    for key in ref:
        np.testing.assert_array_equal(got[key], ref[key], err_msg=f"{key} ({what})")


def test_resnet8_replay_fuses_every_site(device, monkeypatch):
    state = steps.initial_state(device, WIDTH)
    model, fused, got = _replayed(device, state, True, monkeypatch)
    _, unfused, ref = _replayed(device, state, False, monkeypatch)
    sites = _sites(model)
    assert sites == 7
    assert _fused_ops(fused) == sites and _fused_ops(unfused) == 0
    _assert_same(got, ref, "fused vs unfused replay")
    _assert_same(got, _eager(device, state), "fused replay vs eager")
    if device.kind == "opencl":  # captured launches: one elementwise kernel fewer each way per site
        assert len(unfused.launches) - len(fused.launches) == 2 * sites
        norms = [sum(launch.name.startswith("netcl_batch_norm") for launch in g.launches) for g in (fused, unfused)]
        assert norms[0] == norms[1] == 2 * sum(type(m).__name__ == "BatchNorm2d" for m in model.modules())


def _norm_args(device, shape, seed=0):
    rng = np.random.default_rng(seed)
    C = shape[1]
    x = ag.tensor(rng.normal(size=shape).astype(np.float32), device=device, requires_grad=True)
    w = ag.tensor(rng.normal(size=C).astype(np.float32), device=device, requires_grad=True)
    return x, w, rng


def test_no_rewrite_where_the_norm_output_has_another_use(device):
    x, w, _ = _norm_args(device, (4, 3, 4, 4))

    def f(x, w):
        z = ag.batch_norm(x, None, None, w, None, True)
        return ag.relu(z) * z  # z is read twice: it must exist

    jitted = jit_compile(f)
    plan = jitted.plan_for(x, w)
    assert not any(isinstance(s, EagerStep) and s.node.op_name == "batch_norm_relu" for s in plan.steps)
    np.testing.assert_array_equal(_bits(jitted(x, w)), _bits(f(x, w)))


def test_no_rewrite_of_a_broadcast_residual(device):
    x, w, rng = _norm_args(device, (4, 3, 4, 4))
    r = ag.tensor(rng.normal(size=(1, 3, 1, 1)).astype(np.float32), device=device)

    def f(x, w):
        return ag.relu(ag.batch_norm(x, None, None, w, None, True) + r)

    plan = jit_compile(f).plan_for(x, w)
    assert not any(isinstance(s, EagerStep) and s.node.op_name == "batch_norm_relu" for s in plan.steps)


@pytest.mark.parametrize("residual_first", [False, True])
def test_jitted_block_tail_gradients_bitwise(device, residual_first):
    """relu(r + bn(x)) in either operand order: rewritten, and values and gradients equal the eager ones."""
    x, w, rng = _norm_args(device, (4, 3, 5, 5))
    r = ag.tensor(rng.normal(size=(4, 3, 5, 5)).astype(np.float32), device=device, requires_grad=True)
    g = Tensor.from_host(device, rng.normal(size=(4, 3, 5, 5)).astype(np.float32))

    def f(x, w, r):
        z = ag.batch_norm(x, None, None, w, None, True)
        return ag.relu(r + z if residual_first else z + r)

    jitted = jit_compile(f)
    plan = jitted.plan_for(x, w, r)
    assert sum(isinstance(s, EagerStep) and s.node.op_name == "batch_norm_relu" for s in plan.steps) == 1
    results = []
    for fn in (jitted, f):
        for leaf in (x, w, r):
            leaf.grad = None
        with ag.Tape() as tape:
            out = fn(x, w, r)
        tape.backward(out, grad=g)
        results.append([_bits(t) for t in (out, x.grad, w.grad, r.grad)])
    for got, ref in zip(*results, strict=True):
        np.testing.assert_array_equal(got, ref)
