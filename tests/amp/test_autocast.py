"""autocast: float16 operands with float32 accumulation for linear/matmul/conv2d where the device
computes in fp16 (the NumPy backend; OpenCL devices with cl_khr_fp16); where float16 is storage-only
but tensor cores take it (NVIDIA's OpenCL), linear/matmul at matmul precision "fp16" (float32
tensors, operands rounded to float16 in the kernel: the same numbers) and conv2d at "high"
(tf32); nothing but one warning elsewhere.

The fp16 references round the operands to float16 and multiply in float64: the netcl result may
differ from that only by float32 accumulation (and, for conv2d, the float16 rounding of its
output: rtol 2e-3), while it differs from the float32 product by the operands' rounding (~1e-3).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import netcl.amp as amp
import netcl.autograd as ag
import netcl.nn as nn
from netcl.autograd import autocast_mode
from netcl.core.dtypes import float16
from netcl.runtime import ops as R


def _arrays(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]


def _half(a):
    return a.astype(np.float16).astype(np.float64)


def test_linear_and_matmul_under_autocast(device):
    x, w, b, g = _arrays(0, (16, 32), (8, 32), (8,), (16, 8))
    layer = nn.Linear(32, 8, device=device)
    layer.load_state_dict({"weight": w, "bias": b})
    xn = ag.tensor(x, requires_grad=True, device=device)
    autocast_mode._WARNED.discard(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ag.Tape() as tape, amp.autocast():
            out = layer(xn)
            product = ag.matmul(xn, ag.tensor(w.T.copy(), device=device))
            loss = ag.sum(out * ag.tensor(g, device=device))
        tape.backward(loss)
    assert out.dtype == np.float32 and product.dtype == np.float32 and loss.dtype == np.float32
    assert layer.weight.grad.dtype == np.float32 and xn.grad.dtype == np.float32
    full = x.astype(np.float64) @ w.T.astype(np.float64)
    fallback = autocast_mode.device_fallback_precision(device) if not device.computes(float16) else None
    if device.computes(float16) or fallback == "fp16":
        assert not [w for w in caught if "autocast" in str(w.message)]  # (the compiler may warn on a build)
        low = _half(x) @ _half(w).T
        np.testing.assert_allclose(out.to_host(), low + b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(product.to_host(), low, rtol=1e-5, atol=1e-5)
        assert np.abs(out.to_host() - (full + b)).max() > 1e-4  # it really rounded the operands
        np.testing.assert_allclose(layer.weight.grad.to_host(), _half(g).T @ _half(x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(xn.grad.to_host(), _half(g) @ _half(w), rtol=1e-5, atol=1e-5)
    if fallback is not None:  # float16 storage-only: the products at that matmul precision (NVIDIA)
        assert not [w for w in caught if "autocast" in str(w.message)]  # (the compiler may warn on a build)
        mixed_grads = [layer.weight.grad.to_host(), xn.grad.to_host()]  # backward ran after the block
        layer.weight.grad = None
        with ag.Tape() as tape, R.matmul_precision(fallback):
            xr = ag.tensor(x, requires_grad=True, device=device)
            reference = [layer(xr), ag.matmul(xr, ag.tensor(w.T.copy(), device=device))]
            tape.backward(ag.sum(reference[0] * ag.tensor(g, device=device)))
        np.testing.assert_array_equal(out.to_host(), reference[0].to_host())
        np.testing.assert_array_equal(product.to_host(), reference[1].to_host())
        np.testing.assert_array_equal(mixed_grads[0], layer.weight.grad.to_host())  # gradients at it too
        np.testing.assert_array_equal(mixed_grads[1], xr.grad.to_host())
        assert 1e-5 < np.abs(out.to_host() - (full + b)).max() < 2e-2  # 32 products of |x| < 1, each within 2**-10
    elif not device.computes(float16):
        assert [str(w.message) for w in caught if w.category is RuntimeWarning] == [
            f"autocast: device {device.name!r} has no float16 support (cl_khr_fp16); matmul and conv run in float32 "
            "there (autocast does nothing on this device)"
        ]  # once, although three products ran
        np.testing.assert_allclose(out.to_host(), full + b, rtol=1e-5, atol=1e-5)


def test_conv2d_under_autocast(device):
    x, w, b = _arrays(1, (2, 3, 6, 6), (4, 3, 3, 3), (4,))
    conv = nn.Conv2d(3, 4, 3, padding=1, device=device)
    conv.load_state_dict({"weight": w, "bias": b})
    xn = ag.tensor(x, device=device)
    with ag.no_grad():
        plain = conv(xn).to_host()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with amp.autocast():
                mixed = conv(xn)
        rounded = conv.__class__(3, 4, 3, padding=1, device=device)
        rounded.load_state_dict({"weight": _half(w), "bias": b})
        reference = rounded(ag.tensor(_half(x), device=device)).to_host()
    assert mixed.dtype == np.float32
    fallback = autocast_mode.device_fallback_precision(device, "conv")
    if device.computes(float16):
        np.testing.assert_allclose(mixed.to_host(), reference, rtol=2e-3, atol=2e-3)
        assert np.abs(mixed.to_host() - plain).max() > 1e-4
    elif fallback is not None:  # float16 storage-only, tf32 tensor cores
        assert fallback == autocast_mode.CONV_FALLBACK_PRECISION
        with ag.no_grad(), R.matmul_precision(fallback):
            np.testing.assert_array_equal(mixed.to_host(), conv(xn).to_host())
        assert 0 < np.abs(mixed.to_host() - plain).max() < 1e-2
    else:
        np.testing.assert_array_equal(mixed.to_host(), plain)


def test_autocast_nesting_and_arguments(device):
    assert autocast_mode.autocast_dtype() is None
    with amp.autocast():
        assert autocast_mode.autocast_dtype() == float16
        with amp.autocast(enabled=False):
            assert autocast_mode.autocast_dtype() is None
        assert autocast_mode.autocast_dtype() == float16
    assert autocast_mode.autocast_dtype() is None

    @amp.autocast()
    def inside():
        return autocast_mode.autocast_dtype()

    assert inside() == float16
    with pytest.raises(ValueError, match="dtype must be 'float16' or 'bfloat16', got 'float64'"):
        amp.autocast(dtype="float64")
    with pytest.raises(TypeError, match="enabled must be a bool"):
        amp.autocast(enabled="yes")
