"""batch_norm's channel kernels (netcl.runtime.ops.batchnorm) vs float64 NumPy, on PoCL and the NumPy backend.

``check`` compares the forward with the float64 reference, the gradients with its central
differences and runs ``ag.gradcheck``. The shapes pick each kernel path: (N, C) and odd spatial
sizes load scalars, ``S % 4 == 0`` loads float4, channels of more than 4 vectors spread over
several lanes (the tree in local memory). Tolerances: a channel sums at most 512 float32 terms of
magnitude <= ~4 (|x - k| with the shift k one of the channel's values), relative error ~1e-6; the
gradients chain two channel sums, checked at 1e-4 as the other norms (``ag.gradcheck``, float32 finite
differences, only on channels of at most 64 values: beyond, its own noise passes 1e-3). Data far from zero (around
100) checks that the shifted one-pass variance does not cancel.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import netcl.autograd as ag
import netcl.core as nc
import netcl.nn as nn
from netcl.core import DTypeError, ShapeError
from netcl.runtime.graph import Graph, capture_graph
from netcl.runtime.ops import batchnorm as BN


def ref_train(x, w=None, b=None, eps=1e-5):
    axes = (0, *range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    return y * (1 if w is None else w.reshape(shape)) + (0 if b is None else b.reshape(shape))


def stats(c, device, mean=0.0, var=1.0):
    return nc.tensor(np.full(c, mean, np.float32), device=device), nc.tensor(np.full(c, var, np.float32), device=device)


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 5), (4, 2, 4, 4), (3, 2, 7, 9), (32, 2, 1, 8)])
def test_training(check, device, shape):
    rm, rv = stats(shape[1], device)
    fn = lambda x, w, b: ag.batch_norm(x, rm, rv, w, b, training=True)  # noqa: E731
    small = np.prod(shape) // shape[1] <= 64  # float32 finite differences of longer channels are noise (~1e-3)
    check([shape, shape[1:2], shape[1:2]], ref_train, fn, grad_atol=1e-4, gradcheck=small)


def test_training_far_from_zero(check, device):
    fn = lambda x: ag.batch_norm(x, None, None, training=True)  # noqa: E731
    check([(6, 2, 4, 4)], ref_train, fn, low=100.0, high=104.0, atol=5e-5, grad_atol=1e-3, gradcheck=False)


def test_training_no_affine_and_partial_grads(check, device):
    check([(4, 3, 6)], ref_train, lambda x: ag.batch_norm(x, None, None, training=True), grad_atol=1e-4)
    fn = lambda x, w, b: ag.batch_norm(x, None, None, w, b, training=True)  # noqa: E731
    check([(4, 3, 8), (3,), (3,)], ref_train, fn, requires_grad=[False, True, False])
    check([(4, 3, 8), (3,), (3,)], ref_train, fn, requires_grad=[False, False, True])


def test_eval(check, device):
    mean, var = np.array([0.5, -1.0, 0.2]), np.array([0.5, 2.0, 1.5])
    rm, rv = nc.tensor(mean.astype(np.float32), device=device), nc.tensor(var.astype(np.float32), device=device)
    shape = (1, 3, 1, 1)

    def ref(x, w, b):
        return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-3) * w.reshape(shape) + b.reshape(shape)

    check([(2, 3, 2, 4), (3,), (3,)], ref, lambda x, w, b: ag.batch_norm(x, rm, rv, w, b, eps=1e-3))
    np.testing.assert_array_equal(rv.to_host(), var.astype(np.float32))  # eval leaves them alone


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5, 4)])
def test_running_stats_in_place(device, shape):
    x = np.random.default_rng(3).standard_normal(shape) * 2 + 1
    rm, rv = stats(shape[1], device, 0.5, 2.0)
    ag.batch_norm(ag.tensor(x.astype(np.float32), device=device), rm, rv, training=True, momentum=0.2)
    x = x.astype(np.float32).astype(np.float64)
    axes = (0, *range(2, x.ndim))
    np.testing.assert_allclose(rm.to_host(), 0.8 * 0.5 + 0.2 * x.mean(axes), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv.to_host(), 0.8 * 2.0 + 0.2 * x.var(axes, ddof=1), rtol=1e-5)


def test_float64_kernels_match_numpy(device):
    """The runtime functions directly, float64 data: the kernels' formulas to 1e-12."""
    rng = np.random.default_rng(5)
    x, g = rng.standard_normal((3, 4, 6, 4)), rng.standard_normal((3, 4, 6, 4))
    w = rng.standard_normal(4)
    t = lambda a: nc.tensor(a, dtype=np.float64, device=device)  # noqa: E731
    y, mean, rstd = BN.batch_norm_forward(t(x), None, None, t(w), None, training=True)
    np.testing.assert_allclose(y.to_host(), ref_train(x, w), atol=1e-12)
    xh = ref_train(x)
    axes = (0, 2, 3)
    dx, dw, db = BN.batch_norm_backward(t(g), t(x), mean, rstd, t(w), training=True)
    inner = g - g.mean(axes, keepdims=True) - xh * (g * xh).mean(axes, keepdims=True)
    np.testing.assert_allclose(
        dx.to_host(), w.reshape(1, 4, 1, 1) * rstd.to_host().reshape(1, 4, 1, 1) * inner, atol=1e-12
    )
    np.testing.assert_allclose(dw.to_host(), (g * xh).sum(axes), atol=1e-11)
    np.testing.assert_allclose(db.to_host(), g.sum(axes), atol=1e-11)


def test_float16_input(device):
    if not device.computes(np.float16):
        pytest.skip("float16 is storage-only here (no cl_khr_fp16)")
    x = np.random.default_rng(2).standard_normal((8, 3, 4, 4)).astype(np.float16)
    y = ag.batch_norm(ag.tensor(x, device=device), None, None, training=True)
    assert y.dtype == np.float16
    # half storage of y: relative 2^-11 of values <= ~4
    np.testing.assert_allclose(y.to_host().astype(np.float64), ref_train(x.astype(np.float64)), atol=4e-3)


def _launches(device, training: bool = True) -> tuple[int, list[str]]:
    """(forward launches, every launch's kernel name) of a BatchNorm2d forward and backward."""
    layer = nn.BatchNorm2d(4, device=device)
    x = ag.tensor(np.random.default_rng(0).standard_normal((2, 4, 4, 4)).astype(np.float32), device=device)
    x.requires_grad = True
    for _ in range(2):  # the second pass counts (programs built by the first)
        graph = Graph()
        with graph.capture(device.queue):
            with ag.Tape() as tape:
                out = ag.batch_norm(x, layer.running_mean, layer.running_var, layer.weight, layer.bias, training)
            forward = len(graph)
            tape.backward(out, grad=nc.tensor(np.ones((2, 4, 4, 4), np.float32), device=device))
    return forward, [launch.name for launch in graph.launches]


def test_one_kernel_each_way(cl_device):
    """Forward is one launch (statistics, normalization, running stats), backward one launch."""
    forward, names = _launches(cl_device)
    assert forward == 1 and names[0] == "netcl_batch_norm", names
    assert names.count("netcl_batch_norm_backward") == 1, names


def test_counter_counts_training_calls(device):
    """``num_batches_tracked`` gains one per training call (eager, and per replay of a captured forward),
    none from the backward, inside the forward's launches (no kernel of its own)."""
    counter = nc.tensor(np.array(5, np.int64), dtype=np.int64, device=device)
    rm, rv = stats(3, device)
    x = ag.tensor(np.random.default_rng(5).standard_normal((4, 3, 4, 4)).astype(np.float32), device=device)
    x.requires_grad = True
    for _ in range(2):
        with ag.Tape() as tape:
            out = ag.batch_norm(x, rm, rv, training=True, num_batches_tracked=counter)
        tape.backward(ag.sum(out * out))
    assert counter.to_host() == 7
    BN.batch_norm_forward(_t((4, 0, 3), device), None, None, training=True, num_batches_tracked=counter)
    assert counter.to_host() == 8  # no channels: nothing to normalize, a batch counted (as torch)
    if device.kind == "opencl":

        def forward(x):
            return BN.batch_norm_forward(x, rm, rv, training=True, num_batches_tracked=counter)[0]

        graph = capture_graph(device.queue, forward, x.value)
        assert [launch.name for launch in graph.launches] == ["netcl_batch_norm"] * len(graph.launches)
        counted = counter.to_host()  # the capture ran the forward once
        graph.execute(x.value)
        graph.execute(x.value)
        assert counter.to_host() == counted + 2


@pytest.mark.parametrize("parts", [2, 7])
def test_channels_split_into_chunks(check, device, monkeypatch, parts):
    """With few channels on a GPU each channel spreads over several work-groups (``_parts``; forced
    here): the statistics' chunk sums are added in chunk order by a second launch. Training (also far
    from zero, without affine parameters), evaluation, the running statistics, float64 formulas and
    more chunks than a channel has vectors, against the same references as above; a captured
    training step replays bit for bit as eager; two launches forward and backward in training, one
    forward in evaluation."""
    if device.kind != "opencl":
        pytest.skip("chunks are the OpenCL kernels' (the NumPy backend sums whole channels)")
    cl_device = device
    monkeypatch.setattr(BN, "_parts", lambda device, channels, vectors, backward=False: parts)
    test_training(check, cl_device, (3, 2, 7, 9))
    test_training(check, cl_device, (4, 3, 8, 8))
    test_training(check, cl_device, (5, 3))
    test_training_far_from_zero(check, cl_device)
    test_training_no_affine_and_partial_grads(check, cl_device)
    test_eval(check, cl_device)
    test_running_stats_in_place(cl_device, (4, 3, 5, 4))
    test_float64_kernels_match_numpy(cl_device)
    test_counter_counts_training_calls(cl_device)  # one increment although the forward runs twice
    # a captured training forward and backward (two stages each) replays on new inputs as eager runs
    rng = np.random.default_rng(4)
    x, g = (nc.tensor(rng.standard_normal((3, 4, 6, 8)).astype(np.float32), device=cl_device) for _ in range(2))
    w = nc.tensor(rng.standard_normal(4).astype(np.float32), device=cl_device)

    def step(x, g):
        y, mean, rstd = BN.batch_norm_forward(x, None, None, w, None, training=True)
        return (y, *BN.batch_norm_backward(g, x, mean, rstd, w, training=True))

    graph = capture_graph(cl_device.queue, step, x, g)
    x2, g2 = (nc.tensor(rng.standard_normal((3, 4, 6, 8)).astype(np.float32), device=cl_device) for _ in range(2))
    for got, want in zip(graph.execute(x2, g2), step(x2, g2), strict=True):
        np.testing.assert_array_equal(got.to_host(), want.to_host())
    for training in (True, False):
        forward, names = _launches(cl_device, training)
        assert forward == (2 if training else 1) and names[:forward] == ["netcl_batch_norm"] * forward, names
        assert names.count("netcl_batch_norm_backward") == 2, names  # (eval too: the weight's gradient sums)


@pytest.mark.parametrize(
    ("channels", "vectors", "forward", "backward"),
    [
        (64, 32768, 4, 8),  # (128, 64, 32, 32): chunks of >= 8192 vectors forward, >= 2048 backward
        (128, 8192, 1, 4),  # (128, 128, 16, 16)
        (256, 2048, 1, 1),  # (128, 256, 8, 8): channels enough
        (512, 512, 1, 1),
        (3, 100, 1, 1),  # shorter than one chunk
    ],
)
def test_chunks_per_channel_on_a_gpu_of_132_units(channels, vectors, forward, backward):
    """``_parts`` on a GPU of 132 compute units (an H100's or H200's count): the forward splits a channel into
    enough chunks of >= MIN_CHUNK vectors to give each unit 4 groups, the backward into chunks of >=
    BACKWARD_MIN_CHUNK vectors up to 4 groups a unit; other devices never split."""
    gpu = SimpleNamespace(is_gpu=True, cl_device=SimpleNamespace(max_compute_units=132))
    assert BN._parts(gpu, channels, vectors) == forward
    assert BN._parts(gpu, channels, vectors, backward=True) == backward
    cpu = SimpleNamespace(is_gpu=False, cl_device=SimpleNamespace(max_compute_units=132))
    assert BN._parts(cpu, channels, vectors) == BN._parts(cpu, channels, vectors, backward=True) == 1


def _t(shape, device, dtype=np.float32):
    return nc.tensor(np.ones(shape, dtype), dtype=dtype, device=device)


BAD = [
    ("int x", lambda d: BN.batch_norm(_t((4, 3), d, np.int32), None, None, training=True), DTypeError, "floating"),
    ("x 1-d", lambda d: BN.batch_norm(_t((4,), d), None, None, training=True), ShapeError, r"\(N, C\)"),
    ("weight shape", lambda d: BN.batch_norm(_t((4, 3), d), None, None, _t((4,), d), training=True), ShapeError,
     r"weight must have shape \(3,\) \(the channels of x\), got \(4,\)"),
    ("one running stat", lambda d: BN.batch_norm(_t((4, 3), d), _t((3,), d), None, training=True), ValueError,
     "both be given"),
    ("eval without stats", lambda d: BN.batch_norm(_t((4, 3), d), None, None), ValueError,
     "required when training=False"),
    ("one value per channel", lambda d: BN.batch_norm(_t((1, 3, 1), d), None, None, training=True), ValueError,
     "more than 1 value per channel"),
    ("eps", lambda d: BN.batch_norm(_t((4, 3), d), None, None, training=True, eps=0.0), ValueError, "eps must be > 0"),
    ("momentum", lambda d: BN.batch_norm(_t((4, 3), d), None, None, training=True, momentum="x"), TypeError,
     "momentum must be a number"),
    ("weight list", lambda d: BN.batch_norm(_t((4, 3), d), None, None, [1, 1, 1], training=True), TypeError,
     "weight must be a Tensor or None, got list"),
    ("backward g shape", lambda d: BN.batch_norm_backward(_t((4, 2), d), _t((4, 3), d), _t((3,), d), _t((3,), d)),
     ShapeError, r"g \(4, 2\) and x \(4, 3\)"),
    ("backward stats dtype",
     lambda d: BN.batch_norm_backward(_t((4, 3), d), _t((4, 3), d), _t((3,), d, np.float64), _t((3,), d)),
     DTypeError, "mean and rstd must be float32"),
    ("ag eps", lambda d: ag.batch_norm(_t((4, 3), d), None, None, training=True, eps=-1.0), ValueError, "eps"),
    ("counter dtype", lambda d: ag.batch_norm(_t((4, 3), d), None, None, training=True, num_batches_tracked=_t((), d)),
     TypeError, r"num_batches_tracked must be an int64 tensor of shape \(\) .* got dtype float32"),
    ("counter in eval", lambda d: BN.batch_norm_forward(_t((4, 3), d), _t((3,), d), _t((3,), d),
                                                        num_batches_tracked=_t((), d, np.int64)),
     ValueError, "num_batches_tracked counts training calls; got training=False"),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs_raise_before_launch(device, case, raises_before_launch):
    _, fn, error, match = case
    if "dtype" in case[0] and not device.supports(np.float64):
        pytest.skip("no cl_khr_fp64")
    raises_before_launch(device, error, match, lambda: fn(device))
