"""Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution (``conv_winograd`` and its NumPy twin) against float64 NumPy.

Tolerance: each output is a sum over S channels of 9 products. The direct float32 sum is off by
about sqrt(9S) eps of sum |x||w| (a bound of 9S eps). Winograd sums S products of transformed
values instead, then transforms back: F(2x2)'s transforms add <= 4 values with coefficients +-1
and 1/2, so its intermediates are at most ~9x a direct term and its error a few eps of 9 sum |x||w|
(measured: within 2 eps of it); F(4x4)'s coefficients reach 5 (B), 8 (A) and 1/30 (G), whose
products grow the intermediates ~100x (measured: within 15 eps of 9 sum |x||w|, 64 channels
included). The tests allow 8 eps and 80 eps of ``9 * sum |x||w|``: a wrong tap, a missed tile or
a border error is off by a whole term (~1 here), far above either. Under "tf32x3" on tensor cores
each product of the 16 (36) is off by <= 3 * 2**-22 = 6 eps of |U||V| more, |U||V| up to ~9x
(~100x) a direct term: 8 eps (80 eps) more of ``9 * sum |x||w|`` allowed.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.core as nc
from netcl.core import ShapeError
from netcl.runtime.capture import capture_graph
from netcl.runtime.ops import conv, conv_implicit, conv_winograd, gemm_mma
from netcl.runtime.ops._common import clear_kernel_memo
from netcl.runtime.ops.call_plans import clear_plans
from netcl.runtime.ops.linalg import get_float32_matmul_precision, matmul_precision
from tests.autograd.helpers import raises_before_launch

EPS = float(np.finfo(np.float32).eps)
UNITS = {2: 8 * EPS, 4: 80 * EPS}
TF32X3_EXTRA = {2: 8 * EPS, 4: 80 * EPS}


def _direct(x: np.ndarray, w: np.ndarray, pads: tuple[int, int]) -> np.ndarray:
    """Stride-1 3x3 cross-correlation in float64."""
    n, _, h, width = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[0]), (pads[1], pads[1])))
    oh, ow = h + 2 * pads[0] - 2, width + 2 * pads[1] - 2
    out = np.zeros((n, w.shape[0], oh, ow))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", padded[:, :, i : i + oh, j : j + ow], w[:, :, i, j])
    return out


def _weight_grad(g: np.ndarray, x: np.ndarray, pad: int) -> np.ndarray:
    """d conv / d w in float64: dw[o, c, i, j] = sum over n, h, w of g[n, o, h, w] x_padded[n, c, h + i, w + j]."""
    oh, ow = g.shape[2:]
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    taps = [[np.einsum("nohw,nchw->oc", g, padded[:, :, i : i + oh, j : j + ow]) for j in range(3)] for i in range(3)]
    return np.stack([np.stack(row, axis=-1) for row in taps], axis=-2)


def _flipped(w: np.ndarray) -> np.ndarray:
    """The input gradient's filters: w'[c, o] = w[o, c, ::-1, ::-1]."""
    return np.flip(w, (2, 3)).transpose(1, 0, 2, 3)


def _close(got: np.ndarray, exact: np.ndarray, bound: np.ndarray, unit: float, what: str) -> None:
    err = np.abs(got - exact)
    limit = unit * 9 * bound + 1e-30
    assert np.all(err <= limit), (
        f"{what}: worst error {err.max():.3g} at {np.unravel_index(np.argmax(err / limit), err.shape)}"
    )


@pytest.mark.parametrize("precision", ["highest", "tf32x3"])
@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize(
    "n,c,o,h,width,pad",
    [
        (2, 5, 7, 9, 8, 1),  # odd output rows: the last tile row half outside
        (3, 4, 6, 7, 10, 0),  # no padding: output 5 x 8
        (2, 3, 5, 6, 5, 2),  # padding 2: the input gradient at padding 0
        (1, 16, 16, 12, 12, 1),
    ],
)
def test_winograd_forward_and_gradients(device, precision, tile, n, c, o, h, width, pad):
    """Forward with bias and both gradients against float64 (the 16 or 36 products at matmul
    ``precision``); a gradient's addend is added in its last transform's store: the bits of the
    plain gradient + the addend."""
    rng = np.random.default_rng(tile + c)
    unit = UNITS[tile] + (TF32X3_EXTRA[tile] if precision == "tf32x3" else 0.0)
    x, w, b = rng.standard_normal((n, c, h, width)), rng.standard_normal((o, c, 3, 3)), rng.standard_normal(o)
    put = [nc.tensor(a.astype(np.float32), device=device) for a in (x, w, b)]
    geo = conv.check_conv2d(x.shape, w.shape, b.shape, 1, pad, 1, 1)
    g = rng.standard_normal((n, o, geo.OH, geo.OW))
    gt = nc.tensor(g.astype(np.float32), device=device)
    addends = [nc.tensor(rng.standard_normal(v.shape).astype(np.float32), device=device) for v in (x, w)]
    with matmul_precision(precision):
        y = conv_winograd.forward(*put, geo, tile).to_host()
        dx = conv_winograd.backward_input(gt, put[1], geo, tile=tile).to_host()
        dw = conv_winograd.backward_weight(gt, put[0], geo, tile=tile).to_host()
        summed = [
            conv_winograd.backward_input(gt, put[1], geo, addends[0], tile).to_host(),
            conv_winograd.backward_weight(gt, put[0], geo, addends[1], tile).to_host(),
        ]
    exact, bound = _direct(x, w, (pad, pad)) + b[None, :, None, None], _direct(np.abs(x), np.abs(w), (pad, pad))
    _close(y, exact, bound, unit, "y")
    back = (2 - pad, 2 - pad)
    _close(dx, _direct(g, _flipped(w), back), _direct(np.abs(g), np.abs(_flipped(w)), back), unit, "dx")
    _close(dw, _weight_grad(g, x, pad), _weight_grad(np.abs(g), np.abs(x), pad), unit, "dw")
    for got, plain, addend in zip(summed, (dx, dw), addends, strict=True):
        np.testing.assert_array_equal(got, plain + addend.to_host())


def test_conv2d_picks_winograd_by_layer(device, monkeypatch):
    """conv2d and both gradients run Winograd for float32 3x3 stride-1 layers of >= 16 channels each
    way at precision "highest" or "tf32x3", and at "high" with its products as tf32x3 where tensor
    cores take that (F(2x2) on FMA elsewhere), the other paths (implicit GEMM, im2col) otherwise; the
    tile is NETCL_WINOGRAD's, unset F(4x4) where tf32x3 runs on tensor cores, else F(2x2);
    NETCL_WINOGRAD=0 and ``winograd=False`` turn it off."""
    calls, precisions = [], []

    def recorded(real, name):
        def call(*a, **k):
            calls.append((name, a[-1]))
            precisions.append(get_float32_matmul_precision())
            return real(*a, **k)

        return call

    for name in ("forward", "backward_input", "backward_weight"):
        monkeypatch.setattr(conv_winograd, name, recorded(getattr(conv_winograd, name), name))
    rng = np.random.default_rng(0)

    def run(c: int, o: int, stride: int = 1, **kw) -> list:
        calls.clear()
        x = nc.tensor(rng.standard_normal((2, c, 8, 8)).astype(np.float32), device=device)
        w = nc.tensor(rng.standard_normal((o, c, 3, 3)).astype(np.float32), device=device)
        y = conv.conv2d(x, w, None, stride, 1, **kw)
        geo = conv.check_conv2d(x.shape, w.shape, None, stride, 1, 1, 1)
        conv.conv2d_backward_input(y, w, geo, 1, **kw)
        conv.conv2d_backward_weight(y, x, w.shape, geo, 1, **kw)
        return list(calls)

    every = [("forward", 2), ("backward_input", 2), ("backward_weight", 2)]
    assert run(16, 16) == every
    assert run(16, 8) == [] and run(8, 16) == [] and run(16, 16, stride=2) == []
    assert run(16, 16, winograd=False) == [] and run(16, 16, implicit=False) == []
    assert run(4, 4, winograd=True) == every
    assert run(4, 4, winograd=4) == [(name, 4) for name, _ in every]
    monkeypatch.setenv(conv_winograd.ENV_VAR, "4")
    assert run(16, 16) == [(name, 4) for name, _ in every]
    monkeypatch.setenv(conv_winograd.ENV_VAR, "0")
    assert run(16, 16) == []
    monkeypatch.delenv(conv_winograd.ENV_VAR)
    with matmul_precision("high"):  # tf32 tensor cores: F(4x4) with tf32x3 products, more accurate and faster
        mode = conv_implicit.mma_mode(device, np.dtype(np.float32))
        as_three = conv._winograd_precision(device, mode) == "tf32x3"
        assert as_three == (mode == "tf32")
        precisions.clear()
        assert run(16, 16) == [(name, 4 if as_three else 2) for name, _ in every]
        assert precisions == ["tf32x3" if as_three else "high"] * 3
        assert run(16, 8) == []
    with matmul_precision("medium"):  # bf16 keeps the implicit GEMM on the mma kernel where there is one
        tensor_cores = conv_implicit.mma_mode(device, np.dtype(np.float32)) is not None
        assert run(16, 16) == ([] if tensor_cores else every)
    with matmul_precision("tf32x3"):  # Winograd's products run in tf32x3 there
        three_tf32 = conv_implicit.mma_mode(device, np.dtype(np.float32)) == "tf32x3"
        tile = 4 if three_tf32 else 2
        assert run(16, 16) == [(name, tile) for name, _ in every]
        assert run(4, 4, winograd=True) == [(name, tile) for name, _ in every]
        monkeypatch.setenv(conv_winograd.ENV_VAR, "2")
        assert run(16, 16) == every


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"stride": 2, "winograd": True}, ValueError, r"conv2d: winograd=True needs .* stride \(2, 2\)"),
        ({"dilation": 2, "winograd": 2}, ValueError, r"conv2d: winograd=2 needs .* dilation \(2, 2\)"),
        ({"padding": 3, "winograd": 4}, ValueError, r"padding <= 2; .* padding \(3, 3\)"),
        ({"winograd": 3}, ValueError, r"conv2d: winograd must be None, True, False, 2 or 4, got 3"),
    ],
)
def test_winograd_bad_requests_raise_before_any_launch(device, kwargs, error, match):
    x = nc.tensor(np.ones((1, 4, 9, 9), np.float32), device=device)
    w = nc.tensor(np.ones((4, 4, 3, 3), np.float32), device=device)
    raises_before_launch(device, error, match, lambda: conv.conv2d(x, w, None, **kwargs))


def test_winograd_of_float64_is_an_error(device):
    x = nc.tensor(np.ones((1, 4, 9, 9)), dtype="float64", device=device)
    w = nc.tensor(np.ones((4, 4, 3, 3)), dtype="float64", device=device)
    raises_before_launch(
        device,
        ValueError,
        r"winograd=True needs float32 operands \(OpenCL or NumPy backend\), .* got float64 on (opencl|cpu)",
        lambda: conv.conv2d(x, w, None, 1, 1, winograd=True),
    )


def test_bad_environment_tile_is_an_error(cl_device, monkeypatch):
    monkeypatch.setenv(conv_winograd.ENV_VAR, "3")
    x = nc.tensor(np.ones((1, 16, 6, 6), np.float32), device=cl_device)
    w = nc.tensor(np.ones((16, 16, 3, 3), np.float32), device=cl_device)
    with pytest.raises(ValueError, match=r"NETCL_WINOGRAD must be 0 \(off\), 2 .* or 4 .*, got '3'"):
        conv.conv2d(x, w, None, 1, 1)


@pytest.mark.parametrize("tile", [2, 4])
def test_winograd_transforms_are_shape_generic(cl_device, monkeypatch, tile):
    """A new batch, image size or channel count generates no new transform source (sizes are arguments; on a GPU
    the tile kernels have a second variant, rows as vectors, for widths a multiple of the tile: built once).
    Distinct source texts are counted: one generated again because the program cache evicted its program in
    between (a long run's other builds) is the same text."""
    rng = np.random.default_rng(1)
    made = []
    for part, real in conv_winograd._SOURCES.items():

        def spy(*args, _part=part, _real=real):
            source = _real(*args)
            made.append((_part, source))
            return source

        monkeypatch.setitem(conv_winograd._SOURCES, part, spy)

    def layer(n: int, c: int, side: int) -> None:
        x = nc.tensor(rng.standard_normal((n, c, side, side)).astype(np.float32), device=cl_device)
        w = nc.tensor(rng.standard_normal((c, c, 3, 3)).astype(np.float32), device=cl_device)
        geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
        y = conv_winograd.forward(x, w, None, geo, tile)
        conv_winograd.backward_input(y, w, geo, tile=tile)
        conv_winograd.backward_weight(y, x, geo, tile=tile).to_host()

    # width 7: six kernels, two weight transforms and four others (on a GPU the forward's and the input gradient's
    # input and weight transforms as two joint kernels, the weight gradient's input transform on its own); width 8
    # on a GPU, rows as vectors: the input, output and grad-output kernels again, and the two joint ones
    clear_plans()  # no launch plan of an earlier test's layer
    clear_kernel_memo()
    layer(2, 4, 7)
    layer(2, 4, 8)
    first = set(made)
    rows, fused = conv_winograd.rows_by_vectors(cl_device), conv_winograd.fuses_weight_transform(cl_device)
    assert len(first) == 6 + (0 if not rows else 5 if fused else 3), sorted(part for part, _ in first)
    made.clear()
    for n, c, side in ((3, 4, 9), (1, 5, 12), (2, 3, 16)):
        layer(n, c, side)
    assert set(made) <= first
    clear_plans()


#: Layers (n, c, o, h, width, padding) of the tests of the GPUs' tile-kernel variants: widths a multiple of both
#: tiles and not, odd heights, paddings 0-2, more output than input channels and fewer.
_VARIANT_LAYERS = ((2, 3, 5, 8, 8, 1), (1, 6, 3, 7, 12, 1), (2, 3, 4, 9, 8, 0), (1, 2, 3, 6, 7, 2))


def _passes_at_variant_layers(device, tile: int, weight_gradients: bool = True) -> list[np.ndarray]:
    """At each of ``_VARIANT_LAYERS``, from fresh launch plans: the forward with a bias, the input gradient (and the
    weight gradient) without and with an addend, by Winograd F(``tile`` x ``tile``)."""
    clear_plans()
    out = []
    for n, c, o, h, width, pad in _VARIANT_LAYERS:
        rs = np.random.default_rng(n * 100 + h * 10 + width)
        geo = conv.check_conv2d((n, c, h, width), (o, c, 3, 3), (o,), 1, pad, 1, 1)
        x, w, b, g, ax, aw = (
            nc.tensor(rs.standard_normal(shape).astype(np.float32), device=device)
            for shape in ((n, c, h, width), (o, c, 3, 3), (o,), (n, o, geo.OH, geo.OW), (n, c, h, width), (o, c, 3, 3))
        )
        out += [conv_winograd.forward(x, w, b, geo, tile).to_host()]
        for addends in ((None, None), (ax, aw)):
            out += [conv_winograd.backward_input(g, w, geo, addends[0], tile).to_host()]
            if weight_gradients:
                out += [conv_winograd.backward_weight(g, x, geo, addends[1], tile).to_host()]
    return out


@pytest.mark.parametrize("tile", [2, 4])
def test_tile_rows_moved_as_vectors_give_the_per_element_bits(cl_device, monkeypatch, tile):
    """The GPUs' variant of the tile kernels (a block row's m columns as one vector load or store,
    ``rows_by_vectors``), forced on this CPU device: the forward with a bias, both gradients with and without an
    addend, bit for bit the per-element kernels' results, at layers where rows move as vectors (widths a multiple
    of m, padding 1: every transform; odd heights) and where some do not (padding 0 and 2, odd widths)."""
    per_element = _passes_at_variant_layers(cl_device, tile)
    sources = []
    for part, real in conv_winograd._SOURCES.items():
        keep = lambda *a, _real=real: sources.append(_real(*a)) or sources[-1]  # noqa: E731
        monkeypatch.setitem(conv_winograd._SOURCES, part, keep)
    monkeypatch.setattr(conv_winograd, "rows_by_vectors", lambda device: True)
    clear_kernel_memo()
    by_rows = _passes_at_variant_layers(cl_device, tile)
    vectors = f"float{tile}*)"
    moved = {name for name in ("input", "output", "grad_output") for text in sources
             if f"netcl_wino_{name}(" in text and vectors in text}  # fmt: skip
    assert moved == {"input", "output", "grad_output"}, moved
    assert any("netcl_wino_input(" in text and vectors not in text for text in sources)  # padding 0 / 2: per element
    for got, want in zip(by_rows, per_element, strict=True):
        np.testing.assert_array_equal(got, want)
    monkeypatch.undo()
    clear_kernel_memo()
    clear_plans()


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("tile", [2, 4])
def test_transforms_in_one_launch_give_the_two_launches_bits(cl_device, monkeypatch, tile, rows):
    """The GPUs' joint input and weight transform (``fuses_weight_transform``), forced on this CPU device (with and
    without rows as vectors): the forward with a bias and the input gradient with and without an addend, bit for
    bit the results of the two launches, at ``_VARIANT_LAYERS``; no input or weight transform kernel built alone."""
    monkeypatch.setattr(conv_winograd, "rows_by_vectors", lambda device: rows)
    clear_kernel_memo()
    apart = _passes_at_variant_layers(cl_device, tile, weight_gradients=False)
    monkeypatch.setattr(conv_winograd, "fuses_weight_transform", lambda device: True)
    built = []
    for part, real in conv_winograd._SOURCES.items():
        monkeypatch.setitem(conv_winograd._SOURCES, part, lambda *a, _p=part, _r=real: built.append(_p) or _r(*a))
    clear_kernel_memo()
    for got, want in zip(_passes_at_variant_layers(cl_device, tile, weight_gradients=False), apart, strict=True):
        np.testing.assert_array_equal(got, want)
    assert set(built) == {"input_weight", "output"}
    monkeypatch.undo()
    clear_kernel_memo()
    clear_plans()


@pytest.mark.parametrize(("tile", "products", "bound"), [(2, None, 2.0), (4, "bf16x3", 0.5)])
def test_winograd_variants_of_high_err_as_the_implicit_gemm_on_tf32(cl_device, tile, products, bound):
    """The premise of "high"'s further Winograd candidates, where it runs tf32 on tensor cores: in each pass, the
    largest error against float64 over a 64-channel layer's outputs is within ``bound`` times the implicit GEMM's
    on tf32. ``conv.WINOGRAD_TF32``, F(2x2) with tf32 products: within 2x (measured 1.0-1.3x at ResNet-18's layers
    on an H200, where F(4x4) with tf32 products errs 3.4-4.8x: what keeps F(4x4) off tf32).
    ``conv.WINOGRAD_BF16X3``, F(4x4) with bf16x3 products (operands ~16 bits, 1/21 of tf32's rounding; F(4x4)'s
    transforms grow it ~4x): within half."""
    from netcl.core.dtypes import float32

    with matmul_precision("high"):
        if conv_implicit.mma_mode(cl_device, float32) != "tf32":
            pytest.skip("needs tf32 tensor cores")
    if products is not None and gemm_mma.mode_for(cl_device, float32, float32, products) != products:
        pytest.skip(f"needs {products} on tensor cores")
    rng = np.random.default_rng(9)
    x, g = rng.standard_normal((4, 64, 16, 16)), rng.standard_normal((4, 64, 16, 16))
    w = rng.standard_normal((64, 64, 3, 3)) * np.sqrt(2 / (9 * 64))
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
    xt, wt, gt = (nc.tensor(v.astype(np.float32), device=cl_device) for v in (x, w, g))
    exact = [_direct(x, w, (1, 1)), _direct(g, _flipped(w), (1, 1)), _weight_grad(g, x, 1)]
    with matmul_precision(products or "high"):
        winograd = [
            conv_winograd.forward(xt, wt, None, geo, tile),
            conv_winograd.backward_input(gt, wt, geo, tile=tile),
            conv_winograd.backward_weight(gt, xt, geo, tile=tile),
        ]
    with matmul_precision("high"):
        implicit = [
            conv_implicit.forward(xt, wt, None, geo),
            conv_implicit.backward_input(gt, wt, geo),
            conv_implicit.backward_weight(gt, xt, 64, geo),
        ]
    for name, ours, theirs, want in zip(("y", "dx", "dw"), winograd, implicit, exact, strict=True):
        err, err_implicit = (float(np.abs(t.to_host() - want).max()) for t in (ours, theirs))
        assert err <= bound * err_implicit, f"{name}: F({tile}x{tile}) {err:.3g}, the implicit GEMM {err_implicit:.3g}"


@pytest.mark.parametrize("tile", [2, 4])
def test_the_weight_gradient_reads_the_forwards_input_transform(cl_device, tile):
    """``forward(..., keep=)`` appends x's input transform; ``backward_weight(..., kept=)`` reads it where it is of
    the same x at the same tile and padding: the bits of the gradient that transforms x itself (with and without
    an addend), without the input transform's launch; a transform of another tensor, tile or padding is not read
    (x is transformed again: the same bits)."""
    from netcl.profiler import profile

    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 16, 9, 10)), rng.standard_normal((16, 16, 3, 3))
    g, addend = rng.standard_normal((2, 16, 9, 10)), rng.standard_normal((16, 16, 3, 3))
    xt, wt, gt, at = (nc.tensor(v.astype(np.float32), device=cl_device) for v in (x, w, g, addend))
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
    keep: list = []
    y = conv_winograd.forward(xt, wt, None, geo, tile, keep=keep)
    np.testing.assert_array_equal(y.to_host(), conv_winograd.forward(xt, wt, None, geo, tile).to_host())
    (kept,) = keep
    assert (kept.tile, kept.pads, kept.source) == (tile, (1, 1), xt)
    for extra in (None, at):
        plain = conv_winograd.backward_weight(gt, xt, geo, extra, tile).to_host()
        with profile(cl_device) as prof:
            reused = conv_winograd.backward_weight(gt, xt, geo, extra, tile, kept=kept).to_host()
        names = [event.name for event in prof.events()]
        assert "netcl_wino_grad_output" in names and "netcl_wino_input" not in names, names
        np.testing.assert_array_equal(reused, plain)
    other = nc.tensor(x.astype(np.float32), device=cl_device)  # the same values, another tensor
    unpadded = conv.check_conv2d(x.shape, w.shape, None, 1, 0, 1, 1)
    g0 = nc.tensor(rng.standard_normal((2, 16, 7, 8)).astype(np.float32), device=cl_device)
    for grad, source, geometry, at_tile in ((gt, other, geo, tile), (gt, xt, geo, 6 - tile), (g0, xt, unpadded, tile)):
        with profile(cl_device) as prof:
            got = conv_winograd.backward_weight(grad, source, geometry, None, at_tile, kept=kept).to_host()
        assert "netcl_wino_input" in [event.name for event in prof.events()]
        recomputed = conv_winograd.backward_weight(grad, source, geometry, None, at_tile)
        np.testing.assert_array_equal(got, recomputed.to_host())


def test_winograd_passes_capture_and_replay(cl_device):
    """A captured forward + both gradients (workspaces and the batched products included) replays on
    new inputs with the bits of an eager run on them."""
    rng = np.random.default_rng(2)

    def data(*shape: int) -> nc.Tensor:
        return nc.tensor(rng.standard_normal(shape).astype(np.float32), device=cl_device)

    geo = conv.check_conv2d((2, 16, 10, 9), (16, 16, 3, 3), None, 1, 1, 1, 1)

    def passes(x: nc.Tensor, w: nc.Tensor, g: nc.Tensor) -> tuple:
        y = conv.conv2d(x, w, None, 1, 1)
        return y, conv.conv2d_backward_input(g, w, geo, 1), conv.conv2d_backward_weight(g, x, w.shape, geo, 1)

    graph = capture_graph(cl_device.queue, passes, data(2, 16, 10, 9), data(16, 16, 3, 3), data(2, 16, 10, 9))
    assert {launch.name for launch in graph.launches} >= {"netcl_wino_input", "netcl_wino_output"}
    fresh = (data(2, 16, 10, 9), data(16, 16, 3, 3), data(2, 16, 10, 9))
    replayed = [t.to_host() for t in graph.execute(*fresh, copy_outputs=True)]
    for got, want in zip(replayed, passes(*fresh), strict=True):
        np.testing.assert_array_equal(got, want.to_host())


def _merged_moments(parts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, mean, biased variance) of each channel from its groups' (count, mean, M2) rows, in float64."""
    count, mean, m2 = (parts[:, :, k].astype(np.float64) for k in range(3))
    total = count.sum(1)
    merged = (count * mean).sum(1) / total
    return total, merged, (m2 + count * (mean - merged[:, None]) ** 2).sum(1) / total


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("tile", [2, 4])
def test_the_output_transform_gathers_the_outputs_moments(cl_device, monkeypatch, tile, rows):
    """``forward(..., gather=)``: y's bits unchanged, and its (C, G, 3) moments give each channel's element count
    exactly and its mean and biased variance within 64 eps of max y^2 (float64 of the same y; a missed or doubled
    element moves the mean by ~1/count of a value, ~100x that at these sizes); several groups a channel, edge
    tiles (padding 0) and the rows-as-vectors store (forced on this CPU device) included, with and without a
    bias, on data far from zero (the lanes' sums are shifted)."""
    monkeypatch.setattr(conv_winograd, "rows_by_vectors", lambda device: rows)
    clear_kernel_memo()
    clear_plans()
    rng = np.random.default_rng(5)
    for n, pad, bias in ((40, 1, False), (30, 0, True)):
        x = rng.standard_normal((n, 16, 12, 12)).astype(np.float32) + 3
        w = (rng.standard_normal((24, 16, 3, 3)) * 0.1).astype(np.float32)
        b = nc.tensor(rng.standard_normal(24).astype(np.float32), device=cl_device) if bias else None
        xt, wt = nc.tensor(x, device=cl_device), nc.tensor(w, device=cl_device)
        geo = conv.check_conv2d(x.shape, w.shape, None, 1, pad, 1, 1)
        gathered: list = []
        y = conv_winograd.forward(xt, wt, b, geo, tile, gather=gathered)
        (moments,) = gathered
        assert moments.source is y and moments.groups > 1
        y64 = y.to_host().astype(np.float64)
        np.testing.assert_array_equal(y.to_host(), conv_winograd.forward(xt, wt, b, geo, tile).to_host())
        count, mean, var = _merged_moments(moments.parts.to_host())
        np.testing.assert_array_equal(count, np.full(24, n * geo.OH * geo.OW))
        bound = 64 * EPS * float(np.max(y64**2))
        np.testing.assert_allclose(mean, y64.mean((0, 2, 3)), rtol=0, atol=bound)
        np.testing.assert_allclose(var, y64.var((0, 2, 3)), rtol=0, atol=bound)
    monkeypatch.undo()
    clear_kernel_memo()
    clear_plans()


@pytest.mark.parametrize(("relu", "n"), [(False, 40), (True, 40), (True, 300)])
def test_a_batch_norm_merges_the_gathered_moments(cl_device, relu, n):
    """``batch_norm_forward(..., moments=)`` of a Winograd output in training: mean, rstd, y and the running
    statistics within float32 rounding of the float64 batch norm of the same y (1e-5 relative: the statistics'
    sums are of ~10^4 terms), one launch, and the moments are what it reads (groups' means raised by one raise
    its mean by one); moments of another tensor (a copy of y) are not read: the bits of the call without them.
    At n = 300 a channel has more groups (75) than a CPU work-group lanes (64): lanes merge several first."""
    from netcl.profiler import profile
    from netcl.runtime.ops import batchnorm, moments

    rng = np.random.default_rng(6)
    x = rng.standard_normal((n, 16, 16, 16)).astype(np.float32) + 3
    w = (rng.standard_normal((24, 16, 3, 3)) * 0.1).astype(np.float32)
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
    gathered: list = []
    xt, wt = nc.tensor(x, device=cl_device), nc.tensor(w, device=cl_device)
    y = conv_winograd.forward(xt, wt, None, geo, 2, gather=gathered)
    assert gathered[0].groups > (64 if n == 300 else 1)  # 64 tiles an image, work-groups of <= 256 tiles
    scale = nc.tensor(rng.standard_normal(24).astype(np.float32), device=cl_device)

    def normalized(source: nc.Tensor, moments) -> list[np.ndarray]:
        rm = nc.tensor(np.zeros(24, np.float32), device=cl_device)
        rv = nc.tensor(np.ones(24, np.float32), device=cl_device)
        out = batchnorm.batch_norm_forward(source, rm, rv, scale, None, True, 0.1, 1e-5, relu=relu, moments=moments)
        return [t.to_host() for t in (*out, rm, rv)]

    with profile(cl_device) as prof:
        got = normalized(y, gathered[0])
    assert [event.name for event in prof.events() if event.name.startswith("netcl_")] == ["netcl_batch_norm"]
    y64 = y.to_host().astype(np.float64)
    mean, var, count = y64.mean((0, 2, 3)), y64.var((0, 2, 3)), y64.size / 24
    rstd = 1 / np.sqrt(var + 1e-5)
    want = (y64 - mean[:, None, None]) * (rstd * scale.to_host())[:, None, None]
    want = np.maximum(want, 0) if relu else want
    running = (0.1 * mean, 0.9 + 0.1 * var * count / (count - 1))
    for value, ref in zip(got, (want, mean, rstd, *running), strict=True):
        np.testing.assert_allclose(value, ref, rtol=1e-5, atol=1e-5)
    parts = gathered[0].parts.to_host()
    parts[:, :, 1] += 1.0  # every group's mean one higher: so is the batch mean the norm reports
    shifted = moments.ChannelMoments(y, nc.tensor(parts, device=cl_device))
    np.testing.assert_allclose(normalized(y, shifted)[1], mean + 1, rtol=1e-5, atol=1e-5)
    copy = nc.tensor(y.to_host(), device=cl_device)
    for value, plain in zip(normalized(copy, gathered[0]), normalized(copy, None), strict=True):
        np.testing.assert_array_equal(value, plain)


@pytest.mark.parametrize("bad", [[None], "moments"])
def test_moments_of_another_type_raise_before_any_launch(device, bad):
    from netcl.runtime.ops import batchnorm

    x = nc.tensor(np.ones((2, 3, 4, 4), np.float32), device=device)
    match = f"batch_norm: moments must be ChannelMoments or None, got {type(bad).__name__}"
    raises_before_launch(
        device, TypeError, match, lambda: batchnorm.batch_norm_forward(x, None, None, training=True, moments=bad)
    )


@pytest.mark.parametrize("shape", [(4, 2, 3), (3, 2, 2), (3, 0, 3)])
def test_moments_of_another_shape_raise_before_any_launch(cl_device, shape):
    from netcl.runtime.ops import batchnorm, moments

    x = nc.tensor(np.ones((2, 3, 4, 4), np.float32), device=cl_device)
    bad = moments.ChannelMoments(x, nc.tensor(np.ones(shape, np.float32), device=cl_device))
    match = r"batch_norm: moments.parts must be float32 of shape \(3, groups >= 1, 3\) for x of 3 channels"
    raises_before_launch(
        cl_device, ShapeError, match, lambda: batchnorm.batch_norm_forward(x, None, None, training=True, moments=bad)
    )
