"""Layers against float64 NumPy references of PyTorch's definitions, loaded with torch-layout weights."""

from __future__ import annotations

import math

import file_modules
import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl.nn.functional import linear


def _helpers():
    return file_modules.load("tests/autograd/helpers.py", "netcl_autograd_test_helpers")


def _rand(seed, *shape, scale=1.0):
    return (np.random.default_rng(seed).uniform(-1, 1, shape) * scale).astype(np.float32)


# ---- functional.linear (one op: forward, gradients, gradcheck) ------------------------------------
@pytest.mark.parametrize(
    "shapes",
    [((4, 5), (3, 5), (3,)), ((2, 4, 5), (3, 5), (3,)), ((4, 5), (3, 5))],
    ids=["2d", "3d", "no-bias"],
)
def test_linear_op(device, shapes):
    def reference(x, w, b=None):
        return x @ w.T + (0 if b is None else b)

    _helpers().check_op(shapes, reference, linear, device=device)


def test_linear_bad_inputs(device):
    x = ag.tensor(np.zeros((4, 5), np.float32), device=device)
    with pytest.raises(
        nc.ShapeError, match=r"linear: x has shape \(4, 5\), expected \(\.\.\., 6\) for weight \(3, 6\)"
    ):
        linear(x, ag.tensor(np.zeros((3, 6), np.float32), device=device))
    with pytest.raises(nc.ShapeError, match=r"linear: bias has shape \(4,\), expected \(3,\)"):
        linear(x, ag.tensor(np.zeros((3, 5), np.float32), device=device), ag.tensor(np.zeros(4, np.float32)))
    with pytest.raises(ValueError, match="Linear: in_features must be a positive int, got 0"):
        nn.Linear(0, 3)
    with pytest.raises(ValueError, match=r"in_channels \(3\) and out_channels \(4\) must be divisible by groups \(2\)"):
        nn.Conv2d(3, 4, 3, groups=2)


# ---- a torch-layout state dict gives torch's outputs ----------------------------------------------
def _conv_reference(x, w, b, padding):
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, _, h, wd = x.shape
    o, _c, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i : i + out.shape[2], j : j + out.shape[3]]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out + b[None, :, None, None]


def _maxpool_reference(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def test_torch_layout_weights_give_torch_outputs(device):
    """The digits CNN's layers, weights in PyTorch's layout (conv OIHW, linear (out, in)) by torch's keys."""
    state = {
        "0.weight": _rand(1, 4, 1, 3, 3),
        "0.bias": _rand(2, 4),
        "3.weight": _rand(3, 6, 4, 3, 3, scale=0.5),
        "3.bias": _rand(4, 6),
        "7.weight": _rand(5, 10, 24, scale=0.3),
        "7.bias": _rand(6, 10),
    }
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, device=device),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1, device=device),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(24, 10, device=device),
    )
    model.load_state_dict(state)
    x = _rand(7, 3, 1, 8, 8)
    s = {k: v.astype(np.float64) for k, v in state.items()}
    h = _maxpool_reference(np.maximum(_conv_reference(x.astype(np.float64), s["0.weight"], s["0.bias"], 1), 0))
    h = _maxpool_reference(np.maximum(_conv_reference(h, s["3.weight"], s["3.bias"], 1), 0))
    expected = h.reshape(3, -1) @ s["7.weight"].T + s["7.bias"]
    np.testing.assert_allclose(model(ag.tensor(x, device=device)).to_host(), expected, rtol=1e-5, atol=1e-5)


# ---- initialization ------------------------------------------------------------------------------------
def test_default_init_follows_torch_bounds_and_repeats_after_manual_seed(device):
    ag.manual_seed(11)
    layer = nn.Linear(400, 300, device=device)
    conv = nn.Conv2d(8, 16, 3, device=device)
    bound = 1 / math.sqrt(400)  # kaiming_uniform(a=sqrt(5)) on (out, in): U(-1/sqrt(in), 1/sqrt(in))
    w = layer.weight.to_host()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    # U(-a, a) has std a / sqrt(3): 120000 samples pin it within 1%
    np.testing.assert_allclose(w.std(), bound / math.sqrt(3), rtol=0.01)
    assert np.abs(layer.bias.to_host()).max() <= bound
    conv_bound = 1 / math.sqrt(8 * 9)
    assert np.abs(conv.weight.to_host()).max() <= conv_bound and np.abs(conv.bias.to_host()).max() <= conv_bound
    ag.manual_seed(11)
    again = nn.Linear(400, 300, device=device)
    np.testing.assert_array_equal(again.weight.to_host(), w)
    assert not np.array_equal(nn.Linear(400, 300, device=device).weight.to_host(), w)


# ---- parameter-free layers -----------------------------------------------------------------------------
def test_simple_layers(device):
    x = _rand(8, 2, 3, 6, 6)
    xn = ag.tensor(x, device=device)
    x64 = x.astype(np.float64)
    cases = [
        (nn.ReLU(), np.maximum(x64, 0)),
        (nn.Tanh(), np.tanh(x64)),
        (nn.Sigmoid(), 1 / (1 + np.exp(-x64))),
        (nn.GELU(), 0.5 * x64 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))),  # torch's default: exact
        (nn.GELU("tanh"), 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))),
        (nn.LeakyReLU(0.2), np.where(x64 > 0, x64, 0.2 * x64)),
        (nn.ELU(0.5), np.where(x64 > 0, x64, 0.5 * np.expm1(x64))),
        (nn.Softplus(2.0, 1.0), np.where(2 * x64 > 1, x64, np.log1p(np.exp(2 * x64)) / 2)),
        (nn.Softmax(1), np.exp(x64) / np.exp(x64).sum(1, keepdims=True)),
        (nn.LogSoftmax(-1), x64 - np.log(np.exp(x64).sum(-1, keepdims=True))),
        (nn.ReLU6(), np.clip(x64, 0, 6)),
        (nn.Hardtanh(-0.5, 0.25), np.clip(x64, -0.5, 0.25)),
        (nn.Hardsigmoid(), np.clip(x64 / 6 + 0.5, 0, 1)),
        (nn.Hardswish(), x64 * np.clip(x64 / 6 + 0.5, 0, 1)),
        (nn.Mish(), x64 * np.tanh(np.log1p(np.exp(x64)))),
        (nn.Identity(), x64),
        (nn.Flatten(), x64.reshape(2, -1)),
        (nn.MaxPool2d(2), _maxpool_reference(x64)),
        (nn.AvgPool2d(3), x64.reshape(2, 3, 2, 3, 2, 3).mean(axis=(3, 5))),
        (nn.AdaptiveAvgPool2d(1), x64.mean(axis=(2, 3), keepdims=True)),
    ]
    for layer, expected in cases:
        np.testing.assert_allclose(layer(xn).to_host(), expected, rtol=1e-5, atol=1e-6, err_msg=repr(layer))
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'erf'"):
        nn.GELU(approximate="erf")


def test_dropout_train_and_eval(device):
    x = ag.tensor(np.ones((64, 64), np.float32), device=device)
    layer = nn.Dropout(0.25)
    out = layer(x).to_host()
    assert set(np.unique(out)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.2 < np.mean(out == 0) < 0.3  # 4096 draws: the kept fraction is 0.75 +- 0.02
    assert layer.eval()(x) is x
    with pytest.raises(ValueError, match=r"Dropout: p must be a probability in \[0, 1\], got 1.5"):
        nn.Dropout(1.5)


def test_conv2d_module_keeps_a_padding_string(device):
    layer = nn.Conv2d(3, 4, (4, 3), padding="same", device=device)
    assert layer.padding == "same" and "padding='same'" in repr(layer)
    x = ag.tensor(_rand(15, 2, 3, 6, 7), device=device)
    assert layer(x).shape == (2, 4, 6, 7)
    with pytest.raises(ValueError, match=r"padding='same' needs stride 1"):
        nn.Conv2d(3, 4, 3, stride=2, padding="same")


def test_pool_modules_take_torch_arguments(device):
    """``MaxPool2d(..., ceil_mode=True)`` and ``AvgPool2d(..., count_include_pad=False)`` reach the ops; the torch
    arguments netcl does not implement are refused by name."""
    x = ag.tensor(_rand(16, 1, 2, 5, 5), device=device)
    pooled = nn.MaxPool2d(2, ceil_mode=True)(x)
    assert pooled.shape == (1, 2, 3, 3) and "ceil_mode=True" in repr(nn.MaxPool2d(2, ceil_mode=True))
    np.testing.assert_array_equal(pooled.to_host()[..., 2, 2], x.to_host()[..., 4, 4])  # the 1 x 1 corner window
    corner = nn.AvgPool2d(3, 2, 1, count_include_pad=False)(x).to_host()[..., 0, 0]
    np.testing.assert_allclose(corner, x.to_host()[..., :2, :2].mean(axis=(2, 3)), rtol=1e-6)
    with pytest.raises(ValueError, match="dilation"):
        nn.MaxPool2d(2, dilation=2)
    with pytest.raises(ValueError, match="return_indices"):
        nn.MaxPool2d(2, return_indices=True)
    with pytest.raises(ValueError, match="divisor_override"):
        nn.AvgPool2d(2, divisor_override=3)


def test_group_norm_module(device):
    """torch's GroupNorm: ones / zeros affine (C,), the groups normalized together; bad groups refused."""
    layer = nn.GroupNorm(2, 4, device=device)
    assert [k for k in layer.state_dict()] == ["weight", "bias"] and repr(
        layer
    ) == "GroupNorm(2, 4, eps=1e-05, affine=True)"
    x = _rand(17, 2, 4, 3, 3)
    g = x.astype(np.float64).reshape(2, 2, -1)
    want = ((g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(layer(ag.tensor(x, device=device)).to_host(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"num_channels \(4\) must be divisible by num_groups \(3\)"):
        nn.GroupNorm(3, 4)


def test_rms_norm_module(device):
    """torch's RMSNorm: a ones weight (normalized_shape), eps None is the dtype's epsilon; no weight without affine."""
    layer = nn.RMSNorm((3, 4), device=device)
    assert (
        list(layer.state_dict()) == ["weight"] and repr(layer) == "RMSNorm((3, 4), eps=None, elementwise_affine=True)"
    )
    x = _rand(21, 2, 3, 4).astype(np.float64)
    want = x / np.sqrt((x**2).mean(axis=(1, 2), keepdims=True) + np.finfo(np.float32).eps)
    np.testing.assert_allclose(layer(ag.tensor(x.astype(np.float32), device=device)).to_host(), want, rtol=1e-5)
    assert nn.RMSNorm(4, eps=1e-6, elementwise_affine=False).weight is None


def test_one_d_layers(device):
    """Conv1d (torch's weight layout and tuples), the 1-d pools, GLU, Softmin, LogSigmoid, Softsign on (N, C, L)."""
    conv = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2, device=device)
    assert conv.weight.shape == (6, 2, 3) and conv.kernel_size == (3,) and conv.padding == (1,)
    assert repr(conv) == "Conv1d(4, 6, kernel_size=(3,), stride=(2,), padding=(1,), groups=2)"
    x = _rand(22, 2, 4, 8)
    x64, w = x.astype(np.float64), conv.weight.to_host().astype(np.float64)
    padded = np.pad(x64, ((0, 0), (0, 0), (1, 1)))
    want = np.zeros((2, 6, 4))
    for o in range(6):
        group = o // 3
        for t in range(4):
            want[:, o, t] = (padded[:, 2 * group : 2 * group + 2, 2 * t : 2 * t + 3] * w[o]).sum(axis=(1, 2))
    want += conv.bias.to_host()[None, :, None]
    xn = ag.tensor(x, device=device)
    np.testing.assert_allclose(conv(xn).to_host(), want, rtol=1e-5, atol=1e-6)
    cases = [
        (nn.MaxPool1d(2), x64.reshape(2, 4, 4, 2).max(-1)),
        (nn.AvgPool1d(4), x64.reshape(2, 4, 2, 4).mean(-1)),
        (nn.AdaptiveAvgPool1d(1), x64.mean(-1, keepdims=True)),
        (nn.GLU(1), x64[:, :2] / (1 + np.exp(-x64[:, 2:]))),
        (nn.Softmin(-1), np.exp(-x64) / np.exp(-x64).sum(-1, keepdims=True)),
        (nn.LogSigmoid(), -np.log1p(np.exp(-x64))),
        (nn.Softsign(), x64 / (1 + np.abs(x64))),
    ]
    for layer, expected in cases:
        np.testing.assert_allclose(layer(xn).to_host(), expected, rtol=1e-5, atol=1e-6, err_msg=repr(layer))
    with pytest.raises(ValueError, match=r"Conv1d: padding='same' needs stride 1"):
        nn.Conv1d(4, 6, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match=r"MaxPool1d: netcl pools without dilation"):
        nn.MaxPool1d(2, dilation=2)


def test_conv_transpose2d_module_shapes_and_state(device):
    layer = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, device=device)
    assert layer.weight.shape == (4, 3, 3, 3) and layer.bias.shape == (6,)
    assert (
        repr(layer)
        == "ConvTranspose2d(4, 6, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1), groups=2)"
    )
    assert layer(ag.tensor(_rand(18, 2, 4, 5, 7), device=device)).shape == (2, 6, 10, 14)
    with pytest.raises(ValueError, match=r"must be divisible by groups \(4\)"):
        nn.ConvTranspose2d(4, 6, 3, groups=4)


def test_upsample_module(device):
    x = ag.tensor(_rand(19, 1, 2, 3, 4), device=device)
    up = nn.Upsample(scale_factor=2)
    assert repr(up) == "Upsample(scale_factor=2, mode='nearest')"
    np.testing.assert_array_equal(up(x).to_host(), x.to_host().repeat(2, axis=2).repeat(2, axis=3))
    assert nn.Upsample(size=(5, 7), mode="bilinear")(x).shape == (1, 2, 5, 7)


def test_dropout2d_drops_whole_channels(device):
    """Each (sample, channel) plane is either all zero or all scaled by 1 / (1 - p); eval is the identity."""
    ag.manual_seed(3)
    x = ag.tensor(np.ones((8, 16, 3, 3), np.float32), device=device)
    layer = nn.Dropout2d(0.5)
    out = layer(x).to_host()
    planes = out.reshape(8, 16, 9)
    assert set(np.unique(planes)) <= {0.0, 2.0} and (planes.min(axis=2) == planes.max(axis=2)).all()
    assert 0.25 < np.mean(planes[:, :, 0] == 0) < 0.75  # 128 draws at p 0.5
    assert layer.eval()(x) is x


def test_embedding(device):
    table = _rand(9, 10, 4)
    layer = nn.Embedding(10, 4, device=device)
    layer.load_state_dict({"weight": table})
    ids = np.array([[1, 9], [0, 1]], np.int32)
    np.testing.assert_array_equal(layer(ids).to_host(), table[ids])


def test_embedding_padding_idx_row_starts_at_zero_and_gets_no_gradient(device):
    """torch's ``padding_idx``: the row is zero at construction, read like any row, and its gradient stays 0
    while the other rows sum their upstream rows (also from a negative index, counted from the end)."""
    layer = nn.Embedding(6, 3, padding_idx=-2, device=device)
    assert layer.padding_idx == 4 and repr(layer) == "Embedding(6, 3, padding_idx=4)"
    np.testing.assert_array_equal(layer.weight.to_host()[4], 0.0)
    table = _rand(13, 6, 3)
    layer.load_state_dict({"weight": table})  # a loaded padding row is used as it is, as in torch
    ids = np.array([[4, 1, 4], [2, 1, 0]], np.int32)
    out = layer(ids)
    np.testing.assert_array_equal(out.to_host(), table[ids])
    g = _rand(14, 2, 3, 3)
    ag.sum(out * ag.tensor(g, device=device)).backward()
    expected = np.zeros((6, 3))
    for (i, j), row in np.ndenumerate(ids):
        if row != 4:
            expected[row] += g[i, j]
    np.testing.assert_allclose(layer.weight.grad.to_host(), expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"padding_idx must be within num_embeddings \(6\): in \[-6, 6\), got 6"):
        nn.Embedding(6, 3, padding_idx=6)


# ---- normalization (the ops come with issue 12's op set) ---------------------------------------------------
def needs(*names):
    missing = [name for name in names if not hasattr(ag, name)]
    return pytest.mark.skipif(bool(missing), reason=f"ag.{', '.join(missing)} not in this tree yet")


@needs("batch_norm")
def test_batch_norm_train_and_eval_match_torch(device):
    x = _rand(10, 4, 3, 2, 2) * 2 + 0.5
    layer = nn.BatchNorm2d(3, momentum=0.2, device=device)
    layer.load_state_dict(
        {
            "weight": _rand(11, 3) + 1,
            "bias": _rand(12, 3),
            "running_mean": np.zeros(3),
            "running_var": np.ones(3),
            "num_batches_tracked": np.array(0),
        },
    )
    w, b = layer.weight.to_host().astype(np.float64), layer.bias.to_host().astype(np.float64)
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    shape = (1, 3, 1, 1)
    expected = (x64 - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-5) * w.reshape(shape) + b.reshape(shape)
    np.testing.assert_allclose(layer(ag.tensor(x, device=device)).to_host(), expected, rtol=1e-4, atol=1e-5)
    unbiased = var * 16 / 15
    np.testing.assert_allclose(layer.running_mean.to_host(), 0.2 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.running_var.to_host(), 0.8 + 0.2 * unbiased, rtol=1e-5)
    assert layer.num_batches_tracked.to_host() == 1
    layer.eval()
    rm, rv = 0.2 * mean, 0.8 + 0.2 * unbiased
    expected = (x64 - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + 1e-5) * w.reshape(shape) + b.reshape(shape)
    np.testing.assert_allclose(layer(ag.tensor(x, device=device)).to_host(), expected, rtol=1e-4, atol=1e-5)
    assert layer.num_batches_tracked.to_host() == 1  # evaluation does not count
    with pytest.raises(nc.ShapeError, match=r"BatchNorm2d: x has shape \(4, 3, 2\), expected \(N, 3, H, W\)"):
        layer(ag.tensor(x[..., 0], device=device))
    with pytest.raises(nc.ShapeError, match=r"expected \(N, 5\) or \(N, 5, L\)"):
        nn.BatchNorm1d(5, device=device)(ag.tensor(x, device=device))


@needs("layer_norm")
def test_layer_norm(device):
    x = _rand(13, 2, 5, 6)
    layer = nn.LayerNorm(6, device=device)
    layer.load_state_dict({"weight": _rand(14, 6) + 1, "bias": _rand(15, 6)})
    x64 = x.astype(np.float64)
    normed = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    expected = normed * layer.weight.to_host() + layer.bias.to_host()
    np.testing.assert_allclose(layer(ag.tensor(x, device=device)).to_host(), expected, rtol=1e-4, atol=1e-5)


@needs("silu")
def test_silu(device):
    x = _rand(13, 2, 5, 6)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(
        nn.SiLU()(ag.tensor(x, device=device)).to_host(), x64 / (1 + np.exp(-x64)), rtol=1e-5, atol=1e-6
    )


def test_padding_modules_unflatten_and_pretrained_embeddings(device):
    """torch's padding modules (an int pads every side of the last one or two axes; a tuple is torch's order),
    ``Unflatten``, and ``Embedding.from_pretrained`` (frozen by default, the padding row kept)."""
    x = _rand(23, 2, 3, 4, 5).astype(np.float64)
    xn = ag.tensor(x.astype(np.float32), device=device)
    cases = [
        (nn.ZeroPad2d(2), np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))),
        (nn.ConstantPad2d((1, 0, 2, 3), 3.5), np.pad(x, ((0, 0), (0, 0), (2, 3), (1, 0)), constant_values=3.5)),
        (nn.ReflectionPad2d((2, 1, 0, 3)), np.pad(x, ((0, 0), (0, 0), (0, 3), (2, 1)), mode="reflect")),
        (nn.ReplicationPad1d((1, 4)), np.pad(x, ((0, 0), (0, 0), (0, 0), (1, 4)), mode="edge")),
        (nn.Unflatten(-1, (5, 1)), x.reshape(2, 3, 4, 5, 1)),
    ]
    for layer, expected in cases:
        np.testing.assert_allclose(layer(xn).to_host(), expected, rtol=1e-6, err_msg=repr(layer))
    assert repr(nn.ConstantPad2d(1, 3.5)) == "ConstantPad2d(padding=(1, 1, 1, 1), value=3.5)"
    with pytest.raises(ValueError, match=r"ZeroPad2d: padding must be an int or 4 ints, got \(1, 2\)"):
        nn.ZeroPad2d((1, 2))
    table = _rand(24, 6, 4)
    embedding = nn.Embedding.from_pretrained(table, padding_idx=2, device=device)
    assert not embedding.weight.requires_grad and nn.Embedding.from_pretrained(table, freeze=False).weight.requires_grad
    ids = ag.tensor(np.array([[0, 2], [5, 1]], np.int32), device=device)
    np.testing.assert_array_equal(embedding(ids).to_host(), table[[[0, 2], [5, 1]]])


def test_instance_norm_and_pixel_shuffle(device):
    """InstanceNorm2d / 1d (each sample's channel over its positions, affine ones / zeros; unbatched input) against
    float64; PixelShuffle against its index formula and PixelUnshuffle undoing it; bad arguments refused."""
    x = _rand(25, 2, 8, 3, 4).astype(np.float64)
    xn = ag.tensor(x.astype(np.float32), device=device)
    want = (x - x.mean(axis=(2, 3), keepdims=True)) / np.sqrt(x.var(axis=(2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(
        nn.InstanceNorm2d(8, affine=True, device=device)(xn).to_host(), want, rtol=1e-5, atol=1e-5
    )
    seq = x[0, :3, 0]  # (3, 4): unbatched (C, L)
    want1 = (seq - seq.mean(axis=1, keepdims=True)) / np.sqrt(seq.var(axis=1, keepdims=True) + 1e-5)
    got1 = nn.InstanceNorm1d(3, device=device)(ag.tensor(seq.astype(np.float32), device=device)).to_host()
    np.testing.assert_allclose(got1, want1, rtol=1e-5, atol=1e-5)
    shuffled = nn.PixelShuffle(2)(xn).to_host()
    n, c, h, w, i, j = 1, 1, 2, 3, 1, 0
    assert shuffled.shape == (2, 2, 6, 8) and shuffled[n, c, h * 2 + i, w * 2 + j] == np.float32(
        x[n, c * 4 + i * 2 + j, h, w]
    )
    np.testing.assert_array_equal(nn.PixelUnshuffle(2)(nn.PixelShuffle(2)(xn)).to_host(), x.astype(np.float32))
    with pytest.raises(ValueError, match="InstanceNorm2d: track_running_stats=True is not supported"):
        nn.InstanceNorm2d(8, track_running_stats=True)
    with pytest.raises(
        ValueError, match=r"PixelShuffle: channels \(8\) must be divisible by upscale_factor \*\* 2 \(9\)"
    ):
        nn.PixelShuffle(3)(xn)
