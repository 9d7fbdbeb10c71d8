"""bfloat16 tensors (ml_dtypes' dtype): storage-only on every OpenCL device (PoCL here), computed in
float32 by the NumPy backend; both round on store exactly as ml_dtypes converts float32 to bfloat16.

Conversions and moves are checked bit for bit against ml_dtypes (all 65536 bfloat16 patterns, random
float32 bits, ties, subnormals, inf, NaN); elementwise ops bit for bit against float32 arithmetic of
the same values rounded once by ml_dtypes; reductions, row kernels and matrix products against
float64 results of the same bfloat16 values, within one bfloat16 rounding (relative 2**-8: 8
significant bits, round to nearest) plus the float32 accumulation error (K * 2**-24 of sum |terms|).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
from netcl.runtime import ops as R

#: NumPy warns when it casts NaN between bfloat16 and other floats (the NaNs are part of what is checked)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")

BF16 = np.dtype(ml_dtypes.bfloat16)
#: unit roundoff of bfloat16 (8 significant bits, round to nearest even) and of float32
U_BF16, U_F32 = 2.0**-8, 2.0**-24


def _bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).view(np.uint16)


def _same_bits(got: nc.Tensor, expected: np.ndarray) -> None:
    """``got`` holds exactly ``expected`` (bfloat16); where ``expected`` is ml_dtypes' quiet NaN
    (sign | 0x7fc0), that NaN of either sign. ml_dtypes keeps the sign of the NaN it rounds, and so
    does the store, but the float32 NaN it is given may already have lost it: NVIDIA's half -> float
    conversion and its arithmetic make positive NaNs where x86 makes negative ones (IEEE 754 leaves
    the sign of a NaN result unspecified)."""
    host = got.to_host()
    assert host.dtype == BF16 and host.shape == expected.shape
    got_bits, want = _bits(host), _bits(np.ascontiguousarray(expected, dtype=BF16))
    flipped = (got_bits == want ^ 0x8000) & ((want & 0x7FFF) == 0x7FC0)  # the quiet NaN, other sign
    np.testing.assert_array_equal(np.where(flipped, want, got_bits), want)


def _near(got: nc.Tensor, reference: np.ndarray, terms: int = 1, scale: np.ndarray | None = None) -> None:
    """``got`` (bfloat16) within one bfloat16 rounding of the float64 ``reference`` after a float32
    computation over ``terms`` terms whose absolute values sum to ``scale`` (default |reference|)."""
    host = got.to_host()
    assert host.dtype == BF16
    scale = np.abs(reference) if scale is None else scale
    acc = terms * U_F32 * scale
    bound = U_BF16 * (np.abs(reference) + acc) + acc + 1e-38
    err = np.abs(host.astype(np.float64) - reference)
    assert np.all(err <= bound), float((err - bound).max())


def _all_patterns() -> np.ndarray:
    return np.arange(2**16, dtype=np.uint16).view(BF16)


def _delicate_float32() -> np.ndarray:
    """float32 values whose bfloat16 rounding is delicate: exact ties of both parities, one ulp
    either side of a tie, the largest finite values (overflow to inf), subnormals, signed zeros,
    infinities, quiet and signaling NaNs of both signs, and random bit patterns."""
    rng = np.random.default_rng(11)
    high = rng.integers(0, 2**16, 4000, dtype=np.uint32) << 16
    ties = np.concatenate([high | 0x8000, high | 0x7FFF, high | 0x8001, high | 0x0001, high | 0xFFFF])
    special = np.array(
        [0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x80000000,
         0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345, 0x7FBFFFFF],
        np.uint32,
    )  # fmt: skip
    random_bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([ties, special, random_bits]).view(np.float32)


# ---- storage: round trips, conversions, moves ---------------------------------------------------------
def test_bfloat16_round_trips_every_pattern(device):
    assert nc.bfloat16 == BF16 and device.supports(nc.bfloat16)
    host = _all_patterns()
    t = nc.tensor(host, device=device)
    assert t.dtype == BF16
    _same_bits(t, host)
    _same_bits(R.copy(t), host)
    _same_bits(R.cast(t, nc.bfloat16), host)
    np.testing.assert_array_equal(_bits(t.numpy()), _bits(host))


def test_casts_between_bfloat16_and_float32_match_ml_dtypes(device):
    patterns = _all_patterns()
    wide = R.cast(nc.tensor(patterns, device=device), nc.float32).to_host()
    np.testing.assert_array_equal(wide.view(np.uint32), patterns.astype(np.float32).view(np.uint32))  # exact
    values = np.concatenate([_delicate_float32(), patterns.astype(np.float32)])
    _same_bits(R.cast(nc.tensor(values, device=device), nc.bfloat16), values.astype(BF16))


def test_casts_from_every_dtype_round_like_ml_dtypes(device):
    ints = np.array([0, 1, -7, 255, 257, 32769, 2**24 + 1, -(2**31), 2**31 - 1], np.int64)
    _same_bits(R.cast(nc.tensor(ints.astype(np.int32), device=device), nc.bfloat16), ints.astype(np.int32).astype(BF16))
    _same_bits(R.cast(nc.tensor(ints, dtype=nc.int64, device=device), nc.bfloat16), ints.astype(BF16))
    _same_bits(
        R.cast(nc.tensor(np.arange(256, dtype=np.uint8), device=device), nc.bfloat16), np.arange(256).astype(BF16)
    )
    flags = np.array([True, False, True])
    _same_bits(R.cast(nc.tensor(flags, device=device), nc.bfloat16), flags.astype(BF16))
    halves = np.arange(2**16, dtype=np.uint16).view(np.float16)  # float16 -> bfloat16: one rounding of the value
    _same_bits(R.cast(nc.tensor(halves, device=device), nc.bfloat16), halves.astype(BF16))
    if device.supports(nc.float64):  # ml_dtypes rounds float64 through float32: 1 + 2**-8 + 2**-40 -> 1
        doubles = np.array([1 + 2**-8 + 2**-40, 1 + 2**-8, 3.3e38, 3.4e38, 1e-300, -0.0, np.nan, np.inf], np.float64)
        _same_bits(R.cast(nc.tensor(doubles, dtype=nc.float64, device=device), nc.bfloat16), doubles.astype(BF16))


def test_casts_from_bfloat16_to_every_dtype(device):
    patterns = _all_patterns()
    finite = patterns[np.isfinite(patterns.astype(np.float32))]
    if device.supports(nc.float64):
        got = R.cast(nc.tensor(patterns, device=device), nc.float64).to_host()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(patterns.astype(np.float64)))
        np.testing.assert_array_equal(got[~np.isnan(got)], patterns.astype(np.float64)[~np.isnan(got)])
    halves = R.cast(nc.tensor(finite, device=device), nc.float16).to_host()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(
            halves.view(np.uint16), finite.astype(np.float32).astype(np.float16).view(np.uint16)
        )
    small = np.array([0.0, 1.0, 2.75, -0.5, 255.0, 17.5, 1e-30], BF16)  # in range of every integer target
    for dtype in (nc.int32, nc.int64, nc.uint8, nc.bool_):
        source = np.abs(small.astype(np.float32)).astype(BF16) if dtype == nc.uint8 else small
        expected = source.astype(np.float32).astype(dtype)
        np.testing.assert_array_equal(R.cast(nc.tensor(source, device=device), dtype).to_host(), expected)


def test_bfloat16_moves_keep_every_bit(device):
    """Transposes (tiled swap and gather), slices, narrow, concat, pad, flip, broadcast and fills."""
    host = _all_patterns()[: 3 * 5 * 8].reshape(3, 5, 8)  # NaNs and infinities of both signs included
    t = nc.tensor(host, device=device)
    cases = [
        (R.transpose(t, (0, 2, 1)), host.transpose(0, 2, 1)),
        (R.transpose(t, (2, 0, 1)), host.transpose(2, 0, 1)),
        (R.getitem(t, (slice(None), 1)), host[:, 1]),
        (R.narrow(t, 2, 1, 3), host[:, :, 1:4]),
        (R.concat([t, t], axis=1), np.concatenate([host, host], 1)),
        (R.flip(t, 1), host[:, ::-1]),
        (R.broadcast_to(R.narrow(t, 1, 0, 1), (2, 3, 4, 8)), np.broadcast_to(host[:, :1], (2, 3, 4, 8))),
        (R.zeros_like(t), np.zeros_like(host)),
    ]
    for got, expected in cases:
        _same_bits(got, expected)
    _same_bits(R.pad(t, (1, 2), value=1 / 3), np.pad(host, ((0, 0), (0, 0), (1, 2)), constant_values=BF16.type(1 / 3)))
    _same_bits(R.full((2, 3), 1 / 3, nc.bfloat16, device), np.full((2, 3), 1 / 3).astype(BF16))  # rounded once


# ---- arithmetic: elementwise, reductions, row kernels, products -------------------------------------
def _operands(seed: int, *shapes: tuple[int, ...], low: float = -4.0, high: float = 4.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(low, high, s).astype(BF16) for s in shapes]


def test_bfloat16_elementwise_ops_round_like_ml_dtypes(device):
    """float32 arithmetic of the bfloat16 values, rounded once (ml_dtypes' astype): bit for bit,
    broadcasts and specials included; a Python scalar is a float32 operand; exp and tanh (float32
    libraries may differ in the last float32 bit) within one bfloat16 step. Mixed: float32 wins."""
    a, b = _operands(3, (6, 8), (8,))
    a.reshape(-1)[:6] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38], np.float32).astype(BF16)
    ta, tb = nc.tensor(a, device=device), nc.tensor(b, device=device)
    x, y = a.astype(np.float32), b.astype(np.float32)
    with np.errstate(all="ignore"):
        exact = [
            (R.add(ta, tb), x + y),
            (R.sub(ta, tb), x - y),
            (R.mul(ta, tb), x * y),
            (R.div(ta, tb), x / y),
            (R.mul(ta, 0.3), x * np.float32(0.3)),
            (R.maximum(ta, tb), np.where((x > y) | np.isnan(x), x, y)),
            (R.relu(ta), np.where((x > 0) | np.isnan(x), x, np.float32(0))),
            (R.neg(ta), -x),
            (R.abs(ta), np.abs(x)),
            (R.where(R.gt(ta, 0.0), ta, tb), np.where(x > 0, x, y)),
        ]
        close = [(R.exp(ta), np.exp(a.astype(np.float64))), (R.tanh(ta), np.tanh(a.astype(np.float64)))]
    for got, expected in exact:
        _same_bits(got, expected.astype(BF16))
    for got, expected in close:
        host = got.to_host().astype(np.float64)
        np.testing.assert_array_equal(np.isnan(host), np.isnan(expected))
        finite = np.isfinite(expected) & (np.abs(expected) < 3e38)
        assert np.all(np.abs(host[finite] - expected[finite]) <= 2 * U_BF16 * np.abs(expected[finite]))
    mixed = R.add(ta, nc.tensor(y, device=device))
    assert mixed.dtype == nc.float32
    np.testing.assert_array_equal(mixed.to_host(), x + y)
    assert R.add(ta, R.cast(tb, nc.float16)).dtype == nc.float32  # as torch: bfloat16 + float16 -> float32
    assert R.add(ta, nc.tensor(np.ones(8, np.int32), device=device)).dtype == BF16


def test_bfloat16_reductions_accumulate_in_float32(device):
    """sum, mean (float32 partials over a long axis in several stages, an addend) within one
    bfloat16 rounding of float64; max and min exactly NumPy's."""
    (x,) = _operands(4, (6, 5000), low=-2.0, high=2.0)
    t, wide = nc.tensor(x, device=device), x.astype(np.float64)
    _near(R.sum(t, axis=1), wide.sum(1), 5000, np.abs(wide).sum(1))
    _near(R.sum(t), wide.sum(), 30000, np.abs(wide).sum())
    _near(R.mean(t, axis=0, keepdims=True), wide.mean(0, keepdims=True), 6, np.abs(wide).mean(0, keepdims=True))
    first = R.sum(t, axis=1)
    _near(
        R.sum(t, axis=1, addend=first), wide.sum(1) + first.to_host().astype(np.float64), 5001, 2 * np.abs(wide).sum(1)
    )
    _same_bits(R.max(t, axis=1), x.astype(np.float32).max(1).astype(BF16))
    _same_bits(R.min(t, axis=0), x.astype(np.float32).min(0).astype(BF16))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_bfloat16_row_kernels_match_float64(device):
    """softmax, log_softmax and layer_norm of bfloat16 rows: float32 inside, one rounding on store."""
    x, w, b = _operands(5, (7, 300), (300,), (300,))
    tx = nc.tensor(x, device=device)
    xd = x.astype(np.float64)
    _near(R.softmax(tx, -1), _softmax(xd), 300 * 8, np.ones((7, 1)))
    log = np.log(_softmax(xd))
    _near(R.log_softmax(tx, -1), log, 300 * 8, np.abs(xd).max() + 1)
    mu, var = xd.mean(-1, keepdims=True), xd.var(-1, keepdims=True)
    norm = (xd - mu) / np.sqrt(var + 1e-5)
    ref = norm * w.astype(np.float64) + b.astype(np.float64)
    got = R.layer_norm(tx, (300,), nc.tensor(w, device=device), nc.tensor(b, device=device))
    _near(got, ref, 300 * 8, np.abs(norm * w.astype(np.float64)) + np.abs(b.astype(np.float64)) + 1)


@pytest.mark.parametrize(("trans_a", "trans_b"), [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize(("m", "k", "n"), [(33, 17, 9), (2056, 64, 1032)], ids=["odd", "big"])
def test_bfloat16_matmul_matches_float64(device, trans_a, trans_b, m, k, n):
    """bfloat16 x bfloat16: products exact in float32 (8 x 8 significant bits), float32 sums: the
    float32 result within K float32 additions of float64; the bfloat16 one is that sum rounded once
    (bit for bit; on NVIDIA the bf16 tensor-core kernel, the big shape its tiles). Mixed: float32."""
    a, b = _operands(6, (k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n), low=-1.0, high=1.0)
    ta, tb = nc.tensor(a, device=device), nc.tensor(b, device=device)
    x, y = (a.T if trans_a else a).astype(np.float64), (b.T if trans_b else b).astype(np.float64)
    reference, scale = x @ y, np.abs(x) @ np.abs(y)
    wide = R.matmul(ta, tb, transpose_a=trans_a, transpose_b=trans_b, out_dtype=nc.float32)
    assert wide.dtype == nc.float32
    assert np.all(np.abs(wide.to_host() - reference) <= k * U_F32 * scale + 1e-30)
    narrow = R.matmul(ta, tb, transpose_a=trans_a, transpose_b=trans_b)
    assert narrow.dtype == BF16
    _same_bits(narrow, wide.to_host().astype(BF16))
    mixed = R.matmul(ta, R.cast(tb, nc.float32), transpose_a=trans_a, transpose_b=trans_b)
    assert mixed.dtype == nc.float32
    assert np.all(np.abs(mixed.to_host() - reference) <= k * U_F32 * scale + 1e-30)


def test_bfloat16_operands_take_the_bf16_tensor_cores(cl_device):
    """On an NVIDIA device whose bf16 ``mma`` passed its probe, two bfloat16 tensors multiply there
    (their words as stored), as float32 ones rounded to bf16 at precision "medium" do: both within
    float32 accumulation of the float64 product of the bfloat16 values."""
    from netcl.runtime.ops import gemm_mma

    if not gemm_mma.enabled(cl_device, "bf16"):
        pytest.skip(f"no bf16 tensor cores on {cl_device.name}: the portable kernel (test above)")
    assert gemm_mma.mode_for(cl_device, BF16, BF16, "highest") == "bf16"
    a, b = _operands(10, (300, 200), (200, 260), low=-1.0, high=1.0)
    x, y = a.astype(np.float64), b.astype(np.float64)
    ta, tb = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
    bound = 200 * U_F32 * (np.abs(x) @ np.abs(y)) + 1e-30
    words = R.matmul(ta, tb, out_dtype=nc.float32).to_host()
    rounded = R.matmul(R.cast(ta, nc.float32), R.cast(tb, nc.float32), precision="medium").to_host()
    assert np.all(np.abs(words - x @ y) <= bound) and np.all(np.abs(rounded - x @ y) <= bound)


# ---- autograd, autocast, refusals -------------------------------------------------------------------
def test_bfloat16_gradients_are_bfloat16(device):
    """Gradients of bfloat16 leaves are bfloat16 (as torch), each within bfloat16 roundings of the
    float64 gradient of the same values: a linear layer with cross-entropy and a layer norm."""
    x, w = _operands(7, (4, 16), (16, 5), low=-1.0, high=1.0)
    labels = np.array([0, 3, 4, 1], np.int32)
    xn = ag.tensor(x, requires_grad=True, device=device)
    wn = ag.tensor(w, requires_grad=True, device=device)
    logits = ag.matmul(ag.layer_norm(xn, (16,)), wn)
    loss = ag.cross_entropy(logits, ag.tensor(labels, device=device))
    loss.backward()
    assert logits.dtype == BF16 and xn.grad.dtype == BF16 and wn.grad.dtype == BF16
    xd, wd = x.astype(np.float64), w.astype(np.float64)
    norm = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5)
    p = _softmax(norm @ wd)
    assert abs(float(loss.value.to_host()) - -np.log(p[np.arange(4), labels]).mean()) <= 4 * U_BF16 * 3
    g = p.copy()
    g[np.arange(4), labels] -= 1
    g /= 4
    grad_w = norm.T @ g  # every intermediate (norm, logits, g) is rounded to bfloat16 once: a few roundings
    assert np.all(np.abs(wn.grad.to_host().astype(np.float64) - grad_w) <= 8 * U_BF16 * (np.abs(norm.T) @ np.abs(g)))


def test_autocast_bfloat16_multiplies_bfloat16_operands(device):
    """``autocast(dtype=bfloat16)``: matmul of float32 tensors with operands rounded to bfloat16,
    float32 result and gradients: float32 sums of exact bfloat16 products."""
    import netcl.amp as amp

    (x, w) = (np.random.default_rng(8).uniform(-1, 1, s).astype(np.float32) for s in ((16, 32), (32, 8)))
    xn = ag.tensor(x, requires_grad=True, device=device)
    with amp.autocast(dtype=nc.bfloat16):
        out = ag.matmul(xn, ag.tensor(w, device=device))
        loss = ag.sum(out)
    loss.backward()
    assert out.dtype == nc.float32 and xn.grad.dtype == nc.float32
    xb, wb = x.astype(BF16).astype(np.float64), w.astype(BF16).astype(np.float64)
    scale = np.abs(xb) @ np.abs(wb)
    assert np.all(np.abs(out.to_host() - xb @ wb) <= 32 * U_F32 * scale)
    assert np.abs(out.to_host() - x.astype(np.float64) @ w).max() > 1e-3  # the operands really were rounded


def test_unsupported_bfloat16_ops_say_so(device):
    """An op outside the storage-only list raises a DTypeError naming it and bfloat16, launching nothing."""
    h = nc.tensor(np.ones((1, 2, 4, 4), BF16), device=device)
    from netcl.runtime.ops import amp_kernels, clip_kernels

    scale, found = nc.tensor(np.ones((), np.float32), device=device), nc.tensor(np.zeros((), np.int32), device=device)
    for name, op in (
        ("cumsum", lambda: R.cumsum(h, 1)),
        ("max_pool2d", lambda: R.max_pool2d(h, 2)),
        ("grad_norm_clip_", lambda: clip_kernels.grad_norm_clip_([h], 1.0, 2.0)),
        ("unscale_by_", lambda: amp_kernels.unscale_by_(h, scale, found)),
        ("unscale_many_", lambda: amp_kernels.unscale_many_([h], scale, found)),
    ):
        with pytest.raises(nc.DTypeError, match=re.escape(f"{name}: bfloat16 tensors are not supported")):
            op()
    if device.kind == "opencl":  # the NumPy backend computes a bfloat16 convolution in float32
        for implicit in (True, False):
            with pytest.raises(nc.DTypeError, match=re.escape("conv2d: bfloat16 tensors are not supported")):
                R.conv2d(h, nc.tensor(np.ones((3, 2, 3, 3), BF16), device=device), implicit=implicit)
    _same_bits(h, np.ones((1, 2, 4, 4), BF16))  # untouched, still usable


def test_jit_compiled_bfloat16_chain_rounds_per_op(device):
    """A ``jit_compile``d function of bfloat16 tensors (its steps run the eager kernels: the fused
    kernels are float32-only) rounds after every op, as eager code does: bit for bit."""
    a, b = _operands(9, (8, 16), (8, 16))

    @ag.jit_compile
    def step(x, y):
        return ag.relu(ag.mul(ag.add(x, y), x))

    ta, tb = nc.tensor(a, device=device), nc.tensor(b, device=device)
    x, y = a.astype(np.float32), b.astype(np.float32)
    total = (x + y).astype(BF16).astype(np.float32)
    expected = np.maximum((total * x).astype(BF16).astype(np.float32), 0).astype(BF16)
    for _ in range(2):  # the traced call, then the compiled one
        out = step(ta, tb)
        _same_bits(out.value if hasattr(out, "value") else out, expected)
