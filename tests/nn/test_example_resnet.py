"""examples/resnet.py: the basic block against a float64 NumPy reference, and the networks' structure.

The block (conv3x3(stride)-bn-relu-conv3x3-bn + shortcut, relu; training-mode batch norm) runs
forward and backward on each device; its output, the running statistics and the gradients of the
input and of every parameter are compared with the same block computed in float64 NumPy (direct
convolution sums, batch statistics over N, H, W), whose gradients are central differences of that
float64 function. Tolerances: the float32 block accumulates at most 4 * 9 products per
convolution output and 2 * 6 * 6 values per batch statistic; its error stays below 1e-5 of the
largest value, so 1e-4 of the largest reference value (absolute, plus 1e-4 relative) leaves a 10x
margin, while a wrong stride, padding, shortcut, statistic or gradient term is off by O(1) of it.
The central differences (step 1e-6 in float64) are exact to ~1e-9 away from relu kinks, which the
fixed random inputs do not come near.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import file_modules
import numpy as np
import pytest

import netcl.autograd as ag

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "resnet.py"
EPS, MOMENTUM = 1e-5, 0.1


def _resnet() -> Any:
    return file_modules.load(EXAMPLE, "netcl_example_resnet")


# ---- the float64 reference ------------------------------------------------------------------------
def conv2d(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """Cross-correlation of (N, C, H, W) with (O, C, k, k), as a sum over the k * k taps."""
    n, _, h, width = x.shape
    o, _, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = (h + 2 * padding - k) // stride + 1, (width + 2 * padding - k) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(k):
        for j in range(k):
            patch = xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def batch_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training mode: the batch's mean and biased variance over N, H, W; also the batch mean and the
    unbiased variance (what the running statistics take)."""
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    y = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + EPS)
    count = x.size // x.shape[1]
    return gamma[None, :, None, None] * y + beta[None, :, None, None], mean, var * count / (count - 1)


def block_reference(p: dict[str, np.ndarray], x: np.ndarray, stride: int) -> tuple[np.ndarray, dict]:
    """The basic block in float64; ``p`` holds its state-dict arrays. Returns (output, batch statistics)."""
    stats = {}
    h, stats["bn1"] = _bn(conv2d(x, p["conv1.weight"], stride, 1), p, "bn1")
    h = np.maximum(h, 0.0)
    h, stats["bn2"] = _bn(conv2d(h, p["conv2.weight"], 1, 1), p, "bn2")
    if "downsample.0.weight" in p:
        shortcut, stats["downsample.1"] = _bn(conv2d(x, p["downsample.0.weight"], stride, 0), p, "downsample.1")
    else:
        shortcut = x
    return np.maximum(h + shortcut, 0.0), stats


def _bn(x: np.ndarray, p: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    y, mean, unbiased = batch_norm(x, p[f"{name}.weight"], p[f"{name}.bias"])
    return y, (mean, unbiased)


def central_difference(f, value: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """d f / d value (f: array -> float), element by element, in float64."""
    grad = np.zeros_like(value)
    for index in np.ndindex(value.shape):
        saved = value[index]
        value[index] = saved + step
        up = f()
        value[index] = saved - step
        down = f()
        value[index] = saved
        grad[index] = (up - down) / (2 * step)
    return grad


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(scale, 1e-3), err_msg=what)


# ---- the block --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("in_planes", "planes", "stride"), [(4, 4, 1), (3, 4, 2)], ids=["identity", "stride2_1x1"])
def test_basic_block_matches_float64_numpy(device, in_planes, planes, stride):
    resnet = _resnet()
    rng = np.random.default_rng(7 + stride)
    block = resnet.BasicBlock(in_planes, planes, stride, device=device)
    assert (block.downsample is None) == (stride == 1 and in_planes == planes)
    # non-trivial affine batch-norm parameters, so a swapped weight and bias would show
    state = {
        key: (rng.normal(size=v.shape) if key.endswith("weight") or key.endswith("bias") else v.numpy()).astype(
            v.numpy().dtype
        )
        for key, v in block.state_dict().items()
    }
    block.load_state_dict(state)
    x_host = rng.normal(size=(2, in_planes, 6, 6)).astype(np.float32)
    upstream = rng.normal(size=(2, planes, 6 // stride, 6 // stride)).astype(np.float32)

    x = ag.tensor(x_host, requires_grad=True, device=device)
    with ag.Tape() as tape:
        out = block(x)
    tape.backward(out, grad=upstream)

    params = {k: np.asarray(v, np.float64) for k, v in state.items() if k.endswith(("weight", "bias"))}
    x64 = x_host.astype(np.float64)
    want, stats = block_reference(params, x64, stride)
    _close(out.to_host(), want, "output")
    live = block.state_dict()
    for name, (mean, unbiased) in stats.items():
        _close(live[f"{name}.running_mean"].numpy(), MOMENTUM * mean, f"{name}.running_mean")
        _close(live[f"{name}.running_var"].numpy(), (1 - MOMENTUM) + MOMENTUM * unbiased, f"{name}.running_var")
        assert int(live[f"{name}.num_batches_tracked"].numpy()) == 1

    def loss() -> float:
        return float(np.sum(block_reference(params, x64, stride)[0] * upstream))

    _close(x.grad.to_host(), central_difference(loss, x64), "gradient of x")
    named = dict(block.named_parameters())
    assert sorted(named) == sorted(params)
    for key, value in params.items():
        _close(named[key].grad.to_host(), central_difference(loss, value), f"gradient of {key}")


# ---- the networks -----------------------------------------------------------------------------------
def test_resnet18_has_torchvisions_cifar_parameter_count_and_keys():
    """11,173,962 parameters: torchvision's resnet18 with a 3x3 stem and 10 classes."""
    model = _resnet().resnet18(device="cpu")
    assert sum(int(np.prod(p.shape)) for p in model.parameters()) == 11_173_962
    keys = list(model.state_dict())
    assert keys[:2] == ["conv1.weight", "bn1.weight"]
    for key in ("layer1.1.conv2.weight", "layer2.0.downsample.0.weight", "layer4.1.bn2.running_var", "fc.bias"):
        assert key in keys
    assert "layer1.0.downsample.0.weight" not in keys  # stride 1, same width: identity shortcut


def test_resnet8_forward_backward_shapes(device):
    """Three stride-2 blocks with 1x1 shortcuts: 32 -> 16 -> 8 -> 4, pooled to (N, 10); every parameter
    gets a finite gradient of its own shape."""
    model = _resnet().resnet8(width=0.125, device=device)
    assert all(getattr(model, f"layer{i}")[0].downsample is not None for i in (1, 2, 3))
    rng = np.random.default_rng(0)
    x = ag.tensor(rng.normal(size=(2, 3, 32, 32)).astype(np.float32), device=device)
    y = ag.tensor(np.array([1, 7], np.int32), device=device)
    with ag.Tape() as tape:
        logits = model(x)
        loss = ag.cross_entropy(logits, y)
        features = model.relu(model.bn1(model.conv1(x)))
        features = model.layer3(model.layer2(model.layer1(features)))
    assert tuple(features.shape) == (2, 32, 4, 4)
    assert tuple(logits.shape) == (2, 10)
    tape.backward(loss)
    for name, p in model.named_parameters():
        grad = p.grad.to_host()
        assert grad.shape == tuple(p.shape), name
        assert np.isfinite(grad).all(), name
