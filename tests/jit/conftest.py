"""Fixtures of the jit tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import netcl.autograd as ag
from netcl.jit import register_primitive
from netcl.runtime import ops as rops


@pytest.fixture(scope="session")
def c_only_step() -> Callable[[ag.Node], ag.Node]:
    """``step(x)``: ``x > 0 ? 2x : x / 2`` as one op whose fusible form is a primitive written in C (a conditional
    expression, which the vector twins cannot express), registered once per process."""
    register_primitive(
        "c_only_step",
        forward=lambda args, attrs: f"({args[0]} > 0.0f ? 2.0f * {args[0]} : 0.5f * {args[0]})",
        backward=lambda args, g, attrs, out: [f"({args[0]} > 0.0f ? 2.0f * {g} : 0.5f * {g})"],
        arity=1,
    )

    def step(x: ag.Node) -> ag.Node:
        return ag.engine.apply_op(
            lambda v: rops.where(rops.gt(v, 0.0), rops.mul(v, 2.0), rops.mul(v, 0.5)),
            lambda g, inputs, out: [rops.where(rops.gt(inputs[0], 0.0), rops.mul(g, 2.0), rops.mul(g, 0.5))],
            x,
            op_name="c_only_step",
        )

    return step
