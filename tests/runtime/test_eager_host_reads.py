"""Eager and replayed training steps read nothing back (issue 33, the eager fast path): an eager step
(``Tape`` + ``backward`` + ``opt.step()``) and a step replayed by ``fuse_graph`` of the MLP, the digits
CNN and a small GPT block (token ids through the embedding, next-token targets through cross_entropy:
both index checks stay on the device) make no device-to-host copy. Each test then reads the trained
parameters once and compares them with the same steps run on the NumPy backend, so a step that
silently did nothing fails too."""

from __future__ import annotations

from collections.abc import Callable

import file_modules
import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl.jit import fuse_graph
from netcl.optim import SGD, Adam, Optimizer

BATCH = 16
VOCAB, SEQ = 40, 8
GPT = file_modules.load("examples/gpt.py", "netcl_example_gpt").GPT


def _mlp(device: nc.Device) -> nn.Module:
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10)).to(device)


def _cnn(device: nc.Device) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 2 * 2, 10),
    ).to(device)


class _GptLogits(nn.Module):
    """examples/gpt.py's GPT (one block) with its logits flattened to (B * S, vocab) for cross_entropy."""

    def __init__(self, device: nc.Device) -> None:
        super().__init__()
        self.gpt = GPT(VOCAB, SEQ, d_model=32, n_head=4, n_layer=1, device=device)

    def forward(self, ids):
        return ag.reshape(self.gpt(ids), (-1, VOCAB))


def _images(shape: tuple[int, ...]) -> Callable[[nc.Device], tuple[nc.Tensor, nc.Tensor]]:
    def make(device: nc.Device) -> tuple[nc.Tensor, nc.Tensor]:
        rng = np.random.default_rng(3)
        x = nc.Tensor.from_host(device, rng.standard_normal(shape).astype(np.float32))
        return x, nc.Tensor.from_host(device, rng.integers(0, 10, shape[0]).astype(np.int32))

    return make


def _tokens(device: nc.Device) -> tuple[nc.Tensor, nc.Tensor]:
    ids = np.random.default_rng(3).integers(0, VOCAB, (BATCH // 4, SEQ + 1)).astype(np.int32)
    return nc.Tensor.from_host(device, ids[:, :-1]), nc.Tensor.from_host(device, ids[:, 1:].reshape(-1))


# (name, model factory, optimizer factory, inputs and targets on a device)
MODELS: list[tuple[str, Callable, Callable, Callable]] = [
    ("mlp_sgd", _mlp, lambda p: SGD(p, lr=0.05, momentum=0.9), _images((BATCH, 64))),
    ("digits_cnn_adam", _cnn, lambda p: Adam(p, lr=1e-2), _images((BATCH, 1, 8, 8))),
    # SGD: its updates are linear in the gradients, so the two backends' float32 rounding stays within tolerance
    ("gpt_block_sgd", _GptLogits, lambda p: SGD(p, lr=0.05, momentum=0.9), _tokens),
]


def _setup(device: nc.Device, make_model, make_opt, inputs) -> tuple[nn.Module, Optimizer, nc.Tensor, nc.Tensor]:
    # the initial weights of one seed, whatever ran before in this process: Adam divides each gradient by its
    # own size, so an init with a near-cancelling gradient element magnifies the two backends' rounding apart
    ag.manual_seed(5)
    model = make_model(nc.get_device("cpu"))
    model.to(device)
    return model, make_opt(model.parameters()), *inputs(device)


def _eager_step(model: nn.Module, opt: Optimizer, x: nc.Tensor, y: nc.Tensor) -> None:
    opt.zero_grad()
    with ag.Tape() as tape:
        loss = ag.cross_entropy(model(x), y)
    tape.backward(loss)
    opt.step()


def _params(model: nn.Module) -> list[np.ndarray]:
    return [np.asarray(p.value.to_host(), np.float64) for p in model.parameters()]


def _reference(make_model, make_opt, inputs, steps: int, initial: list[np.ndarray]) -> list[np.ndarray]:
    """The same steps on the NumPy backend from the same initial parameters."""
    cpu = nc.get_device("cpu")
    model, opt, x, y = _setup(cpu, make_model, make_opt, inputs)
    for p, value in zip(model.parameters(), initial, strict=True):
        p.value = nc.Tensor.from_host(cpu, value.astype(np.float32))
    for _ in range(steps):
        _eager_step(model, opt, x, y)
    return _params(model)


@pytest.mark.parametrize(("name", "make_model", "make_opt", "inputs"), MODELS, ids=[m[0] for m in MODELS])
def test_eager_steps_read_nothing_back(cl_device, host_reads, name, make_model, make_opt, inputs) -> None:
    model, opt, x, y = _setup(cl_device, make_model, make_opt, inputs)
    initial = _params(model)
    _eager_step(model, opt, x, y)  # the first step builds the programs and creates the optimizer state
    with host_reads() as reads:
        for _ in range(2):
            _eager_step(model, opt, x, y)
        cl_device.queue.finish()
    assert reads == [], f"{name}: an eager step copied {reads} bytes from the device to the host"
    # 3 steps in all; float32 kernels against NumPy float32 with another summation order
    for got, want in zip(_params(model), _reference(make_model, make_opt, inputs, 3, initial), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize(("name", "make_model", "make_opt", "inputs"), MODELS, ids=[m[0] for m in MODELS])
def test_replayed_steps_read_nothing_back(cl_device, host_reads, name, make_model, make_opt, inputs) -> None:
    model, opt, x, y = _setup(cl_device, make_model, make_opt, inputs)
    initial = _params(model)
    step = fuse_graph(model, x, y, ag.cross_entropy, optimizer_step=opt.step)  # captures and runs step 1
    step.execute(x, y)
    with host_reads() as reads:
        for _ in range(2):
            step.execute(x, y)
        cl_device.queue.finish()
    assert reads == [], f"{name}: a replayed step copied {reads} bytes from the device to the host"
    for got, want in zip(_params(model), _reference(make_model, make_opt, inputs, 4, initial), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
