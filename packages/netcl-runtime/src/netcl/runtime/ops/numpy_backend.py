"""Every eager op in NumPy, for the ``cpu`` device (``device.kind == "cpu"``).

Values are computed in the dtype the OpenCL kernels use (float32 for float32/float16 data,
float64 for float64) and returned in the same result dtype, so both backends agree within
float32 rounding. Floating-point warnings (overflow, division by zero) are silenced: the
OpenCL kernels produce inf/nan without warning and so does this backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor, broadcast_shapes
from netcl.core.dtypes import float16, float32
from netcl.runtime.ops._common import wrap_numpy


def _np_compute(dtype: np.dtype) -> np.dtype:
    """The NumPy dtype values of ``dtype`` are computed in (half -> float32, as on OpenCL)."""
    return float32 if dtype == float16 else dtype


def transpose(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    return wrap_numpy(np.transpose(x.data, axes).copy(order="C"), x.device, x.dtype)


def broadcast_to(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    return wrap_numpy(np.broadcast_to(x.data, shape).copy(order="C"), x.device, x.dtype)


def cast(x: Tensor, dtype: np.dtype) -> Tensor:
    with np.errstate(all="ignore"):
        return wrap_numpy(np.asarray(x.data).astype(dtype), x.device, dtype)


def one_hot(labels: Tensor, num_classes: int) -> Tensor:
    data = np.asarray(labels.data)
    result = (data[..., None] == np.arange(num_classes, dtype=data.dtype)).astype(np.float32)
    return wrap_numpy(result, labels.device, float32)


def shape_of(operands: Sequence[Any]) -> tuple[int, ...]:
    return broadcast_shapes(*[v.shape for v in operands if isinstance(v, Tensor)])


# ---- counter-based random numbers (the same Philox4x32-10 as ops/random.py's C code) ------------
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32(counter: Sequence[np.ndarray], key: tuple[int, int], rounds: int = 10) -> list[np.ndarray]:
    """Philox4x32 (Salmon et al., SC'11) of four uint32 counter words under a 2-word key."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _MASK32 for c in counter)
    k0, k1 = np.uint64(key[0] & 0xFFFFFFFF), np.uint64(key[1] & 0xFFFFFFFF)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    w0, w1 = np.uint64(PHILOX_W[0]), np.uint64(PHILOX_W[1])
    shift = np.uint64(32)
    for _ in range(rounds):
        p0 = m0 * c0
        p1 = m1 * c2
        c0, c1, c2, c3 = (p1 >> shift) ^ c1 ^ k0, p1 & _MASK32, (p0 >> shift) ^ c3 ^ k1, p0 & _MASK32
        k0, k1 = (k0 + w0) & _MASK32, (k1 + w1) & _MASK32
    return [c.astype(np.uint32) for c in (c0, c1, c2, c3)]


def random_bits(n: int, seed: int, stream: int, word3: int = 0) -> list[np.ndarray]:
    """Philox output words for element indices 0..n-1 of ``stream`` under ``seed`` (counter word 3: ``word3``)."""
    index = np.arange(n, dtype=np.uint64)
    seed %= 2**64
    zeros = np.zeros(n, dtype=np.uint64)
    return philox4x32((index & _MASK32, index >> np.uint64(32), zeros + stream, zeros + word3), (seed, seed >> 32))


def uniform(shape: tuple[int, ...], low: float, span: float, seed: int, device: Device) -> Tensor:
    n = int(np.prod(shape))
    bits = random_bits(n, seed, 0)[0]
    u = (bits >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
    values = np.float32(low) + np.float32(span) * u
    return wrap_numpy(values.reshape(shape), device, float32)


def normal(shape: tuple[int, ...], mean: float, std: float, seed: int, device: Device) -> Tensor:
    n = int(np.prod(shape))
    b0, b1 = random_bits(n, seed, 1)[:2]
    u1 = ((b0 >> np.uint32(8)).astype(np.float32) + np.float32(1.0)) * np.float32(2.0**-24)
    u2 = (b1 >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)
    theta = np.float32(2.0 * np.pi) * u2  # rounded to float32 exactly as the kernel does
    z = (np.sqrt(-2.0 * np.log(u1.astype(np.float64))) * np.cos(theta.astype(np.float64))).astype(np.float32)
    values = np.float32(mean) + np.float32(std) * z
    return wrap_numpy(values.reshape(shape), device, float32)
