"""``broadcast_index_lines`` compiled into real OpenCL kernels computing ``out = a + b``."""

from __future__ import annotations

import math

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc

# (a shape, b shape, index type). One program holds a kernel per case, so PoCL compiles once.
CASES = [
    ((6, 1), (1, 9), "int"),  # (B, 1) + (1, F)
    ((2, 1, 4), (3, 1), "int"),
    ((), (5,), "int"),
    ((5,), (), "long"),
    ((4, 3), (3,), "int"),
    ((3, 1, 1), (1, 4, 5), "long"),
    ((1,), (2, 3), "int"),
    ((3, 4), (3, 4), "int"),
    ((2, 3, 1, 5), (3, 4, 1), "int"),
    ((1, 1), (7, 1), "int"),
    ((0, 3), (1, 3), "int"),  # zero-size output: the kernel must still compile
]


def _kernel_source(index: int, a_shape, b_shape, index_type: str) -> str:
    out_shape = nc.broadcast_shapes(a_shape, b_shape)
    lines = [
        *nc.broadcast_index_lines(a_shape, out_shape, "gid", "ia", index_type),
        *nc.broadcast_index_lines(b_shape, out_shape, "gid", "ib", index_type),
    ]
    body = "\n    ".join(lines)
    return f"""
__kernel void badd_{index}(__global const float* a, __global const float* b, __global float* out,
                         const {index_type} n) {{
    {index_type} gid = get_global_id(0);
    if (gid >= n) return;
    {body}
    out[gid] = a[ia] + b[ib];
}}
"""


@pytest.fixture(scope="module")
def program(cl_device: nc.Device) -> cl.Program:
    source = "\n".join(_kernel_source(i, *case) for i, case in enumerate(CASES))
    return cl.Program(cl_device.context, source).build()


@pytest.fixture(scope="module")
def cl_device() -> nc.Device:  # module scope, so the program above is built once
    if not nc.usable_opencl_devices():
        pytest.skip("no OpenCL device on this machine")
    return nc.get_device("opencl")


@pytest.mark.parametrize("case", range(len(CASES)), ids=lambda i: f"{CASES[i][0]}+{CASES[i][1]}")
def test_broadcast_add_kernel_matches_numpy(program: cl.Program, cl_device: nc.Device, case: int) -> None:
    a_shape, b_shape, index_type = CASES[case]
    rng = np.random.default_rng(case)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    expected = a + b  # float32 + float32 is one correctly rounded IEEE add on both sides: exact match
    out = nc.Tensor.empty(expected.shape, nc.float32, cl_device)
    n = math.prod(expected.shape)
    if n:
        kernel = getattr(program, f"badd_{case}")
        ta, tb = nc.Tensor.from_host(cl_device, a), nc.Tensor.from_host(cl_device, b)
        # round the global size up to a multiple of 8 so the `gid >= n` guard is exercised too
        size = -(-n // 8) * 8
        n_arg = np.int32(n) if index_type == "int" else np.int64(n)
        kernel(cl_device.queue, (size,), None, ta.data, tb.data, out.data, n_arg)
    got = out.to_host()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
