"""The float32 tensor-core attention kernels (``ops.attention_mma_tf32``, kinds "tf32" and "tf32x3"): values,
and which calls they take.

Values: output, lse and dq/dk/dv against a float64 reference (``test_attention_mma.expected``) for E 64 and
128, causal and not, L != S (L > S causal), GQA, a scale, 3-d inputs, tails past one 64-row block.
Everywhere: the kernels with their PTX instructions replaced by OpenCL C models (``emulate=True``), which
checks all of the kernels' index arithmetic, the permuted P / dS -> A fragment trick included, on PoCL. On
an NVIDIA device with tf32 ``mma.sync``: the real kernels through ``attention_forward`` /
``attention_backward`` at matmul precision "high" and "tf32x3".

Tolerances, per element, relative to the element's sum of absolute terms (``expected``'s bounds):

* "tf32": q, k, v and the upstream gradient are drawn as tf32 numbers, so the reference takes the kernels'
  operands exactly and what differs is the rounding the kernels add: P and dS rounded to tf32 before their
  products (10-bit mantissa, nearest: relative 2**-11 per term), ``D = rowsum(dO * O)`` from the kernel's O
  (2**-11 of its bound), fp32 accumulation and ``ex2.approx`` (about 2**-22). At most three roundings of
  2**-11 reach an element: 2**-8 of its bound holds with a factor 2 to spare (the f16 kernels' bound; their
  roundings are as large).
* "tf32x3": inputs are any float32 numbers. A split product x y = (hi_x + lo_x)(hi_y + lo_y) drops
  lo_x lo_y and lo's own rounding, each at most 2**-22 |x y|, and the fp32 sums add 2**-24 a term: a score
  is off by at most about 2**-20 of ``sigma = scale * sum_e |q_e k_e|``, which is a probability's relative
  error (``ex2.approx`` adds 2**-22); sigma stays below 16 for these unit-normal inputs (checked), so
  2**-14 of the bound holds with a factor 4 to spare.
"""

from __future__ import annotations

import functools
import zlib

import file_modules
import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime.ops import attention as RA
from netcl.runtime.ops import attention_mma_tf32 as T
from netcl.runtime.ops import attention_mma_tf32_source as SRC
from netcl.runtime.ops import gemm_mma
from netcl.runtime.ops.attention_mma_tf32_source import attention_source, local_bytes
from netcl.runtime.ops.precision import matmul_precision, round_tf32

REL = {"tf32": 2.0**-8, "tf32x3": 2.0**-14}
LSE_ATOL = {"tf32": 1e-4, "tf32x3": 1e-5}
SIGMA_MAX = 16.0
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
PRECISION = {"tf32": "high", "tf32x3": "tf32x3"}


_MMA_TESTS = file_modules.load("tests/runtime/test_attention_mma.py", "netcl_attention_mma_tests")
expected = _MMA_TESTS.expected


def _inputs(kind, qs, ks, seed_of):
    """q, k, v, g as float64 arrays of float32 numbers (tf32 numbers for kind "tf32")."""
    rng = np.random.default_rng(zlib.crc32(repr(seed_of).encode()))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (qs, ks, ks, (*qs[:-1], ks[-1]))]
    if kind == "tf32":
        arrays = [round_tf32(a) for a in arrays]
    return tuple(a.astype(np.float64) for a in arrays)


def _sigma(q, k, opts) -> float:
    """max over (query, key) of scale * sum_e |q_e k_e| (the tf32x3 score error's scale)."""
    rep = q.shape[-3] // k.shape[-3] if opts.get("gqa") else 1
    ke = np.repeat(k, rep, axis=-3) if rep > 1 else k
    scale = opts.get("scale") or 1 / np.sqrt(q.shape[-1])
    return float((np.abs(q) @ np.swapaxes(np.abs(ke), -1, -2)).max() * scale)


def _compare(kind, got, want, bounds) -> None:
    for name, x, w, b in zip(("out", "lse", "dq", "dk", "dv"), got, want, bounds, strict=True):
        x = np.asarray(x, np.float64)
        assert x.shape == w.shape, name
        if b is None:
            np.testing.assert_allclose(x, w, atol=LSE_ATOL[kind], rtol=0, err_msg=name)
            continue
        bad = np.abs(x - w) > REL[kind] * b + 1e-7
        assert not bad.any(), f"{kind} {name}: {bad.sum()} elements off, worst {np.abs(x - w).max():.3g}"


def run_case(device, kind, qs, ks, opts, emulate):
    """Forward and backward of one case through the tf32 variant (``emulate``: the PTX models)."""
    q, k, v, g = _inputs(kind, qs, ks, (qs, ks, opts, kind))
    while kind == "tf32x3" and _sigma(q, k, opts) >= SIGMA_MAX:  # a large scale: halve q (exactly) until the
        q = q * 0.5  # tolerance's premise holds
    tensors = [nc.Tensor.from_host(device, a, F32) for a in (q, k, v)]
    spec = RA.check_attention(*tensors, None, 0.0, opts.get("causal", False), opts.get("scale"), opts.get("gqa", False))
    gt = nc.Tensor.from_host(device, g, F32)
    if emulate:
        out, lse = T.forward(*tensors, None, spec, 0, None, kind=kind, emulate=True)
        grads = T.backward(gt, *tensors, out, lse, None, spec, 0, None, kind=kind, emulate=True)
    else:
        with matmul_precision(PRECISION[kind]):
            assert RA.select_variant(device, F32, spec).name == "mma-tf32"
            out, lse = RA.attention_forward(*tensors, None, spec)
            grads = RA.attention_backward(gt, *tensors, out, lse, None, spec)
    assert out.dtype == F32 and lse.dtype == F32 and all(x.dtype == F32 for x in grads)
    want, bounds = expected(q, k, v, g, **opts)
    _compare(kind, [t.to_host() for t in (out, lse, *grads)], want, bounds)


#: the f16 kernels' cases (name, q shape, k shape (= v shape), options)
CASES = _MMA_TESTS.CASES
_BY_NAME = {c[0]: c for c in CASES}
#: the emulated kernels are slow to build (PoCL compiles each at its first launch, ~5-45 s of a CI core): a
#: subset; tf32x3 (its own products and plans) at E 64, its E 128 kernels and one-key rows on the GPU only
EMULATED = [("tf32", _BY_NAME[n]) for n in ("plain", "causal L>S", "gqa causal", "scale 3-d", "E128 causal gqa")]
EMULATED += [("tf32x3", _BY_NAME[n]) for n in ("causal", "gqa causal")]


@pytest.mark.parametrize(("kind", "case"), EMULATED, ids=[f"{k}-{c[0]}" for k, c in EMULATED])
def test_emulated_kernels_match_float64(cl_device, kind, case) -> None:
    _, qs, ks, opts = case
    run_case(cl_device, kind, qs, ks, opts, emulate=True)


@pytest.mark.parametrize("kind", ["tf32", "tf32x3"])
def test_emulated_forward_with_two_row_tiles_a_warp(cl_device, monkeypatch, kind) -> None:
    """The forward's ``Plan.mt`` 2 (128 query rows a work-group; the default plans use 1)."""
    monkeypatch.setitem(SRC.PLANS, ("fwd", 64), SRC.Plan(16, 2, mt=2))
    _, qs, ks, opts = _BY_NAME["causal L>S"]
    run_case(cl_device, kind, qs, ks, opts, emulate=True)


def packed_case(device, kind, batch, length, heads, e, causal, emulate):
    """Self-attention on one packed (B, L, 3 * H * E) tensor (``packed_kernels``, the GPT block's path):
    against float64 within the kind's bound, and bit for bit the per-head kernels."""
    q, k, v, g = _inputs(kind, (batch, heads, length, e), (batch, heads, length, e), (batch, length, heads, e, kind))
    while kind == "tf32x3" and _sigma(q, k, {}) >= SIGMA_MAX:
        q = q * 0.5
    if emulate:
        runs = _MMA_TESTS.emulated_runs(
            T.packed_kernels(kind, emulate=True),
            functools.partial(T.forward, kind=kind, emulate=True),
            functools.partial(T.backward, kind=kind, emulate=True),
        )
        got = _MMA_TESTS.packed_and_per_head(device, F32, (q, k, v, g), causal, *runs)
    else:
        with matmul_precision(PRECISION[kind]):
            got = _MMA_TESTS.packed_and_per_head(
                device, F32, (q, k, v, g), causal, *_MMA_TESTS.dispatched_runs(T.VARIANT.packed)
            )
    want, bounds = expected(q, k, v, g, causal=causal)
    _compare(kind, got, want, bounds)


#: (kind, batch, length, heads, E, causal): tails past a 64-row block, several heads and batches
PACKED_CASES = [("tf32", 2, 70, 3, 64, False), ("tf32", 1, 90, 2, 128, True), ("tf32x3", 2, 40, 2, 64, True)]


@pytest.mark.parametrize("case", PACKED_CASES, ids=[f"{c[0]}-E{c[4]}{'-causal' if c[5] else ''}" for c in PACKED_CASES])
def test_emulated_packed_kernels_match_float64_and_the_per_head_kernels(cl_device, case) -> None:
    packed_case(cl_device, *case, emulate=True)


@pytest.fixture
def tensor_cores(cl_device, monkeypatch) -> nc.Device:
    if not (gemm_mma.enabled(cl_device, "tf32") and gemm_mma.enabled(cl_device, "tf32x3")):
        pytest.skip("needs an NVIDIA device with tf32 mma.sync")
    monkeypatch.delenv("NETCL_ATTENTION", raising=False)
    return cl_device


@pytest.mark.parametrize("kind", ["tf32", "tf32x3"])
@pytest.mark.parametrize(("name", "qs", "ks", "opts"), CASES, ids=[c[0] for c in CASES])
def test_tensor_cores_match_float64(tensor_cores, kind, name, qs, ks, opts) -> None:
    run_case(tensor_cores, kind, qs, ks, opts, emulate=False)


@pytest.mark.parametrize("case", PACKED_CASES, ids=[f"{c[0]}-E{c[4]}{'-causal' if c[5] else ''}" for c in PACKED_CASES])
def test_tensor_cores_packed_match_float64_and_the_per_head_kernels(tensor_cores, case) -> None:
    packed_case(tensor_cores, *case, emulate=False)


def one_key_case(device, kind, emulate):
    """With one key every probability is exactly 1, so each output row is V's row as the kind multiplies it:
    tf32 rounds it (nearest, ties away: ``round_tf32`` bit for bit, not truncation), tf32x3 keeps hi + lo
    (within 2**-21 relative of V, about 2**10 times closer than tf32's rounding)."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2, 5, 64), (1, 2, 1, 64), (1, 2, 1, 64)))
    tensors = [nc.Tensor.from_host(device, a, F32) for a in (q, k, v)]
    spec = RA.check_attention(*tensors, None, 0.0, False)
    if emulate:
        out = T.forward(*tensors, None, spec, 0, None, kind=kind, emulate=True)[0].to_host()
    else:
        with matmul_precision(PRECISION[kind]):
            out = RA.attention_forward(*tensors, None, spec)[0].to_host()
    rows = np.broadcast_to(v, out.shape)
    if kind == "tf32":
        assert not np.array_equal(round_tf32(v), v)  # the rounding is visible
        np.testing.assert_array_equal(out, np.broadcast_to(round_tf32(v), out.shape))
    else:
        assert np.all(np.abs(out - rows) <= 2.0**-21 * np.abs(rows))


def test_emulated_one_key_rows_are_v_as_tf32_multiplies_it(cl_device) -> None:
    one_key_case(cl_device, "tf32", emulate=True)


@pytest.mark.parametrize("kind", ["tf32", "tf32x3"])
def test_tensor_cores_one_key_rows_are_v_as_the_kind_multiplies_it(tensor_cores, kind) -> None:
    one_key_case(tensor_cores, kind, emulate=False)


# ---- which calls the kernels take, bad inputs ---------------------------------------------------------------
#: a (2, 4, 8, e) float32 call's spec, the f16 kernels' tests' helper
_spec = _MMA_TESTS._spec


def test_calls_it_takes() -> None:
    mask = nc.Tensor.empty((8, 8), np.bool_, "cpu")
    for precision, kind in (("high", "tf32"), ("tf32x3", "tf32x3"), ("highest", T.HIGHEST)):
        with matmul_precision(precision):
            assert T.kind_for(precision) == kind
            assert T.takes(F32, _spec()) == (kind is not None)
            assert not T.takes(F16, _spec()) and not T.takes(np.dtype(np.float64), _spec())
    for precision in ("medium", "fp16"):
        with matmul_precision(precision):
            assert not T.takes(F32, _spec())
    with matmul_precision("high"):
        assert T.takes(F32, _spec(e=128, ev=128, causal=True))
        for spec in (_spec(e=32, ev=32), _spec(ev=128), _spec(mask=mask), _spec(dropout=0.1)):
            assert not T.takes(F32, spec)


@pytest.mark.parametrize("choice", ["blocked", "quad", "portable"])
def test_netcl_attention_naming_another_variant_turns_them_off(cl_device, monkeypatch, choice) -> None:
    monkeypatch.setenv("NETCL_ATTENTION", choice)
    with matmul_precision("high"):
        assert RA.select_variant(cl_device, F32, _spec()).name != "mma-tf32"


def test_not_selected_without_tensor_cores(cl_device, monkeypatch) -> None:
    if gemm_mma.enabled(cl_device, "tf32"):
        pytest.skip("a device with tf32 mma.sync")
    monkeypatch.delenv("NETCL_ATTENTION", raising=False)
    for precision in ("high", "tf32x3", "highest"):
        with matmul_precision(precision):
            assert RA.select_variant(cl_device, F32, _spec()).name != "mma-tf32"


def test_bad_inputs_raise_before_any_launch(cl_device, launch_counter) -> None:
    x = nc.Tensor.zeros((1, 1, 8, 64), F32, cl_device)
    spec = RA.check_attention(x, x, x, None, 0.0, False)
    h = nc.Tensor.zeros((1, 1, 8, 64), np.float64, cl_device)
    with launch_counter(cl_device.queue) as launches:
        with pytest.raises(TypeError, match="float32 tensors only, got float64"):
            T.forward(h, x, x, None, spec, 0, None, kind="tf32")
        with pytest.raises(TypeError, match="float32 tensors only, got float64"):
            T.backward(x, x, x, x, h, x, None, spec, 0, None, kind="tf32")
        with pytest.raises(ValueError, match="kind must be one of"):
            T.forward(x, x, x, None, spec, 0, None, kind="fp16")
        with matmul_precision("medium"), pytest.raises(ValueError, match="kind must be one of"):
            T.forward(x, x, x, None, spec, 0, None)
    assert launches.names == []
    with pytest.raises(ValueError, match="kind must be one of"):
        attention_source("fwd", 64, False, "bf16", "int")


@pytest.mark.parametrize("e", T.FEATURES)
def test_local_memory_within_nvidias_48_kb(e) -> None:
    for kernel in ("fwd", "bwd_q", "bwd_kv"):
        for kind in ("tf32", "tf32x3"):
            assert local_bytes(kernel, e, kind) <= 48 * 1024
