"""The ``floatN`` twins of the preamble helpers (``vector_primitives``): each agrees with its scalar
helper on the OpenCL device, lane by lane, and ``vectorize`` accepts only what the twins cover.

Tolerance. The select-based twins (comparisons, WHERE, RELU, LEAKY_RELU, SIGN, MAX/MIN/CLAMP, SMOOTH_L1 and
its gradient, the gradients of RELU and LEAKY_RELU) evaluate the same float operations as the scalar helpers, so they
must be bit-identical (NaN where the scalar gives NaN). The others call the vector builtins
(``exp``/``tanh``/``log1p``/... on ``float8``), which a driver may implement differently from the
scalar ones within the OpenCL bounds (3 ulp exp/log, 5 ulp tanh, 16 ulp pow; section 7.4); composite
helpers chain a few of those, so they are compared within 32 ulp of the scalar result (the same
bound test_primitives.py allows against float64), absolutely near 0.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc
from netcl.core.kernels import PRIMITIVE_PREAMBLE
from netcl.core.kernels.vector_primitives import VECTOR_HELPERS, vector_preamble, vectorize

EXACT = {"LT", "LE", "GT", "GE", "EQ", "WHERE", "RELU", "RELU_GRAD", "ABS", "SIGN", "MAX", "MIN", "CLAMP"}
EXACT |= {"SMOOTH_L1", "SMOOTH_L1_GRAD", "NE", "LEAKY_RELU", "LEAKY_RELU_GRAD"}
ARITY = {"WHERE": 3, "CLAMP": 3, "LT": 2, "LE": 2, "GT": 2, "GE": 2, "EQ": 2, "MAX": 2, "MIN": 2, "POW": 2}
ARITY |= {"BCE_LOGITS": 2, "BCE_LOGITS_GRAD": 2, "SMOOTH_L1": 2, "SMOOTH_L1_GRAD": 2, "NE": 2}
ARITY |= {"LEAKY_RELU": 2, "LEAKY_RELU_GRAD": 2, "ELU": 2, "ELU_GRAD": 2}
WIDTH = 8

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, 0.05, -0.05, 0.5, -0.5, 1, -1, 3, -3]
LARGE = [20.0, -20.0, 88.0, -88.0, 100.0, -100.0, 3e38, -3e38]
values = np.array([*SPECIAL, *LARGE], np.float32)
X = np.concatenate([values, np.linspace(-9, 9, 71, dtype=np.float32)])
X = np.resize(X, -(-X.size // WIDTH) * WIDTH).astype(np.float32)
Y = np.roll(X, 5)
Z = np.abs(np.roll(X, 11))  # CLAMP's upper bound, SMOOTH_L1's beta: >= 0


def _run(device: nc.Device, helper: str) -> tuple[np.ndarray, np.ndarray]:
    """(scalar helper, vector twin) on X, Y, Z."""
    arity = ARITY.get(helper, 1)
    if helper == "CLAMP":
        args_s, args_v = "x[i], -z[i], z[i]", "vload8(v, x), -vload8(v, z), vload8(v, z)"
    elif helper in ("SMOOTH_L1", "SMOOTH_L1_GRAD"):
        args_s, args_v = "x[i], z[i]", "vload8(v, x), vload8(v, z)"
    elif helper in ("SOFTPLUS", "SOFTPLUS_GRAD"):  # beta > 0, torch's threshold
        args_s, args_v = "x[i], z[i] + 0.5f, 20.0f", "vload8(v, x), vload8(v, z) + 0.5f, (VF)20.0f"
    else:
        names = "xyz"[:arity]
        args_s = ", ".join(f"{n}[i]" for n in names)
        args_v = ", ".join(f"vload8(v, {n})" for n in names)
    source = (
        PRIMITIVE_PREAMBLE
        + vector_preamble(WIDTH)
        + f"""
__kernel void scalar_k(__global const float* x, __global const float* y, __global const float* z,
                       __global float* out) {{
    int i = get_global_id(0);
    out[i] = {helper}({args_s});
}}
__kernel void vector_k(__global const float* x, __global const float* y, __global const float* z,
                       __global float* out) {{
    int v = get_global_id(0);
    VF r = V_{helper}({args_v});
    vstore8(r, v, out);
}}
"""
    )
    context, queue = device.context, device.queue
    program = cl.Program(context, source).build()
    flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
    buffers = [cl.Buffer(context, flags, hostbuf=a) for a in (X, Y, Z)]
    results = []
    for name, size in (("scalar_k", X.size), ("vector_k", X.size // WIDTH)):
        out = cl.Buffer(context, cl.mem_flags.WRITE_ONLY, X.nbytes)
        getattr(program, name)(queue, (size,), None, *buffers, out)
        host = np.empty_like(X)
        cl.enqueue_copy(queue, host, out)
        results.append(host)
    return results[0], results[1]


@pytest.mark.parametrize("helper", VECTOR_HELPERS)
def test_vector_twin_matches_scalar_helper(cl_device: nc.Device, helper: str) -> None:
    scalar, vector = _run(cl_device, helper)
    assert np.array_equal(np.isnan(scalar), np.isnan(vector)), X[np.isnan(scalar) != np.isnan(vector)]
    if helper in EXACT:
        np.testing.assert_array_equal(vector, scalar)
        return
    finite = np.isfinite(scalar)
    assert np.array_equal(scalar[~finite & ~np.isnan(scalar)], vector[~finite & ~np.isnan(scalar)])
    ulp = np.spacing(np.abs(scalar[finite])).astype(np.float64)
    err = np.abs(vector[finite].astype(np.float64) - scalar[finite])
    assert np.all(err <= 32 * np.maximum(ulp, 1e-37)), (X[finite][err > 32 * ulp], err.max())


def test_vectorize_rewrites_helpers_and_refuses_other_c() -> None:
    assert vectorize("MUL(g10, SUB(1.0f, TANH(v9)))") == "MUL(g10, SUB(1.0f, V_TANH(v9)))"
    assert vectorize("WHERE(GT(x0, (-2.5f)), gout, 0.0f)") == "V_WHERE(V_GT(x0, (-2.5f)), gout, 0.0f)"
    assert vectorize("fmax(x1, 1e-3f) * INFINITY") == "fmax(x1, 1e-3f) * INFINITY"
    for c_only in ("x0 > 0.0f ? x0 : 0.0f", "(float)(x0)", "my_helper(x0)", "x0 % 2", "vals[0]"):
        assert vectorize(c_only) is None, c_only
    with pytest.raises(ValueError, match="vector width must be 2, 3, 4, 8 or 16, got 5"):
        vector_preamble(5)
