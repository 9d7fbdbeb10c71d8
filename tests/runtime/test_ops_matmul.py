"""matmul / gemm against a float64 NumPy reference: layouts, odd sizes, batches, split-K, precisions.

Tolerance (fp32): each output is a K-term float32 dot product. With inputs in [-1, 1] its rounding
error is bounded by ~K * eps * sum|a_ik b_kj| in the worst case and is ~sqrt(K) * eps of it in
practice; we allow atol = 4 * K * eps (a few 1e-6 for K = 33), which a wrong index, a missed tile
or an un-zeroed padding element (errors of order 0.1) exceed by far. Tensor-core precisions round
each operand first: tf32 keeps 10 mantissa bits (relative error <= 2**-11 per operand rounded,
2**-10 truncated), bf16 7 (<= 2**-8), fp16 10; a product of two rounded operands is off by <= 2u
relative, so a K-term sum of |a b| <= 1 is off by <= 2uK, plus the fp32 accumulation above.
tf32x3 splits each operand into tf32 hi + lo (off by <= 2**-22) and drops lo * lo: a product is off
by <= 3 * 2**-22 < 2 * 2**-21 relative; each k-step's sum joins the accumulator with an fp32 add,
within the 4 * K * eps term. bf16x3 the same with bf16 parts (hi + lo off by <= 2**-16): <= 3 * 2**-16
< 2 * 2**-15 relative.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops, tune
from netcl.runtime.cache import program_cache
from netcl.runtime.capture import capture_graph
from netcl.runtime.ops import gemm, gemm_mma, gemm_plan
from netcl.runtime.ops.gemm_source import Epilogue, GemmConfig
from netcl.runtime.ops.linalg import get_float32_matmul_precision, matmul_precision, set_float32_matmul_precision

EPS = float(np.finfo(np.float32).eps)
#: relative error of one rounded operand: tf32 truncated (the cp.async path feeds raw fp32 words,
#: whose low 13 bits the mma ignores) 2**-10, bf16 rounded 2**-8, fp16 rounded 2**-11
UNIT = {
    "highest": 0.0, "tf32x3": 2.0**-21, "bf16x3": 2.0**-15, "high": 2.0**-10, "medium": 2.0**-8, "f16": 2.0**-11,
    "fp16": 2.0**-11,
}  # fmt: skip


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape).astype(np.float32)


def _tolerance(k: int, mode: str = "highest") -> float:
    return 4 * max(k, 1) * EPS + 2 * UNIT[mode] * max(k, 1)


def _check(device, sa, sb, ta=False, tb=False, seed=0, precision=None, bias=False) -> np.ndarray:
    a, b = _data(sa, seed), _data(sb, seed + 1)
    x = np.swapaxes(a, -1, -2) if ta else a
    y = np.swapaxes(b, -1, -2) if tb else b
    row = _data((y.shape[-1],), seed + 2) if bias else None
    result = ops.matmul(
        nc.tensor(a, device=device),
        nc.tensor(b, device=device),
        transpose_a=ta,
        transpose_b=tb,
        precision=precision,
        bias=None if row is None else nc.tensor(row, device=device),
    )
    expected = np.matmul(x.astype(np.float64), y.astype(np.float64)) + (0.0 if row is None else row)
    host = result.to_host()
    assert host.dtype == np.float32 and host.shape == expected.shape
    k = x.shape[-1]
    mode = precision or "highest"
    if device.kind != "opencl" or gemm_mma.mode_for(device, np.dtype("f4"), np.dtype("f4"), mode) is None:
        mode = "highest"  # no tensor cores: fp32 whatever was asked
    np.testing.assert_allclose(host, expected, rtol=0, atol=_tolerance(k, mode))
    return host


@pytest.mark.parametrize(
    ("sa", "sb"),
    [
        ((17, 33), (33, 5)),  # odd sizes: partial tiles in M, K and N
        ((16, 16), (16, 16)),  # exactly one tile
        ((1, 40), (40, 1)),  # a dot product
        ((1, 33), (33, 70)),  # one row
        ((9, 1), (1, 13)),  # K = 1: an outer product
        ((70, 64), (64, 68)),  # several blocks, vector loads (widths divide 64 and 68)
        ((3, 17, 33), (33, 5)),  # batched left, shared right (folded into M)
        ((3, 17, 33), (3, 33, 5)),  # batched both
        ((17, 33), (4, 33, 5)),  # shared left, batched right
        ((2, 1, 4, 3), (3, 3, 5)),  # broadcast batch dims (2, 1) x (3,) -> (2, 3)
        ((2, 1, 3, 1, 4, 6), (1, 5, 3, 2, 6, 3)),  # interleaved broadcasts: > 3 merged dims
        ((33,), (33, 5)),  # 1-D on the left
        ((17, 33), (33,)),  # 1-D on the right
    ],
)
def test_matmul(device, sa, sb):
    _check(device, sa, sb)


@pytest.mark.parametrize(("ta", "tb"), [(False, True), (True, False), (True, True)])
@pytest.mark.parametrize(("m", "n", "k"), [(17, 5, 33), (66, 70, 64), (1, 9, 20)])
def test_transposed_operands(device, ta, tb, m, n, k):
    """op(a) @ op(b) reads the stored layout: a stored (K, M) with ta, b stored (N, K) with tb."""
    _check(device, (k, m) if ta else (m, k), (n, k) if tb else (k, n), ta, tb)


def test_transposed_batched_with_broadcast(device):
    _check(device, (2, 1, 33, 17), (3, 5, 33), ta=True, tb=True)
    _check(device, (4, 40, 12), (40, 12), ta=True)  # x.T @ g with a shared g


def test_float64(device):
    a, b = np.random.default_rng(0).normal(size=(2, 19, 37)), np.random.default_rng(1).normal(size=(37, 11))
    got = ops.matmul(nc.tensor(a, np.float64, device=device), nc.tensor(b, np.float64, device=device))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got.to_host(), a @ b, rtol=1e-12, atol=1e-12)


def test_zero_sizes(device):
    a = nc.tensor(np.zeros((3, 0), np.float32), device=device)
    b = nc.tensor(np.zeros((0, 4), np.float32), device=device)
    np.testing.assert_array_equal(ops.matmul(a, b).to_host(), np.zeros((3, 4), np.float32))
    rows = nc.tensor(np.zeros((0, 2), np.float32), device=device)
    empty = ops.matmul(rows, nc.tensor(_data((2, 3), 1), device=device))
    assert empty.shape == (0, 3)


def test_shape_errors(device):
    a = nc.tensor(_data((2, 3), 0), device=device)
    with pytest.raises(nc.ShapeError, match=r"inner dimensions 3 and 4"):
        ops.matmul(a, nc.tensor(_data((4, 2), 1), device=device))
    with pytest.raises(nc.ShapeError, match=r"\(2, 3\)\.T and \(2, 3\)\.T do not fit"):
        ops.matmul(a, a, transpose_a=True, transpose_b=True)
    with pytest.raises(nc.ShapeError, match="batch"):
        ops.matmul(nc.tensor(_data((2, 2, 3), 0), device=device), nc.tensor(_data((3, 3, 2), 1), device=device))
    with pytest.raises(nc.ShapeError, match="transposed operand must be at least 2-D"):
        ops.matmul(nc.tensor(_data((3,), 0), device=device), a, transpose_a=True)
    with pytest.raises(ValueError, match="precision must be one of"):
        ops.matmul(a, nc.tensor(_data((3, 2), 1), device=device), precision="fast")


def test_integer_operands_give_float32(device):
    a = nc.tensor(np.arange(6, dtype=np.int32).reshape(2, 3), device=device)
    b = nc.tensor(np.ones((3, 2), np.float32), device=device)
    result = ops.matmul(a, b)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result.to_host(), [[3, 3], [12, 12]])


@pytest.mark.parametrize(("sa", "sb", "ta"), [((5, 16384), (16384, 7), False), ((8192, 64), (8192, 3), True)])
def test_small_output_with_large_k_is_split_along_k(device, sa, sb, ta):
    """Few output blocks and a large K take the split-K path (partial products, then their sum)."""
    if device.kind == "opencl":
        m, n, k = (sa[1] if ta else sa[0]), sb[1], sb[0]
        problem = gemm_plan.Problem(m, n, k, ta, False, ())
        cfg = gemm.portable_config(device, problem, np.dtype(np.float32))
        assert gemm_plan.split_count(problem, cfg.bm, cfg.bn, cfg.bk, device)[0] > 1
    _check(device, sa, sb, ta=ta)


@pytest.mark.parametrize("precision", ["highest", "tf32x3"])
@pytest.mark.parametrize(
    ("m", "n", "k", "finer"),
    [
        (5, 7, 12288, False),  # the config's own split count; 35 outputs: the sum takes one a work-item
        (8, 6, 1400, True),  # finer splits: 5 on the 2-core CI machine and the GPUs (not a power of two); 4 a work-item
    ],
)
def test_split_product_is_its_parts_summed_in_order(cl_device, precision, m, n, k, finer):
    """Split along K, the split-sum kernel adds the splits' partial products in split order: bit for
    bit the float32 sum, in that order, of the unsplit products of the K chunks with the same tiles.
    Again on a later call and in a captured graph's replays."""
    f4 = np.dtype(np.float32)
    problem = gemm_plan.Problem(m, n, k, False, False, ())
    mode = gemm_mma.mode_for(cl_device, f4, f4, precision)
    if mode is None:
        cfg = gemm.portable_config(cl_device, problem, f4)

        def plan(p: gemm_plan.Problem, c) -> gemm_plan.Plan:
            return gemm_plan.make_plan(cl_device, f4, f4, (p.m, p.n), p, cfg=c)
    else:
        cfg = gemm_mma.config(cl_device, mode, problem, False, False)

        def plan(p: gemm_plan.Problem, c) -> gemm_plan.Plan:
            return gemm_mma.make_plan(cl_device, mode, f4, f4, f4, (p.m, p.n), p, cfg=c)

    cfg = dataclasses.replace(cfg, split=4) if finer else cfg
    bk = cfg.bk if mode is None else cfg.bk_elements(mode)
    splits, chunk = gemm_plan.split_count(problem, cfg.bm, cfg.bn, bk, cl_device, cfg.split)
    assert splits > 1
    a, b = _data((m, k), 3), _data((k, n), 4)
    x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
    got = plan(problem, cfg).run(x, y).to_host()
    expected = np.zeros((m, n), np.float32)
    for lo in range(0, k, chunk):
        hi = min(k, lo + chunk)
        part = plan(gemm_plan.Problem(m, n, hi - lo, False, False, ()), dataclasses.replace(cfg, split=0))
        ends = nc.tensor(np.ascontiguousarray(a[:, lo:hi]), device=cl_device), nc.tensor(b[lo:hi], device=cl_device)
        expected = expected + part.run(*ends).to_host()
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(plan(problem, cfg).run(x, y).to_host(), got)
    graph = capture_graph(cl_device.queue, plan(problem, cfg).run, x, y)
    for _ in range(2):
        np.testing.assert_array_equal(graph.execute(x, y).to_host(), got)


def test_new_batch_size_builds_nothing(cl_device, monkeypatch):
    """Sizes and batch strides are kernel arguments: another batch size (and M, N) reuses the program. The sizes keep
    the operands' alignment class (odd leading dims and batch strides): an even one selects vector loads, another
    program, which an earlier test of the same process may or may not have built."""
    _check(cl_device, (3, 17, 33), (3, 33, 5))
    built: list = []
    compile_program = program_cache.get_or_compile

    def recording(key, source, ctx, *args, **kwargs):
        before = program_cache.stats().builds
        handle = compile_program(key, source, ctx, *args, **kwargs)
        if program_cache.stats().builds != before:
            built.append((key, [line for line in source.splitlines() if line.startswith("#define")][:8]))
        return handle

    monkeypatch.setattr(program_cache, "get_or_compile", recording)
    _check(cl_device, (5, 17, 33), (5, 33, 5))
    _check(cl_device, (2, 19, 33), (2, 33, 7))
    assert not built, built


@pytest.mark.parametrize("precision", ["tf32x3", "bf16x3", "high", "medium", "fp16"])
def test_reduced_precisions(device, precision):
    """tf32x3 / bf16x3 / tf32 / bf16 / fp16 on tensor cores where present (tolerance of the rounded operands), else
    fp32."""
    _check(device, (70, 96), (96, 68), precision=precision)
    _check(device, (3, 33, 40), (40, 24), precision=precision)
    _check(device, (40, 33), (24, 40), ta=True, tb=True, precision=precision)


def test_tf32x3_accumulates_without_bias(cl_device):
    """tf32x3 adds each k-step's sum with an IEEE add: on positive operands, where the mma's own
    truncating accumulation would lose ~2**-24 of the running sum per k-step (8x FMA's error at
    K = 2048 on the H100), its error stays within twice the fp32 FMA kernel's on the same product."""
    if gemm_mma.mode_for(cl_device, np.dtype("f4"), np.dtype("f4"), "tf32x3") is None:
        pytest.skip("no tensor cores: tf32x3 computes in fp32")
    rng = np.random.default_rng(3)
    a, b = rng.uniform(0.0, 1.0, (128, 2048)).astype(np.float32), rng.uniform(0.0, 1.0, (2048, 128)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    ta, tb = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
    errors = {p: np.abs(ops.matmul(ta, tb, precision=p).to_host() - exact).max() for p in ("highest", "tf32x3")}
    assert errors["tf32x3"] <= 2 * errors["highest"], errors


def test_bf16x3_errs_far_under_tf32(cl_device):
    """bf16x3 (each operand as two bf16 parts, ~16 bits) errs at most 1/8 of tf32's rounding ("high") on the same
    product, in the layouts Winograd's products and their gradients take (its bound is 1/21 of tf32's): a kernel
    that multiplied only the hi parts (bf16) or dropped a cross term would err more than tf32."""
    f4 = np.dtype("f4")
    if gemm_mma.mode_for(cl_device, f4, f4, "bf16x3") is None:
        pytest.skip("no bf16 tensor cores: bf16x3 computes in fp32")
    rng = np.random.default_rng(5)
    for trans_a, trans_b in ((False, False), (False, True), (True, False)):
        a, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((6, 96, 520), (6, 520, 72)))
        a, b = (a.swapaxes(1, 2).copy() if trans_a else a), (b.swapaxes(1, 2).copy() if trans_b else b)
        ta, tb = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
        x = a.swapaxes(1, 2) if trans_a else a
        y = b.swapaxes(1, 2) if trans_b else b
        exact = x.astype(np.float64) @ y.astype(np.float64)
        errors = {
            p: np.abs(ops.matmul(ta, tb, transpose_a=trans_a, transpose_b=trans_b, precision=p).to_host() - exact).max()
            for p in ("high", "bf16x3")
        }
        assert 8 * errors["bf16x3"] <= errors["high"], (trans_a, trans_b, errors)


def test_precision_setting_and_context():
    assert get_float32_matmul_precision() == "highest"
    with matmul_precision("high"):
        assert get_float32_matmul_precision() == "high"
    set_float32_matmul_precision("medium")
    try:
        assert get_float32_matmul_precision() == "medium"
        with matmul_precision("tf32x3"):
            assert get_float32_matmul_precision() == "tf32x3"
    finally:
        set_float32_matmul_precision("highest")
    with pytest.raises(ValueError, match="precision must be one of"):
        set_float32_matmul_precision("low")


def test_a_function_at_a_matmul_precision():
    """``at_matmul_precision`` runs each call inside the context (autocast wraps an op's forward and
    gradient so); None leaves the function as it is; a bad precision fails when wrapping."""
    from netcl.runtime.ops import at_matmul_precision

    seen = at_matmul_precision("high", get_float32_matmul_precision)
    assert seen() == "high" and get_float32_matmul_precision() == "highest"
    assert at_matmul_precision(None, get_float32_matmul_precision) is get_float32_matmul_precision
    with pytest.raises(ValueError, match="precision must be one of"):
        at_matmul_precision("low", get_float32_matmul_precision)


def test_tensor_cores_only_where_probed(device):
    """PoCL and the NumPy backend have no tensor cores: precision requests fall back to fp32."""
    if device.kind == "opencl" and "NVIDIA" in device.platform_name.upper():
        pytest.skip("an NVIDIA device may have tensor cores")
    assert gemm_mma.mode_for(device, np.dtype("f4"), np.dtype("f4"), "high") is None


@pytest.mark.parametrize("host_blas", ["1", "0"], ids=["host-blas-where-it-applies", "gemm-kernel"])
@pytest.mark.parametrize(
    ("sa", "sb", "tb"),
    [
        ((17, 33), (33, 5), False),  # partial tiles
        ((9, 6), (4, 6), True),  # a Linear layer: x @ weight.T
        ((4, 3000), (3000, 6), False),  # split along K: the bias is added by the sum of the parts
        ((3, 17, 33), (33, 5), False),  # batched left (folded into M)
    ],
)
def test_matmul_bias(device, monkeypatch, host_blas, sa, sb, tb):
    """``matmul(a, b, bias=row)``: the row added to every row of the product (in the GEMM's store)."""
    monkeypatch.setenv("NETCL_HOST_BLAS", host_blas)
    _check(device, sa, sb, tb=tb, bias=True)


def test_matmul_bias_errors(device):
    a, b = nc.tensor(_data((4, 3), 0), device=device), nc.tensor(_data((3, 5), 1), device=device)
    with pytest.raises(nc.ShapeError, match=r"bias must have shape \(5,\) for a product with 5 columns, got \(4,\)"):
        ops.matmul(a, b, bias=nc.tensor(_data((4,), 2), device=device))
    with pytest.raises(nc.DTypeError, match="bias must be float32, got int32"):
        ops.matmul(a, b, bias=nc.tensor(np.zeros(5, np.int32), device=device))
    with pytest.raises(TypeError, match="bias must be a float32 Tensor, got ndarray"):
        ops.matmul(a, b, bias=np.zeros(5, np.float32))
    with pytest.raises(nc.ShapeError, match="a bias needs operands of at least 2-D"):
        ops.matmul(nc.tensor(_data((3,), 0), device=device), b, bias=nc.tensor(_data((5,), 2), device=device))
    with pytest.raises(nc.DTypeError, match="a bias needs a float32 result, got float64"):
        ops.matmul(a, b, bias=nc.tensor(_data((5,), 2), device=device), out_dtype=np.float64)


@pytest.mark.parametrize("host_blas", ["1", "0"], ids=["host-blas-where-it-applies", "gemm-kernel"])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_bias_checks_the_inner_dimensions(device, monkeypatch, host_blas, tb):
    """Operands whose inner dimensions differ raise before any launch on every path (a CPU device's product kernels,
    which read them as given, included)."""
    monkeypatch.setenv("NETCL_HOST_BLAS", host_blas)
    a = nc.tensor(_data((4, 3), 0), device=device)
    b = nc.tensor(_data((6, 5) if tb else (5, 6), 1), device=device)
    with pytest.raises(nc.ShapeError, match="inner dimensions 3 and 5 differ"):
        ops.matmul(a, b, transpose_b=tb, bias=nc.tensor(_data((6,), 2), device=device))


@pytest.mark.parametrize("host_blas", ["1", "0"], ids=["host-blas-where-it-applies", "gemm-kernel"])
@pytest.mark.parametrize(
    ("sa", "sb", "ta", "tb", "precision"),
    [
        ((17, 33), (33, 5), False, False, None),  # partial tiles
        ((64, 32), (64, 48), True, False, None),  # a weight gradient x.T @ g
        ((4, 3000), (3000, 6), False, False, None),  # split along K: the sum of the parts adds it
        ((3, 5, 7), (7, 4), False, False, None),  # batched left (folded into M)
        ((2, 3, 8, 16), (3, 16, 8), False, False, None),  # broadcast batch
        ((40, 30), (20, 30), False, True, "high"),  # tensor cores where the device has them
        ((5,), (5, 3), False, False, None),  # a 1-D operand: matmul, then an add
    ],
)
def test_matmul_addend(device, monkeypatch, host_blas, sa, sb, ta, tb, precision):
    """``matmul(a, b, addend=c)``: the bits of ``matmul(a, b)`` + c (one float add, in the GEMM's store
    or an add kernel), and within the product's tolerance of float64."""
    monkeypatch.setenv("NETCL_HOST_BLAS", host_blas)
    a, b = nc.tensor(_data(sa, 0), device=device), nc.tensor(_data(sb, 1), device=device)
    product = ops.matmul(a, b, transpose_a=ta, transpose_b=tb, precision=precision).to_host()
    c = _data(product.shape, 2)
    got = ops.matmul(a, b, transpose_a=ta, transpose_b=tb, precision=precision, addend=nc.tensor(c, device=device))
    np.testing.assert_array_equal(got.to_host(), product + c)
    x, y = _data(sa, 0).astype(np.float64), _data(sb, 1).astype(np.float64)
    x, y = (np.swapaxes(x, -1, -2) if ta else x), (np.swapaxes(y, -1, -2) if tb else y)
    mode = (
        precision
        if device.kind == "opencl" and gemm_mma.mode_for(device, np.dtype("f4"), np.dtype("f4"), precision or "highest")
        else "highest"
    )
    np.testing.assert_allclose(got.to_host(), np.matmul(x, y) + c, rtol=0, atol=_tolerance(x.shape[-1], mode) + 2 * EPS)


def test_matmul_addend_errors(device):
    a, b = nc.tensor(_data((4, 3), 0), device=device), nc.tensor(_data((3, 5), 1), device=device)
    with pytest.raises(nc.ShapeError, match=r"addend must have the result's shape \(4, 5\), got \(5, 4\)"):
        ops.matmul(a, b, addend=nc.tensor(_data((5, 4), 2), device=device))
    with pytest.raises(nc.DTypeError, match="addend must have the result's dtype float32, got int32"):
        ops.matmul(a, b, addend=nc.tensor(np.zeros((4, 5), np.int32), device=device))
    with pytest.raises(TypeError, match="addend must be a Tensor, got ndarray"):
        ops.matmul(a, b, addend=np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="bias= and addend= together"):
        ops.matmul(
            a, b, bias=nc.tensor(_data((5,), 2), device=device), addend=nc.tensor(_data((4, 5), 2), device=device)
        )


@pytest.mark.parametrize(("bias", "activation"), [("col", "relu"), ("row", None), ("none", "gelu"), ("col", "tanh")])
def test_epilogue(device, bias, activation):
    """act(a @ b + bias) in the GEMM's store equals the separate ops in float64."""
    a, b = _data((19, 23), 0), _data((23, 21), 1)
    values = _data((19 if bias == "row" else 21,), 2)
    ep = Epilogue(bias, activation)
    got = gemm.gemm(
        nc.tensor(a, device=device),
        nc.tensor(b, device=device),
        epilogue=ep,
        bias=None if bias == "none" else nc.tensor(values, device=device),
    ).to_host()
    v = a.astype(np.float64) @ b.astype(np.float64)
    if bias == "col":
        v = v + values
    elif bias == "row":
        v = v + values[:, None]
    ref = {
        None: v,
        "relu": np.maximum(v, 0),
        "tanh": np.tanh(v),
        "gelu": 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3))),
    }[activation]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=_tolerance(23))


def test_epilogue_errors(device):
    a = nc.tensor(_data((4, 3), 0), device=device)
    b = nc.tensor(_data((3, 5), 1), device=device)
    with pytest.raises(nc.ShapeError, match="needs 5 values"):
        gemm.gemm(a, b, epilogue=Epilogue("col"), bias=nc.tensor(_data((4,), 2), device=device))
    with pytest.raises(ValueError, match="bias='none'"):
        gemm.gemm(a, b, bias=nc.tensor(_data((5,), 2), device=device))
    with pytest.raises(ValueError, match="activation"):
        Epilogue("col", "swish")


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_code_epilogue(cl_device, precision):
    """C statements in the store: every operand kind, a batched product, a saved pre-activation
    (on the tensor-core kernel too where "high" selects it; elsewhere both are fp32)."""
    a, b = _data((2, 9, 23), 0), _data((23, 7), 1)
    full, col, row = _data((2, 9, 7), 2), _data((7,), 3), _data((2, 9, 1), 4)
    code = "float ep_out0 = fmax(ep_value + ep1, 0.0f) * ep0 + ep2 * ep3;\nfloat ep_out1 = ep_value;"
    ep = Epilogue(code=code, operands=("full", "col", "row", "scalar", "out"))
    saved = nc.Tensor.empty((2, 9, 7), np.dtype("f4"), cl_device)
    args = [nc.tensor(v, device=cl_device) for v in (full, col, row)] + [1.5, saved]
    for _ in range(2):  # the second call runs the remembered plan
        x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
        got = gemm.gemm(x, y, epilogue=ep, epilogue_args=args, precision=precision)
        v = a.astype(np.float64) @ b.astype(np.float64)
        ref = np.maximum(v + col, 0) * full + row * 1.5
        np.testing.assert_allclose(got.to_host(), ref, rtol=1e-5, atol=2 * _tolerance(23, precision))
        np.testing.assert_allclose(saved.to_host(), v, rtol=1e-5, atol=_tolerance(23, precision))
    with pytest.raises(ValueError, match="4 arguments"):
        gemm.gemm(nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device), epilogue=ep, epilogue_args=args[:4])
    with pytest.raises(nc.ShapeError, match="operand 1 \\(col\\)"):
        bad = [args[0], args[0], *args[2:]]
        gemm.gemm(nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device), epilogue=ep, epilogue_args=bad)
    with pytest.raises(ValueError, match="operand kinds"):
        Epilogue(code="float ep_out0 = ep_value;", operands=("diag",))


@pytest.mark.parametrize("precision", ["highest", "high"])
@pytest.mark.parametrize(("lead", "n"), [((2, 8), 24), ((3, 5), 23)])  # and with odd sizes
def test_code_epilogue_on_a_split_product(cl_device, precision, lead, n):
    """A product split along K stores raw partial sums; the split's sum kernel applies the epilogue."""
    m = lead[0] * lead[1]
    a, b = _data((*lead, 1536), 5), _data((1536, n), 6)
    problem = gemm_plan.Problem(m, n, 1536, False, False, ())
    cfg = gemm.portable_config(cl_device, problem, np.dtype(np.float32))
    assert gemm_plan.split_count(problem, cfg.bm, cfg.bn, cfg.bk, cl_device)[0] > 1
    col, row = _data((n,), 7), _data((*lead, 1), 8)
    code = "float ep_out0 = tanh(ep_value * ep2) + ep0 * ep1;\nfloat ep_out1 = ep_value;"
    ep = Epilogue("col", "relu", code=code, operands=("col", "row", "scalar", "out"))
    saved = nc.Tensor.empty((*lead, n), np.dtype("f4"), cl_device)
    bias = nc.tensor(_data((n,), 9), device=cl_device)
    args = [nc.tensor(col, device=cl_device), nc.tensor(row, device=cl_device), 0.25, saved]
    x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
    for _ in range(2):
        got = gemm.gemm(x, y, epilogue=ep, bias=bias, epilogue_args=args, precision=precision)
        v = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias.to_host(), 0)
        tol = _tolerance(1536, precision)
        np.testing.assert_allclose(saved.to_host(), v, rtol=1e-5, atol=tol)
        np.testing.assert_allclose(got.to_host(), np.tanh(v * 0.25) + col * row, rtol=1e-5, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, nc.bfloat16, np.float16])
@pytest.mark.parametrize(("m", "n"), [(8, 6), (5, 7)])  # the sum's vector path (48 outputs); one a work-item (35)
def test_split_sum_stores_each_output_dtype(cl_device, dtype, m, n):
    """A split product of float64 or 16-bit tensors: its sum adds in float64 (float32 for the 16-bit ones) and
    stores the output's dtype, also on the vector path. Against float64 of the same operands: for 16-bit
    outputs their rounding (half an ulp: 2**-9 relative for bfloat16, 2**-12 for float16) dominates the float32
    sums' error at K = 3000; float64 sums of 3000 N(0, 1) products stay within 1e-12 of the largest output."""
    a, b = _data((m, 3000), 14), _data((3000, n), 15)
    x, y = nc.tensor(a, device=cl_device, dtype=dtype), nc.tensor(b, device=cl_device, dtype=dtype)
    if gemm_mma.mode_for(cl_device, x.dtype, y.dtype, "highest") is None:
        problem = gemm_plan.Problem(m, n, 3000, False, False, ())
        cfg = gemm.portable_config(cl_device, problem, x.dtype)
        assert gemm_plan.split_count(problem, cfg.bm, cfg.bn, cfg.bk, cl_device)[0] > 1
    got = gemm.gemm(x, y)
    assert got.dtype == x.dtype
    expected = x.to_host().astype(np.float64) @ y.to_host().astype(np.float64)
    rtol = {np.dtype(np.float64): 0.0, np.dtype(nc.bfloat16): 2.0**-8, np.dtype(np.float16): 2.0**-11}[x.dtype]
    atol = (1e-12 if x.dtype == np.float64 else 1e-4) * np.abs(expected).max()
    np.testing.assert_allclose(got.to_host().astype(np.float64), expected, rtol=rtol, atol=atol)


def test_split_sum_applies_the_epilogue_across_batch_entries(cl_device):
    """A batched split product with an epilogue reading a per-row operand: the sum finds each element's
    batch entry, row and column (one element a work-item: ``sum_width`` is 1 with an epilogue)."""
    a, b = _data((2, 5, 3072), 10), _data((2, 3072, 6), 11)
    problem = gemm_plan.Problem(5, 6, 3072, False, False, ((2, 5 * 3072, 3072 * 6),))
    cfg = gemm.portable_config(cl_device, problem, np.dtype(np.float32))
    assert gemm_plan.split_count(problem, cfg.bm, cfg.bn, cfg.bk, cl_device)[0] > 1
    assert gemm_plan.sum_width(2 * 5 * 6, Epilogue("col")) == 1 and gemm_plan.sum_width(2 * 5 * 6) == 4
    bias, row = _data((6,), 12), _data((2, 5, 1), 13)
    ep = Epilogue("col", "relu", code="float ep_out0 = ep_value * ep0;", operands=("row",))
    got = gemm.gemm(
        nc.tensor(a, device=cl_device),
        nc.tensor(b, device=cl_device),
        bias=nc.tensor(bias, device=cl_device),
        epilogue=ep,
        epilogue_args=[nc.tensor(row, device=cl_device)],
    )
    expected = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0) * row
    np.testing.assert_allclose(got.to_host(), expected, rtol=1e-5, atol=_tolerance(3072, "highest"))


def test_batch_merging():
    # (2, 1) x (3,) broadcast -> (2, 3): A strides (mat, 0), B strides (0, mat): two dims
    assert gemm.merge_batch((2, 1), (3,), (2, 3), 12, 15) == [(2, 12, 0), (3, 0, 15)]
    # contiguous batch dims of both merge into one
    assert gemm.merge_batch((2, 3), (2, 3), (2, 3), 4, 5) == [(6, 4, 5)]
    # size-1 dims vanish; a shared operand keeps stride 0
    assert gemm.merge_batch((1, 4), (), (1, 4), 6, 7) == [(4, 6, 0)]


def test_tuner_stores_and_reloads_the_winner(cl_device, tmp_path, monkeypatch):
    """A search (here over trivial trials) stores its winner on disk; a fresh table reads it back."""
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NETCL_TUNE", "1")
    tune.clear(cl_device)
    calls = []
    key = tune.shape_class("test", 100, 60, 33, False, "NN", "<f4")
    assert key == "test|NN|<f4|128x64x48|1"  # sizes up to a power of two or 1.5x one
    winner = tune.select(cl_device, key, [1, 2, 3], 0, calls.append, lambda c: {"v": c}, lambda d: d["v"])
    assert winner in (1, 2, 3) and set(calls) == {1, 2, 3}
    assert tune.store_path(cl_device).exists()
    tune._MEMORY.clear()  # a new process: only the file knows
    calls.clear()
    assert tune.select(cl_device, key, [1, 2, 3], 0, calls.append, lambda c: {"v": c}, lambda d: d["v"]) == winner
    assert calls == []
    monkeypatch.setenv("NETCL_TUNE", "0")
    other = tune.shape_class("test", 1000, 60, 33, False, "NN", "<f4")
    assert tune.select(cl_device, other, [1, 2], 0, calls.append, lambda c: {"v": c}, lambda d: d["v"]) == 0
    assert calls == []
    tune.clear(cl_device)


def test_tune_command_runs_without_warnings(cl_device, tmp_path):
    """``python -m netcl.runtime.tune --show`` (the README's command) runs with warnings as errors:
    runpy warned when the package had imported the module it was asked to run."""
    env = {**os.environ, "NETCL_CACHE_DIR": str(tmp_path)}
    command = [
        sys.executable,
        "-W",
        "error::RuntimeWarning",
        "-m",
        "netcl.runtime.tune",
        "--show",
        "--device",
        "opencl",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"winners in {tmp_path}" in done.stdout


def test_tune_command_shows_and_clears_the_stored_winners(cl_device, tmp_path, monkeypatch, capsys):
    """``--show`` lists ``tune.winners`` (a copy of the table), ``--clear`` forgets them; shapes parse
    as ``MxNxK[:layout]``."""
    from netcl.runtime.tune import __main__ as command

    assert command.parse_shape("128x512x784") == (128, 512, 784, False, False)
    assert command.parse_shape("784X512x128:tn") == (784, 512, 128, True, False)
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    tune.clear(cl_device)
    key = tune.shape_class("test", 64, 64, 64, False, "NN", "<f4")
    tune.remember(cl_device, key, {"v": 3}, 1.5)
    shown = tune.winners(cl_device)
    assert shown == {key: {"v": 3, "_ms": 1.5}}
    shown[key]["v"] = 4  # a copy: the stored table is unchanged
    assert tune.lookup(cl_device, key) == {"v": 3, "_ms": 1.5}
    command.main(["--device", "opencl", "--show"])
    assert f"  {key}: {{'v': 3, '_ms': 1.5}}" in capsys.readouterr().out
    command.main(["--device", "opencl", "--clear"])
    assert tune.winners(cl_device) == {} and not tune.store_path(cl_device).exists()


def test_search_times_a_trials_prepared_run(cl_device):
    """Every candidate's trial is called (its build) before any timing, then once more for its prepared
    run; the search times only what that returned (``repeats`` times), then the ``finalists`` fastest
    again in interleaved ``rounds``, the winner one of them; a warm-up runs the first candidate first."""
    trials, runs = [], []

    def trial(cfg):
        trials.append(cfg)
        return lambda: runs.append(cfg)

    best, ms = tune.search(cl_device, ["a", "b", "c"], trial, repeats=3, finalists=2, rounds=5, warmup_ms=0)
    assert trials == ["a", "b", "c"] * 2 and runs[:9] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    again = runs[9:]
    assert len(set(again)) == 2 and again == again[:2] * 5  # two finalists, alternating
    assert best in again and ms >= 0
    runs.clear()
    assert tune.search(cl_device, ["a"], trial, repeats=3, warmup_ms=0)[0] == "a" and runs == ["a"] * 3  # no final
    runs.clear()
    tune.search(cl_device, ["a", "b"], trial, repeats=3, finalists=1, warmup_ms=1.0)
    assert runs.index("b") > 3 and set(runs[: runs.index("b")]) == {"a"}  # warm-up runs, then a's three timings


def test_trials_run_on_random_operands(cl_device):
    """The GEMM and convolution trials multiply uniform [-1, 1) data, not constants (tensor cores run
    faster on zeros, and a split precision's lo parts of constants like 0.5 are zeros)."""
    from netcl.runtime.ops import conv, conv_implicit, gemm_configs

    f32 = np.dtype(np.float32)
    problem = gemm_plan.Problem(32, 32, 32, False, False, ())
    product = gemm_configs._Trial(cl_device, problem, f32)
    product(gemm.portable_config(cl_device, problem, f32))()
    geo = conv.check_conv2d((2, 4, 6, 6), (5, 4, 3, 3), None, 1, 1, 1, 1)
    layer = conv_implicit._Layer("fwd", cl_device, geo, 5, f32, False)
    layer(conv_implicit._config(layer))()
    for operand in (*product.operands[:2], *layer.scratch):
        values = operand.to_host()
        assert values.min() >= -1 and values.max() < 1 and len(np.unique(values)) > values.size // 2


@pytest.mark.parametrize(
    "cfg",
    [
        GemmConfig(8, 8, 2, 2, 16, 1, 1, 2, split=0, group=3),
        GemmConfig(8, 8, 2, 2, 8, 2, 2, 2),
        GemmConfig(8, 8, 2, 2, 8, 2, 2, 2, ks=3),
        GemmConfig(8, 16, 2, 2, 32, 4, 4, 2, ks=2, group=3),
        GemmConfig(8, 16, 16, 8, 8, 4, 4, 4),
    ],
)
@pytest.mark.parametrize(("m", "n", "k"), [(300, 70, 36), (5, 7, 3000), (9, 3, 0)])
def test_tile_configs(cl_device, cfg, m, n, k):
    """Configs the search may pick compute the same product: grouped block order (a partial last
    group: 19 block-rows in groups of 3), another K depth and vector width, K slices (three slices
    over 5 steps of K: one runs a step past the range on zeros; with a split along K at 5 x 7 x 3000;
    and K = 0), 16 x 8 outputs per thread in 128 x 128 blocks (NVIDIA's default for big products)."""
    a, b = _data((m, k), 0), _data((k, n), 1)
    problem = gemm_plan.Problem(m, n, k, False, False, ())
    cfg = gemm_plan.with_alignment(cfg, problem)  # as the search's trials: vector widths the strides allow
    plan = gemm_plan.make_plan(cl_device, np.dtype(np.float32), np.dtype(np.float32), (m, n), problem, cfg=cfg)
    got = plan.run(nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)).to_host()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=0, atol=_tolerance(k))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_k_slices_with_an_epilogue(cl_device, dtype):
    """A K-sliced config (the search may pick one for any small product) applies a bias, an
    activation and a code epilogue with a second output once, after the slices' sums: slice 0
    stores; in float32 and float64 (the slices' hand-over buffer is of the accumulator type)."""
    m, n, k = 37, 45, 1000
    a, b = _data((m, k), 0).astype(dtype), _data((k, n), 1).astype(dtype)
    bias = _data((n,), 2)
    problem = gemm_plan.Problem(m, n, k, False, False, ())
    ep = Epilogue("col", "relu", code="float ep_out0 = ep_value * 2.0f;\nfloat ep_out1 = ep_value;", operands=("out",))
    cfg = gemm_plan.with_alignment(GemmConfig(8, 8, 2, 2, 16, 4, 4, 2, ks=3), problem)
    saved = nc.Tensor.empty((m, n), np.dtype("f4"), cl_device)
    f = np.dtype(dtype)
    plan = gemm_plan.make_plan(cl_device, f, f, (m, n), problem, epilogue=ep, cfg=cfg)
    x, y = nc.tensor(a, dtype=dtype, device=cl_device), nc.tensor(b, dtype=dtype, device=cl_device)
    got = plan.run(x, y, bias=nc.tensor(bias, device=cl_device), extras=[saved]).to_host()
    v = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    tol = _tolerance(k) if dtype == np.float32 else 4e-6  # float64 sums; the epilogue's values are float
    np.testing.assert_allclose(saved.to_host(), v, rtol=1e-5, atol=tol)
    np.testing.assert_allclose(got, 2 * v, rtol=1e-5, atol=2 * tol)


def test_every_searchable_config_on_a_gpu(cl_device):
    """Every config the tile search may pick (portable and tensor-core, with grouped order, fragment
    prefetch, cp.async stages, no split) computes the same product. GPUs only: on PoCL this would be
    dozens of slow builds, and the search is off there."""

    from netcl.runtime.ops import gemm_configs

    if not cl_device.is_gpu:
        pytest.skip("the tile search runs on GPUs")
    f32 = np.dtype(np.float32)
    m, n, k = 300, 200, 136
    for trans in (False, True):
        a, b = _data((k, m) if trans else (m, k), 0), _data((n, k) if trans else (k, n), 1)
        x = (a.T if trans else a).astype(np.float64)
        y = (b.T if trans else b).astype(np.float64)
        ta, tb = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
        problem = gemm_plan.Problem(m, n, k, trans, trans, ())
        configs = [(c, None) for c in gemm_configs._grid()]
        configs += [(dataclasses.replace(c, group=2, split=0), None) for c in gemm_configs._grid()[:3]]
        for mode in ("tf32", "tf32x3", "bf16x3", "bf16"):
            ldsm = gemm_mma._probe_result(cl_device, mode)
            if ldsm is None:
                continue
            for c in gemm_mma._grid() + (list(gemm_mma._BF16X3_MORE) if mode == "bf16x3" else []):
                # float32 operands of the bf16 mode are rounded on their way through registers: no cp.async
                c = dataclasses.replace(c, ldsm=ldsm, stages=c.stages if mode in gemm_mma.WORD_MODES else 0)
                variants = [c, dataclasses.replace(c, group=2, fpre=1, split=0)]
                configs += [(gemm_mma._aligned(v, problem, False, False), mode) for v in variants]
        for cfg, mode in configs:
            if mode is None:
                plan = gemm_plan.make_plan(
                    cl_device, f32, f32, (m, n), problem, cfg=gemm_plan.with_alignment(cfg, problem)
                )
            elif cfg.problems(mode, trans, trans):
                continue
            else:
                plan = gemm_mma.make_plan(cl_device, mode, f32, f32, f32, (m, n), problem, cfg=cfg)
            got = plan.run(ta, tb).to_host()
            unit = {None: "highest", "tf32": "high", "tf32x3": "tf32x3", "bf16x3": "bf16x3", "bf16": "medium"}[mode]
            err = np.abs(got - x @ y).max()
            assert err <= _tolerance(k, unit), (cfg, mode, trans, err)


def test_default_tiles_follow_the_device():
    """Without a search, big products on NVIDIA get 16 x 8 outputs per thread (their 255 registers
    hold them; H200 4096^3 44.6 against 39.7 TFLOP/s), other GPUs 8 x 8, small outputs smaller tiles."""
    from types import SimpleNamespace

    from netcl.runtime.ops import gemm_configs

    def device(platform: str) -> SimpleNamespace:
        return SimpleNamespace(is_gpu=True, platform_name=platform, cl_device=SimpleNamespace(max_compute_units=132))

    nvidia, amd = device("NVIDIA CUDA"), device("AMD Accelerated Parallel Processing")
    big, small = (
        gemm_plan.Problem(4096, 4096, 4096, False, False, ()),
        gemm_plan.Problem(128, 512, 784, False, False, ()),
    )
    assert gemm_configs.default(nvidia, big) == GemmConfig(8, 16, 16, 8, 8, 4, 4, 4)
    assert gemm_configs.default(amd, big) == GemmConfig(16, 16, 8, 8, 16, 4, 4, 4)
    assert (
        gemm_configs.default(nvidia, small) == gemm_configs.default(amd, small) == GemmConfig(16, 16, 2, 2, 32, 4, 4, 2)
    )


@pytest.mark.parametrize("mode", ["tf32", "f16"])
@pytest.mark.parametrize("along_k", [True, False], ids=["rows-mn", "rows-k"])
@pytest.mark.parametrize("bkw", [8, 16])
def test_swizzled_tiles_are_permutations_without_bank_conflicts(mode, along_k, bkw):
    """A swizzled tile of the tensor-core kernel (cp.async stages with ldmatrix: three 128 x 16-word
    stages fit 48 KB) puts every (row, word) at its own word and keeps 16-byte chunks whole, and the
    8 rows an ldmatrix reads at one chunk (a tf32 word load: rows tig x 8 words) hit distinct banks.
    The generated macro itself is evaluated (its C operators mean the same on non-negative ints)."""
    from netcl.runtime.ops.gemm_mma_source import MmaConfig, _tile

    tile = _tile("A", 128, MmaConfig(2, 2, 4, 8, bkw, stages=3), along_k, mode)
    assert tile.swizzle and tile.ld == (bkw if along_k else 128 // (1 if mode == "tf32" else 2))
    body = tile.macro().split("SWA(r, w) ", 1)[1]
    at = {(r, w): eval(body, {"r": r, "w": w}) for r in range(tile.rows) for w in range(tile.ld)}
    assert sorted(at.values()) == list(range(tile.words))
    assert all(at[r, w] - at[r, w & ~3] == w & 3 for r, w in at)
    if along_k or mode == "f16":  # ldmatrix: one 16-byte chunk of 8 consecutive rows, 8 chunks of banks
        for first in range(0, tile.rows, 8):
            for chunk in range(tile.ld // 4):
                assert len({at[r, 4 * chunk] // 4 % 8 for r in range(first, first + 8)}) == 8
    else:  # tf32 rows k: lanes read rows ks + tig (4) at words base + gid (8 consecutive)
        for ks in range(0, tile.rows, 8):
            for base in range(0, tile.ld, 16):
                assert len({at[ks + t, base + g] % 32 for t in range(4) for g in range(8)}) == 32


@pytest.mark.parametrize("bkw", [8, 16])
def test_swapped_tf32_tiles(bkw):
    """The swapped tf32 kernel keeps A's tile in wgmma atoms (K-major, as wgmma's B) and B's k-rows
    tile swizzled: a permutation of whole 16-byte chunks where a warp's fragment load (rows ks + tig,
    words wr + 64 f (+ 8) + gid: any multiple of 8 on) hits 32 distinct banks."""
    from netcl.runtime.ops.gemm_mma_source import MmaConfig, _tile

    cfg = MmaConfig(4, 1, 2, 16, bkw, stages=3, wg=2, swap=1)
    assert _tile("A", cfg.bm, cfg, True, "tf32").atom == bkw
    tile = _tile("B", cfg.bn, cfg, False, "tf32")
    assert tile.swizzle and not tile.atom and (tile.rows, tile.ld) == (bkw, 128)
    body = tile.macro().split("SWB(r, w) ", 1)[1]
    at = {(r, w): eval(body, {"r": r, "w": w}) for r in range(tile.rows) for w in range(tile.ld)}
    assert sorted(at.values()) == list(range(tile.words))
    assert all(at[r, w] - at[r, w & ~3] == w & 3 for r, w in at)
    for ks in range(0, tile.rows, 4):
        for base in range(0, tile.ld, 8):
            assert len({at[(ks + t) % tile.rows, base + g] % 32 for t in range(4) for g in range(8)}) == 32


def test_swapped_tf32_tiles_copied_by_tma():
    """Copied by TMA, the swapped kernel's B tile is in 128-byte atoms an atom wide and all rows deep (one box
    an atom), and a warp's fragment load hits each bank at most twice."""
    from netcl.runtime.ops.gemm_mma_source import MmaConfig, _tile

    cfg = MmaConfig(8, 1, 1, 32, 32, stages=3, wg=2, swap=1, tma=1)
    tile = _tile("B", cfg.bn, cfg, False, "tf32")
    assert (tile.atom, tile.atom_major, tile.rows, tile.ld) == (32, True, 32, 128)
    body = tile.macro().split("SWB(r, w) ", 1)[1]
    at = {(r, w): eval(body, {"r": r, "w": w}) for r in range(tile.rows) for w in range(tile.ld)}
    assert sorted(at.values()) == list(range(tile.words))
    for ks in range(0, tile.rows, 4):
        for base in range(0, tile.ld, 8):
            banks = [at[ks + t, base + g] % 32 for t in range(4) for g in range(8)]
            assert max(banks.count(b) for b in banks) <= 2


@pytest.mark.parametrize(
    ("along_k", "side", "bkw", "mode", "tma"),
    [
        (True, 128, 16, "f16", 0),
        (True, 64, 8, "tf32", 0),
        (True, 128, 32, "f16", 0),
        (False, 128, 16, "f16", 0),
        (False, 16, 8, "f16", 0),
        (True, 128, 32, "tf32", 1),
        (False, 128, 32, "f16", 1),
        (False, 256, 16, "bf16", 1),
    ],
)
def test_wgmma_atoms_follow_the_hardware_swizzle(along_k, side, bkw, mode, tma):
    """A wgmma tile's macro puts (row, word) where Hopper's swizzle reads it: canonical rows of 8 x
    W-byte atoms (K-major: one atom a row group; M/N-major: atoms side by side along M/N, or, in a
    tile copied by TMA, each atom all rows deep: one box), each address's 16-byte chunk bits XORed
    with its bits 7 and up (PTX ISA, "shared memory matrix layout", swizzle modes 32/64/128 B; TMA
    writes a box with the same swizzle). The generated macro is evaluated; the descriptor's strides
    and the TMA box follow the same layout."""
    from netcl.runtime.ops.gemm_mma_source import MmaConfig, _descriptor_bits, _tile, tma_box

    cfg = MmaConfig(8, 1, 1, 16, bkw, stages=3, wg=1, tma=tma)
    tile = _tile("A", side, cfg, along_k, mode)
    width = 4 * tile.atom  # bytes of an atom's row
    atoms = tile.ld // tile.atom
    body = tile.macro().split("SWA(r, w) ", 1)[1]
    for r in range(tile.rows):
        for w in range(tile.ld):
            atom, inside = divmod(4 * w, width)
            group = atom * (tile.rows // 8) + r // 8 if tma else (r // 8) * atoms + atom
            canonical = group * 8 * width + (r % 8) * width + inside
            mask = width // 16 - 1
            swizzled = canonical ^ (((canonical >> 7) & mask) << 4)
            assert 4 * eval(body, {"r": r, "w": w}) == swizzled, (r, w)
    bits = _descriptor_bits(along_k, tile)
    lead, stride = 16 * ((bits >> 16) & 0x3FFF), 16 * ((bits >> 32) & 0x3FFF)
    assert stride == 8 * width * (1 if tma else atoms)  # 8 rows on
    assert lead == (0 if along_k else 8 * width * (tile.rows // 8 if tma else 1))  # atom to atom
    if tma:  # a box: one atom row of every row (K-major: BK x side), or an atom wide, BK rows deep
        box, swizzle = tma_box(cfg, mode, "A", along_k)
        per_word = 1 if mode == "tf32" else 2
        assert swizzle == width and box[0] * 4 // per_word == width
        assert box[1] == (side if along_k else cfg.bk_elements(mode)) == tile.rows


def test_wgmma_descriptors_and_limits():
    """Descriptor strides in 16-byte units (leading: atom to atom along M/N, stride: 8 rows on) and the
    swizzle field; the layouts wgmma cannot read are refused by ``problems``."""
    from netcl.runtime.ops.gemm_mma_source import MmaConfig, _descriptor_bits, _tile

    cfg = MmaConfig(8, 1, 1, 16, 16, stages=3, wg=1)
    a = _descriptor_bits(True, _tile("A", 128, cfg, True, "f16"))  # rows m of 64 bytes: 64-byte swizzle
    assert (a >> 16) & 0x3FFF == 0 and (a >> 32) & 0x3FFF == 8 * 64 // 16 and a >> 62 == 2
    b = _descriptor_bits(False, _tile("B", 128, cfg, False, "f16"))  # rows k of 256 bytes: two 128-byte atoms
    assert (b >> 16) & 0x3FFF == 1024 // 16 and (b >> 32) & 0x3FFF == 2048 // 16 and b >> 62 == 1
    assert not cfg.problems("f16", True, False) and not cfg.problems("tf32", False, True)
    assert "tf32 wgmma reads both operands K-major" in " ".join(cfg.problems("tf32", False, False))
    swap = dataclasses.replace(cfg, wg=2, swap=1)  # C^T = B^T A^T: tf32 of untransposed operands only
    assert (swap.bm, swap.bn) == (16 * 8, 8 * 1 * 16) and not swap.problems("tf32", False, False)
    for bad in (("f16", False, False), ("tf32", False, True), ("tf32", True, False), ("tf32", True, True)):
        assert "swap" in " ".join(swap.problems(*bad)), bad
    assert dataclasses.replace(swap, wg=1).problems("tf32", False, False)
    assert dataclasses.replace(swap, wg=0).problems("tf32", False, False)
    assert cfg.problems("tf32", True, True)
    assert dataclasses.replace(cfg, stages=1).problems("f16", False, False)
    registers = dataclasses.replace(cfg, stages=0, wg=2)  # converted float32 operands: tiles filled by stores
    assert not registers.problems("bf16", True, False) and not registers.problems("f16", False, True)
    # TMA copies the stages' tiles: every layout wgmma reads, not register-filled tiles
    assert not dataclasses.replace(cfg, tma=1).problems("f16", True, False)
    assert not dataclasses.replace(swap, tma=1).problems("tf32", False, False)
    # swapped products are never in flight over their register fragments (wg 1), with or without TMA tiles
    for tma, wm, fm in ((0, 4, 2), (1, 4, 2), (1, 8, 1)):
        in_flight = dataclasses.replace(swap, wg=1, tma=tma, wm=wm, fm=fm)
        assert "(wg 2)" in " ".join(in_flight.problems("tf32", False, False)), in_flight
    assert "tma" in " ".join(dataclasses.replace(registers, tma=1).problems("f16", False, False))
    assert dataclasses.replace(cfg, stages=0).problems("bf16", False, False)  # wg 1 needs cp.async stages
    assert dataclasses.replace(cfg, wm=2).problems("f16", False, False)
    assert dataclasses.replace(cfg, fn=40).problems("f16", False, False)
    assert not cfg.problems("bf16", False, True)  # bfloat16 words
    # tf32x3: TMA stages split in local memory, each stage's products finished (wg 2), in every layout: lo tiles of
    # both operands, K-major hi tiles of those stored M/N-major (none where they are transposed first: pre)
    x3, tile = gemm_mma.X3, 4 * 128 * 32  # bytes of one operand's stage
    assert x3.local_bytes("tf32x3", False, True) == (3 + 2) * 2 * tile
    for ta, tb in ((False, False), (True, False), (True, True)):
        assert not x3.problems("tf32x3", ta, tb), (ta, tb)
        assert x3.local_bytes("tf32x3", ta, tb) == (3 + 2) * 2 * tile + 2 * tile * (ta + (not tb))
        pre = dataclasses.replace(x3, pre=1)
        assert not pre.problems("tf32x3", ta, tb) and pre.local_bytes("tf32x3", ta, tb) == (3 + 2) * 2 * tile
    for bad in (dataclasses.replace(x3, tma=0), dataclasses.replace(x3, wg=1), cfg):
        assert bad.problems("tf32x3", False, True), bad
    assert "pre" in " ".join(dataclasses.replace(cfg, pre=1).problems("f16", False, True))
    # tf32 of operands stored M/N-major may take the K-major wgmma kernels after a transpose, not the swapped ones
    for ta, tb in ((False, False), (True, False)):
        assert not dataclasses.replace(gemm_mma.WIDE, pre=1).problems("tf32", ta, tb), (ta, tb)
        assert "pre" in " ".join(dataclasses.replace(gemm_mma.WIDE_SWAP, pre=1).problems("tf32", ta, tb))


def test_tma_switched_off(cl_device, monkeypatch):
    """``NETCL_TMA=0``: no TMA configs (and no CUDA context for their tensor maps), on every device."""
    monkeypatch.setenv("NETCL_TMA", "0")
    assert not gemm_mma.tma_ok(cl_device, "f16") and not gemm_mma.wide_ok(cl_device, "f16")
    monkeypatch.setattr(gemm_mma.tune, "select", lambda device, key, candidates, default, *rest, **kw: default)
    big = gemm_plan.Problem(2048, 2048, 2048, False, False, ())
    for words in (True, False):
        assert not gemm_mma.config(cl_device, "f16", big, words, words).tma


def test_tma_only_for_a_bounded_number_of_work_groups(cl_device):
    """A TMA config is valid only up to ``TMA_MAX_WORK_GROUPS`` tiles (each work-group keeps two tensor-map slots
    in the plan's buffer): a big batch of small products copies by cp.async, on every device."""
    cfg = dataclasses.replace(gemm_mma.DEEP, tma=1)  # 128 x 128 tiles
    few = gemm_plan.Problem(256, 256, 64, False, True, ((4, 256 * 64, 256 * 64),))
    many = gemm_plan.Problem(256, 256, 64, False, True, ((gemm_mma.TMA_MAX_WORK_GROUPS, 256 * 64, 256 * 64),))
    assert not gemm_mma._valid(cl_device, cfg, "f16", many)
    assert gemm_mma._valid(cl_device, dataclasses.replace(cfg, tma=0), "f16", many) == gemm_mma._valid(
        cl_device, dataclasses.replace(cfg, tma=0), "f16", few
    )


def test_local_memory_above_the_reported_size_only_after_the_deep_probe(cl_device):
    """Configs above ``CL_DEVICE_LOCAL_MEM_SIZE`` are valid only where ``DEEP`` (96 KB) or the widest TMA
    pipeline (192 KB) built and multiplied correctly."""
    reported = int(cl_device.cl_device.local_mem_size)
    limit = gemm_mma.local_limit(cl_device, "f16")
    deep, wide = 3 * 4 * 2 * 128 * 32, 4 * 4 * (128 + 256) * 32
    if gemm_mma.wide_ok(cl_device, "f16"):
        assert limit == max(reported, wide)
    else:
        assert limit == (max(reported, deep) if gemm_mma.deep_ok(cl_device, "f16") else reported)


def test_every_wgmma_config_on_a_hopper_gpu(cl_device, monkeypatch):
    """Every wgmma config of the search computes float16 and bfloat16 products in all four layouts and tf32 ones
    in the layouts it reads (A untransposed, B transposed; the swapped ones: both untransposed), with
    partial tiles in M, N and K, split along K or not, in grouped block order, and a batch, against
    float64 products of the same operands; float32 operands rounded to f16 / bf16 through registers
    in all four layouts (and a big product's default). Hopper GPUs only (its probe)."""
    if not (cl_device.kind == "opencl" and gemm_mma.wgmma_ok(cl_device, "f16")):
        pytest.skip("wgmma: Hopper GPUs through NVIDIA's OpenCL")
    f32 = np.dtype(np.float32)
    # leading dims of 16-byte rows, as cp.async needs; the second shape runs every stage buffer many times over in
    # dozens of work-groups (where swapped kernels with products in flight went wrong on an H100 while the first
    # shape's products were right)
    shapes = [(296, 200, 136), (1000, 1000, 1000)]
    for (m, n, k), (mode, dtype, layouts) in itertools.product(
        shapes,
        (
            ("f16", np.float16, [(False, False), (False, True), (True, False), (True, True)]),
            ("bf16", nc.bfloat16, [(False, False), (False, True), (True, False), (True, True)]),
            ("tf32", np.float32, [(False, True), (False, False)]),
        ),
    ):
        if not gemm_mma.wgmma_ok(cl_device, mode):
            continue
        for ta, tb in layouts:
            a = _data((k, m) if ta else (m, k), 0).astype(dtype)
            b = _data((n, k) if tb else (k, n), 1).astype(dtype)
            expected = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
            x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
            problem = gemm_plan.Problem(m, n, k, ta, tb, ())
            # tf32: NT on the plain kernels, NN swapped (C^T = B^T A^T); float16: no swapped kernels
            copied = gemm_mma.tma_ok(cl_device, mode)  # tiles by the Tensor Memory Accelerator
            for cfg in [c for c in gemm_mma._grid() if c.wg and c.swap == (mode == "tf32" and not tb)]:
                if cfg.tma and not copied:
                    continue
                for variant in (cfg, dataclasses.replace(cfg, split=0), dataclasses.replace(cfg, group=2)):
                    words = dtype != np.float32  # 16-bit words, copied as they are
                    variant = gemm_mma._aligned(variant, problem, words, words)
                    assert not variant.problems(mode, ta, tb), variant
                    assert gemm_mma._valid(cl_device, variant, mode, problem), variant
                    plan = gemm_mma.make_plan(cl_device, mode, x.dtype, y.dtype, f32, (m, n), problem, cfg=variant)
                    err = np.abs(plan.run(x, y).to_host() - expected).max()
                    # float16 and bfloat16 operands multiply exactly; every mode accumulates on the tensor cores
                    assert err <= _tolerance(k, "high"), (variant.short(), mode, ta, tb, err)
    # tf32 of operands stored M/N-major (NN, TN, TT) on the K-major TMA kernels, those operands transposed first
    if gemm_mma.wgmma_ok(cl_device, "tf32") and gemm_mma.tma_ok(cl_device, "tf32"):
        m, n, k = shapes[1]
        for ta, tb in ((False, False), (True, False), (True, True)):
            a, b = _data((k, m) if ta else (m, k), 6), _data((n, k) if tb else (k, n), 7)
            expected = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
            x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
            problem = gemm_plan.Problem(m, n, k, ta, tb, ())
            pre = [dataclasses.replace(c, pre=1) for c in gemm_mma._grid() if c.tma and not c.swap]
            pre = [gemm_mma._aligned(c, problem, False, False) for c in pre]
            pre = [c for c in pre if gemm_mma._valid(cl_device, c, "tf32", problem)]
            assert len(pre) >= 2, (ta, tb)
            for variant in pre[:2]:
                plan = gemm_mma.make_plan(cl_device, "tf32", x.dtype, y.dtype, f32, (m, n), problem, cfg=variant)
                err = np.abs(plan.run(x, y).to_host() - expected).max()
                assert err <= _tolerance(k, "high"), (variant.short(), ta, tb, err)
    # bfloat16 tensors' default for a big product: their words copied by cp.async, as float16's
    big = gemm_plan.Problem(2048, 2048, 2048, False, False, ())
    if gemm_mma.wgmma_ok(cl_device, "bf16"):
        default = gemm_mma.config(cl_device, "bf16", big, True, True)
        assert default.wg and default.stages >= 2, default
    # the deep pipeline's 96 KB of local memory (above the 48 KB the driver reports) builds and runs on Hopper;
    # big 16-bit products take it by default (tuning off), or where TMA copies, the wide TMA tile's 144 KB
    assert gemm_mma.deep_ok(cl_device, "f16") and gemm_mma.local_limit(cl_device, "f16") > 49152
    # the default, not a search's (or a stored search's) choice
    monkeypatch.setattr(gemm_mma.tune, "select", lambda device, key, candidates, default, *rest, **kw: default)
    default = gemm_mma.config(cl_device, "f16", big, True, True)
    wide = gemm_mma.wide_ok(cl_device, "f16")
    expected = gemm_mma.WIDE if wide else gemm_mma.DEEP
    assert (default.bm, default.bn, default.stages, default.wg, default.tma) == (
        expected.bm,
        expected.bn,
        expected.stages,
        expected.wg,
        expected.tma,
    ), default
    assert gemm_mma.local_limit(cl_device, "f16") == (196608 if wide else 98304)
    # float32 operands rounded to f16 / bf16 as they pass through registers (amp's "fp16", "medium"),
    # within the rounded operands' bound of the float64 product
    m, n, k = shapes[0]
    for mode, precision in (("f16", "fp16"), ("bf16", "medium")):
        if not gemm_mma.wgmma_ok(cl_device, mode, converts=True):
            continue
        default = gemm_mma.config(cl_device, mode, big, False, False)  # (tuning off): register-fed wgmma
        # register-fed wgmma; how many warpgroups is the device's choice (the H200 takes 2, the H100 1)
        assert default.wg and not default.stages, (mode, default)
        for ta, tb in [(False, False), (False, True), (True, False), (True, True)]:
            a, b = _data((k, m) if ta else (m, k), 4), _data((n, k) if tb else (k, n), 5)
            expected = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
            x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
            problem = gemm_plan.Problem(m, n, k, ta, tb, ())
            for cfg in [c for c in gemm_mma._grid() if c.wg == 2 and not (c.swap or c.tma)]:
                variant = gemm_mma._aligned(dataclasses.replace(cfg, stages=0), problem, False, False)
                assert not variant.problems(mode, ta, tb), variant
                plan = gemm_mma.make_plan(cl_device, mode, x.dtype, y.dtype, f32, (m, n), problem, cfg=variant)
                err = np.abs(plan.run(x, y).to_host() - expected).max()
                assert err <= _tolerance(k, precision), (variant.short(), mode, ta, tb, err)
    # a batch of two (each product's operands one stride on)
    a, b = _data((2, m, k), 2).astype(np.float16), _data((2, k, n), 3).astype(np.float16)
    problem = gemm_plan.Problem(m, n, k, False, False, ((2, m * k, k * n),))
    cfg = gemm_mma._aligned(next(c for c in gemm_mma._grid() if c.wg), problem, True, True)
    x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
    plan = gemm_mma.make_plan(cl_device, "f16", x.dtype, y.dtype, f32, (2, m, n), problem, cfg=cfg)
    err = np.abs(plan.run(x, y).to_host() - a.astype(np.float64) @ b.astype(np.float64)).max()
    assert err <= _tolerance(k, "high"), err


def test_tf32x3_on_wgmma_in_every_layout(cl_device, monkeypatch):
    """Every tf32x3 wgmma config of the search (TMA stages split in local memory into hi and lo tiles; tiles of
    operands stored M/N-major transposed by the split, or first by a kernel of their own: ``pre``) multiplies
    within tf32x3's bound of the float64 product in all four layouts, partial tiles in M, N and K, split along
    K or not, grouped, a batch. Without a search every big product runs there. Hopper GPUs only (its probe)."""
    if not (cl_device.kind == "opencl" and gemm_mma.wgmma_ok(cl_device, "tf32x3")):
        pytest.skip("tf32x3 on wgmma: Hopper GPUs through NVIDIA's OpenCL")
    f32 = np.dtype(np.float32)
    configs = [c for c in gemm_mma._grid() if c.wg == 2 and c.tma and not c.swap]
    for (m, n, k, batch), ta, tb in itertools.product(
        [(296, 200, 136, 1), (1000, 1000, 1000, 1), (136, 264, 264, 2)], (False, True), (False, True)
    ):
        a = _data((batch, k, m) if ta else (batch, m, k), 0)
        b = _data((batch, n, k) if tb else (batch, k, n), 1)
        expected = np.swapaxes(a, 1, 2) if ta else a
        expected = expected.astype(np.float64) @ (np.swapaxes(b, 1, 2) if tb else b).astype(np.float64)
        x, y = nc.tensor(a, device=cl_device), nc.tensor(b, device=cl_device)
        problem = gemm_plan.Problem(m, n, k, ta, tb, ((batch, m * k, n * k),) if batch > 1 else ())
        for cfg, pre in itertools.product(configs, (0, 1) if ta or not tb else (0,)):
            cfg = dataclasses.replace(cfg, pre=pre)
            for variant in (cfg, dataclasses.replace(cfg, split=0), dataclasses.replace(cfg, group=2)):
                variant = gemm_mma._aligned(variant, problem, False, False)
                assert not variant.problems("tf32x3", ta, tb), variant
                if not gemm_mma._valid(cl_device, variant, "tf32x3", problem):  # local memory (hi tiles)
                    assert variant.local_bytes("tf32x3", ta, tb) > gemm_mma.local_limit(cl_device, "tf32x3"), variant
                    continue
                plan = gemm_mma.make_plan(cl_device, "tf32x3", f32, f32, f32, (batch, m, n), problem, cfg=variant)
                err = np.abs(plan.run(x, y).to_host().reshape(expected.shape) - expected).max()
                assert err <= _tolerance(k, "tf32x3"), (variant.short(), ta, tb, err)
    monkeypatch.setattr(gemm_mma.tune, "select", lambda device, key, candidates, default, *rest, **kw: default)
    for ta, tb in itertools.product((False, True), (False, True)):
        default = gemm_mma.config(cl_device, "tf32x3", gemm_plan.Problem(2048, 2048, 2048, ta, tb, ()), False, False)
        assert default.wg and default.pre == int(not ta and not tb), (ta, tb, default)


def test_stored_and_converted_bf16_operands_tune_apart(cl_device, tmp_path, monkeypatch):
    """bfloat16 tensors (copied by cp.async) and float32 ones rounded to bf16 in the kernel (amp's "medium",
    no cp.async) keep their tuned choices under different keys, so a staged winner of the first never reaches
    the second; a staged winner under the float32 key (a store older than the split) is not used either."""
    if not (cl_device.kind == "opencl" and gemm_mma.wgmma_ok(cl_device, "bf16")):
        pytest.skip("bf16 cp.async wgmma: Hopper GPUs through NVIDIA's OpenCL")
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    tune.clear(cl_device)
    big = gemm_plan.Problem(2048, 2048, 2048, False, False, ())
    staged = gemm_mma.config(cl_device, "bf16", big, True, True)
    assert staged.stages >= 2, staged
    for operands in ("w11", "f"):
        key = tune.shape_class("mma-bf16", 2048, 2048, 2048, False, "NN", operands)
        tune.remember(cl_device, key, dataclasses.asdict(staged), 1.0)
        converted = gemm_mma.config(cl_device, "bf16", big, False, False)
        assert not converted.stages and converted.wg, (operands, converted)
    tune.clear(cl_device)


def test_tf32_products_of_untransposed_operands_run_swapped(cl_device):
    """On a GPU with tf32 wgmma the default of a big NN product at "high" (tuning off) is the swapped
    kernel (C^T = B^T A^T, B^T's fragments from registers); its results (a bias, then an addend added
    in the store) are within tf32's bound of the float64 product, partial tiles in M, N and K. NT keeps
    the plain wgmma kernel, TN and TT mma.sync. Hopper GPUs only."""
    if not (cl_device.kind == "opencl" and gemm_mma.swap_ok(cl_device)):
        pytest.skip("tf32 wgmma: Hopper GPUs through NVIDIA's OpenCL")

    def default(ta: bool, tb: bool):
        return gemm_mma.config(cl_device, "tf32", gemm_plan.Problem(2048, 2048, 2048, ta, tb, ()), False, False)

    assert default(False, False).swap and default(False, False).wg
    assert default(False, True).wg and not default(False, True).swap
    assert not default(True, False).wg and not default(True, True).wg
    m, n, k = 2056, 1032, 1028
    a, b, bias, addend = _data((m, k), 0), _data((k, n), 1), _data((n,), 2), _data((m, n), 3)
    x, y, row, res = (nc.tensor(v, device=cl_device) for v in (a, b, bias, addend))
    product = a.astype(np.float64) @ b.astype(np.float64)
    got = ops.matmul(x, y, precision="high", bias=row).to_host()
    np.testing.assert_allclose(got, product + bias, rtol=0, atol=_tolerance(k, "high"))
    got = ops.matmul(x, y, precision="high", addend=res).to_host()
    np.testing.assert_allclose(got, product + addend, rtol=0, atol=_tolerance(k, "high"))
    # a code epilogue (the JIT's) with every operand kind, on the swapped kernel unsplit
    f32 = np.dtype(np.float32)
    col, rows = _data((n,), 4), _data((m, 1), 5)
    code = "float ep_out0 = ep_value * ep2 + ep0 * ep1;\nfloat ep_out1 = ep_value;"
    ep = Epilogue("col", "relu", code=code, operands=("col", "row", "scalar", "out"))
    problem = gemm_plan.Problem(m, n, k, False, False, ())
    cfg = gemm_mma._aligned(gemm_mma.MmaConfig(4, 1, 2, 16, 16, stages=3, wg=2, swap=1, split=0), problem, False, False)
    plan = gemm_mma.make_plan(cl_device, "tf32", f32, f32, f32, (m, n), problem, epilogue=ep, cfg=cfg)
    saved = nc.Tensor.empty((m, n), f32, cl_device)
    extras = [nc.tensor(col, device=cl_device), nc.tensor(rows, device=cl_device), 0.5, saved]
    got = plan.run(x, y, row, extras=extras).to_host()
    v = np.maximum(product + bias, 0.0)
    np.testing.assert_allclose(saved.to_host(), v, rtol=0, atol=_tolerance(k, "high"))
    np.testing.assert_allclose(got, v * 0.5 + col * rows, rtol=1e-6, atol=_tolerance(k, "high"))
