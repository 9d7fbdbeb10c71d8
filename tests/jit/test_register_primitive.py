"""register_primitive returns a callable op, takes preamble= C helpers and probes its expressions."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.jit import JitError, jit_compile, register_primitive
from netcl.jit.primitive_registry import PRIMITIVES

SQPLUS = "inline float SQPLUS(float x, float y) { return x * x + y; }\n"


@pytest.fixture
def registered():
    """Names registered by a test, removed afterwards (the registry is process-wide)."""
    names: list[str] = []
    yield names
    for name in names:
        PRIMITIVES.pop(name, None)


def _sq_plus(registered: list[str]):
    registered.append("sq_plus_test")
    return register_primitive(
        "sq_plus_test",
        forward=lambda args, attrs: f"SQPLUS({args[0]}, {args[1]})",
        backward=lambda args, g, attrs, out: [f"MUL({g}, MUL(2.0f, {args[0]}))", g],
        arity=2,
        preamble=SQPLUS,
        numpy_helpers={"SQPLUS": lambda x, y: x * x + y},
    )


def test_the_registered_primitive_is_the_op_eager_and_fused(device, registered):
    sq_plus = _sq_plus(registered)
    x_np = np.array([[1.0, -2.0, 3.0], [0.5, 0.0, -1.5]], np.float32)
    y_np = np.array([0.25, -1.0, 2.0], np.float32)  # broadcast over rows: its gradient sums them
    fused = jit_compile(lambda a, b: sq_plus(a, b) * 2.0)
    for fn, scale in ((sq_plus, 1.0), (fused, 2.0)):
        x = ag.tensor(x_np, requires_grad=True, device=device)
        y = ag.tensor(y_np, requires_grad=True, device=device)
        with ag.Tape() as tape:
            out = fn(x, y)
            loss = ag.sum(out)
        tape.backward(loss)
        assert isinstance(out, ag.Node)
        # x*x + y and its gradients are exact in float32 for these values
        np.testing.assert_array_equal(out.to_host(), scale * (x_np * x_np + y_np))
        np.testing.assert_array_equal(x.grad.to_host(), scale * 2 * x_np)
        np.testing.assert_array_equal(y.grad.to_host(), np.full(3, 2 * scale, np.float32))


def test_the_preamble_reaches_the_fused_kernel(cl_device, registered):
    sq_plus = _sq_plus(registered)
    fused = jit_compile(lambda a, b: sq_plus(a, b) + 1.0)
    x = ag.tensor(np.ones(8, np.float32), device=cl_device)
    forward, _ = fused.source(x, x)
    assert SQPLUS.strip() in forward and "SQPLUS(x0, x1)" in forward


def test_an_expression_that_does_not_build_fails_at_registration_with_the_log(cl_device, registered):
    registered.append("no_such_helper")
    with pytest.raises(JitError, match="does not compile") as info:
        register_primitive(
            "no_such_helper",
            forward=lambda args, attrs: f"MY_OP({args[0]}, {args[1]})",
            backward=lambda args, g, attrs, out: [g, g],
            arity=2,
        )
    text = str(info.value)
    assert "MY_OP" in text and "build log" in text and "preamble=" in text
    assert "no_such_helper" not in PRIMITIVES  # nothing half-registered


def test_a_helper_without_its_numpy_twin_names_numpy_helpers(registered):
    registered.append("sq_plus_no_numpy")
    op = register_primitive(
        "sq_plus_no_numpy",
        forward=lambda args, attrs: f"SQPLUS({args[0]}, {args[1]})",
        backward=lambda args, g, attrs, out: [g, g],
        arity=2,
        preamble=SQPLUS,
    )
    x = ag.tensor(np.ones(3, np.float32), device="cpu")
    with pytest.raises(JitError, match="numpy_helpers="):
        op(x, x)


def test_arity_and_preamble_are_checked(registered):
    registered.append("unary_test")
    op = register_primitive("unary_test", lambda a, t: f"NEG({a[0]})", lambda a, g, t, o: [f"NEG({g})"], arity=1)
    x = ag.tensor(np.ones(2, np.float32), device="cpu")
    with pytest.raises(JitError, match="takes 1 inputs, got 2"):
        op(x, x)
    with pytest.raises(JitError, match="preamble must be a string"):
        register_primitive("bad_preamble", lambda a, t: "0.0f", lambda a, g, t, o: ["0.0f"], preamble=3)
