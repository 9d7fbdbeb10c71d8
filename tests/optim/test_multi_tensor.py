"""Multi-tensor optimizer kernels: one launch per ``update_arity`` parameters, bit-identical to the
per-parameter updates (``sgd_step_`` / ``adam_step_``: the same kernel on one parameter), on both backends,
replay-safe, and the optimizers' step is built on them."""

from __future__ import annotations

import types

import numpy as np
import pytest

import netcl.core as nc
import netcl.nn as nn
from netcl.optim import SGD, Adagrad, Adam, AdamW, RMSprop
from netcl.runtime.graph import Graph
from netcl.runtime.ops import optim_kernels
from netcl.runtime.ops.optim_kernels import (
    ADAM_HYPER,
    CPU_CHUNK,
    GPU_VECTOR,
    MULTI_ARITY,
    SGD_HYPER,
    ItemSplit,
    adam_multi_step_,
    adam_step_,
    count_steps_,
    sgd_multi_step_,
    sgd_step_,
    update_arity,
)

# more than one launch's worth, sizes that do not line up with work-groups, one empty parameter
SIZES = [7, 256, 1, 33, 0, 1000, 5, 64] * 2 + [300, 2, 17]
STEPS = 3
SGD_CASES = [
    (0.1, 0.0, 0.0, 0.0, 0.0),
    (0.05, 0.9, 0.1, 0.01, 0.0),
    (0.05, 0.9, 0.0, 0.0, 1.0),  # nesterov
]
ADAM_CASES = [
    ((1e-2, 0.9, 0.999, 1e-8, 0.0), False),
    ((1e-2, 0.8, 0.99, 1e-6, 0.1), False),
    ((1e-3, 0.9, 0.999, 1e-8, 0.05), True),
]


def _tensors(device, seed, sizes=SIZES, scale=1.0):
    rng = np.random.default_rng(seed)
    return [nc.tensor((scale * rng.standard_normal(n)).astype(np.float32), device=device) for n in sizes]


def _copies(tensors):
    return [nc.tensor(t.to_host(), device=t.device) for t in tensors]


def _steps(device, n):
    return nc.tensor(np.zeros(n, np.int32), device=device)


def _advance(steps):
    count_steps_(steps, nc.tensor(np.ones(steps.shape[0], np.uint8), device=steps.device))


@pytest.mark.parametrize("hyper_values", SGD_CASES)
def test_sgd_multi_is_bit_identical_to_per_parameter(device, hyper_values):
    assert len(SIZES) > MULTI_ARITY
    hyper = nc.tensor(np.asarray(hyper_values, np.float32), device=device)
    momentum = hyper_values[1] != 0
    params = _tensors(device, 0)
    mine = _copies(params)
    bufs = [nc.Tensor.zeros((n,), device=device) for n in SIZES] if momentum else [None] * len(SIZES)
    my_bufs = [nc.Tensor.zeros((n,), device=device) for n in SIZES] if momentum else [None] * len(SIZES)
    # indices out of order: each parameter reads its own step count
    indices = list(reversed(range(len(SIZES))))
    steps, my_steps = _steps(device, len(SIZES)), _steps(device, len(SIZES))
    for step in range(STEPS):
        grads = _tensors(device, 10 + step)
        for p, g, b, i in zip(params, grads, bufs, indices, strict=True):
            sgd_step_(p, g, b, steps, i, hyper)
        sgd_multi_step_(mine, grads, my_bufs, my_steps, indices, hyper)
        _advance(steps), _advance(my_steps)
    for a, b in zip(
        params + [x for x in bufs if x is not None], mine + [x for x in my_bufs if x is not None], strict=True
    ):
        np.testing.assert_array_equal(a.to_host().view(np.uint32), b.to_host().view(np.uint32))


@pytest.mark.parametrize(("hyper_values", "decoupled"), ADAM_CASES)
def test_adam_multi_is_bit_identical_to_per_parameter(device, hyper_values, decoupled):
    for amsgrad in (False, True):
        hyper = nc.tensor(np.asarray(hyper_values, np.float32), device=device)
        params = _tensors(device, 1)
        mine = _copies(params)
        state = [[nc.Tensor.zeros((n,), device=device) for n in SIZES] for _ in range(6)]
        indices = list(range(len(SIZES)))
        steps, my_steps = _steps(device, len(SIZES)), _steps(device, len(SIZES))
        for step in range(STEPS):
            grads = _tensors(device, 20 + step)
            for p, g, m, v, x, i in zip(params, grads, state[0], state[1], state[4], indices, strict=True):
                adam_step_(p, g, m, v, steps, i, hyper, decoupled, max_exp_avg_sq=x if amsgrad else None)
            maxima = state[5] if amsgrad else None
            adam_multi_step_(
                mine, grads, state[2], state[3], my_steps, indices, hyper, decoupled, max_exp_avg_sqs=maxima
            )
            _advance(steps), _advance(my_steps)
        kept = params + state[0] + state[1] + (state[4] if amsgrad else [])
        for a, b in zip(kept, mine + state[2] + state[3] + (state[5] if amsgrad else []), strict=True):
            np.testing.assert_array_equal(a.to_host().view(np.uint32), b.to_host().view(np.uint32))


@pytest.mark.parametrize("split", [ItemSplit(CPU_CHUNK), ItemSplit(GPU_VECTOR, vector=True)], ids=["loop", "vector"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_multi_chunks_are_bit_identical_to_per_parameter(cl_device, optimizer, split, monkeypatch):
    """Parameters of several work-item chunks, each chunk a CPU device's loop or a GPU's vector, on whichever device
    runs the suite (sizes one past, one short of and exactly a chunk multiple, a tiny one), update as the
    per-parameter kernels do."""
    monkeypatch.setattr(optim_kernels, "update_split", lambda device: split)
    chunk = split.chunk
    sizes = [2 * chunk + 1, chunk, 3 * chunk - 1, 3, 2 * chunk]
    names = SGD_HYPER if optimizer == "sgd" else ADAM_HYPER
    values = (0.05, 0.9, 0.1, 0.01, 1.0) if optimizer == "sgd" else (1e-2, 0.8, 0.99, 1e-6, 0.1)
    assert len(names) == len(values)
    hyper = nc.tensor(np.asarray(values, np.float32), device=cl_device)
    params, mine = _tensors(cl_device, 5, sizes), _tensors(cl_device, 5, sizes)
    state = [[nc.Tensor.zeros((n,), device=cl_device) for n in sizes] for _ in range(4)]
    indices = list(range(len(sizes)))
    steps, my_steps = _steps(cl_device, len(sizes)), _steps(cl_device, len(sizes))
    for step in range(STEPS):
        grads = _tensors(cl_device, 30 + step, sizes)
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            if optimizer == "sgd":
                sgd_step_(p, g, state[0][i], steps, i, hyper)
            else:
                adam_step_(p, g, state[0][i], state[1][i], steps, i, hyper, False)
        if optimizer == "sgd":
            sgd_multi_step_(mine, grads, state[2], my_steps, indices, hyper)
        else:
            adam_multi_step_(mine, grads, state[2], state[3], my_steps, indices, hyper, False)
        _advance(steps), _advance(my_steps)
    theirs, ours = (params + state[0] + state[1], mine + state[2] + state[3])
    for a, b in zip(theirs, ours, strict=True):
        np.testing.assert_array_equal(a.to_host().view(np.uint32), b.to_host().view(np.uint32))


def test_adam_multi_float64_is_bit_identical_to_per_parameter(cl_device):
    """float64 parameters (a double compute type; several elements per work-item on CPU devices)."""
    hyper = nc.tensor(np.asarray((1e-2, 0.8, 0.99, 1e-6, 0.1), np.float32), device=cl_device)
    sizes = [5, 300, 17]

    def tensors(seed):
        rng = np.random.default_rng(seed)
        return [nc.tensor(rng.standard_normal(n), np.float64, device=cl_device) for n in sizes]

    params, mine = tensors(1), tensors(1)
    state = [[nc.Tensor.zeros((n,), np.float64, cl_device) for n in sizes] for _ in range(4)]
    steps, my_steps = _steps(cl_device, len(sizes)), _steps(cl_device, len(sizes))
    for step in range(STEPS):
        grads = tensors(20 + step)
        for i, (p, g, m, v) in enumerate(zip(params, grads, state[0], state[1], strict=True)):
            adam_step_(p, g, m, v, steps, i, hyper, False)
        adam_multi_step_(mine, grads, state[2], state[3], my_steps, list(range(len(sizes))), hyper, False)
        _advance(steps), _advance(my_steps)
    for a, b in zip(params + state[0] + state[1], mine + state[2] + state[3], strict=True):
        np.testing.assert_array_equal(a.to_host().view(np.uint64), b.to_host().view(np.uint64))


def test_multi_launch_count_and_replay(cl_device):
    """ceil(n / update_arity) launches; a captured step replays with the device-side step count."""
    n = update_arity(cl_device, 4) + 3
    hyper = nc.tensor(np.asarray((1e-2, 0.9, 0.999, 1e-8, 0.0), np.float32), device=cl_device)
    params, grads = _tensors(cl_device, 2, [9] * n), _tensors(cl_device, 3, [9] * n)
    ms, vs = (
        [nc.Tensor.zeros((9,), device=cl_device) for _ in range(n)],
        [nc.Tensor.zeros((9,), device=cl_device) for _ in range(n)],
    )
    steps = _steps(cl_device, n)
    mask = nc.tensor(np.ones(n, np.uint8), device=cl_device)
    ref = _copies(params)
    ref_m, ref_v = (
        [nc.Tensor.zeros((9,), device=cl_device) for _ in range(n)],
        [nc.Tensor.zeros((9,), device=cl_device) for _ in range(n)],
    )
    ref_steps = _steps(cl_device, n)
    adam_multi_step_(params, grads, ms, vs, steps, list(range(n)), hyper)  # builds outside the capture
    count_steps_(steps, mask)
    graph = Graph()
    with graph.capture(cl_device.queue):
        adam_multi_step_(params, grads, ms, vs, steps, list(range(n)), hyper)
        count_steps_(steps, mask)
    assert [s.name for s in graph.launches] == ["netcl_adam_multi"] * 2 + ["netcl_count_steps"]
    for _ in range(3):
        graph.execute()
    for _ in range(5):  # the eager reference: t = 1 (eager), 2 (run while captured), 3..5 (replays)
        for i in range(n):
            adam_step_(ref[i], grads[i], ref_m[i], ref_v[i], ref_steps, i, hyper)
        count_steps_(ref_steps, mask)
    for a, b in zip(params, ref, strict=True):
        np.testing.assert_array_equal(a.to_host().view(np.uint32), b.to_host().view(np.uint32))


def test_update_arity_follows_the_devices_kernel_argument_room():
    """32 parameters a launch where their pointers and the four arguments after them fit ``max_parameter_size``
    (NVIDIA's 4,352 bytes), else 16 (OpenCL's minimum of 1,024; PoCL's), and 16 off OpenCL."""

    def device(room: int, bits: int = 64):
        return types.SimpleNamespace(cl_device=types.SimpleNamespace(address_bits=bits, max_parameter_size=room))

    assert update_arity(device(4352), 4) == update_arity(device(4352), 5) == 32
    assert update_arity(device(1024), 4) == update_arity(device(1024), 5) == MULTI_ARITY == 16  # Adam's
    assert update_arity(device(1024), 3) == 32  # SGD's three buffers: 32 x 3 x 8 + 40 bytes fit
    assert update_arity(device(32 * 4 * 8 + 4 * 8 + 8), 4) == 32  # exactly full
    assert update_arity(device(32 * 4 * 8 + 4 * 8 + 7), 4) == 16
    assert update_arity(device(1024, bits=32), 4) == 32  # 4-byte pointers: 32 x 4 x 4 + 16 + 8 bytes
    assert update_arity(types.SimpleNamespace(cl_device=None), 4) == 16  # the NumPy backend


def test_multi_bad_inputs(cl_device):
    hyper = nc.tensor(np.zeros(len(SGD_HYPER), np.float32), device=cl_device)
    steps = _steps(cl_device, 2)
    p, g = _tensors(cl_device, 0, [4, 4]), _tensors(cl_device, 1, [4, 4])
    with pytest.raises(ValueError, match="grads has 1 entries, indices has 2"):
        sgd_multi_step_(p, g[:1], [None, None], steps, [0, 1], hyper)
    with pytest.raises(ValueError, match="all Tensors or all None"):
        sgd_multi_step_(p, g, [None, nc.Tensor.zeros((4,), device=cl_device)], steps, [0, 1], hyper)
    with pytest.raises(IndexError, match="index 5 is out of range"):
        sgd_multi_step_(p, g, [None, None], steps, [0, 5], hyper)
    with pytest.raises(Exception, match="shape"):
        sgd_multi_step_(p, [g[0], _tensors(cl_device, 2, [3])[0]], [None, None], steps, [0, 1], hyper)
    adam_hyper = nc.tensor(np.zeros(len(ADAM_HYPER), np.float32), device=cl_device)
    with pytest.raises(TypeError, match="exp_avg must be a Tensor"):
        adam_multi_step_(p, g, [None, None], p, steps, [0, 1], adam_hyper)


@pytest.mark.parametrize("opt_cls", [SGD, Adam, AdamW, RMSprop, Adagrad])
def test_optimizer_step_is_one_launch_per_group_and_dtype(cl_device, opt_cls):
    rng = np.random.default_rng(0)
    params = [
        nn.Parameter(rng.standard_normal(s).astype(np.float32), device=cl_device) for s in [(3, 4), (5,), (2, 2, 2)]
    ]
    opt = opt_cls(params, lr=0.1, **({"momentum": 0.9} if opt_cls is SGD else {}))
    for p in params:
        p.grad = nc.tensor(rng.standard_normal(p.shape).astype(np.float32), device=cl_device)
    opt.step()
    graph = Graph()
    with graph.capture(cl_device.queue):
        opt.step()
    kernels = {SGD: "netcl_sgd_multi", RMSprop: "netcl_rmsprop_multi", Adagrad: "netcl_adagrad_multi"}
    assert [s.name for s in graph.launches] == [kernels.get(opt_cls, "netcl_adam_multi"), "netcl_count_steps"]


def test_sgd_with_some_loaded_momentum_buffers_and_momentum_off_matches_per_parameter(device):
    """momentum 0 while only some parameters carry a momentum buffer (loaded from a state_dict):
    the mixed bucket updates per parameter; results equal the per-parameter kernels bit for bit."""
    rng = np.random.default_rng(4)
    values = [rng.standard_normal(s).astype(np.float32) for s in [(3,), (4, 2), (5,)]]
    grads = [rng.standard_normal(v.shape).astype(np.float32) for v in values]
    params = [nn.Parameter(v, device=device) for v in values]
    opt = SGD(params, lr=0.1)
    opt.state[params[1]] = {"momentum_buffer": nc.tensor(np.ones((4, 2), np.float32), device=device)}
    for p, g in zip(params, grads, strict=True):
        p.grad = nc.tensor(g, device=device)
    opt.step()
    hyper = nc.tensor(np.asarray((0.1, 0, 0, 0, 0), np.float32), device=device)
    steps = _steps(device, 3)
    for i, (v, g) in enumerate(zip(values, grads, strict=True)):
        ref = nc.tensor(v, device=device)
        buf = nc.tensor(np.ones((4, 2), np.float32), device=device) if i == 1 else None
        sgd_step_(ref, nc.tensor(g, device=device), buf, steps, i, hyper)
        np.testing.assert_array_equal(params[i].to_host().view(np.uint32), ref.to_host().view(np.uint32))
