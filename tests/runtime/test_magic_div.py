"""Division by a kernel-argument size as a multiply and a shift (netcl.runtime.ops.magic_div) and the CPU
im2col kernel built on it: exact quotients for every 31-bit numerator, and the kernel's columns equal to a
NumPy im2col and, bit for bit, to the shape-generic kernel's."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl import profiler
from netcl.runtime.cache import clear_caches
from netcl.runtime.ops import conv, conv_winograd, magic_div
from netcl.runtime.ops._grid import index_ctype


def test_magic_quotients_are_exact():
    """n * M >> S == n // d for the edge numerators (0, d - 1, d, the largest 31-bit ones) and random
    ones, for small divisors, powers of two and their neighbours, and random divisors up to 2**31 - 1."""
    rng = np.random.default_rng(0)
    divisors = [*range(1, 1100), *(2**k + e for k in range(1, 31) for e in (-1, 0, 1)), 2**31 - 1]
    divisors += [int(d) for d in rng.integers(1, 2**31, 500)]
    for d in divisors:
        m, s = magic_div.magic(d)
        assert m < 2**32
        numerators = [0, 1, d - 1, d, d + 1, 2**31 - 2, 2**31 - 1, *(int(n) for n in rng.integers(0, 2**31, 20))]
        for n in numerators:
            if n < 2**31:
                assert (n * m) >> s == n // d, (n, d)


def test_magic_rejects_a_non_positive_divisor():
    with pytest.raises(ValueError, match="divisor must be positive"):
        magic_div.magic(0)


def test_macro_divides_plainly_with_64_bit_indices():
    assert "d##_M" in magic_div.macro("int")
    assert "((n) / (d))" in magic_div.macro("long")


def _np_im2col(x: np.ndarray, geo: conv.ConvGeometry) -> np.ndarray:
    n, c = x.shape[:2]
    xp = np.pad(x, ((0, 0), (0, 0), (geo.PH, geo.PH), (geo.PW, geo.PW)))
    cols = np.empty((n, c, geo.KH, geo.KW, geo.OH, geo.OW), x.dtype)
    for ki in range(geo.KH):
        for kj in range(geo.KW):
            h0, w0 = ki * geo.DH, kj * geo.DW
            cols[:, :, ki, kj] = xp[:, :, h0 : h0 + geo.SH * geo.OH : geo.SH, w0 : w0 + geo.SW * geo.OW : geo.SW]
    return cols.reshape(n, c * geo.KH * geo.KW, geo.OH * geo.OW)


@pytest.mark.parametrize(
    "shape,kernel,stride,padding,dilation",
    [
        ((3, 1, 8, 8), (3, 3), (1, 1), (1, 1), (1, 1)),  # the digits CNN's first conv
        ((2, 5, 9, 7), (3, 2), (2, 1), (1, 0), (1, 2)),
        ((1, 3, 11, 13), (5, 5), (3, 2), (2, 2), (1, 1)),
    ],
)
def test_cpu_im2col_matches_numpy_and_the_generic_kernel(cl_device, shape, kernel, stride, padding, dilation):
    if cl_device.is_gpu:
        pytest.skip("the CPU im2col kernel runs on CPU OpenCL devices only")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    geo = conv.ConvGeometry(shape, kernel, stride, padding, dilation, "t")
    xt = nc.tensor(x, device=cl_device)
    with profiler.profile() as prof:
        cols = conv.im2col(xt, geo)
    assert [e.name for e in prof.events()] == ["netcl_im2col_cpu"]
    np.testing.assert_array_equal(cols.to_host(), _np_im2col(x, geo))
    # the shape-generic kernel (what a GPU runs) on the same device
    generic = nc.Tensor.empty(cols.shape, cols.dtype, cl_device)
    prepared = conv._prepare_layout(conv._IM2COL, "im2col", geo, xt.size, generic, cpu_variant=False)
    assert index_ctype(xt.size, generic.size) == "int"
    prepared(xt.data, generic.data)
    assert generic.to_host().tobytes() == cols.to_host().tobytes()


@pytest.mark.parametrize(
    "shape,kernel,stride,padding,dilation",
    [
        ((3, 1, 8, 8), (3, 3), (1, 1), (1, 1), (1, 1)),
        ((2, 5, 9, 7), (3, 2), (2, 1), (1, 0), (1, 2)),  # strides and dilation: taps that skip pixels
        ((1, 3, 11, 13), (5, 5), (3, 2), (2, 2), (1, 1)),
        ((2, 4, 8, 8), (1, 1), (2, 2), (0, 0), (1, 1)),  # a 1x1 stride-2 shortcut: pixels no tap reaches are 0
    ],
)
def test_cpu_col2im_matches_numpy_and_the_generic_kernel(cl_device, shape, kernel, stride, padding, dilation):
    """``netcl_col2im_cpu`` (the window compiled in, unrolled) sums each pixel's taps in the generic kernel's order:
    its bits, and float64's adjoint of im2col to float32 rounding."""
    if cl_device.is_gpu:
        pytest.skip("the CPU col2im kernel runs on CPU OpenCL devices only")
    geo = conv.ConvGeometry(shape, kernel, stride, padding, dilation, "t")
    rows = shape[1] * kernel[0] * kernel[1]
    c64 = np.random.default_rng(3).standard_normal((shape[0], rows, geo.OH * geo.OW))
    cols = nc.tensor(c64.astype(np.float32), device=cl_device)
    with profiler.profile() as prof:
        x = conv.col2im(cols, geo)
    assert [e.name for e in prof.events()] == ["netcl_col2im_cpu"]
    generic = nc.Tensor.empty(x.shape, x.dtype, cl_device)
    conv._prepare_layout(conv._COL2IM, "col2im", geo, cols.size, generic, cpu_variant=False)(cols.data, generic.data)
    assert generic.to_host().tobytes() == x.to_host().tobytes()
    # the adjoint: <im2col(u), c> == <u, col2im(c)> for every u, so col2im(c) is im2col's transpose applied to c
    exact = np.zeros(shape)
    for index in np.ndindex(*shape):
        unit = np.zeros(shape, np.float32)
        unit[index] = 1
        exact[index] = float(np.sum(_np_im2col(unit, geo) * c64))
    np.testing.assert_allclose(x.to_host(), exact, rtol=1e-5, atol=1e-5)


def test_winograd_tile_kernels_split_by_magic_as_by_division(cl_device, monkeypatch):
    """The Winograd transforms with their tile index split by ``magic_div`` (CPU devices) give the bits
    the ``/`` split gives: forward, input gradient and weight gradient, F(2x2) and F(4x4), ragged tiles."""
    if cl_device.is_gpu:
        pytest.skip("the magic split runs on CPU OpenCL devices only")
    rng = np.random.default_rng(2)
    x = nc.tensor(rng.standard_normal((3, 4, 7, 9)).astype(np.float32), device=cl_device)
    w = nc.tensor(rng.standard_normal((5, 4, 3, 3)).astype(np.float32), device=cl_device)
    g = nc.tensor(rng.standard_normal((3, 5, 7, 9)).astype(np.float32), device=cl_device)
    geo = conv.ConvGeometry(x.shape, (3, 3), (1, 1), (1, 1), (1, 1), "t")

    def passes() -> list[bytes]:
        out = []
        for tile in (2, 4):
            out.append(conv_winograd.forward(x, w, None, geo, tile).to_host().tobytes())
            out.append(conv_winograd.backward_input(g, w, geo, None, tile).to_host().tobytes())
            out.append(conv_winograd.backward_weight(g, x, geo, None, tile).to_host().tobytes())
        return out

    assert conv_winograd.split_by_magic(cl_device)
    magic = passes()
    monkeypatch.setattr(conv_winograd, "split_by_magic", lambda device: False)
    clear_caches()
    assert passes() == magic
    clear_caches()
