"""The layer kernels of the runtime (im2col/col2im, pooling, strided copies, indexing, dropout).

Values are checked through autograd's ``check_op`` tests (tests/autograd/test_ops_layers.py and
test_ops_shape.py); here: col2im is the adjoint of im2col, and every layer kernel is shape-generic
(a new batch or image size builds no program).
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.runtime import ops as R
from netcl.runtime.cache import program_cache
from netcl.runtime.ops import (
    conv,
    conv_winograd,
    gathering,
    gemm_mma,
    host_blas,
    indexing,
    pool,
    selecting,
    shape,
    strided,
)
from netcl.runtime.ops.random import dropout


@pytest.mark.parametrize("stride,padding,dilation", [(1, 1, 1), (2, 0, 1), ((2, 1), (1, 2), 2)])
def test_col2im_is_the_adjoint_of_im2col(device, stride, padding, dilation):
    """<im2col(x), c> == <x, col2im(c)> for random x and c (float32 sums of ~500 terms: rtol 1e-4)."""
    rng = np.random.default_rng(0)
    geo = conv.ConvGeometry(
        (2, 3, 7, 6),
        (3, 2),
        conv.pair(stride, "stride", "t", 1),
        conv.pair(padding, "padding", "t", 0),
        conv.pair(dilation, "dilation", "t", 1),
        "t",
    )
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    c = rng.standard_normal((2, 3 * 3 * 2, geo.OH * geo.OW)).astype(np.float32)
    cols = conv.im2col(nc.tensor(x, device=device), geo).to_host()
    back = conv.col2im(nc.tensor(c, device=device), geo).to_host()
    lhs = np.sum(cols.astype(np.float64) * c)
    rhs = np.sum(x.astype(np.float64) * back)
    assert lhs == pytest.approx(rhs, rel=1e-4)


def _layer_calls(n: int, h: int, device: nc.Device) -> None:
    """One call of every layer kernel at batch ``n`` and image size ``h`` x ``h + 1``."""
    rng = np.random.default_rng(n)
    x = nc.tensor(rng.standard_normal((n, 2, h, h + 1)), device=device)
    geo = conv.ConvGeometry(x.shape, (3, 3), (1, 1), (1, 1), (1, 1), "t")
    conv.col2im(conv.im2col(x, geo), geo)
    g = pool.max_pool2d(x, 2)
    pool.max_pool2d_backward(g, x, 2)
    pool.avg_pool2d_backward(pool.avg_pool2d(x, 3, 1, 1), x.shape, 3, 1, 1)
    pool.adaptive_avg_pool2d_backward(pool.adaptive_avg_pool2d(x, 1), x.shape)
    flat = x.reshape(n * 2, h * (h + 1))
    index = nc.tensor(rng.integers(0, h, size=(n * 2, 3)).astype(np.int64), device=device)
    gathering.gather_backward(gathering.gather(flat, 1, index), 1, index, flat.shape)
    rows = nc.tensor(np.arange(n) % 2, device=device)
    selecting.index_select_backward(selecting.index_select(flat, 0, rows), 0, rows, flat.shape)
    indexing.getitem_backward(
        indexing.getitem(x, (slice(None), 1, slice(None, None, 2))), x.shape, (slice(None), 1, slice(None, None, 2))
    )
    shape.pad_backward(shape.pad(x, (1, 1, 0, 2)), x.shape, (1, 1, 0, 2))
    dropout(x, 0.5, 1)


def test_layer_kernels_are_shape_generic(cl_device):
    """A second batch size and image size reuse every program the first one built."""
    _layer_calls(2, 5, cl_device)
    before = program_cache.stats().misses
    _layer_calls(3, 7, cl_device)
    assert program_cache.stats().misses == before


def _conv_three(x, w, b, g, geo, implicit: bool) -> list:
    """conv2d (``geo``'s stride, padding, dilation) and its input and weight gradients for upstream ``g``."""
    step, pad, dil = (geo.SH, geo.SW), (geo.PH, geo.PW), (geo.DH, geo.DW)
    return [
        conv.conv2d(x, w, b, step, pad, dil, implicit=implicit),
        conv.conv2d_backward_input(g, w, geo, 1, implicit=implicit),
        conv.conv2d_backward_weight(g, x, w.shape, geo, 1, implicit=implicit),
    ]


@pytest.mark.parametrize(
    "image,stride,padding,dilation",
    [
        ((6, 7, 6), 2, 1, 1),  # OW 3: every group of four columns taken element by element
        ((16, 9, 10), 1, 1, 1),  # OW 10: groups of four in a row and across rows; C = 16: a K tile shares (ki, kj)
        ((4, 12, 11), (2, 1), (2, 1), 2),  # strided, dilated, asymmetric: OH 6, OW 9
    ],
)
def test_implicit_conv_matches_im2col_and_reuses_programs(cl_device, monkeypatch, image, stride, padding, dilation):
    """The implicit-GEMM conv (fwd, dx, dw) against im2col + matmul and float64; a new batch builds nothing.

    Host BLAS off: a CPU device would run these short reductions as im2col + BLAS. Sums of <= 6*9
    (forward, input gradient; 16*9 with 16 channels) and 3*12*11 (weight gradient) float32 terms of
    N(0, 1) values: atol 1e-4 (float32 rounding of such sums stays below 1e-5).
    """
    monkeypatch.setenv(host_blas.ENV_VAR, "0")
    rng = np.random.default_rng(5)
    w64, b64 = rng.standard_normal((5, image[0], 3, 3)), rng.standard_normal(5)
    w, b = nc.tensor(w64.astype(np.float32), device=cl_device), nc.tensor(b64.astype(np.float32), device=cl_device)
    before = None
    for n in (3, 2):
        x64 = rng.standard_normal((n, *image))
        x = nc.tensor(x64.astype(np.float32), device=cl_device)
        geo = conv.check_conv2d(x.shape, w.shape, None, stride, padding, dilation, 1)
        assert conv._use_implicit(True, x, w, b, 1, geo)
        g = nc.tensor(rng.standard_normal((n, 5, geo.OH, geo.OW)).astype(np.float32), device=cl_device)
        got = [out.to_host() for imp in (True, False) for out in _conv_three(x, w, b, g, geo, imp)]
        for k in range(3):
            np.testing.assert_allclose(got[k], got[k + 3], atol=1e-4, err_msg=str(k))
        i, j = geo.SH - geo.PH, geo.SW - geo.PW  # output pixel (1, 1): its taps start at input (i, j)
        if i >= 0 and j >= 0:
            patch = x64[:, :, i : i + 2 * geo.DH + 1 : geo.DH, j : j + 2 * geo.DW + 1 : geo.DW]
            np.testing.assert_allclose(got[0][:, :, 1, 1], np.einsum("nchw,ochw->no", patch, w64) + b64, atol=1e-4)
        if before is None:
            before = program_cache.stats().misses
    assert program_cache.stats().misses == before


def _input_gradient_float64(g64: np.ndarray, w64: np.ndarray, geo) -> np.ndarray:
    """d x of conv2d in float64 by scattering every output pixel's gradient through every tap."""
    n, c = g64.shape[0], w64.shape[1]
    padded = np.zeros((n, c, geo.H + 2 * geo.PH + geo.KH * geo.SH, geo.W + 2 * geo.PW + geo.KW * geo.SW))
    for ki in range(geo.KH):
        for kj in range(geo.KW):
            rows, cols = slice(ki, ki + geo.SH * geo.OH, geo.SH), slice(kj, kj + geo.SW * geo.OW, geo.SW)
            padded[:, :, rows, cols] += np.einsum("noyx,oc->ncyx", g64, w64[:, :, ki, kj])
    return padded[:, :, geo.PH : geo.PH + geo.H, geo.PW : geo.PW + geo.W]


@pytest.mark.parametrize(
    "image,stride,padding,taps",
    [
        ((3, 7, 6), 2, 1, [1, 2, 2, 4]),  # ResNet's downsampling 3x3: odd rows and columns reached by two taps
        ((2, 9, 20), (2, 3), (1, 0), [1, 1, 1, 2, 2, 2]),  # asymmetric; 7 columns a class
        ((2, 1, 1), 2, 1, [1]),  # a 1x1 image: the other classes have no pixels
    ],
)
def test_a_strided_input_gradient_runs_one_product_per_stride_class(
    cl_device, monkeypatch, image, stride, padding, taps
):
    """conv2d's input gradient at stride > 1 runs one implicit product per remainder of the input pixel modulo the
    stride, over only the taps that reach it, each storing its own pixels of one output: against float64 (sums
    of <= 4*3*3 float32 products of N(0, 1) values, atol 1e-4), with an addend summed in the store. (The FMA
    kernel; the tensor-core one keeps one product, ``test_implicit_conv_under_tensor_core_precision``.)"""
    from netcl.runtime.ops import conv_implicit

    monkeypatch.setenv(host_blas.ENV_VAR, "0")  # a CPU device would run these short reductions as im2col + BLAS
    rng = np.random.default_rng(7)
    x64 = rng.standard_normal((2, *image))
    w64 = rng.standard_normal((4, image[0], 3, 3))
    geo = conv.check_conv2d(x64.shape, w64.shape, None, stride, padding, 1, 1)
    classes = conv_implicit.stride_classes(geo)
    assert [cls.taps_h * cls.taps_w for cls in classes] == taps
    g64 = rng.standard_normal((2, 4, geo.OH, geo.OW))
    addend64 = rng.standard_normal(x64.shape)
    w, g, addend = (nc.tensor(v.astype(np.float32), device=cl_device) for v in (w64, g64, addend64))
    expected = _input_gradient_float64(g64, w64, geo)
    with R.matmul_precision("highest"):
        np.testing.assert_allclose(conv_implicit.backward_input(g, w, geo).to_host(), expected, atol=1e-4)
        summed = conv_implicit.backward_input(g, w, geo, addend).to_host()
    np.testing.assert_allclose(summed, expected + addend64, atol=1e-4)
    keys = {key for key in conv_implicit.CHOSEN if "dx|" in key and str(geo.values) in key and "|class " in key}
    assert len(keys) == len(classes)


def _forward_float64(x64: np.ndarray, w64: np.ndarray, b64: np.ndarray, geo) -> np.ndarray:
    """conv2d in float64: every output pixel's window of the zero-padded input against every filter."""
    padded = np.pad(x64, ((0, 0), (0, 0), (geo.PH, geo.PH), (geo.PW, geo.PW)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (geo.KH, geo.KW), axis=(2, 3))
    windows = windows[:, :, :: geo.SH, :: geo.SW][:, :, : geo.OH, : geo.OW]
    return np.einsum("ncyxij,ocij->noyx", windows, w64) + b64.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("precision", ["highest", "tf32x3"])
@pytest.mark.parametrize("stride", [1, 2])
def test_a_convolution_split_along_k_sums_through_its_output_view(cl_device, monkeypatch, precision, stride):
    """A layer with few output tiles and a long reduction (64 -> 128 channels, 3x3, a 6x6 image) splits its
    implicit GEMM along K: the partial products are plain rows and the split sum applies the bias or the addend
    and stores through the output's view (NCHW; at stride 2 on the FMA kernel a stride class's pixels). Forward
    and input gradient against float64: sums of <= 1,152 products of N(0, 1) values (|sum| < 200), whose float32
    rounding in any order stays below 1e-3 (tf32x3 is within 2**-20 of a float32 product)."""
    from netcl.runtime.ops import conv_implicit, gemm_mma
    from netcl.runtime.ops.gemm_source import GemmConfig

    if precision != "highest" and not gemm_mma.available(cl_device, precision):
        pytest.skip("no tensor cores: the FMA kernel runs every precision")
    monkeypatch.setenv(host_blas.ENV_VAR, "0")
    monkeypatch.setenv("NETCL_TUNE", "0")  # the defaults, which split where tiles are few
    monkeypatch.setattr(conv_implicit, "_PLANS", {})
    if not cl_device.is_gpu:  # a CPU device's default does not split an output view: this one does
        monkeypatch.setattr(conv_implicit, "_default", lambda device, kind, problem: GemmConfig(16, 16, 8, 8, 16))
    rng = np.random.default_rng(3)
    x64, w64, b64 = rng.standard_normal((2, 64, 6, 6)), rng.standard_normal((128, 64, 3, 3)), rng.standard_normal(128)
    geo = conv.check_conv2d(x64.shape, w64.shape, None, stride, 1, 1, 1)
    g64, addend64 = rng.standard_normal((2, 128, geo.OH, geo.OW)), rng.standard_normal(x64.shape)
    x, w, b, g, addend = (nc.tensor(v.astype(np.float32), device=cl_device) for v in (x64, w64, b64, g64, addend64))
    with R.matmul_precision(precision):
        y = conv_implicit.forward(x, w, b, geo).to_host()
        dx = conv_implicit.backward_input(g, w, geo, addend).to_host()
    np.testing.assert_allclose(y, _forward_float64(x64, w64, b64, geo), atol=1e-3)
    np.testing.assert_allclose(dx, _input_gradient_float64(g64, w64, geo) + addend64, atol=1e-3)
    split = {key[0] for key, plan in conv_implicit._PLANS.items() if getattr(plan, "work", None) is not None}
    assert split == {"fwd", "dx"}


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize(
    "image,window,stride,padding",
    [((5, 7, 6), 3, 2, 1), ((4, 9, 20), 3, (2, 3), (1, 0)), ((3, 8, 8), 1, 2, 0), ((2, 5, 5), 3, 1, 1)],
)
def test_the_input_gradient_as_a_product_of_stored_operands_and_a_gather(
    cl_device, image, window, stride, padding, batched
):
    """``gemm_backward_input``: w^T @ dy as one product (dy's images behind its channels) or one per image, then
    each input pixel sums the columns of its taps: against float64 (sums of <= 6*3*3 float32 products of N(0, 1)
    values, atol 1e-4); an addend summed in the gather rounds as a float32 add of the two."""
    rng = np.random.default_rng(11)
    x_shape, w64 = (3, *image), rng.standard_normal((6, image[0], window, window))
    geo = conv.check_conv2d(x_shape, w64.shape, None, stride, padding, 1, 1)
    g64 = rng.standard_normal((3, 6, geo.OH, geo.OW))
    w, g = (nc.tensor(v.astype(np.float32), device=cl_device) for v in (w64, g64))
    got = conv.gemm_backward_input(g, w, geo, batched).to_host()
    np.testing.assert_allclose(got, _input_gradient_float64(g64, w64, geo), atol=1e-4)
    addend = nc.tensor(rng.standard_normal(x_shape).astype(np.float32), device=cl_device)
    summed = conv.gemm_backward_input(g, w, geo, batched, addend).to_host()
    assert np.array_equal(summed, (addend.to_host() + got).astype(np.float32))  # rounded as an add after it


def _strided_input_gradient_with_addend(device: nc.Device) -> tuple[np.ndarray, np.ndarray]:
    """(``conv2d_backward_input`` of a stride-2 3x3 layer with an addend on ``device``, its float64 reference)."""
    rng = np.random.default_rng(5)
    x_shape, w64 = (4, 6, 12, 12), rng.standard_normal((8, 6, 3, 3))
    geo = conv.check_conv2d(x_shape, w64.shape, None, 2, 1, 1, 1)
    g64, addend64 = rng.standard_normal((4, 8, geo.OH, geo.OW)), rng.standard_normal(x_shape)
    w, g, addend = (nc.tensor(v.astype(np.float32), device=device) for v in (w64, g64, addend64))
    got = conv.conv2d_backward_input(g, w, geo, 1, addend=addend).to_host()
    return got, _input_gradient_float64(g64, w64, geo) + addend64


@pytest.mark.parametrize(
    "image,window,stride,padding",
    [((5, 7, 6), 3, 2, 1), ((4, 9, 20), 3, (2, 3), (1, 0)), ((3, 8, 8), 1, 2, 0), ((6, 5, 5), 3, 1, 1)],
)
def test_the_forward_as_one_product_of_stored_operands(cl_device, image, window, stride, padding):
    """``gemm_forward``: w @ x's receptive fields laid out as one product's rows (``im2col_rows``: im2col's columns
    with the images behind the taps, bit for bit), the images then moved in front of the channels, plus the bias:
    against float64 (sums of <= 6*3*3 float32 products of N(0, 1) values, atol 1e-4)."""
    rng = np.random.default_rng(12)
    x64, w64, b64 = rng.standard_normal((3, *image)), rng.standard_normal((5, image[0], window, window)), rng.random(5)
    geo = conv.check_conv2d(x64.shape, w64.shape, None, stride, padding, 1, 1)
    x, w, b = (nc.tensor(v.astype(np.float32), device=cl_device) for v in (x64, w64, b64))
    per_image = conv.im2col(x, geo).to_host()  # (N, K, L)
    rows = conv.im2col_rows(x, geo).to_host()
    assert np.array_equal(rows, per_image.transpose(1, 0, 2).reshape(rows.shape))
    with R.matmul_precision("highest"):
        got = conv.gemm_forward(x, w, b, geo).to_host()
    np.testing.assert_allclose(got, _forward_float64(x64, w64, b64, geo), atol=1e-4)


def _paths_spied(monkeypatch) -> list[str]:
    """The names of the convolution paths each later call runs (Winograd's three passes as "winograd F<tile> <the
    matmul precision its products ran at>", the implicit GEMM's and the stored products' forward and input
    gradient), in order."""
    from netcl.runtime.ops import conv_implicit

    ran: list[str] = []
    for module, name, label in [
        (conv_winograd, "forward", "winograd"),
        (conv_winograd, "backward_input", "winograd"),
        (conv_winograd, "backward_weight", "winograd"),
        (conv_implicit, "forward", "implicit"),
        (conv_implicit, "backward_input", "implicit"),
        (conv, "gemm_forward", "gemm"),
    ]:
        original = getattr(module, name)

        def spy(*args, _original=original, _label=label, **kwargs):
            if _label == "winograd":  # (conv.py passes the tile last)
                _label = f"winograd F{args[-1]} {R.get_float32_matmul_precision()}"
            ran.append(_label)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return ran


def _weight_gradient_float64(g64: np.ndarray, x64: np.ndarray, geo) -> np.ndarray:
    """d w of conv2d in float64: every tap's window of the zero-padded input against the upstream gradient."""
    padded = np.pad(x64, ((0, 0), (0, 0), (geo.PH, geo.PH), (geo.PW, geo.PW)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (geo.KH, geo.KW), axis=(2, 3))
    windows = windows[:, :, :: geo.SH, :: geo.SW][:, :, : geo.OH, : geo.OW]
    return np.einsum("ncyxij,noyx->ocij", windows, g64)


@pytest.mark.parametrize(
    "kind,algorithm",
    [(k, a) for k, names in conv._ALGORITHMS.items() for a in (*names, conv.WINOGRAD_TF32, conv.WINOGRAD_BF16X3)],
)
def test_each_algorithm_of_a_searched_pass_runs_what_it_names(cl_device, kind, algorithm, monkeypatch):
    """Each pass of a 3x3 stride-1 layer of 16 channels runs the path ``_gpu_algorithm`` names (Winograd a
    candidate: it applies; here as F(2x2) with its products at "tf32x3", as "high" runs them on tensor cores, so that
    ``WINOGRAD_TF32`` is F(2x2) at the current precision, ``WINOGRAD_BF16X3`` F(4x4) on "bf16x3"), the gradients with
    an addend summed in their store or gather: against float64 (sums of <= 16*3*3 float32 products of N(0, 1)
    values, the weight gradient's of 2*6*6; atol 2e-4, Winograd's transforms included; "tf32x3" and "bf16x3" are
    float32 where no tensor cores take them; bf16x3's products are off by <= 3 * 2**-16 of |a b|, whose sums here
    are ~92, grown ~4x by F(4x4)'s transforms: atol 2e-2, where tf32 or bf16 products would be off by 0.4-1)."""
    from netcl.runtime import clear_caches

    rng = np.random.default_rng(6)
    x64, w64 = rng.standard_normal((2, 16, 6, 6)), rng.standard_normal((16, 16, 3, 3))
    geo = conv.check_conv2d(x64.shape, w64.shape, None, 1, 1, 1, 1)
    g64, addend64 = rng.standard_normal((2, 16, 6, 6)), rng.standard_normal(x64.shape)
    x, w, g, addend = (nc.tensor(v.astype(np.float32), device=cl_device) for v in (x64, w64, g64, addend64))
    w_addend64 = rng.standard_normal(w64.shape)
    w_addend = nc.tensor(w_addend64.astype(np.float32), device=cl_device)
    monkeypatch.setenv(host_blas.ENV_VAR, "0")  # a CPU device would run "implicit" as im2col + BLAS
    monkeypatch.setattr(conv, "_gpu_algorithm", lambda *args: algorithm)
    monkeypatch.setattr(conv, "_winograd_tile", lambda *args: (2, "tf32x3"))
    ran = _paths_spied(monkeypatch)
    original, products = conv.gemm_backward_input, []
    monkeypatch.setattr(conv, "gemm_backward_input", lambda *a: products.append(a[3]) or original(*a))
    clear_caches()  # no plan of an earlier test's choice
    with R.matmul_precision("highest"):
        if kind == "fwd":
            got, expected = conv.conv2d(x, w, None, 1, 1).to_host(), _forward_float64(x64, w64, np.zeros(16), geo)
        elif kind == "dx":
            got = conv.conv2d_backward_input(g, w, geo, 1, addend=addend).to_host()
            expected = _input_gradient_float64(g64, w64, geo) + addend64
        else:
            got = conv.conv2d_backward_weight(g, x, w.shape, geo, 1, addend=w_addend).to_host()
            expected = _weight_gradient_float64(g64, x64, geo) + w_addend64
    clear_caches()
    np.testing.assert_allclose(got, expected, atol=2e-2 if algorithm == conv.WINOGRAD_BF16X3 else 2e-4)
    winograd = {"winograd": "F2 tf32x3", conv.WINOGRAD_TF32: "F2 highest", conv.WINOGRAD_BF16X3: "F4 bf16x3"}
    named = "winograd " + winograd[algorithm] if algorithm in winograd else algorithm
    assert ran == ([] if algorithm == "batched-gemm" or (kind, algorithm) == ("dx", "gemm") else [named])
    assert products == {"gemm": [False], "batched-gemm": [True]}.get(algorithm, []) * (kind == "dx")


@pytest.mark.parametrize("algorithm", [a for a in conv._ALGORITHMS["dx"] if a != "winograd"])
def test_each_strided_input_gradient_algorithm_runs_with_its_addend(cl_device, algorithm, monkeypatch):
    """``conv2d_backward_input`` of a strided layer (no Winograd) runs the algorithm ``_gpu_algorithm`` names, the
    addend summed in its store or its gather: against float64 (sums of <= 8*3*3 float32 products of N(0, 1) values,
    atol 1e-4)."""
    from netcl.runtime import clear_caches

    original, ran = conv.gemm_backward_input, []

    def spy(grad, w, geo, batched=False, addend=None):
        ran.append((batched, addend is not None))
        return original(grad, w, geo, batched, addend)

    monkeypatch.setattr(conv, "_gpu_algorithm", lambda *args: algorithm)
    monkeypatch.setattr(conv, "gemm_backward_input", spy)
    clear_caches()  # no plan of an earlier test's choice
    got, expected = _strided_input_gradient_with_addend(cl_device)
    clear_caches()
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert ran == {"implicit": [], "gemm": [(False, True)], "batched-gemm": [(True, True)]}[algorithm]


def test_a_gpu_measures_which_path_runs_a_strided_input_gradient(cl_device, searching):
    """On a GPU with searches on, a strided layer's input gradient is timed by the implicit GEMM and by
    ``gemm_backward_input`` at its first use, the winner stored under its own key and run (with the addend added):
    against float64 (sums of <= 8*3*3 float32 products of N(0, 1) values, atol 1e-4)."""
    from netcl.runtime import tune

    if not cl_device.is_gpu:
        pytest.skip("the measured choice is made on GPUs")
    got, expected = _strided_input_gradient_with_addend(cl_device)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    chosen = [v["algorithm"] for k, v in tune.winners(cl_device).items() if k.startswith("conv-dx-algorithm|")]
    assert len(chosen) == 1 and chosen[0] in conv._ALGORITHMS["dx"][1:]


def test_a_gpu_measures_which_path_runs_a_winograd_layer(cl_device, searching):
    """On a GPU with searches on, the forward and the input gradient of a 3x3 stride-1 layer of 16 channels are
    timed by Winograd, the implicit GEMM and the products of stored operands at their first use, each winner stored
    under a key naming the Winograd tile and run: against float64 (sums of <= 16*3*3 float32 products of N(0, 1)
    values, atol 2e-4)."""
    from netcl.runtime import tune

    if not cl_device.is_gpu:
        pytest.skip("the measured choice is made on GPUs")
    rng = np.random.default_rng(8)
    x64, w64, g64 = (rng.standard_normal(s) for s in [(4, 16, 12, 12), (16, 16, 3, 3), (4, 16, 12, 12)])
    geo = conv.check_conv2d(x64.shape, w64.shape, None, 1, 1, 1, 1)
    x, w, g = (nc.tensor(v.astype(np.float32), device=cl_device) for v in (x64, w64, g64))
    with R.matmul_precision("highest"):
        y, dx = conv.conv2d(x, w, None, 1, 1).to_host(), conv.conv2d_backward_input(g, w, geo, 1).to_host()
    np.testing.assert_allclose(y, _forward_float64(x64, w64, np.zeros(16), geo), atol=2e-4)
    np.testing.assert_allclose(dx, _input_gradient_float64(g64, w64, geo), atol=2e-4)
    winners = tune.winners(cl_device)
    for kind in ("fwd", "dx"):
        chosen = [v["algorithm"] for k, v in winners.items() if k.startswith(f"conv-{kind}-algorithm|")]
        keys = [k for k in winners if k.startswith(f"conv-{kind}-algorithm|")]
        assert len(chosen) == 1 and chosen[0] in conv._ALGORITHMS[kind] and "|winograd " in keys[0]


@pytest.mark.parametrize(
    "memory,searched", [(16 * 64 * 9 * 8 * 8 * 8 * 4, True), (16 * 64 * 9 * 8 * 8 * 8 * 4 - 1, False)]
)
def test_a_strided_input_gradient_searches_the_gather_path_only_where_its_columns_fit(
    cl_device, memory, searched, monkeypatch
):
    """``_gpu_algorithm`` on a GPU: a layer whose columns (C*KH*KW x N*OH*OW floats) exceed 1/16 of the device's
    memory keeps the implicit GEMM without a search; one whose columns fit is searched."""
    from netcl.runtime import tune

    monkeypatch.setattr(type(cl_device), "is_gpu", property(lambda self: True))
    monkeypatch.setattr(type(cl_device), "global_mem_size", property(lambda self: memory))
    monkeypatch.setattr(tune, "select", lambda *args, **kwargs: "searched")
    g = nc.tensor(np.zeros((8, 16, 8, 8), np.float32), device=cl_device)
    w = nc.tensor(np.zeros((16, 64, 3, 3), np.float32), device=cl_device)
    geo = conv.check_conv2d((8, 64, 16, 16), w.shape, None, 2, 1, 1, 1)
    assert conv._gpu_algorithm("dx", True, g, w, 1, geo, 16, 0, None) == ("searched" if searched else "implicit")


@pytest.mark.parametrize("products", [None, "tf32x3"])
@pytest.mark.parametrize("kind", ["fwd", "dx", "dw"])
def test_a_winograd_layer_searches_winograd_beside_the_other_paths_and_keeps_it_without_a_search(
    cl_device, kind, products, monkeypatch
):
    """``_gpu_algorithm`` on a GPU for a layer Winograd F(4x4) takes: Winograd among the candidates (and, where its
    products run as tf32x3, F(2x2) on tf32: ``WINOGRAD_TF32``, and where tensor cores take bf16x3, F(4x4) on it:
    ``WINOGRAD_BF16X3``), under a key of its own (the tile, and the variants, appended), and the choice where nothing
    is measured; a stored choice this version does not offer is refused (searched again); off GPUs, where the caller
    asked for Winograd and where Winograd is the one candidate (the weight gradient but beside the variants),
    Winograd without a search."""
    from netcl.runtime import tune

    x = nc.tensor(np.zeros((8, 16, 8, 8), np.float32), device=cl_device)
    w = nc.tensor(np.zeros((16, 16, 3, 3), np.float32), device=cl_device)
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
    if not cl_device.is_gpu:
        assert conv._gpu_algorithm(kind, True, x, w, 1, geo, 16, 4, products) == "winograd"
    monkeypatch.setattr(type(cl_device), "is_gpu", property(lambda self: True))
    asked = []

    def select(device, key, candidates, default, trial, encode, decode, **kwargs):
        asked.append((key, list(candidates), default, decode))
        return default

    monkeypatch.setattr(tune, "select", select)
    assert conv._gpu_algorithm(kind, True, x, w, 1, geo, 16, 4, products) == "winograd"
    expected = list(conv._ALGORITHMS[kind])
    bf16x3 = products == "tf32x3" and gemm_mma.available(cl_device, "bf16x3")
    if products == "tf32x3":
        expected.insert(1, conv.WINOGRAD_TF32)
    if bf16x3:
        expected.insert(1, conv.WINOGRAD_BF16X3)
    if len(expected) == 1:
        assert asked == []
        return
    ((key, candidates, default, decode),) = asked
    assert key.startswith(f"conv-{kind}-algorithm|")
    assert key.endswith(("|winograd 4 or 2 on tf32" if products else "|winograd 4") + " or 4 on bf16x3" * bf16x3)
    assert candidates == expected and default == "winograd"
    assert decode({"algorithm": expected[-1]}) == expected[-1]
    with pytest.raises(ValueError, match="unknown"):
        decode({"algorithm": "fft"})
    asked.clear()
    assert conv._gpu_algorithm(kind, True, x, w, 1, geo, 16, 4, products, True) == "winograd"  # asked for
    assert asked == []
    if kind != "dw":
        assert conv._gpu_algorithm(kind, True, x, w, 1, geo, 16, 0, None) == "implicit"  # no Winograd: no candidate
        assert "winograd" not in " ".join(asked[0][1]) and "|winograd" not in asked[0][0]


def test_no_stride_class_split_where_a_remainder_has_no_tap_or_the_window_is_dilated():
    """A 1x1 window at stride 2 reaches only even pixels, a dilated window's taps do not fall in classes: one
    product over every tap, as at stride 1."""
    from netcl.runtime.ops import conv_implicit

    for x_shape, w_shape, stride, padding, dilation in [
        ((1, 2, 8, 8), (3, 2, 1, 1), 2, 0, 1),
        ((1, 2, 8, 8), (3, 2, 3, 3), 2, 1, 2),
        ((1, 2, 8, 8), (3, 2, 3, 3), 1, 1, 1),
    ]:
        geo = conv.check_conv2d(x_shape, w_shape, None, stride, padding, dilation, 1)
        assert conv_implicit.stride_classes(geo) is None


@pytest.mark.parametrize("with_bias", [False, True])
def test_pointwise_conv_is_one_batched_product(device, monkeypatch, with_bias):
    """A 1x1 stride-1 unpadded layer: conv2d and its input gradient run as batched products of the
    stored tensors (no im2col, no implicit GEMM), against float64 (sums of 24 float32 products of
    N(0, 1) values: atol 1e-4); the input gradient with an addend is the plain one + the addend bit
    for bit; any stride, padding or groups takes the other paths."""
    from netcl.runtime.ops import conv_implicit

    rng = np.random.default_rng(11)
    x64, w64, b64 = rng.standard_normal((3, 24, 5, 7)), rng.standard_normal((10, 24, 1, 1)), rng.standard_normal(10)
    g64, extra = rng.standard_normal((3, 10, 5, 7)), rng.standard_normal((3, 24, 5, 7)).astype(np.float32)
    x, w, b, g = (nc.tensor(a.astype(np.float32), device=device) for a in (x64, w64, b64, g64))
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 0, 1, 1)
    for name in ("forward", "backward_input"):
        monkeypatch.setattr(conv_implicit, name, lambda *a, **k: pytest.fail("the implicit GEMM ran"))
    monkeypatch.setattr(conv, "im2col", lambda *a, **k: pytest.fail("im2col ran"))
    y = conv.conv2d(x, w, b if with_bias else None).to_host()
    dx = conv.conv2d_backward_input(g, w, geo, 1).to_host()
    summed = conv.conv2d_backward_input(g, w, geo, 1, addend=nc.tensor(extra, device=device)).to_host()
    want = np.einsum("oc,nchw->nohw", w64[:, :, 0, 0], x64) + (b64[:, None, None] if with_bias else 0)
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(dx, np.einsum("oc,nohw->nchw", w64[:, :, 0, 0], g64), rtol=0, atol=1e-4)
    np.testing.assert_array_equal(summed, dx + extra)
    for stride, padding, groups in ((2, 0, 1), (1, 1, 1), (1, 0, 2)):
        other = conv.check_conv2d(x.shape, (10, 24 // groups, 1, 1), None, stride, padding, 1, groups)
        assert not conv._pointwise(True, x, w, groups, other)
    assert not conv._pointwise(False, x, w, 1, geo)


@pytest.mark.parametrize("implicit", [True, False], ids=["implicit", "im2col"])
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_conv_gradients_with_an_addend(device, monkeypatch, implicit, precision):
    """conv2d's input and weight gradients with ``addend=``: the bits of the plain gradient + the
    addend (one float add, in the implicit GEMM's store or an add kernel); bad addends raise first."""
    monkeypatch.setenv(host_blas.ENV_VAR, "0")
    rng = np.random.default_rng(3)
    x = nc.tensor(rng.standard_normal((2, 6, 9, 8)).astype(np.float32), device=device)
    w = nc.tensor(rng.standard_normal((5, 6, 3, 3)).astype(np.float32), device=device)
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
    g = nc.tensor(rng.standard_normal((2, 5, geo.OH, geo.OW)).astype(np.float32), device=device)
    with R.matmul_precision(precision):
        for fn, shape in (
            (lambda **kw: conv.conv2d_backward_input(g, w, geo, 1, implicit=implicit, **kw), x.shape),
            (lambda **kw: conv.conv2d_backward_weight(g, x, w.shape, geo, 1, implicit=implicit, **kw), w.shape),
        ):
            addend = rng.standard_normal(shape).astype(np.float32)
            got = fn(addend=nc.tensor(addend, device=device)).to_host()
            np.testing.assert_array_equal(got, fn().to_host() + addend)
            with pytest.raises(nc.ShapeError, match="addend must have shape"):
                fn(addend=nc.tensor(addend[:1], device=device))
            with pytest.raises(TypeError, match="addend must be a Tensor"):
                fn(addend=addend)


@pytest.mark.parametrize(
    "precision,pipeline,unit",
    [
        ("high", "registers", 2.0**-10),
        ("high", "cp.async", 2.0**-9),
        ("medium", "registers", 2.0**-7),
        ("tf32x3", "registers", 2.0**-20),
        ("tf32x3", "cp.async", 2.0**-20),
    ],
)
@pytest.mark.parametrize("shape,stride", [((3, 6, 7, 6), 2), ((2, 16, 9, 10), 1)])
def test_implicit_conv_under_tensor_core_precision(cl_device, monkeypatch, precision, pipeline, unit, shape, stride):
    """conv2d, input and weight gradient under a tf32 / bf16 matmul precision: on tensor cores the
    implicit views feed the mma kernel (elsewhere the FMA kernel runs); each element within the
    rounding bound of its sum: operands rounded to tf32 (bf16) are each off by <= 2**-11 (2**-8)
    relative, a product by ~2**-10 (2**-7), so |error| <= unit * sum |x||w| (+ float32 summation).
    The cp.async pipeline copies raw float32 words, which the mma truncates: 2**-10 per operand,
    2**-9 a product. tf32x3 splits each operand into tf32 hi + lo (off by <= 2**-22 relative) and
    drops lo * lo: <= 3 * 2**-22 a product, within 2**-20.
    """
    from netcl.runtime.ops import conv_implicit, gemm_mma
    from netcl.runtime.ops.gemm_mma_source import MmaConfig

    mode = {"high": "tf32", "medium": "bf16", "tf32x3": "tf32x3"}[precision]
    if pipeline == "cp.async":
        if not gemm_mma.available(cl_device, mode) or not gemm_mma._async_ok(cl_device, mode):
            pytest.skip("no cp.async tensor-core pipeline on this device")
        staged = MmaConfig(2, 2, 2, 4, 8, stages=3)
        monkeypatch.setattr(
            gemm_mma, "view_default", lambda d, m, p, v: gemm_mma._view_flags(staged, m, p, v)
        )  # what conv_implicit falls back to without a search (NETCL_TUNE=0 in the tests)
        monkeypatch.setattr(conv_implicit, "_PLANS", {})
        monkeypatch.setattr(conv_implicit, "CHOSEN", {})
    tensor_cores = gemm_mma.available(cl_device, mode)
    if not tensor_cores and shape[1] != 6:
        pytest.skip("no tensor cores: the first shape checks the fallback to the FMA kernel")
    monkeypatch.setenv(host_blas.ENV_VAR, "0")
    rng = np.random.default_rng(11)
    x64 = rng.standard_normal(shape)
    w64 = rng.standard_normal((5, shape[1], 3, 3))  # the geometry of the test above: no new programs on PoCL
    b64 = rng.standard_normal(5)
    geo = conv.check_conv2d(x64.shape, w64.shape, None, stride, 1, 1, 1)
    g64 = rng.standard_normal((shape[0], 5, geo.OH, geo.OW))
    put = [nc.tensor(v.astype(np.float32), device=cl_device) for v in (x64, w64, b64, g64)]
    magnitudes = [nc.tensor(np.abs(v).astype(np.float32), device=cl_device) for v in (x64, w64, g64)]
    exact = [out.to_host() for out in _conv_three(*put, geo, True)]  # "highest": tested against float64 above
    bounds = [out.to_host() for out in _conv_three(magnitudes[0], magnitudes[1], None, magnitudes[2], geo, True)]
    with R.matmul_precision(precision):
        got = [out.to_host() for out in _conv_three(*put, geo, True)]
    chosen = [cfg for key, cfg in conv_implicit.CHOSEN.items() if f"mma-{mode}-" in key]
    assert bool(chosen) == tensor_cores
    if pipeline == "cp.async":
        # staged wherever both operands can be copied so (a weight whose rows are not 16-byte
        # aligned, 6 channels * 9 taps, is loaded through registers)
        assert len(chosen) == 3 and all(cfg.stages == 3 or not (cfg.va and cfg.vb) for cfg in chosen)
        assert any(cfg.stages == 3 for cfg in chosen)
    for k, name in enumerate(("forward", "input gradient", "weight gradient")):
        bound = unit * bounds[k] + 1e-4 + (np.abs(b64).reshape(1, -1, 1, 1) * 2.0**-20 if k == 0 else 0)
        assert np.all(np.abs(got[k] - exact[k]) <= bound), name
        if tensor_cores:  # the rounding shows: not the FMA kernel's result
            assert not np.array_equal(got[k], exact[k]), name


def test_host_blas_cpu_device_runs_short_conv_reductions_as_im2col(cl_device, monkeypatch):
    """On a host-memory CPU device with host BLAS on, K = C*KH*KW < 256 takes im2col + BLAS; longer is implicit."""
    if not host_blas.host_memory_device(cl_device):
        pytest.skip("a GPU: every supported conv is implicit")
    monkeypatch.setenv(host_blas.ENV_VAR, "1")
    for channels, implicit in ((6, False), (64, True)):
        x = nc.tensor(np.zeros((1, channels, 4, 4), np.float32), device=cl_device)
        w = nc.tensor(np.zeros((2, channels, 3, 3), np.float32), device=cl_device)
        geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
        assert conv._use_implicit(True, x, w, None, 1, geo) is implicit


def test_host_blas_cpu_device_measures_long_conv_reductions(cl_device, monkeypatch, tmp_path):
    """With the search allowed (NETCL_TUNE unset), a host-memory CPU device times the implicit GEMM
    against im2col + BLAS at a layer's first use (K = 64*9 here), stores the winner and reuses it;
    the pass's result is the same sum either way (a stride-2 layer: no Winograd)."""
    from netcl.runtime import tune

    if not host_blas.host_memory_device(cl_device):
        pytest.skip("a GPU: every supported conv is implicit")
    monkeypatch.setenv(host_blas.ENV_VAR, "1")
    monkeypatch.setenv("NETCL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(tune.ENV, raising=False)
    tune.clear(cl_device)
    rng = np.random.default_rng(4)
    x64, w64 = rng.standard_normal((2, 64, 9, 9)), rng.standard_normal((8, 64, 3, 3))
    x, w = (nc.tensor(v.astype(np.float32), device=cl_device) for v in (x64, w64))
    geo = conv.check_conv2d(x.shape, w.shape, None, 2, 1, 1, 1)
    measured = []
    real_search = tune.search
    monkeypatch.setattr(tune, "search", lambda *a, **k: measured.append(a[1]) or real_search(*a, **k))
    chosen = conv._use_implicit(True, x, w, None, 1, geo)
    assert measured == [["implicit", "im2col"]]
    key = f"conv-algorithm-fwd|<f4|8|{geo.values}"
    assert tune.lookup(cl_device, key)["algorithm"] == ("implicit" if chosen else "im2col")
    assert conv._use_implicit(True, x, w, None, 1, geo) is chosen and len(measured) == 1
    got = conv.conv2d(x, w, None, 2, 1).to_host()
    patch = x64[:, :, 1:4, 1:4]  # output pixel (1, 1) reads input rows and columns 1-3
    np.testing.assert_allclose(got[:, :, 1, 1], np.einsum("nchw,ochw->no", patch, w64), atol=5e-4)  # 576-term sums
    tune.clear(cl_device)


@pytest.mark.parametrize("kind", ["fwd", "dx", "dw"])
def test_an_algorithm_trial_makes_only_the_operands_its_pass_reads(cl_device, kind):
    """``conv._AlgorithmTrial`` runs its pass by each algorithm on scratch operands, made only for what the pass
    reads (a whole-batch input-gradient trial makes no x), and returns the pass's result shape."""
    geo = conv.check_conv2d((3, 4, 9, 9), (8, 4, 3, 3), None, 2, 1, 1, 1)
    trial = conv._AlgorithmTrial(cl_device, geo, 8, kind, np.dtype(np.float32), whole=True)
    shapes = {"fwd": (3, 8, 5, 5), "dx": (3, 4, 9, 9), "dw": (8, 4, 3, 3)}
    algorithms = ["implicit", "im2col"] + {"fwd": ["gemm"], "dx": ["gemm", "batched-gemm"], "dw": []}[kind]
    assert [trial(algorithm)().shape for algorithm in algorithms] == [shapes[kind]] * len(algorithms)
    assert set(trial.scratch[1]) == set(conv._TRIAL_OPERANDS[kind])


@pytest.mark.parametrize("algorithm", ["winograd", conv.WINOGRAD_TF32, conv.WINOGRAD_BF16X3])
@pytest.mark.parametrize("kind", ["fwd", "dx", "dw"])
def test_a_winograd_trial_runs_its_pass_by_winograd(cl_device, kind, algorithm, monkeypatch):
    """``conv._AlgorithmTrial("winograd")`` of a 3x3 stride-1 layer runs its pass by Winograd F(tile x tile) with
    its products at the trial's precision ("tf32x3" here), ``WINOGRAD_TF32`` by F(2x2) at the current one,
    ``WINOGRAD_BF16X3`` by F(4x4) on bf16x3, on its scratch operands (uniform values in [-1, 1), sums of 16*3*3
    products, the weight gradient's of 2*6*6; against float64, atol 1e-4, bf16x3's 5e-3 (its products off by
    <= 3 * 2**-16 of |a b|, whose sums here are ~36, grown ~4x by F(4x4)'s transforms); "tf32x3" and "bf16x3" are
    float32 where no tensor cores take them)."""
    ran = _paths_spied(monkeypatch)
    geo = conv.check_conv2d((2, 16, 6, 6), (16, 16, 3, 3), None, 1, 1, 1, 1)
    trial = conv._AlgorithmTrial(cl_device, geo, 16, kind, np.dtype(np.float32), True, 2, "tf32x3")
    with R.matmul_precision("highest"):
        got = trial(algorithm)().to_host()
    one, operands = trial.scratch
    host = {name: operand.to_host().astype(np.float64) for name, operand in operands.items()}
    if kind == "fwd":
        expected = _forward_float64(host["x"], host["w"], np.zeros(16), one)
    elif kind == "dx":
        expected = _input_gradient_float64(host["g"], host["w"], one)
    else:
        expected = _weight_gradient_float64(host["g"], host["x"], one)
    np.testing.assert_allclose(got, expected, atol=5e-3 if algorithm == conv.WINOGRAD_BF16X3 else 1e-4)
    named = {"winograd": "F2 tf32x3", conv.WINOGRAD_TF32: "F2 highest", conv.WINOGRAD_BF16X3: "F4 bf16x3"}[algorithm]
    assert ran == ["winograd " + named]


def test_strided_copy_bounds_are_checked(device):
    x = nc.tensor(np.arange(6, dtype=np.float32), device=device)
    with pytest.raises(IndexError, match=r"reaches flat positions \[-1, 3\] outside a tensor of 6 elements"):
        strided.strided_copy(x, (2, 2), (3, -1), 0)
    np.testing.assert_array_equal(strided.strided_copy(x, (2, 3), (1, 2), 0).to_host(), [[0, 2, 4], [1, 3, 5]])


def test_runtime_layer_ops_without_autograd(device):
    """The eager library alone runs a conv-pool-flatten step (no netcl.autograd import needed)."""
    rng = np.random.default_rng(1)
    x = nc.tensor(rng.standard_normal((2, 1, 6, 6)), device=device)
    w = nc.tensor(rng.standard_normal((4, 1, 3, 3)), device=device)
    y = R.max_pool2d(R.relu(R.conv2d(x, w, None, 1, 1)), 2)
    assert y.shape == (2, 4, 3, 3)
    joined = R.concat([R.getitem(y, (slice(None), 0)), R.narrow(y, 1, 1, 1).reshape(2, 3, 3)], axis=1)
    assert joined.shape == (2, 6, 3)
    np.testing.assert_array_equal(joined.to_host()[:, 3:], y.to_host()[:, 1])


def _has_fp16(device: nc.Device) -> bool:
    return device.kind == "cpu" or "cl_khr_fp16" in device.extensions


def test_float16_layer_ops_follow_float32(device):
    """float16 (amp's dtype) through every layer kernel, against the float32 result (rtol 1e-2: fp16 rounding)."""
    if not _has_fp16(device):
        pytest.skip(f"{device.name} has no cl_khr_fp16")
    rng = np.random.default_rng(3)
    x32 = rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    w32 = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    index = nc.tensor(np.array([3, 0, 3]), device=device)
    calls = [
        lambda x, w: R.conv2d(x, w, None, 1, 1, 1, 2),
        lambda x, w: conv.conv2d_backward_input(
            R.conv2d(x, w, None, 1, 1, 1, 2), w, conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 2), 2
        ),
        lambda x, w: pool.max_pool2d_backward(pool.max_pool2d(x, 2), x, 2),
        lambda x, w: pool.avg_pool2d_backward(pool.avg_pool2d(x, 3, 1, 1), x.shape, 3, 1, 1),
        lambda x, w: pool.adaptive_avg_pool2d(x, (2, 3)),
        lambda x, w: R.concat(
            [R.getitem(x, (slice(None), slice(None), slice(None, None, 2))), R.pad(x, (0, 0, 1, 0))], 2
        ),
        lambda x, w: selecting.index_select_backward(selecting.index_select(x, 1, index), 1, index, x.shape),
        lambda x, w: R.dropout(x, 0.5, 9),
    ]
    for k, call in enumerate(calls):
        want = call(nc.tensor(x32, device=device), nc.tensor(w32, device=device)).to_host()
        got = call(nc.tensor(x32, np.float16, device), nc.tensor(w32, np.float16, device))
        assert got.dtype == np.float16, k
        np.testing.assert_allclose(got.to_host().astype(np.float32), want, rtol=1e-2, atol=2e-2, err_msg=str(k))
