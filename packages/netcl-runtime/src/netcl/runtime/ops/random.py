"""Counter-based random numbers: the same seed gives the same numbers on every device.

Element ``i`` of a draw is a pure function of ``(seed, i)``: Philox4x32-10 (Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3", SC'11) of the counter ``(i_lo, i_hi, stream, 0)``
under the key ``(seed_lo, seed_hi)``; ``stream`` is 0 for ``uniform`` and 1 for ``normal``,
so the two never share bits. NumPy (``numpy_backend.philox4x32``) runs the same integer
function. ``uniform`` maps the top 24 bits of word 0 to ``[0, 1)`` exactly and is computed with
contraction off, so both backends give identical float32 values; ``normal`` uses Box-Muller
(``sqrt(-2 log u1) * cos(2 pi u2)``) and agrees across backends within a few float32 ulps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from netcl.core import Device, Tensor, get_device
from netcl.core.broadcast import normalize_shape
from netcl.core.dtypes import float32
from netcl.runtime.launch import launch
from netcl.runtime.ops import numpy_backend
from netcl.runtime.ops._common import get_kernel, round_up

PHILOX_SOURCE = r"""
#pragma OPENCL FP_CONTRACT OFF
inline uint4 philox4x32_10(uint4 c, uint2 k) {
    for (int i = 0; i < 10; ++i) {
        const uint hi0 = mul_hi(0xD2511F53u, c.x);
        const uint lo0 = 0xD2511F53u * c.x;
        const uint hi1 = mul_hi(0xCD9E8D57u, c.z);
        const uint lo1 = 0xCD9E8D57u * c.z;
        c = (uint4)(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += 0x9E3779B9u;
        k.y += 0xBB67AE85u;
    }
    return c;
}
inline uint4 netcl_bits(long i, uint stream, uint k0, uint k1) {
    return philox4x32_10((uint4)((uint)i, (uint)(i >> 32), stream, 0u), (uint2)(k0, k1));
}
"""

_UNIFORM = r"""
__kernel void netcl_uniform(__global float* out, const long n, const uint k0, const uint k1,
                            const float low, const float span) {
    const long gid = get_global_id(0);
    if (gid >= n) return;
    const uint4 r = netcl_bits(gid, 0u, k0, k1);
    const float u = (float)(r.x >> 8) * 0x1.0p-24f;
    out[gid] = low + span * u;
}
"""

_NORMAL = r"""
__kernel void netcl_normal(__global float* out, const long n, const uint k0, const uint k1,
                           const float mean, const float std) {
    const long gid = get_global_id(0);
    if (gid >= n) return;
    const uint4 r = netcl_bits(gid, 1u, k0, k1);
    const float u1 = ((float)(r.x >> 8) + 1.0f) * 0x1.0p-24f;
    const float u2 = (float)(r.y >> 8) * 0x1.0p-24f;
    const float z = sqrt(-2.0f * log(u1)) * cos(6.2831855f * u2);
    out[gid] = mean + std * z;
}
"""

_ARG_DTYPES = [None, np.int64, np.uint32, np.uint32, np.float32, np.float32]


def uniform(
    shape: Sequence[int] | int,
    low: float = 0.0,
    high: float = 1.0,
    seed: int = 0,
    device: Device | str | None = None,
) -> Tensor:
    """float32 samples from U[low, high), a pure function of (seed, element index)."""
    return _draw("uniform", shape, float(low), float(high) - float(low), seed, device)


def normal(
    shape: Sequence[int] | int,
    mean: float = 0.0,
    std: float = 1.0,
    seed: int = 0,
    device: Device | str | None = None,
) -> Tensor:
    """float32 samples from N(mean, std**2) by Box-Muller, a pure function of (seed, element index)."""
    return _draw("normal", shape, float(mean), float(std), seed, device)


def _draw(kind: str, shape: Sequence[int] | int, a: float, b: float, seed: int, device: Device | str | None) -> Tensor:
    dims = normalize_shape(shape)
    target = get_device(device)
    seed = int(seed) % 2**64
    if target.kind == "cpu":
        if kind == "uniform":
            return numpy_backend.uniform(dims, a, b, seed, target)
        return numpy_backend.normal(dims, a, b, seed, target)
    out = Tensor.empty(dims, float32, target)
    n = math.prod(dims)
    if n == 0:
        return out
    source = PHILOX_SOURCE + (_UNIFORM if kind == "uniform" else _NORMAL)
    resolved = get_kernel(("random", kind), target, lambda: source, f"netcl_{kind}", _ARG_DTYPES)
    local = resolved.max_local
    args = (np.int64(n), np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32), np.float32(a), np.float32(b))
    launch(resolved.kernel, round_up(n, local), local, out.data, *args, queue=target.queue)
    return out
