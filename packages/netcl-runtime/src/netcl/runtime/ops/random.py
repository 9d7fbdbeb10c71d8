"""Counter-based random numbers: the same seed gives the same numbers on every device.

Element ``i`` of a draw is a pure function of ``(seed, i)``: Philox4x32-10 (Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3", SC'11) of the counter ``(i_lo, i_hi, stream, 0)``
under the key ``(seed_lo, seed_hi)``; ``stream`` is 0 for ``uniform`` and 1 for ``normal``,
so the two never share bits. NumPy (``philox4x32`` here) runs the same integer
function. ``uniform`` maps the top 24 bits of word 0 to ``[0, 1)`` exactly and is computed with
contraction off, so both backends give identical float32 values; ``normal`` uses Box-Muller
(``sqrt(-2 log u1) * cos(2 pi u2)``) and agrees across backends within a few float32 ulps.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from netcl.core import Device, Tensor, get_device
from netcl.core.broadcast import normalize_shape
from netcl.core.dtypes import float32, refuse_bfloat16
from netcl.runtime.ops._common import compute_ctype, get_kernel, pragmas, round_up, storage_ctype
from netcl.runtime.ops._grid import launch_prepared
from netcl.runtime.ops.backend import backend_op

_TWINS = "netcl.runtime.numpy_twins.random"

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
    return draw(kind, normalize_shape(shape), a, b, int(seed) % 2**64, get_device(device))


@backend_op(_TWINS, device_arg="target")
def draw(kind: str, dims: tuple[int, ...], a: float, b: float, seed: int, target: Device) -> Tensor:
    """``uniform`` (``a`` low, ``b`` span) or ``normal`` (``a`` mean, ``b`` std) of a checked call."""
    out = Tensor.empty(dims, float32, target)
    n = math.prod(dims)
    if n == 0:
        return out
    source = PHILOX_SOURCE + (_UNIFORM if kind == "uniform" else _NORMAL)
    resolved = get_kernel(("random", kind), target, lambda: source, f"netcl_{kind}", _ARG_DTYPES)
    local = resolved.max_local
    args = (np.int64(n), np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32), np.float32(a), np.float32(b))
    launch_prepared(("random", kind), target, resolved.kernel, round_up(n, local), local, [out, *args])
    return out


# ---- counter-based random numbers on the host (the same Philox4x32-10 as the C code above) --------------
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


# ---- the global generator and dropout ------------------------------------------------------------
#: Seed of the global generator until ``manual_seed`` is called (fixed, so runs repeat, as in PyTorch).
DEFAULT_SEED = 0x5EED_0F_4E7C1
#: Philox stream of dropout masks (0 is ``uniform``, 1 ``normal``, 3 the generator's per-call seeds).
DROPOUT_STREAM = 2
_SEED_STREAM = 3
_generator = {"seed": DEFAULT_SEED, "calls": 0}
_generator_lock = threading.Lock()


def manual_seed(seed: int) -> None:
    """Seed the global generator: the sequence of ``next_seed()`` values (and so dropout masks) repeats."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"manual_seed: seed must be an int, got {seed!r}")
    with _generator_lock:
        _generator["seed"] = int(seed) % 2**64
        _generator["calls"] = 0


def initial_seed() -> int:
    """The seed the global generator was last seeded with."""
    return _generator["seed"]


def get_rng_state() -> dict[str, int]:
    """The global generator's state, ``{"seed": int, "calls": int}`` (JSON-ready; ``set_rng_state`` restores it)."""
    with _generator_lock:
        return {"seed": int(_generator["seed"]), "calls": int(_generator["calls"])}


def set_rng_state(state: dict[str, int]) -> None:
    """Restore what ``get_rng_state`` returned: the following ``next_seed()`` values repeat."""
    try:
        seed, calls = int(state["seed"]), int(state["calls"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"set_rng_state: expected {{'seed': int, 'calls': int}}, got {state!r}") from exc
    if not 0 <= seed < 2**64 or calls < 0:
        raise ValueError(f"set_rng_state: seed must be in [0, 2**64) and calls >= 0, got {state!r}")
    with _generator_lock:
        _generator["seed"], _generator["calls"] = seed, calls


class _Untaken(threading.local):
    """This thread's ``draws_not_taken`` blocks: how deep, and how many seeds they handed out."""

    depth = 0
    handed = 0


_untaken = _Untaken()


@contextmanager
def draws_not_taken() -> Iterator[None]:
    """Within the block, on this thread, ``next_seed`` hands out seeds without advancing the global generator
    (a jit trace's draws, which none of its runs uses): the next seed after the block is the one before it,
    and other threads' draws are untouched."""
    if not _untaken.depth:
        _untaken.handed = 0
    _untaken.depth += 1
    try:
        yield
    finally:
        _untaken.depth -= 1


def next_seed() -> int:
    """A fresh 64-bit seed: Philox of the call count under the global seed (host only, no device work)."""
    with _generator_lock:
        seed, call = _generator["seed"], _generator["calls"]
        if _untaken.depth:  # the count ahead of the generator's, which stays where it is
            call, _untaken.handed = call + _untaken.handed, _untaken.handed + 1
        else:
            _generator["calls"] = call + 1
    words = philox4x32(
        [np.uint64(call & 0xFFFFFFFF), np.uint64(call >> 32), np.uint64(_SEED_STREAM), np.uint64(0)],
        (seed & 0xFFFFFFFF, seed >> 32),
    )
    return int(words[0]) | (int(words[1]) << 32)


_DROPOUT = r"""
__kernel void netcl_dropout(__global const {st}* x, __global {st}* out, const long n, const uint k0, const uint k1,
                            const uint threshold, const float scale, __global const int* counter) {{
    const long gid = get_global_id(0);
    if (gid >= n) return;
    const uint4 r = philox4x32_10((uint4)((uint)gid, (uint)(gid >> 32), {stream}u, (uint)counter[0]), (uint2)(k0, k1));
    out[gid] = (r.x >> 8) >= threshold ? ({st})(({ct})x[gid] * ({ct})scale) : ({st})0;
}}
"""

_ADVANCE = r"""
__kernel void netcl_counter_advance(__global int* counter) {
    if (get_global_id(0) == 0) counter[0] = (int)((uint)counter[0] + 1u);
}
"""

#: device -> a one-element zero counter that is never advanced (what eager dropout reads).
_ZERO_COUNTERS: dict[Device, Tensor] = {}


#: the value new counters start at (``counters_start_at``); 0 outside it
_counter_start = [0]


@contextmanager
def counters_start_at(value: int) -> Iterator[None]:
    """Within the block, ``new_counter`` starts counters at ``value`` instead of 0: a step captured
    again after a resume draws the masks that the ``value``-th replay of the first capture drew."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < 2**32:
        raise ValueError(f"counters_start_at: value must be an int in [0, 2**32), got {value!r}")
    previous, _counter_start[0] = _counter_start[0], int(value)
    try:
        yield
    finally:
        _counter_start[0] = previous


def new_counter(device: Device | str | None = None) -> Tensor:
    """A one-element int32 device counter that ``advance_counter`` steps (Philox counter word 3): 0, or the
    value of an enclosing ``counters_start_at``."""
    start = np.asarray([_counter_start[0]], np.uint32).view(np.int32)
    return Tensor.from_host(get_device(device), start)


@backend_op(_TWINS)
def advance_counter(counter: Tensor) -> Tensor:
    """``counter += 1`` on the device (a launch, so a captured graph advances it on every replay)."""
    resolved = get_kernel(("random", "advance"), counter.device, lambda: _ADVANCE, "netcl_counter_advance", [None])
    launch_prepared(("random", "advance"), counter.device, resolved.kernel, 1, 1, [counter])
    return counter


def dropout_threshold(p: float) -> int:
    """Element i is kept when the top 24 bits of its Philox word are >= this (probability 1 - p)."""
    return min(round(float(p) * 2**24), 2**24)


def dropout(x: Tensor, p: float, seed: int, counter: Tensor | None = None) -> Tensor:
    """x with each element zeroed with probability ``p`` and the rest scaled by 1 / (1 - p).

    The mask is a pure function of (seed, element index, ``counter``'s value: 0 when None)
    (Philox stream 2, identical on every backend), so the gradient is ``dropout(grad, p, seed,
    counter)``. The counter lives on the device: a captured graph that advances it before the
    forward (``advance_counter``) draws a new mask on each replay, its backward the same one.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"dropout: x must be a Tensor, got {type(x).__name__}")
    refuse_bfloat16("dropout", x.dtype)
    if x.dtype.kind != "f":
        raise TypeError(f"dropout: x must be a floating-point tensor, got dtype {x.dtype}")
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    seed = int(seed) % 2**64
    threshold = dropout_threshold(p)
    scale = 0.0 if threshold >= 2**24 else 1.0 / (1.0 - float(p))
    return dropout_mask(x, seed, threshold, scale, counter)


@backend_op(_TWINS)
def dropout_mask(x: Tensor, seed: int, threshold: int, scale: float, counter: Tensor | None) -> Tensor:
    """``dropout`` of a checked call: element i kept (times ``scale``) when its Philox bits >= ``threshold``."""
    st, ct = storage_ctype(x.dtype), compute_ctype(x.dtype)
    out = Tensor.empty(x.shape, x.dtype, x.device)
    if x.size == 0:
        return out
    if counter is None:
        counter = _ZERO_COUNTERS.get(x.device)
        if counter is None:
            counter = _ZERO_COUNTERS[x.device] = Tensor.zeros((1,), np.int32, x.device)
    source = pragmas([x.dtype]) + PHILOX_SOURCE + _DROPOUT.format(st=st, ct=ct, stream=DROPOUT_STREAM)
    types = [None, None, np.int64, np.uint32, np.uint32, np.uint32, np.float32, None]
    key = ("random", "dropout", st, ct)
    resolved = get_kernel(key, x.device, lambda: source, "netcl_dropout", types)
    local = resolved.max_local
    args = (
        np.int64(x.size),
        np.uint32(seed & 0xFFFFFFFF),
        np.uint32(seed >> 32),
        np.uint32(threshold),
        np.float32(scale),
    )
    launch_prepared(key, x.device, resolved.kernel, round_up(x.size, local), local, [x, out, *args, counter])
    return out
