"""Strided views (``x.T``, ``permute``, ``x[:, 0]``): made with no launch, read as aliases of their source, read-only.

Views only move values, so every forward is exact against NumPy's view of the same float32 data (the ``check``
helper's 1e-5 is far above zero); gradients are single float32 terms against float64 finite differences (1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.autograd.saved_values import ModifiedInPlaceError
from netcl.profiler import profile
from netcl.runtime import ops

S3 = (3, 4, 5)

VIEWS = {
    "T": lambda x: x.T,
    "swap last two": lambda x: x.transpose(1, 2),
    "permute": lambda x: x.permute(2, 0, 1),
    "column": lambda x: x[:, 1],
    "every other": lambda x: x[::2, :, 1:4],
    "reversed": lambda x: x[::-1, None, ..., ::-2],
    "T of a column": lambda x: x[:, :, 2].T,
    "slice of a T": lambda x: x.T[1:4, ::2],
    "T of a T": lambda x: x.T.T,
    "permute of a slice": lambda x: x[1:, 1:3].permute(1, 2, 0),
    "empty": lambda x: x.T[:, 4:2],
}


class _NumpyView:
    """A NumPy array under the Node methods the chains above call: NumPy's views are the reference."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @property
    def T(self) -> _NumpyView:
        return _NumpyView(self.array.T)

    def transpose(self, d0: int, d1: int) -> _NumpyView:
        return _NumpyView(np.swapaxes(self.array, d0, d1))

    def permute(self, *axes: int) -> _NumpyView:
        return _NumpyView(self.array.transpose(axes))

    def __getitem__(self, key: object) -> _NumpyView:
        return _NumpyView(self.array[key])


def reference(name: str, x: np.ndarray) -> np.ndarray:
    """The view ``name`` of NumPy array ``x``."""
    return VIEWS[name](_NumpyView(x)).array


@pytest.mark.parametrize("name", VIEWS)
def test_view_values_and_gradients(check, name):
    check([S3], lambda x: reference(name, x) * 2.0, lambda x: VIEWS[name](x) * 2.0)


@pytest.mark.parametrize("name", VIEWS)
def test_view_read_as_an_operand_of_a_binary_op(check, name):
    check(
        [S3, S3],
        lambda x, y: reference(name, x) - reference(name, y) ** 2,
        lambda x, y: VIEWS[name](x) - VIEWS[name](y) ** 2,
    )


def test_matmul_of_transposed_views(check):
    check([(6, 4), (5, 4)], lambda a, b: a @ b.T, lambda a, b: a @ b.T)
    check(
        [(2, 4, 6), (2, 5, 4)],
        lambda a, b: a.transpose(0, 2, 1) @ b.transpose(0, 2, 1),
        lambda a, b: a.transpose(1, 2) @ b.transpose(1, 2),
    )


def test_matmul_of_a_batch_and_a_transposed_matrix(check):
    check([(2, 3, 4), (5, 4)], lambda a, b: a @ b.T, lambda a, b: a @ b.T)  # ranks differ: the view is gathered


def test_a_product_reads_a_transposed_view_in_place(device):
    a = ag.tensor(np.ones((4, 6), np.float32), device=device)
    b = ag.tensor(np.ones((5, 6), np.float32), device=device)
    with ag.no_grad(), profile() as prof:
        out = a @ b.T
    assert not any("transpose" in e.name or "strided" in e.name for e in prof.events())
    np.testing.assert_array_equal(out.to_host(), np.full((4, 5), 6.0, np.float32))


@pytest.mark.parametrize("name", ["T", "permute", "column", "reversed", "slice of a T"])
def test_making_a_view_launches_nothing(device, name):
    x = ag.tensor(np.ones(S3, np.float32), device=device)
    with profile() as prof:
        view = VIEWS[name](x)
    assert [e.name for e in prof.events() if e.kind != "range"] == []
    assert view.value.strided and view.value.base is x.value


def test_a_view_reads_its_sources_current_values(device):
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = ag.tensor(host, device=device)
    view = x.T[1:, ::2]
    ops.add_(x.value, 100.0)  # an in-place write into the source after the view was made
    np.testing.assert_array_equal(view.to_host(), (host + 100.0).T[1:, ::2])
    copy = view.contiguous()
    ops.fill_(x.value, 0.0)
    np.testing.assert_array_equal(copy.to_host(), (host + 100.0).T[1:, ::2])  # a copy of its own
    np.testing.assert_array_equal(view.to_host(), np.zeros((5, 2), np.float32))
    assert copy.is_contiguous() and not view.is_contiguous()


@pytest.mark.parametrize("write", [lambda t: ops.fill_(t, 1.0), lambda t: ops.add_(t, 1.0)], ids=["fill_", "add_"])
def test_in_place_write_into_a_view_is_refused_and_changes_nothing(device, write):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = ag.tensor(host, device=device)
    view = x.T
    stamp = x.value._written_at
    with pytest.raises(
        ValueError, match=r"cannot write in place into a strided view \(shape \(4, 3\), strides \(1, 4\)"
    ):
        write(view.value)
    assert x.value._written_at == stamp
    np.testing.assert_array_equal(x.to_host(), host)


def test_a_saved_view_whose_source_was_written_raises_at_backward(device):
    x = ag.tensor(np.ones((3, 4), np.float32), requires_grad=True, device=device)
    with ag.Tape() as tape:
        y = ag.sum(ag.mul(x.T, x.T))
    ops.add_(x.value, 1.0)
    with pytest.raises(ModifiedInPlaceError):
        tape.backward(y)


def test_reshape_of_a_view_is_a_gathered_copy(device):
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = ag.tensor(host, device=device)
    flat = x.T.reshape((24,))
    assert not flat.value.strided and flat.value.base is not x.value  # memory of its own
    ops.fill_(x.value, 0.0)
    np.testing.assert_array_equal(flat.to_host(), host.T.reshape(24))


def test_contiguous_passes_the_gradient_through(check):
    check([S3], lambda x: np.transpose(x, (2, 0, 1)) * 3.0, lambda x: x.permute(2, 0, 1).contiguous() * 3.0)


def test_a_view_of_every_dtype_reads_its_elements(device):
    for dtype in (np.float32, np.int32, np.uint8, np.float16, np.float64):
        try:
            device.check_dtype(dtype)
        except nc.DTypeError:  # a device without float64
            continue
        host = (np.arange(60) % 7).astype(dtype).reshape(3, 4, 5)
        x = nc.tensor(host, device=device)
        node = ag.tensor(x, device=device)
        np.testing.assert_array_equal(node.permute(2, 0, 1)[1:, ::-1].to_host(), host.transpose(2, 0, 1)[1:, ::-1])


def test_a_leaf_or_parameter_made_of_a_view_has_memory_of_its_own(device):
    from netcl import nn

    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = ag.tensor(host, device=device)
    for leaf in (ag.tensor(x.T, requires_grad=True), nn.Parameter(x.T)):
        assert not leaf.value.strided
        ops.add_(leaf.value, 1.0)  # writable, and the write stays in the leaf
        np.testing.assert_array_equal(leaf.to_host(), host.T + 1.0)
    np.testing.assert_array_equal(x.to_host(), host)


def test_a_block_the_device_cannot_address_is_a_strided_view(device):
    if device.kind != "opencl" or device.cl_device.mem_base_addr_align // 8 <= 4:
        pytest.skip("a device whose sub-buffers start at any float32")
    n = device.cl_device.mem_base_addr_align // 32  # float32 per alignment unit: row 1 of (3, n + 1) misses it
    host = np.arange(3 * (n + 1), dtype=np.float32).reshape(3, n + 1)
    x = ag.tensor(host, device=device)
    for _ in range(2):  # the second call takes the remembered layout
        row = x[1]
        assert row.value.strided and row.value.base is x.value
        np.testing.assert_array_equal(row.to_host(), host[1])


def test_a_jitted_row_program_reads_a_view(device):
    from netcl.jit import jit_compile

    @jit_compile
    def softmax_rows(a):
        e = ag.exp(a - ag.max(a, axis=-1, keepdims=True))
        return e / ag.sum(e, axis=-1, keepdims=True)

    host = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    x = ag.tensor(host, requires_grad=True, device=device)
    expected = np.exp(host.T - host.T.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    for _ in range(2):  # the trace, then the plan
        with ag.Tape() as tape:
            out = softmax_rows(x.T)
        np.testing.assert_allclose(out.to_host(), expected, rtol=1e-5, atol=1e-6)
        tape.backward(ag.sum(out * ag.tensor(np.arange(24, dtype=np.float32).reshape(4, 6), device=device)))
    assert x.grad.shape == (6, 4)


def test_launch_refuses_a_view_argument(device):
    if device.kind != "opencl":
        pytest.skip("kernels launch on OpenCL")
    from netcl.runtime import cache
    from netcl.runtime.errors import LaunchError
    from netcl.runtime.launch import enqueue_copy, enqueue_fill, launch

    source = "__kernel void fill_ones(__global float* x) { x[get_global_id(0)] = 1.0f; }"
    kernel = cache.program_cache.get_or_compile(("test", "fill_ones"), source, device.context).kernel("fill_ones")
    x = ag.tensor(np.zeros((2, 3), np.float32), device=device)
    with pytest.raises(LaunchError, match=r"argument 0 of kernel 'fill_ones' is a strided view \(shape \(3, 2\)"):
        launch(kernel, 6, None, x.T.value)
    with pytest.raises(LaunchError, match="enqueue_copy's destination is a strided view"):
        enqueue_copy(device.queue, x.T.value, x.value)
    with pytest.raises(LaunchError, match="enqueue_fill's buffer is a strided view"):
        enqueue_fill(device.queue, x.T.value)
    np.testing.assert_array_equal(x.to_host(), np.zeros((2, 3), np.float32))  # nothing written


def _kernels(fn) -> list[str]:
    with profile() as prof:
        fn()
    return [e.name for e in prof.events() if e.kind != "range"]


def test_an_elementwise_op_reads_a_view_in_place_unless_its_backward_reads_it(device):
    if device.kind != "opencl":
        pytest.skip("launches are counted on OpenCL")
    x = ag.tensor(np.arange(64, dtype=np.float32).reshape(8, 8) / 64, requires_grad=True, device=device)
    y = ag.tensor(np.ones((8, 8), np.float32), requires_grad=True, device=device)
    t = x.T
    with ag.no_grad():  # no backward: every view read through its strides, no gather
        assert _kernels(lambda: ag.exp(t)) == ["netcl_ew"]
        assert _kernels(lambda: ag.mul(t, t)) == ["netcl_ew"]
        assert len(_kernels(lambda: ag.where(t > 0.5, t, 0.0))) == 2  # the comparison, the select
        np.testing.assert_array_equal(ag.where(t > 0.5, t, 0.0).to_host(), np.where(x.numpy().T > 0.5, x.numpy().T, 0))

    def step(op, a: ag.Node) -> None:
        x.grad = y.grad = None  # each step's gradients new, none accumulated
        with ag.Tape() as tape:
            loss = ag.sum(op(a, y))
        tape.backward(loss)

    for op, gathers in ((ag.mul, 1), (ag.add, 0)):
        viewed = _kernels(lambda op=op: step(op, x.T))
        # mul's backward reads its inputs: one gather (a transpose) forward, the backward reads the copy; add's
        # reads none: its kernel reads the view; both transpose the gradient back
        assert viewed.count("netcl_transpose") == gathers + 1, (op, viewed)
        np.testing.assert_array_equal(x.grad.to_host(), np.ones((8, 8), np.float32))


def test_views_of_one_shape_and_other_layouts_each_read_their_own_elements(device):
    """An elementwise op's launch is remembered per operand layout (strides and offset), not per shape alone:
    views of one shape taken in other orders or at other offsets, alternating, each read their own elements."""
    host = np.arange(36, dtype=np.float32).reshape(6, 6)
    x = ag.tensor(host, device=device)
    z = ag.tensor(np.full((3, 6), 0.5, np.float32), device=device)
    chains = {
        "rows 0-2 of x.T": (lambda t: t.T[:3], host.T[:3]),
        "rows 3-5 of x.T": (lambda t: t.T[3:], host.T[3:]),
        "every other row": (lambda t: t[::2], host[::2]),
        "reversed rows 0-2": (lambda t: t[2::-1], host[2::-1]),
    }
    with ag.no_grad():
        for _ in range(2):
            for name, (chain, expected) in chains.items():
                np.testing.assert_array_equal((chain(x) + z).to_host(), expected + np.float32(0.5), err_msg=name)
                # exp within a few float32 ulps; a wrong element would be off by a factor of e or more
                np.testing.assert_allclose(ag.exp(chain(x)).to_host(), np.exp(expected), rtol=1e-6, err_msg=name)


def test_a_view_on_either_side_and_views_of_two_dtypes_each_launch_their_own_way(device):
    """The remembered launch of a two-operand op knows which operands are views and each one's dtype: a view on
    the left, on the right, or on both sides (also of float64 beside float32), alternating, each subtract their
    own operands in their own order (sub does not commute: a swapped buffer would change every element)."""
    host = np.arange(36, dtype=np.float32).reshape(6, 6)
    wide = host.astype(np.float64) / 7
    x, w = ag.tensor(host, device=device), ag.tensor(wide, device=device, dtype=np.float64)
    z = ag.tensor(np.full((6, 6), 0.5, np.float32), device=device)
    cases = {
        "view - tensor": (lambda: ag.sub(x.T, z), host.T - np.float32(0.5)),
        "tensor - view": (lambda: ag.sub(z, x.T), np.float32(0.5) - host.T),
        "view - view": (lambda: ag.sub(x.T, x[::-1]), host.T - host[::-1]),
        "view - float64 view": (lambda: ag.sub(x.T, w[::-1]), host.T.astype(np.float64) - wide[::-1]),
    }
    with ag.no_grad():
        for _ in range(2):
            for name, (run, expected) in cases.items():
                result = run().to_host()
                assert result.dtype == expected.dtype, name
                np.testing.assert_array_equal(result, expected, err_msg=name)


def test_gradient_scalers_and_clippers_refuse_a_view(device):
    from netcl.runtime.ops import amp_kernels, clip_kernels, optim_kernels

    g = ag.tensor(np.ones((2, 3), np.float32), device=device)
    view = g.T.value
    found = nc.tensor(np.zeros(1, np.int32), device=device)
    scale = nc.tensor(np.full(1, 2.0, np.float32), device=device)
    for write in (
        lambda: clip_kernels.grad_norm_clip_([view], 0.5),
        lambda: clip_kernels.scale_many_([view], scale),
        lambda: amp_kernels.unscale_by_(view, scale, found),
        lambda: amp_kernels.unscale_many_([view], scale, found),
        lambda: optim_kernels.unscale_(view, 0.5, found),
    ):
        with pytest.raises(ValueError, match="cannot write in place into a strided view"):
            write()
    np.testing.assert_array_equal(g.to_host(), np.ones((2, 3), np.float32))


def test_whether_a_block_is_a_sub_buffer_depends_on_its_dtype(device):
    if device.kind != "opencl" or device.cl_device.mem_base_addr_align // 8 <= 8:
        pytest.skip("a device whose sub-buffers start at any float64")
    k = device.cl_device.mem_base_addr_align // 64  # row 1 starts at k * 4 bytes (unaligned), k * 8 (aligned)
    for dtype, strided in ((np.float32, True), (np.float64, False)):  # the float32 layout is remembered first
        try:
            device.check_dtype(dtype)
        except nc.DTypeError:
            pytest.skip("no float64 on this device")
        x = ag.tensor(np.arange(3 * k, dtype=dtype).reshape(3, k), dtype=dtype, device=device)
        row = x[1]
        assert row.value.strided == strided, dtype
        np.testing.assert_array_equal(row.to_host(), np.arange(k, 2 * k, dtype=dtype))
