"""Max pooling on CPU OpenCL devices (netcl.runtime.ops.pool_cpu): the geometry-specialized kernels give
what a float64 NumPy walk of the windows gives, and bit for bit what the shape-generic kernels of pool.py
give on the same device, with ties, NaNs and -0.0 gradients (the window walk, the forward and the
per-window backward of exact tilings, and the per-input gather of overlapping or padded windows)."""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime.ops import pool, pool_cpu

#: (x shape, kernel, stride, padding): exact tilings (the per-window backward), a tiling with a row and a
#: column left over, overlapping windows, rectangular ones; padded ones (the kernels handle padding, though
#: pool.max_pool2d keeps pool.py's kernels for them)
CASES = [
    ((3, 4, 8, 8), 2, None, 0),
    ((2, 3, 6, 9), (2, 3), None, 0),
    ((2, 3, 7, 7), 2, None, 0),
    ((2, 3, 7, 9), 3, 2, 1),
    ((2, 2, 6, 5), (3, 2), (1, 2), (1, 0)),
    ((1, 2, 5, 5), 3, 1, 1),
    ((2, 3, 9, 7), 3, 2, 0),
    ((1, 2, 6, 5), (3, 2), (1, 2), 0),
]


@pytest.fixture
def cpu_cl_device(cl_device: nc.Device) -> nc.Device:
    if cl_device.is_gpu:
        pytest.skip(f"{cl_device.name} is a GPU: the CPU pooling kernels do not apply")
    return cl_device


def _values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Small integers (so windows hold ties), a few NaNs (two in some windows), some -0.0 and 0.0."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=shape).astype(np.float32)
    x[rng.random(shape) < 0.05] = np.nan
    x[x == 0] = np.where(rng.random(int(np.sum(x == 0))) < 0.5, -0.0, 0.0)
    return x


def _reference(x: np.ndarray, g: np.ndarray, kernel, stride, padding) -> tuple[np.ndarray, np.ndarray]:
    """float64 forward and backward by walking every window: the first maximum in row-major order, a NaN
    beating every number and the first NaN winning; each window's gradient added to that position."""
    (kh, kw), (ph, pw) = pool.pair(kernel, "k", "t", 1), pool.pair(padding, "p", "t", 0)
    sh, sw = (kh, kw) if stride is None else pool.pair(stride, "s", "t", 1)
    n, c, h, w = x.shape
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.zeros((n, c, oh, ow))
    gx = np.zeros(x.shape)
    for i in np.ndindex(n, c, oh, ow):
        best, at = None, None
        for ki in range(kh):
            for kj in range(kw):
                r, s = i[2] * sh - ph + ki, i[3] * sw - pw + kj
                if 0 <= r < h and 0 <= s < w:
                    v = float(x[i[0], i[1], r, s])
                    if best is None or v > best or (np.isnan(v) and not np.isnan(best)):
                        best, at = v, (r, s)
        out[i] = best
        gx[(i[0], i[1], *at)] += float(g[i])
    return out, gx


def _generic(x: nc.Tensor, g: nc.Tensor | None, geo) -> nc.Tensor:
    """pool.py's shape-generic kernel on the same device (what every GPU runs)."""
    values = [geo.H, geo.W, geo.OH, geo.OW, geo.KH, geo.KW, geo.SH, geo.SW, geo.PH, geo.PW]
    if g is None:
        out = nc.Tensor.empty((geo.N, geo.C, geo.OH, geo.OW), x.dtype, x.device)
        return pool._launch(pool._MAX_FORWARD, "max_pool", pool._POOL, values, out, x)
    out = nc.Tensor.empty(x.shape, x.dtype, x.device)
    return pool._launch(pool._MAX_BACKWARD, "max_pool_backward", pool._POOL, values, out, x, g)


@pytest.mark.parametrize("shape,kernel,stride,padding", CASES)
def test_max_pool_cpu_kernels_match_numpy_and_the_generic_kernels(cpu_cl_device, shape, kernel, stride, padding):
    """Forward and backward: equal to the float64 walk where it is exact (maxima are copies; a gradient is
    a sum of at most a few small integers), NaN where it is NaN, and bitwise equal to pool.py's kernels."""
    x = _values(shape, 1)
    geo = pool.pool_geometry(x, kernel, stride, padding, "max_pool2d")
    g = np.random.default_rng(2).integers(-4, 5, size=(geo.N, geo.C, geo.OH, geo.OW)).astype(np.float32)
    g[g == 0] = -0.0
    xt, gt = nc.tensor(x, device=cpu_cl_device), nc.tensor(g, device=cpu_cl_device)
    want_out, want_gx = _reference(x, g, kernel, stride, padding)

    out = pool_cpu.max_pool(xt, geo).to_host()
    gx = pool_cpu.max_pool_backward(gt, xt, geo).to_host()
    np.testing.assert_array_equal(out, want_out.astype(np.float32))
    np.testing.assert_array_equal(gx, want_gx.astype(np.float32))
    assert out.tobytes() == _generic(xt, None, geo).to_host().tobytes()
    assert gx.tobytes() == _generic(xt, gt, geo).to_host().tobytes()


def test_max_pool_cpu_kernels_take_unpadded_pooling_on_cpu_devices(cpu_cl_device):
    """pool.max_pool2d runs them for unpadded windows only (padded ones keep pool.py's kernels)."""
    x = nc.Tensor.empty((1, 1, 6, 6), np.float32, cpu_cl_device)
    assert pool_cpu.applies(x, pool.pool_geometry(x, 3, 2, 0, "max_pool2d"))
    assert not pool_cpu.applies(x, pool.pool_geometry(x, 3, 2, 1, "max_pool2d"))
    assert not pool_cpu.applies(nc.Tensor.empty((1, 1, 6, 6), np.float32, "cpu"), pool.pool_geometry(x, 2, 2, 0, "t"))


def test_max_pool_cpu_tiling_rule():
    """The per-window backward runs only where every input element lies in exactly one window."""

    def geo(shape, kernel, stride=None, padding=0):
        return pool.pool_geometry(np.empty(shape, np.float32), kernel, stride, padding, "max_pool2d")

    assert pool_cpu.tiles(geo((1, 1, 8, 8), 2))
    assert pool_cpu.tiles(geo((1, 1, 6, 9), (2, 3)))
    assert not pool_cpu.tiles(geo((1, 1, 7, 8), 2))  # a row left over
    assert not pool_cpu.tiles(geo((1, 1, 8, 8), 2, 1))  # overlapping
    assert not pool_cpu.tiles(geo((1, 1, 8, 8), 2, 2, 1))  # padded


def test_max_pool_cpu_float64_and_float16(cpu_cl_device):
    """The other storage types: float64 exactly as NumPy; float16 (where the device computes in it)
    bitwise as pool.py's kernels."""
    x = _values((2, 3, 8, 8), 3)
    geo = pool.pool_geometry(x, 2, None, 0, "max_pool2d")
    g = np.random.default_rng(4).standard_normal((2, 3, 4, 4))
    want_out, want_gx = _reference(x, g, 2, None, 0)
    x64 = nc.tensor(x, np.float64, device=cpu_cl_device)
    g64 = nc.tensor(g, np.float64, device=cpu_cl_device)
    np.testing.assert_array_equal(pool_cpu.max_pool(x64, geo).to_host(), want_out)
    np.testing.assert_array_equal(pool_cpu.max_pool_backward(g64, x64, geo).to_host(), want_gx)
    if "cl_khr_fp16" not in cpu_cl_device.cl_device.extensions:  # float16 is storage-only there: no pooling
        return
    x16 = nc.tensor(x, np.float16, device=cpu_cl_device)
    g16 = nc.tensor(g, np.float16, device=cpu_cl_device)
    assert pool_cpu.max_pool(x16, geo).to_host().tobytes() == _generic(x16, None, geo).to_host().tobytes()
    assert pool_cpu.max_pool_backward(g16, x16, geo).to_host().tobytes() == _generic(x16, g16, geo).to_host().tobytes()


@pytest.mark.parametrize("shape,kernel,stride,padding", [*CASES, ((1, 2, 34, 34), 17, None, 0)])
def test_the_numpy_backend_pools_as_the_kernels(shape, kernel, stride, padding):
    """The NumPy twins (a window walk over reshaped tiles for exact tilings, gathered windows otherwise) give the
    float64 walk's maxima and gradients, sign bits included: a maximum is a copy of its element, a gradient is
    summed from zero (a -0.0 gradient lands as 0.0), a NaN gradient reaches only its window's maximum. The last
    case's windows have more than 256 positions (the arg-max outgrows a byte)."""
    device = nc.get_device("cpu")
    x = _values(shape, 1)
    xt = nc.tensor(x, device=device)
    geo = pool.pool_geometry(xt, kernel, stride, padding, "max_pool2d")
    g = np.random.default_rng(2).integers(-4, 5, size=(geo.N, geo.C, geo.OH, geo.OW)).astype(np.float32)
    g[g == 0] = -0.0
    g.flat[::7] = np.nan
    want_out, want_gx = _reference(x, g, kernel, stride, padding)
    out = pool.max_pool2d(xt, kernel, stride, padding).to_host()
    gx = pool.max_pool2d_backward(nc.tensor(g, device=device), xt, kernel, stride, padding).to_host()
    for got, want in ((out, want_out.astype(np.float32)), (gx, want_gx.astype(np.float32))):
        np.testing.assert_array_equal(got, want)
        assert (np.signbit(got) == np.signbit(want)).all()
