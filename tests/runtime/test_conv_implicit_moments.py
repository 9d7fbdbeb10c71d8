"""The implicit GEMM's tensor-core store gathers its output's per-channel moments (``conv_implicit.forward(...,
gather=)``, ``gemm_source.Epilogue.moments``): under a tensor-core matmul precision ("high": tf32 products, where
the device's tensor cores take them) each work-group of the ``mma.sync`` kernel writes, for each output channel
(a row of the product), the (count, mean, M2) of the values it stored over its block of columns, and a training
batch norm merges them instead of reading y. Elsewhere (the FMA kernel of "highest", CPU devices) nothing is
gathered and the batch norm reads y as before.

References are float64 NumPy statistics of the very y the kernel stored: counts exactly, means and variances
within 64 eps of max y^2 (a missed or doubled element moves a mean by ~1/count of a value, ~100x that here), and
the batch norm within float32 rounding of the float64 one of y (1e-5 relative, sums of ~10^3 terms).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime.ops import batchnorm, conv, conv_implicit
from netcl.runtime.ops.call_plans import clear_plans
from netcl.runtime.ops.precision import matmul_precision

EPS = float(np.finfo(np.float32).eps)

#: (x shape, output channels, kernel, stride, padding): a stem (3 input channels, padded), a stride-2 3x3 and a
#: stride-2 1x1 layer, each with output channels and pixels that leave partial tiles and several column blocks.
LAYERS = [
    ((6, 3, 16, 16), 24, 3, 1, 1),
    ((5, 16, 12, 12), 40, 3, 2, 1),
    ((7, 16, 10, 10), 32, 1, 2, 0),
]


def _gathers(device: nc.Device) -> bool:
    """Whether "high" runs this device's float32 convolutions on the tensor cores' mma.sync kernel."""
    with matmul_precision("high"):
        return conv_implicit.mma_mode(device, np.dtype(np.float32)) is not None


def _operands(device: nc.Device, shape, out_ch: int, kernel: int, bias: bool, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) + 2  # far from zero: the lanes' sums are shifted
    w = (rng.standard_normal((out_ch, shape[1], kernel, kernel)) * 0.2).astype(np.float32)
    b = nc.tensor(rng.standard_normal(out_ch).astype(np.float32), device=device) if bias else None
    return nc.tensor(x, device=device), nc.tensor(w, device=device), b


def _merged(parts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, mean, biased variance) of each channel from its groups' (count, mean, M2) rows, in float64."""
    count, mean, m2 = (parts[:, :, k].astype(np.float64) for k in range(3))
    total = count.sum(1)
    merged = (count * mean).sum(1) / total
    return total, merged, (m2 + count * (mean - merged[:, None]) ** 2).sum(1) / total


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("shape", "out_ch", "kernel", "stride", "padding"), LAYERS)
def test_the_tensor_core_store_gathers_the_outputs_moments(cl_device, shape, out_ch, kernel, stride, padding, bias):
    """y's bits as without gathering, and its (C, G, 3) moments: each channel's count exactly, its mean and
    biased variance within the bound above, one group per block of the product's columns."""
    if not _gathers(cl_device):
        pytest.skip(f"{cl_device.name}: no float32 tensor-core convolutions under 'high'")
    x, w, b = _operands(cl_device, shape, out_ch, kernel, bias, 7)
    geo = conv.check_conv2d(shape, w.shape, None, stride, padding, 1, 1)
    with matmul_precision("high"):
        gathered: list = []
        y = conv_implicit.forward(x, w, b, geo, gather=gathered)
        plain = conv_implicit.forward(x, w, b, geo).to_host()
    (moments,) = gathered
    assert moments.source is y and moments.groups > 1
    np.testing.assert_array_equal(y.to_host(), plain)
    y64 = plain.astype(np.float64)
    count, mean, var = _merged(moments.parts.to_host())
    np.testing.assert_array_equal(count, np.full(out_ch, geo.N * geo.OH * geo.OW))
    bound = 64 * EPS * float(np.max(y64**2))
    np.testing.assert_allclose(mean, y64.mean((0, 2, 3)), rtol=0, atol=bound)
    np.testing.assert_allclose(var, y64.var((0, 2, 3)), rtol=0, atol=bound)


def test_a_batch_norm_merges_a_strided_convolutions_moments(cl_device, monkeypatch):
    """``conv.conv2d(..., gather=)`` of a stride-2 layer (the implicit GEMM: Winograd does not apply, and no
    algorithm is searched) hands its moments over where they are gathered, and the training batch norm given them
    matches the float64 batch norm of y (output, mean, rstd, running statistics); where nothing is gathered the
    list stays empty."""
    monkeypatch.setenv("NETCL_TUNE", "0")
    clear_plans()  # conv2d's plans read the policy when made
    x, w, b = _operands(cl_device, (9, 16, 14, 14), 48, 3, True, 8)
    gathered: list = []
    with matmul_precision("high"):
        y = conv.conv2d(x, w, b, 2, 1, gather=gathered)
    clear_plans()
    if not _gathers(cl_device):
        assert gathered == []
        return
    (moments,) = gathered
    rm = nc.tensor(np.zeros(48, np.float32), device=cl_device)
    rv = nc.tensor(np.ones(48, np.float32), device=cl_device)
    out, mean_t, rstd_t = batchnorm.batch_norm_forward(y, rm, rv, None, None, True, 0.1, 1e-5, moments=moments)
    y64 = y.to_host().astype(np.float64)
    mean, var, count = y64.mean((0, 2, 3)), y64.var((0, 2, 3)), y64.size / 48
    rstd = 1 / np.sqrt(var + 1e-5)
    want = (y64 - mean[:, None, None]) * rstd[:, None, None]
    running = (0.1 * mean, 0.9 + 0.1 * var * count / (count - 1))
    for value, ref in zip((out, mean_t, rstd_t, rm, rv), (want, mean, rstd, *running), strict=True):
        np.testing.assert_allclose(value.to_host(), ref, rtol=1e-5, atol=1e-5)


def test_the_fma_kernel_gathers_nothing(cl_device):
    """Under "highest" (the FMA kernel, every device) the forward appends nothing and gives its usual bits."""
    x, w, b = _operands(cl_device, (4, 8, 10, 10), 16, 3, True, 9)
    geo = conv.check_conv2d(x.shape, w.shape, None, 2, 1, 1, 1)
    gathered: list = []
    with matmul_precision("highest"):
        y = conv_implicit.forward(x, w, b, geo, gather=gathered)
        np.testing.assert_array_equal(y.to_host(), conv_implicit.forward(x, w, b, geo).to_host())
    assert gathered == []
