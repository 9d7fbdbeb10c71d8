"""Layer ops (conv2d, pooling, dropout) vs float64 NumPy references, one ``check`` line per case.

The references are written independently of netcl's kernels: convolution and pooling loop over
kernel offsets on a padded float64 array (no im2col); adaptive pooling loops over output cells.
Tolerances: forward sums of <= 27 float32 products (|terms| <= 4) stay within 1e-4 absolute;
gradients (float32 sums of <= 150 terms against exact float64 finite differences) within 1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.runtime as rt
from netcl.runtime.ops import host_blas

X, W = (2, 3, 5, 5), (4, 3, 3, 3)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def np_conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    per = o // groups
    for g in range(groups):
        xs = xp[:, g * cg : (g + 1) * cg]
        ws = w[g * per : (g + 1) * per]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw]
                out[:, g * per : (g + 1) * per] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out if b is None else out + b[None, :, None, None]


def np_pool(x, kernel, stride=None, padding=0, kind="max"):
    (kh, kw), (ph, pw) = _pair(kernel), _pair(padding)
    sh, sw = _pair(kernel if stride is None else stride)
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    oh = (x.shape[2] + 2 * ph - kh) // sh + 1
    ow = (x.shape[3] + 2 * pw - kw) // sw + 1
    parts = [
        xp[:, :, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw] for i in range(kh) for j in range(kw)
    ]
    return np.max(parts, axis=0) if kind == "max" else np.sum(parts, axis=0) / (kh * kw)


def np_adaptive_avg(x, size):
    oh, ow = _pair(size)
    h, w = x.shape[2:]
    out = np.zeros((*x.shape[:2], oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, h1 = (i * h) // oh, -(-(i + 1) * h // oh)
            w0, w1 = (j * w) // ow, -(-(j + 1) * w // ow)
            out[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return out


def distinct(shape, seed=0):
    """Values 0.05 apart in random order: no ties inside a pooling window, even after +-1e-3 steps."""
    n = int(np.prod(shape))
    return (np.random.default_rng(seed).permutation(n) * 0.05 - n * 0.025).reshape(shape)


# ---- conv2d ---------------------------------------------------------------------------------------
def test_conv2d(check):
    # inputs in [-1, 1): gradcheck's float32 differences need |sum(w * out)| small (rounding ~1e-7 |L| / eps)
    check([X, W, (4,)], np_conv2d, ag.conv2d, atol=1e-4, grad_atol=1e-3, low=-1.0, high=1.0)


def test_conv2d_weight_gradient_reads_the_forwards_winograd_transform(device):
    """A Winograd layer (float32, 3x3, stride 1, 16 channels each way) keeps x's input transform from the forward
    for its weight gradient: the backward launches no input transform on OpenCL devices, and its gradients are the
    bits of the runtime's passes, which transform x themselves."""
    from netcl.profiler import profile
    from netcl.runtime.ops import conv

    rng = np.random.default_rng(8)
    x = ag.tensor(rng.standard_normal((2, 16, 8, 8)).astype(np.float32), device=device)
    w = ag.tensor(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), device=device, requires_grad=True)
    g = rng.standard_normal((2, 16, 8, 8)).astype(np.float32)
    with ag.Tape() as tape:
        y = ag.conv2d(x, w, None, 1, 1)
        loss = ag.sum(y * ag.tensor(g, device=device))
    with profile(device) as prof:
        tape.backward(loss)
        got = w.grad.to_host()
    geo = conv.check_conv2d(x.shape, w.shape, None, 1, 1, 1, 1)
    upstream = ag.tensor(g, device=device).value
    expected = conv.conv2d_backward_weight(upstream, x.value, tuple(w.shape), geo, 1).to_host()
    np.testing.assert_array_equal(got, expected)
    names = [event.name for event in prof.events()]
    if device.kind == "opencl":
        assert "netcl_wino_grad_output" in names and "netcl_wino_input" not in names, names


def test_conv2d_padding_no_bias(check):
    check(
        [X, W],
        lambda x, w: np_conv2d(x, w, padding=1),
        lambda x, w: ag.conv2d(x, w, padding=1),
        atol=1e-4,
        grad_atol=1e-3,
        gradcheck=False,
    )


def test_conv2d_stride2(check):
    check(
        [(2, 3, 6, 5), W, (4,)],
        lambda x, w, b: np_conv2d(x, w, b, stride=2, padding=(1, 0)),
        lambda x, w, b: ag.conv2d(x, w, b, stride=2, padding=(1, 0)),
        atol=1e-4,
        grad_atol=1e-3,
        gradcheck=False,
    )


def test_conv2d_dilation2(check):
    check(
        [(1, 2, 7, 6), (3, 2, 3, 2)],
        lambda x, w: np_conv2d(x, w, padding=2, dilation=2),
        lambda x, w: ag.conv2d(x, w, None, 1, 2, 2),
        atol=1e-4,
        grad_atol=1e-3,
        gradcheck=False,
    )


def test_conv2d_groups2(check):
    check(
        [(2, 4, 5, 4), (6, 2, 3, 2), (6,)],
        lambda x, w, b: np_conv2d(x, w, b, stride=(1, 2), groups=2),
        lambda x, w, b: ag.conv2d(x, w, b, stride=(1, 2), groups=2),
        atol=1e-4,
        grad_atol=1e-3,
        gradcheck=False,
    )


def np_conv2d_same(x, w, dilation=1):
    """torch's padding="same" written out: the input padded by total // 2 on top / left and the rest (one more
    where the total d (k - 1) is odd) on the bottom / right, then a valid convolution."""
    (dh, dw), (kh, kw) = _pair(dilation), w.shape[2:]
    th, tw = dh * (kh - 1), dw * (kw - 1)
    xp = np.pad(x, ((0, 0), (0, 0), (th // 2, th - th // 2), (tw // 2, tw - tw // 2)))
    return np_conv2d(xp, w, dilation=dilation)


@pytest.mark.parametrize(("ws", "dilation"), [((4, 3, 3, 3), 1), ((3, 3, 4, 3), (1, 3)), ((2, 3, 2, 2), 2)])
def test_conv2d_same_and_valid_padding(check, ws, dilation):
    """torch's padding strings: "same" keeps H x W (an even kernel pads its extra row / column at the bottom /
    right), "valid" pads nothing."""
    check(
        [(2, 3, 6, 7), ws],
        lambda x, w: np_conv2d_same(x, w, dilation),
        lambda x, w: ag.conv2d(x, w, padding="same", dilation=dilation),
        atol=1e-4,
        grad_atol=1e-3,
        gradcheck=False,
    )
    check(
        [(2, 3, 6, 7), ws],
        lambda x, w: np_conv2d(x, w, dilation=dilation),
        lambda x, w: ag.conv2d(x, w, padding="valid", dilation=dilation),
        atol=1e-4,
        grad_atol=1e-3,
        gradcheck=False,
    )


def np_conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """torch's transposed convolution by its definition: every input pixel scatters x * w into the output at
    i * stride - padding + k * dilation (no gradient identity used)."""
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = map(_pair, (stride, padding, output_padding, dilation))
    n, cin, h, wd = x.shape
    _, per, kh, kw = w.shape
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    full = np.zeros((n, per * groups, oh + 2 * ph + kh * dh, ow + 2 * pw + kw * dw))
    cin_g = cin // groups
    for g in range(groups):
        xs, ws = x[:, g * cin_g : (g + 1) * cin_g], w[g * cin_g : (g + 1) * cin_g]
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", xs, ws[:, :, i, j])
                full[:, g * per : (g + 1) * per, i * dh : i * dh + sh * h : sh, j * dw : j * dw + sw * wd : sw] += (
                    contrib
                )
    out = full[:, :, ph : ph + oh, pw : pw + ow]
    return out if b is None else out + b[None, :, None, None]


@pytest.mark.parametrize(
    ("xs", "ws", "kwargs"),
    [
        ((2, 4, 3, 4), (4, 3, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
        ((1, 4, 4, 3), (4, 1, 3, 2), {"stride": (2, 3), "padding": (1, 0), "output_padding": (0, 2), "groups": 2}),
        ((2, 3, 3, 3), (3, 2, 3, 3), {"stride": 2, "padding": 2, "dilation": 2}),
    ],
)
def test_conv_transpose2d(check, xs, ws, kwargs):
    """torch's conv_transpose2d against its scatter definition: strides, padding, output_padding, groups,
    dilation, with a bias."""
    check(
        [xs, ws, (ws[1] * kwargs.get("groups", 1),)],
        lambda x, w, b: np_conv_transpose2d(x, w, b, **kwargs),
        lambda x, w, b: ag.conv_transpose2d(x, w, b, **kwargs),
        atol=1e-4,
        grad_atol=1e-3,
        gradcheck=False,
    )


def np_interpolate(x, out_sizes, scales, mode, align_corners=False):
    """torch's interpolate by its definition, axis by axis in float64: source positions in float32 (as torch's
    kernels compute them; a given scale factor, else the size ratio), then the nearest sample or the two
    neighbours weighted by the fraction."""
    f32 = np.float32
    for k, (target, scale) in enumerate(zip(out_sizes, scales, strict=True)):
        axis, length = 2 + k, x.shape[2 + k]
        dst = np.arange(target, dtype=f32)
        ratio = f32(1 / scale) if scale else f32(length / target)
        if mode in ("nearest", "nearest-exact"):
            offset = f32(0.5) if mode == "nearest-exact" else f32(0)
            src = np.minimum(np.floor((dst + offset) * ratio), length - 1).astype(int)
            x = np.take(x, src, axis=axis)
            continue
        if align_corners:
            pos = dst * (f32((length - 1) / (target - 1)) if target > 1 else f32(0))
        else:
            pos = np.maximum((dst + f32(0.5)) * ratio - f32(0.5), f32(0))
        lo = np.minimum(np.floor(pos).astype(int), length - 1)
        hi = np.minimum(lo + 1, length - 1)
        frac = (pos - lo).astype(np.float64).reshape((-1,) + (1,) * (x.ndim - axis - 1))
        x = np.take(x, lo, axis=axis) * (1 - frac) + np.take(x, hi, axis=axis) * frac
    return x


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bilinear-corners"])
@pytest.mark.parametrize(("size", "scale_factor"), [(None, 2), ((11, 4), None), (None, (1.5, 0.7))])
def test_interpolate_2d(check, mode, size, scale_factor):
    """torch's interpolate on (N, C, H, W): up and down, by size or scale factor; gradients by finite differences."""
    align = mode.endswith("corners")
    name = mode.removesuffix("-corners")
    xs = (2, 3, 5, 6)
    outs = size or tuple(int(np.floor(n * f)) for n, f in zip(xs[2:], np.broadcast_to(scale_factor, 2), strict=True))
    scales = (None, None) if size else tuple(np.broadcast_to(scale_factor, 2).astype(float))
    check(
        [xs],
        lambda x: np_interpolate(x, outs, scales, name, align),
        lambda x: ag.interpolate(x, size, scale_factor, name, True if align else None),
        atol=1e-5,
        grad_atol=1e-3,
        gradcheck=False,
    )


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("widths", [(1, 2, 3, 0), (0, 2, 1, 1)])
def test_pad_modes(check, mode, widths):
    """torch's non-constant ``F.pad`` modes against NumPy's ``np.pad`` (reflect, edge, wrap), gradients by finite
    differences (reflected and wrapped cells send theirs back to the cells they copy)."""
    numpy_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    pairs = ((0, 0), (0, 0), (widths[2], widths[3]), (widths[0], widths[1]))
    check(
        [(2, 3, 4, 5)],
        lambda x: np.pad(x, pairs, mode=numpy_mode),
        lambda x: ag.pad(x, widths, mode=mode),
        gradcheck=False,
    )


#: Shapes of the implicit-GEMM path (netcl.runtime.ops.conv_implicit, on OpenCL devices): 3x3 pad 1 at
#: stride 1 and 2, 1x1 at stride 2 (a ResNet shortcut; at stride 1 its forward and input gradient are
#: batched products, ``conv._pointwise``, its weight gradient implicit), odd image sizes, batch > 1,
#: channel counts no tile divides, and a weight gradient whose reduction (N * OH * OW = 512) is split
#: along K. Sums of <= 512 float32 terms. Host BLAS off: a CPU device would run these short reductions
#: as im2col + BLAS.
IMPLICIT = [
    ((3, 5, 9, 7), (6, 5, 3, 3), 1, 1),
    ((2, 5, 9, 7), (7, 5, 3, 3), 2, 1),
    ((3, 6, 5, 7), (5, 6, 1, 1), 1, 0),
    ((3, 6, 5, 7), (5, 6, 1, 1), 2, 0),
    ((2, 3, 16, 16), (4, 3, 3, 3), 1, 1),
    ((1, 17, 6, 5), (19, 17, 3, 3), 1, 1),
    ((2, 16, 7, 5), (16, 16, 3, 3), 1, 1),  # 16 channels: a K tile shares one kernel offset
]


@pytest.mark.parametrize("xs,ws,stride,padding", IMPLICIT)
def test_conv2d_implicit_gemm_shapes(check, monkeypatch, xs, ws, stride, padding):
    monkeypatch.setenv(host_blas.ENV_VAR, "0")
    check(
        [xs, ws, (ws[0],)],
        lambda x, w, b: np_conv2d(x, w, b, stride, padding),
        lambda x, w, b: ag.conv2d(x, w, b, stride, padding),
        atol=1e-4,
        grad_atol=1e-3,
        low=-1.0,
        high=1.0,
        gradcheck=False,
    )


def test_conv2d_1x1_only_weight_grad(check):
    check(
        [(2, 3, 4, 4), (5, 3, 1, 1)],
        np_conv2d,
        ag.conv2d,
        atol=1e-4,
        grad_atol=1e-3,
        requires_grad=[False, True],
        gradcheck=False,
    )


@pytest.mark.parametrize(
    ("ws", "stride", "padding"), [((8, 16, 3, 3), 1, 1), ((8, 16, 3, 3), 2, 1), ((8, 16, 1, 1), 1, 0)]
)
def test_conv2d_of_an_empty_batch(device, ws, stride, padding):
    """A batch of 0 images: an empty output, an empty input gradient, zero weight and bias gradients (a sum
    over no image), as torch."""
    x = ag.tensor(np.zeros((0, 16, 8, 8), np.float32), requires_grad=True, device=device)
    w = ag.tensor(np.ones(ws, np.float32), requires_grad=True, device=device)
    b = ag.tensor(np.ones(ws[0], np.float32), requires_grad=True, device=device)
    with ag.Tape() as tape:
        y = ag.conv2d(x, w, b, stride, padding)
    tape.backward(ag.sum(y))
    assert y.shape[0] == 0 and x.grad.shape == x.shape
    assert not w.grad.to_host().any() and not b.grad.to_host().any()


# ---- pooling --------------------------------------------------------------------------------------
P = (2, 3, 6, 5)


def test_max_pool2d(check):
    check([P], lambda x: np_pool(x, 2), lambda x: ag.max_pool2d(x, 2), vals=[distinct(P)])


def test_max_pool2d_overlapping_padded(check):
    check([P], lambda x: np_pool(x, 3, 2, 1), lambda x: ag.max_pool2d(x, 3, 2, 1), vals=[distinct(P, 1)])


def test_max_pool2d_rectangular(check):
    check(
        [P],
        lambda x: np_pool(x, (3, 2), (1, 2), (1, 0)),
        lambda x: ag.max_pool2d(x, (3, 2), (1, 2), (1, 0)),
        vals=[distinct(P, 2)],
        gradcheck=False,
    )


def test_avg_pool2d(check):
    check([P], lambda x: np_pool(x, 2, kind="avg"), lambda x: ag.avg_pool2d(x, 2))


def test_avg_pool2d_padded_counts_padding(check):
    check([P], lambda x: np_pool(x, 3, 2, 1, kind="avg"), lambda x: ag.avg_pool2d(x, 3, 2, 1), gradcheck=False)


def np_pool_cells(x, kernel, stride, padding, kind, ceil_mode, count_include_pad=True):
    """Pooling written per output cell from torch's definitions: the output length rounded down or (ceil mode)
    up, less a last window that would start in the bottom / right padding; an average divides by the window
    clipped to the padded input, or (count_include_pad False) to the input."""
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel), _pair(stride), _pair(padding)
    n, c, h, w = x.shape

    def length(size, k, st, pd):
        out = (size + 2 * pd - k + (st - 1 if ceil_mode else 0)) // st + 1
        return out - 1 if ceil_mode and (out - 1) * st >= size + pd else out

    oh, ow = length(h, kh, sh, ph), length(w, kw, sw, pw)
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * sh - ph, j * sw - pw
            h1, w1 = min(h0 + kh, h + ph), min(w0 + kw, w + pw)
            cells = x[:, :, max(h0, 0) : min(h1, h), max(w0, 0) : min(w1, w)]
            if kind == "max":
                out[:, :, i, j] = cells.max(axis=(2, 3))
            else:
                area = (h1 - h0) * (w1 - w0) if count_include_pad else cells.shape[2] * cells.shape[3]
                out[:, :, i, j] = cells.sum(axis=(2, 3)) / area
    return out


#: (kernel, stride, padding) on a 7 x 8 input: ceil mode adds a partial last row and / or column of windows
CEIL_CASES = [(3, 2, 1), (2, 2, 0), ((3, 2), (2, 3), (1, 0)), (3, 2, 0)]


@pytest.mark.parametrize(("kernel", "stride", "padding"), CEIL_CASES)
def test_max_pool2d_ceil_mode(check, kernel, stride, padding):
    check(
        [(2, 3, 7, 8)],
        lambda x: np_pool_cells(x, kernel, stride, padding, "max", True),
        lambda x: ag.max_pool2d(x, kernel, stride, padding, ceil_mode=True),
        vals=[distinct((2, 3, 7, 8), 2)],
    )


@pytest.mark.parametrize(("kernel", "stride", "padding"), CEIL_CASES)
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool2d_ceil_mode_and_count_include_pad(check, kernel, stride, padding, ceil_mode, count_include_pad):
    check(
        [(2, 3, 7, 8)],
        lambda x: np_pool_cells(x, kernel, stride, padding, "avg", ceil_mode, count_include_pad),
        lambda x: ag.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad),
        gradcheck=False,
    )


@pytest.mark.parametrize("size", [1, (2, 3), (4, 4)])
def test_adaptive_avg_pool2d(check, size):
    check([P], lambda x: np_adaptive_avg(x, size), lambda x: ag.adaptive_avg_pool2d(x, size), gradcheck=size == 1)


def test_adaptive_avg_pool2d_keeps_none_axis(check):
    check([P], lambda x: np_adaptive_avg(x, (3, 5)), lambda x: ag.adaptive_avg_pool2d(x, (3, None)), gradcheck=False)


# ---- dropout --------------------------------------------------------------------------------------
def _mask(shape, p, seed, device):
    """The keep mask dropout draws after ``manual_seed(seed)``, read off a forward on ones."""
    ag.manual_seed(seed)
    return ag.dropout(ag.tensor(np.ones(shape, np.float32), device=device), p).to_host() != 0


def test_dropout(check, device):
    shape, p = (4, 8), 0.25
    keep = _mask(shape, p, 7, device)

    def seeded(x):  # reseeding before each call makes every call (and gradcheck's) draw the same mask
        ag.manual_seed(7)
        return ag.dropout(x, p)

    check([shape], lambda x: x * keep / (1 - p), seeded)


def test_dropout_mask_statistics_and_backends(device):
    """Keep rate near 1 - p (n = 20000: 4 standard deviations is 0.013); the mask is the same on both backends."""
    p = 0.3
    keep = _mask((20000,), p, 123, device)
    assert abs(keep.mean() - (1 - p)) < 0.013
    assert np.array_equal(keep, _mask((20000,), p, 123, "cpu"))
    assert not np.array_equal(keep, _mask((20000,), p, 124, device))


def test_dropout_fresh_mask_each_call_and_reproducible(device):
    x = ag.tensor(np.ones((64,), np.float32), device=device)
    ag.manual_seed(5)
    first, second = ag.dropout(x).to_host(), ag.dropout(x).to_host()
    assert not np.array_equal(first, second)
    rt.manual_seed(5)  # the runtime's generator is the one ag.manual_seed seeds
    assert np.array_equal(ag.dropout(x).to_host(), first)
    assert rt.initial_seed() == 5


def test_dropout_identity_cases(device):
    x = ag.tensor(np.arange(6, dtype=np.float32), requires_grad=True, device=device)
    assert ag.dropout(x, 0.5, training=False) is x
    assert ag.dropout(x, 0.0) is x
    with ag.Tape() as tape:
        y = ag.dropout(x, 1.0)
    assert np.array_equal(y.to_host(), np.zeros(6))
    tape.backward(ag.sum(y))
    assert np.array_equal(x.grad.to_host(), np.zeros(6))


def test_dropout_replays_draw_new_masks(cl_device):
    """In a CompiledGraph each replay advances a device counter: a new mask, and the backward uses it."""
    from netcl.autograd.graph import CompiledGraph

    x = ag.tensor(np.ones((256,), np.float32), requires_grad=True, device=cl_device)
    graph = CompiledGraph([x])
    with graph:
        with ag.Tape() as tape:
            out = ag.dropout(x, 0.5) * 3.0
        tape.backward(ag.sum(out))
        graph.outputs = out
    outputs = [out.to_host()]
    assert np.array_equal(x.grad.to_host(), outputs[0])  # d(3 * dropout(x))/dx = 6 * mask = out at x = 1
    for _ in range(2):
        outputs.append(graph.replay().to_host())
        assert np.array_equal(graph.grads[0].to_host(), outputs[-1])
    assert not np.array_equal(outputs[0], outputs[1]) and not np.array_equal(outputs[1], outputs[2])
    assert all(abs((o != 0).mean() - 0.5) < 0.15 for o in outputs)  # 256 draws: 0.15 is 4.8 sigma
