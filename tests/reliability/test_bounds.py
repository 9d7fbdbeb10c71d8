"""Tensors past 2**31 elements: generated kernels index with 64-bit integers where they must.

Nothing here allocates a large buffer (PoCL's max allocation is 1 GiB; a 2**31-element float32
tensor is 8 GiB): kernel sources are generated from shapes alone, through the same functions
``jit_compile`` and the eager ops use, and the fused ones are also built on the device. The
checks: every index variable is ``long`` when a buffer has 2**31 elements or more, and a kernel
that keeps ``int`` indices never forms an index past 2**31 - 1, even in the padding work-items
of a grid rounded up to whole work-groups (the case just below 2**31 elements).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import netcl.autograd as ag
from netcl.core import Tensor, broadcast_index_lines, get_device, needs_64bit_index
from netcl.jit import jit_compile, opencl_source
from netcl.jit.codegen import Body
from netcl.runtime.ops import pointwise
from netcl.runtime.ops._common import index_type as runtime_index_type

BIG = 2**31 + 8
INT_MAX = 2**31 - 1
#: index variables of the fused skeleton and the eager elementwise kernel
INDEX_DECL = re.compile(r"\b(int|long)\s+(i\d*|v|first|stride|gid|n)\b\s*[=;,)]")


def _fake(shape, device):
    """A Tensor of ``shape`` with no buffer: enough for tracing and source generation."""
    return Tensor(None, tuple(shape), np.dtype(np.float32), device)


def _index_types(source: str) -> set[str]:
    return {m.group(1) for m in INDEX_DECL.finditer(source)}


@pytest.mark.parametrize(
    "shapes",
    [
        [(BIG,), (BIG,)],  # same shape: the float4 path
        [(2, 2**30 + 4), (1, 2**30 + 4)],  # broadcast along rows: vector broadcast path
        [(2**16 + 1, 2**15 + 3), (2**16 + 1, 1)],  # broadcast along the last dim, odd width: scalar path
        [(BIG,), ()],  # a 0-d tensor input
    ],
)
def test_fused_kernels_use_long_indices_past_2_31(cl_device, shapes):
    args = [_fake(s, cl_device) for s in shapes]
    assert needs_64bit_index(np.broadcast_shapes(*shapes))
    jitted = jit_compile(lambda x, y: ag.tanh(x * y) + y)
    nodes = [ag.Node(a, requires_grad=True) for a in args]
    forward, backward = jitted.source(*nodes)  # builds both kernels on the device, allocates nothing
    for source in (forward, backward):
        assert _index_types(source) == {"long"}, source
        assert "const long n" in source
        assert "get_global_id(0)" in source
    for line in forward.splitlines():
        if re.search(r"\bi\d+ = ", line):  # broadcast index arithmetic is long as well
            assert line.strip().startswith("long "), line


def test_broadcast_index_lines_in_long():
    lines = broadcast_index_lines((1, 3, 2**30), (4, 3, 2**30), "i", "i0", "long")
    assert lines == [f"long i0 = ((i / {2**30}) % 3) * {2**30} + (i % {2**30});"]
    # every constant fits the arithmetic: strides of a 2**32-element output
    assert str(3 * 2**30) not in lines[0] or "long" in lines[0]


def test_int_indices_never_overflow_in_padding_work_items():
    """Just below 2**31 elements the grid, rounded up to whole work-groups, must not pass INT_MAX."""
    overflows = []
    for offset in (1, 2, 255, 256, 1000, 4096, 70_000, 2**20, 2**24):
        n = 2**31 - offset
        for width in (1, 2, 4, 8, 16):
            for items in (1, 4):
                for local in (64, 256, 1024, 4096):
                    for input_shapes in ([(n,)], [(n,), None], [(n,), ()]):
                        out_shape = (n,)
                        if opencl_source.needs_long_index(out_shape, input_shapes, width, items):
                            continue
                        gsize = opencl_source.global_size(n, out_shape, input_shapes, local, width, items)
                        modes = opencl_source.vector_modes(input_shapes, out_shape, width)
                        vector = modes is not None and all(m in ("same", "param") for m in modes)
                        per_item = width * items if vector else width if modes is not None else 1
                        if gsize * per_item > INT_MAX:  # v * width (or get_global_id) of the last work-item
                            overflows.append((n, width, items, local, input_shapes, gsize))
    assert not overflows, overflows[:5]
    body = Body([("v0", "x0")], ["v0"])
    source = opencl_source.kernel_source("k", [(2**31 - 1,)], (2**31 - 1,), body, 0, 4, 1)
    assert _index_types(source) == {"long"}


def test_scalar_path_just_below_2_31_uses_long(cl_device):
    """A broadcast whose output has 2**31 - 100 elements: the scalar path's padding needs long."""
    rows = 2**31 - 100
    shapes = [(rows, 1), (1, 1)]
    forward, _ = jit_compile(lambda x, y: x * y + 1.0).source(*[_fake(s, cl_device) for s in shapes])
    assert _index_types(forward) == {"long"}, forward


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        ([(BIG,), (BIG,)], "long"),
        ([(2, 2**30 + 4), (2**30 + 4,)], "long"),
        ([(2**31 - 100,), ()], "long"),  # padding of the rounded-up grid
        ([(2**20,), (2**20,)], "int"),
    ],
)
def test_eager_elementwise_source_index_type(shapes, expected):
    device = get_device("cpu")  # source generation only needs shapes
    operands = [_fake(s, device) for s in shapes]
    out_shape = tuple(np.broadcast_shapes(*shapes))
    plan = pointwise.Plan("ADD({0}, {1})", operands, ["float", "float"], out_shape, np.dtype(np.float32))
    source = plan.make_source()  # what the eager op would build for these shapes
    assert _index_types(source) == {expected}, source
    assert runtime_index_type(out_shape, *shapes) == expected
    # the element count is a kernel argument of the index type (shape-generic source, issue 17)
    assert f"const {expected} n" in source


def test_needs_64bit_index_threshold():
    assert not needs_64bit_index((2**31 - 1,))
    assert needs_64bit_index((2**31,))
    assert needs_64bit_index((2, 2**30))
    assert not needs_64bit_index((0, 2**40))  # zero elements


def _room_for(device, n: int, buffers: int) -> bool:
    return device.max_alloc_size >= 4 * n and device.global_mem_size >= buffers * 4 * n + (1 << 30)


def _fused_ones_count(device, n: int) -> tuple[int, int]:
    """2**31-scale check: n ones through a fused kernel, forward and backward; exact-result counts."""
    from netcl.runtime import ops as R

    x = ag.Node(R.full((n,), 1.0, device=device), requires_grad=True)
    jitted = jit_compile(lambda v: v * 2.0 + 1.0)
    with ag.Tape() as tape:
        y = jitted(x)
    tape.backward(y, grad=ag.Node(R.full((n,), 1.0, device=device)))

    def count(t, value):
        return int(R.sum(R.cast(R.eq(t, value), np.int32)).to_host())

    return count(y.value, 3.0), count(x.grad, 2.0)


@pytest.mark.parametrize("n", [4099, 2**31 + 5])
def test_fused_kernel_on_the_device(cl_device, n):
    """A real run past 2**31 where the device has the memory (skipped on PoCL: 1-2 GiB per buffer).

    A wrong or overflowing index leaves elements unwritten or writes elsewhere, and the count of
    exact results (an int32 sum on the device, exact) comes out short. The small size checks the
    check itself everywhere.
    """
    if not _room_for(cl_device, n, buffers=6):
        pytest.skip(f"needs 6 buffers of {4 * n} bytes; {cl_device.name} allows {cl_device.max_alloc_size} per buffer")
    assert _fused_ones_count(cl_device, n) == (n, n)
