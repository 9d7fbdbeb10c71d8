"""NumPy twins of ``netcl.runtime.ops.random`` (arguments already checked there).

The same Philox4x32-10 bits as the kernels (``ops.random.philox4x32`` on the host): ``uniform``
gives identical float32 values, ``normal`` agrees within a few float32 ulps.
"""

from __future__ import annotations

import numpy as np

from netcl.core import Device, Tensor
from netcl.core.dtypes import float32
from netcl.runtime.numpy_twins._values import float_compute_type
from netcl.runtime.ops._common import wrap_numpy
from netcl.runtime.ops.random import DROPOUT_STREAM, random_bits


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


def draw(kind: str, dims: tuple[int, ...], a: float, b: float, seed: int, target: Device) -> Tensor:
    if kind == "uniform":
        return uniform(dims, a, b, seed, target)
    return normal(dims, a, b, seed, target)


def advance_counter(counter: Tensor) -> Tensor:
    counter.data[...] = (counter.data.astype(np.int64) + 1).astype(np.uint32).view(np.int32)
    return counter


def dropout_mask(x: Tensor, seed: int, threshold: int, scale: float, counter: Tensor | None) -> Tensor:
    word3 = 0 if counter is None else int(np.asarray(counter.data).reshape(-1)[0].astype(np.uint32))
    bits = random_bits(x.size, seed, DROPOUT_STREAM, word3)[0] >> np.uint32(8)
    keep = (bits >= threshold).reshape(x.shape)
    compute = float_compute_type(x.dtype)
    values = np.where(keep, np.asarray(x.data, dtype=compute) * compute(scale), compute(0))
    return wrap_numpy(values, x.device, x.dtype)
