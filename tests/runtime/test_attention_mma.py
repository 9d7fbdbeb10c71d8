"""The tensor-core attention kernels (``ops.attention_mma``): values, and which calls they take.

Values: output, lse and dq/dk/dv against a float64 reference of the same f16-rounded operands (q, k, v and
the upstream gradient are drawn as float16 numbers), for E 64 and 128, causal and not, L != S (L < S and
L > S causal), GQA, a scale, 3-d inputs, tails past one 64-row block. Everywhere: the kernels with their
PTX instructions replaced by OpenCL C models (``emulate=True``), which checks all of the kernels' index
arithmetic on PoCL. On an NVIDIA device with ``mma.sync``: the real kernels, float16 tensors and float32
at matmul precision "fp16", through ``attention_forward`` / ``attention_backward``, and autocast; bfloat16
tensors and float32 at "medium" (``autocast(dtype=bfloat16)``) on the bf16 ``mma``. bf16 products round P
and dS to 8 significant bits (2**-8 a rounding), hence ``REL_BF16``; their inputs are drawn as bfloat16.

Tolerance, per element: the reference takes the kernels' operands exactly, so what differs is the rounding
the kernels add: P rounded to f16 before ``P V`` (relative 2**-11 per term), dS rounded to f16 (2**-11 per
term), ``D = rowsum(dO * O)`` from the kernel's O (2**-11 of ``rowsum(|dO| (P |V|))``), the float16
output (2**-11), and fp32 accumulation and ``ex2.approx`` (about 2**-22). Each result element is a sum of
terms whose absolute values sum to a bound computed from the reference (``P |V|`` for the output,
``P^T |dO|`` for dV, ``scale |P (|dP| + rowsum(|dO| P|V|))| |K|`` for dQ, likewise dK); at most three
roundings of 2**-11 reach an element, so 2**-8 of its bound holds with a factor 2 to spare. lse: fp32
sums of E exact products and ``ex2.approx``: 1e-4 absolute.
"""

from __future__ import annotations

import functools
import zlib

import file_modules
import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime.ops import attention as RA
from netcl.runtime.ops import attention_mma as M
from netcl.runtime.ops import attention_mma_tf32, gemm_mma
from netcl.runtime.ops.attention_mma_source import local_bytes
from netcl.runtime.ops.precision import matmul_precision

REL = 2.0**-8
#: bf16 products: P, dS (and a bfloat16 output) rounded to 8 significant bits, 2**-8 each: three roundings
#: reach an element, so 2**-5 of its bound holds with a factor 2.7 to spare
REL_BF16 = 2.0**-5
LSE_ATOL = 1e-4
F16, F32, BF16 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(nc.bfloat16)


_REF = file_modules.load("tests/autograd/test_attention.py", "netcl_attention_reference")


def _fold(x, rep, shape):
    """Sum the ``rep`` q heads of each kv head (GQA) back to the kv ``shape``."""
    if rep == 1:
        return x
    return x.reshape((*shape[:-3], shape[-3], rep, *shape[-2:])).sum(axis=-3)


def expected(q, k, v, g, causal=False, scale=None, gqa=False):
    """(values, bounds): float64 out, lse, dq, dk, dv and each one's sum of absolute terms (see the docstring)."""
    kw = {"causal": causal, "scale": scale, "gqa": gqa}
    out = _REF.reference(q, k, v, **kw)
    grads = _REF.reference_grads(g, q, k, v, **kw)
    ke, ve, rep = _REF._expand_kv(q, k, v, gqa)
    sc = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(ke, -1, -2) * sc
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    top = s.max(axis=-1)
    lse = top + np.log(np.exp(s - top[..., None]).sum(axis=-1))
    p = _REF._probs(q, ke, None, causal, sc, None)[0]
    out_b = p @ np.abs(ve)
    dp = g @ np.swapaxes(ve, -1, -2)
    dsb = p * (np.abs(dp) + (np.abs(g) * out_b).sum(axis=-1, keepdims=True))
    dq_b = sc * dsb @ np.abs(ke)
    dk_b = _fold(sc * np.swapaxes(dsb, -1, -2) @ np.abs(q), rep, k.shape)
    dv_b = _fold(np.swapaxes(p, -1, -2) @ np.abs(g), rep, v.shape)
    return (out, lse, *grads), (out_b, None, dq_b, dk_b, dv_b)


def _inputs(qs, ks, seed_of, numbers=F16):
    """q, k, v and the upstream gradient: standard normal draws that are ``numbers`` (float16 or bfloat16)."""
    rng = np.random.default_rng(zlib.crc32(repr(seed_of).encode()))
    q, k, v = (rng.standard_normal(s).astype(numbers).astype(np.float64) for s in (qs, ks, ks))
    g = rng.standard_normal((*qs[:-1], ks[-1])).astype(numbers).astype(np.float64)
    return q, k, v, g


def _compare(got, want, bounds, rel=REL) -> None:
    for name, x, w, b in zip(("out", "lse", "dq", "dk", "dv"), got, want, bounds, strict=True):
        x = np.asarray(x, np.float64)
        assert x.shape == w.shape, name
        if b is None:
            np.testing.assert_allclose(x, w, atol=LSE_ATOL, rtol=0, err_msg=name)
            continue
        bad = np.abs(x - w) > rel * b + 1e-6
        assert not bad.any(), f"{name}: {bad.sum()} elements off, worst {np.abs(x - w).max():.3g}"


def run_case(device, dtype, qs, ks, opts, emulate):
    """Forward and backward of one case through the mma variant (``emulate``: the PTX models); bf16 products
    for bfloat16 tensors and float32 at matmul precision "medium", f16 otherwise."""
    bf16 = M.kind(dtype) == "bf16"
    q, k, v, g = _inputs(qs, ks, (qs, ks, opts), BF16 if bf16 else F16)
    tensors = [nc.Tensor.from_host(device, a, dtype) for a in (q, k, v)]
    spec = RA.check_attention(*tensors, None, 0.0, opts.get("causal", False), opts.get("scale"), opts.get("gqa", False))
    gt = nc.Tensor.from_host(device, g, dtype)
    if emulate:
        out, lse = M.forward(*tensors, None, spec, 0, None, emulate=True)
        grads = M.backward(gt, *tensors, out, lse, None, spec, 0, None, emulate=True)
    else:
        assert RA.select_variant(device, dtype, spec).name == "mma"
        out, lse = RA.attention_forward(*tensors, None, spec)
        grads = RA.attention_backward(gt, *tensors, out, lse, None, spec)
    assert out.dtype == dtype and lse.dtype == F32 and all(x.dtype == dtype for x in grads)
    want, bounds = expected(q, k, v, g, **opts)
    _compare([t.to_host() for t in (out, lse, *grads)], want, bounds, REL_BF16 if bf16 else REL)


# (name, q shape, k shape (= v shape), options)
CASES = [
    ("plain", (2, 2, 70, 64), (2, 2, 45, 64), {}),
    ("causal", (1, 2, 130, 64), (1, 2, 130, 64), {"causal": True}),
    ("causal L<S", (1, 1, 20, 64), (1, 1, 150, 64), {"causal": True}),
    ("causal L>S", (1, 2, 150, 64), (1, 2, 19, 64), {"causal": True}),
    ("gqa causal", (1, 4, 100, 64), (1, 2, 100, 64), {"gqa": True, "causal": True}),
    ("scale 3-d", (3, 33, 64), (3, 80, 64), {"scale": 0.3}),
    ("E128", (1, 2, 45, 128), (1, 2, 70, 128), {}),
    ("E128 causal gqa", (1, 4, 90, 128), (1, 1, 90, 128), {"causal": True, "gqa": True}),
]
#: the emulated kernels are slow (a barrier per modelled instruction): a subset, and float16 storage once
EMULATED = [(c, F32) for c in CASES if c[0] in ("plain", "causal L>S", "gqa causal", "E128 causal gqa")]
EMULATED.append((CASES[1], F16))
EMULATED.append((CASES[4], BF16))  # bf16 products (float32 at "medium": the same kernels, on the GPU below)


@pytest.mark.parametrize(("case", "dtype"), EMULATED, ids=[f"{c[0]}-{d}" for c, d in EMULATED])
def test_emulated_kernels_match_float64(cl_device, case, dtype) -> None:
    if dtype == F16:
        try:
            cl_device.check_dtype(F16)
        except nc.DTypeError:
            pytest.skip("no float16 storage on this device")
    _, qs, ks, opts = case
    run_case(cl_device, dtype, qs, ks, opts, emulate=True)


def packed_and_per_head(device, dtype, arrays, causal, packed_run, per_head_run):
    """One self-attention both ways: ``packed_run(packed, g, spec) -> (out, lse, dqkv)`` on the (B, L, 3 * H * E)
    packing of ``arrays`` (q, k, v, g, each (B, H, L, E)) and ``per_head_run(q, k, v, g, spec) -> (out, lse,
    (dq, dk, dv))`` on the planes, in ``dtype``. Asserts they agree bit for bit (the same arithmetic, only the
    addresses differ) and returns the packed results heads first: out, lse, dq, dk, dv (host arrays)."""
    q, k, v, g = arrays
    batch, heads, length, e = q.shape
    qkv = np.concatenate([x.transpose(0, 2, 1, 3).reshape(batch, length, heads * e) for x in (q, k, v)], axis=-1)
    g_merged = g.transpose(0, 2, 1, 3).reshape(batch, length, heads * e)
    packed, gp = (nc.Tensor.from_host(device, a, dtype) for a in (qkv, g_merged))
    spec = RA.check_packed_attention(packed, heads, causal)
    out, lse, dqkv = packed_run(packed, gp, spec)
    out_h, lse_h, grads_h = per_head_run(*(nc.Tensor.from_host(device, a, dtype) for a in arrays), spec)
    assert out.dtype == dtype and dqkv.dtype == dtype and lse.dtype == F32
    heads_first = out.to_host().reshape(batch, length, heads, e).transpose(0, 2, 1, 3)
    grads = dqkv.to_host().reshape(batch, length, 3, heads, e).transpose(2, 0, 3, 1, 4)
    np.testing.assert_array_equal(heads_first, out_h.to_host())
    np.testing.assert_array_equal(lse.to_host(), lse_h.to_host())
    for got, per_head in zip(grads, grads_h, strict=True):
        np.testing.assert_array_equal(got, per_head.to_host())
    return [heads_first, lse.to_host(), *grads]


def dispatched_runs(kernels):
    """(packed_run, per_head_run) of ``packed_and_per_head`` through ``attention``'s dispatch, as the ops run;
    the packed call must take ``kernels`` (a variant's ``PackedKernels``: in place, no copies)."""

    def packed_run(packed, gp, spec):
        assert RA._packed_kernels(packed, spec) is kernels
        out, lse = RA.packed_attention_forward(packed, spec)
        return out, lse, RA.packed_attention_backward(gp, packed, out, lse, spec)

    def per_head_run(q, k, v, g, spec):
        out, lse = RA.attention_forward(q, k, v, None, spec)
        return out, lse, RA.attention_backward(g, q, k, v, out, lse, None, spec)

    return packed_run, per_head_run


def emulated_runs(kernels, forward, backward):
    """(packed_run, per_head_run) of ``packed_and_per_head`` through a variant's emulated ``kernels`` (a
    ``PackedKernels``) and its emulated per-head ``forward`` / ``backward``."""

    def packed_run(packed, gp, spec):
        out, lse = kernels.forward(packed, spec)
        return out, lse, kernels.backward(gp, packed, out, lse, spec)

    def per_head_run(q, k, v, g, spec):
        out, lse = forward(q, k, v, None, spec, 0, None)
        return out, lse, backward(g, q, k, v, out, lse, None, spec, 0, None)

    return packed_run, per_head_run


def packed_case(device, dtype, batch, length, heads, e, causal, emulate):
    """Self-attention on one packed (B, L, 3 * H * E) tensor (``packed_kernels``; the GPT block's path under
    autocast: float32 rounded to the products' kind by one copy): against float64 within the products' bound,
    and bit for bit the per-head kernels."""
    bf16 = M.kind(dtype) == "bf16"
    shape = (batch, heads, length, e)
    arrays = _inputs(shape, shape, ("packed", str(dtype), shape, causal), BF16 if bf16 else F16)
    if emulate:
        runs = emulated_runs(
            M.packed_kernels(emulate=True),
            functools.partial(M.forward, emulate=True),
            functools.partial(M.backward, emulate=True),
        )
    else:
        runs = dispatched_runs(M.VARIANT.packed)
    got = packed_and_per_head(device, dtype, arrays, causal, *runs)
    want, bounds = expected(*arrays, causal=causal)
    _compare(got, want, bounds, REL_BF16 if bf16 else REL)


#: (matmul precision, dtype, batch, length, heads, E, causal): tails past a 64-row block, several heads and
#: batches; float32 at "fp16" / "medium" is autocast's case with float16 / bfloat16 (bfloat16 tensors take no
#: packed attention: ``check_packed_attention`` refuses them)
PACKED_CASES = [
    ("highest", F16, 2, 70, 2, 64, False),
    ("fp16", F32, 1, 90, 2, 128, True),
    ("medium", F32, 2, 40, 2, 64, True),
]
PACKED_IDS = [f"{c[1]}@{c[0]}-E{c[5]}{'-causal' if c[6] else ''}" for c in PACKED_CASES]


@pytest.mark.parametrize("case", PACKED_CASES, ids=PACKED_IDS)
def test_emulated_packed_kernels_match_float64_and_the_per_head_kernels(cl_device, case) -> None:
    precision, *rest = case
    try:
        cl_device.check_dtype(F16)  # float32 at "fp16" rounds to float16 storage
    except nc.DTypeError:
        pytest.skip("no float16 storage on this device")
    with matmul_precision(precision):
        packed_case(cl_device, *rest, emulate=True)


def test_backward_reuses_the_forwards_rounded_copies(cl_device, monkeypatch) -> None:
    """Float32 q, k, v are rounded once a call: the backward takes the forward's copies (only dO is rounded
    there), with the bits of a backward that rounds them again; other tensors, or a second backward, round anew."""
    from netcl.runtime.ops import layout

    casts = []
    real_cast = layout.cast
    monkeypatch.setattr(layout, "cast", lambda x, dtype: casts.append(x) or real_cast(x, dtype))
    q, k, v, g = (nc.Tensor.from_host(cl_device, a, F32) for a in _inputs((1, 2, 40, 64), (1, 2, 40, 64), "reuse"))
    spec = RA.check_attention(q, k, v, None, 0.0, True)
    out, lse = M.forward(q, k, v, None, spec, 0, None, emulate=True)
    assert casts == [q, k, v]
    reused = M.backward(g, q, k, v, out, lse, None, spec, 0, None, emulate=True)
    assert casts[3:] == [g]
    again = M.backward(g, q, k, v, out, lse, None, spec, 0, None, emulate=True)  # the copies went with the first
    assert casts[4:] == [q, k, v, g]
    for a, b in zip(reused, again, strict=True):
        np.testing.assert_array_equal(a.to_host(), b.to_host())
    out, lse = M.forward(q, k, v, None, spec, 0, None, emulate=True)
    q2 = nc.Tensor.from_host(cl_device, q.to_host() * 2, F32)  # not the tensor the forward rounded
    del casts[:]
    M.backward(g, q2, k, v, out, lse, None, spec, 0, None, emulate=True)
    assert casts == [q2, k, v, g]


def _with_tensor_cores(device, monkeypatch, kind: str) -> nc.Device:
    if not gemm_mma.enabled(device, kind):
        pytest.skip(f"needs an NVIDIA device with mma.sync ({kind})")
    monkeypatch.delenv("NETCL_ATTENTION", raising=False)
    return device


@pytest.fixture
def tensor_cores(cl_device, monkeypatch) -> nc.Device:
    return _with_tensor_cores(cl_device, monkeypatch, "f16")


@pytest.fixture
def bf16_tensor_cores(cl_device, monkeypatch) -> nc.Device:
    return _with_tensor_cores(cl_device, monkeypatch, "bf16")


@pytest.mark.parametrize(("name", "qs", "ks", "opts"), CASES, ids=[c[0] for c in CASES])
def test_tensor_cores_float16_match_float64(tensor_cores, name, qs, ks, opts) -> None:
    run_case(tensor_cores, F16, qs, ks, opts, emulate=False)


@pytest.mark.parametrize(("name", "qs", "ks", "opts"), CASES[1::3], ids=[c[0] for c in CASES[1::3]])
def test_tensor_cores_float32_at_fp16_precision_match_float64(tensor_cores, name, qs, ks, opts) -> None:
    with matmul_precision("fp16"):
        run_case(tensor_cores, F32, qs, ks, opts, emulate=False)


@pytest.mark.parametrize(("name", "qs", "ks", "opts"), CASES, ids=[c[0] for c in CASES])
def test_tensor_cores_bfloat16_match_float64(bf16_tensor_cores, name, qs, ks, opts) -> None:
    run_case(bf16_tensor_cores, BF16, qs, ks, opts, emulate=False)
    if name in ("causal", "E128"):
        with matmul_precision("medium"):  # autocast(dtype=bfloat16)'s precision: float32 tensors, bf16 products
            run_case(bf16_tensor_cores, F32, qs, ks, opts, emulate=False)


@pytest.mark.parametrize("case", PACKED_CASES, ids=PACKED_IDS)
def test_tensor_cores_packed_match_float64_and_the_per_head_kernels(tensor_cores, case) -> None:
    precision, *rest = case
    if precision == "medium" and not gemm_mma.enabled(tensor_cores, "bf16"):
        pytest.skip("no bf16 mma.sync")
    with matmul_precision(precision):
        packed_case(tensor_cores, *rest, emulate=False)


@pytest.mark.parametrize("low", [F16, BF16], ids=["float16", "bfloat16"])
def test_autocast_runs_attention_on_tensor_cores(tensor_cores, low) -> None:
    import netcl.autograd as ag
    from netcl import amp
    from netcl.nn import functional as F

    if not gemm_mma.enabled(tensor_cores, M.KIND_OF[low]):
        pytest.skip(f"no {M.KIND_OF[low]} mma.sync")
    q, k, v, g = _inputs((2, 2, 80, 64), (2, 2, 80, 64), "autocast", low)
    with ag.Tape() as tape, amp.autocast(dtype=low):
        nodes = [ag.tensor(a.astype(np.float32), requires_grad=True, device=tensor_cores) for a in (q, k, v)]
        out = F.scaled_dot_product_attention(*nodes, is_causal=True)
        loss = ag.sum(out * ag.tensor(g.astype(np.float32), device=tensor_cores))
    tape.backward(loss)  # after the block: the gradient keeps the forward's precision
    tensors = [n.value for n in nodes]
    spec = RA.check_attention(*tensors, None, 0.0, True)
    routed = attention_mma_tf32.HIGHEST is not None and gemm_mma.enabled(tensor_cores, attention_mma_tf32.HIGHEST)
    outside = "mma-tf32" if routed else "blocked"
    assert RA.select_variant(tensor_cores, F32, spec).name == outside  # outside autocast: float32 accuracy
    with matmul_precision("fp16" if low == F16 else "medium"):  # what autocast set around the op
        direct, lse = M.forward(*tensors, None, spec, 0, None)
        grads = M.backward(nc.Tensor.from_host(tensor_cores, g, F32), *tensors, direct, lse, None, spec, 0, None)
    np.testing.assert_array_equal(out.to_host(), direct.to_host())
    for node, want in zip(nodes, grads, strict=True):
        np.testing.assert_array_equal(node.grad.to_host(), want.to_host())


# ---- which calls the kernels take ---------------------------------------------------------------------------
def _spec(e=64, ev=64, mask=None, dropout=0.0, causal=False):
    q = nc.Tensor.empty((2, 4, 8, e), np.float32, "cpu")
    k = nc.Tensor.empty((2, 4, 8, e), np.float32, "cpu")
    v = nc.Tensor.empty((2, 4, 8, ev), np.float32, "cpu")
    return RA.check_attention(q, k, v, mask, dropout, causal)


def test_calls_it_takes(monkeypatch) -> None:
    monkeypatch.delenv("NETCL_ATTENTION", raising=False)
    mask = nc.Tensor.empty((8, 8), np.bool_, "cpu")
    assert M.takes(F16, _spec()) and M.takes(F16, _spec(e=128, ev=128, causal=True))
    assert not M.takes(F32, _spec())  # float32 at "highest": the exact kernels
    with matmul_precision("fp16"):
        assert M.takes(F32, _spec())
    with matmul_precision("high"):
        assert not M.takes(F32, _spec())
    assert M.kind(BF16) == "bf16" and M.takes(BF16, _spec()) and M.kind(F16) == "f16"
    with matmul_precision("medium"):  # autocast(dtype=bfloat16) on NVIDIA
        assert M.takes(F32, _spec()) and M.kind(F32) == "bf16"
    for spec in (_spec(e=32, ev=32), _spec(ev=128), _spec(mask=mask), _spec(dropout=0.1)):
        assert not M.takes(F16, spec)
    assert not M.takes(np.dtype(np.float64), _spec())
    monkeypatch.setenv("NETCL_ATTENTION", "mma")
    assert M.takes(F32, _spec())  # forced: float32 at every precision, operands rounded to f16


@pytest.mark.parametrize("choice", ["blocked", "quad", "portable"])
def test_netcl_attention_naming_another_variant_turns_them_off(cl_device, monkeypatch, choice) -> None:
    monkeypatch.setenv("NETCL_ATTENTION", choice)
    assert RA.select_variant(cl_device, F16, _spec()).name != "mma"


def test_bfloat16_without_tensor_cores_is_refused_naming_the_op(cl_device) -> None:
    if gemm_mma.enabled(cl_device, "bf16"):
        pytest.skip("a device with bf16 mma.sync")
    q = nc.Tensor.from_host(cl_device, np.zeros((1, 2, 8, 64)), BF16)
    with pytest.raises(nc.DTypeError, match=r"scaled_dot_product_attention: bfloat16 tensors run on NVIDIA"):
        RA.scaled_dot_product_attention(q, q, q)


def test_not_selected_without_tensor_cores(cl_device, monkeypatch) -> None:
    if gemm_mma.enabled(cl_device, "f16"):
        pytest.skip("a device with mma.sync")
    for choice in ("", "mma"):
        monkeypatch.setenv("NETCL_ATTENTION", choice)
        assert RA.select_variant(cl_device, F16, _spec()).name != "mma"
        with matmul_precision("fp16"):
            assert RA.select_variant(cl_device, F32, _spec()).name != "mma"


@pytest.mark.parametrize("e", M.FEATURES)
def test_local_memory_within_nvidias_48_kb(e) -> None:
    for kernel in ("fwd", "bwd_q", "bwd_kv"):
        assert local_bytes(kernel, e) <= 48 * 1024
