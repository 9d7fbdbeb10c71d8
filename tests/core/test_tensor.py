"""Tensor construction, host round trips of every dtype, views, copies and the ``tensor`` helper."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

import netcl.core as nc

SHAPES = [(), (0,), (3, 0, 2), (7,), (4, 5), (2, 3, 4)]
ALL_DTYPES = [nc.float32, nc.float16, nc.float64, nc.int32, nc.int64, nc.uint8, nc.bool_]


def _values(dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Host data of ``dtype`` that exercises the type's range (extremes, NaN, inf, -0.0 for floats)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == nc.bool_:
        flat = rng.random(n) < 0.5
    elif dtype.kind == "f":
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(dtype).max, np.finfo(dtype).tiny], dtype)
        flat = (rng.standard_normal(n) * 100).astype(dtype)
        flat[: min(n, len(specials))] = specials[: min(n, len(specials))]
    else:
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        flat[: min(n, 2)] = np.array([info.min, info.max], dtype)[: min(n, 2)]
    return flat.reshape(shape)


def _supported(device: nc.Device) -> list[np.dtype]:
    return [d for d in ALL_DTYPES if device.supports(d)]


def _write(t: nc.Tensor, values: np.ndarray) -> None:
    """Overwrite ``t``'s storage directly (not through netcl), to observe buffer sharing."""
    values = np.ascontiguousarray(values, dtype=t.dtype)
    if t.device.kind == "cpu":
        t.data.reshape(-1)[:] = values.reshape(-1)
    elif values.nbytes:
        cl.enqueue_copy(t.queue, t.data, values, is_blocking=True)


def test_supported_dtypes_follow_extensions(device: nc.Device) -> None:
    for dtype in (nc.float32, nc.int32, nc.int64, nc.uint8, nc.bool_):
        assert device.supports(dtype)
    if device.kind == "cpu":
        assert _supported(device) == ALL_DTYPES
    else:
        assert device.supports(nc.float16)  # storage everywhere; arithmetic where the extension is
        assert device.computes(nc.float16) == ("cl_khr_fp16" in device.extensions)
        assert device.supports(nc.float64) == device.computes(nc.float64) == ("cl_khr_fp64" in device.extensions)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_every_dtype(device: nc.Device, shape: tuple[int, ...]) -> None:
    for dtype in _supported(device):
        host = _values(dtype, shape)
        # every dtype but float64 is kept as is; float64 data needs an explicit dtype to stay float64
        t = nc.Tensor.from_host(device, host, dtype=dtype if dtype == nc.float64 else None)
        assert (t.shape, t.dtype, t.device) == (shape, dtype, device)
        assert (t.size, t.ndim, t.nbytes) == (host.size, host.ndim, host.nbytes)
        back = t.to_host()
        assert type(back) is np.ndarray and back.dtype == dtype and back.shape == shape
        assert back.tobytes() == host.tobytes()  # bit-exact: NaN payloads, -0.0 and extremes survive


def test_from_queue_and_explicit_dtype(cl_device: nc.Device) -> None:
    host = np.arange(6, dtype=np.float64).reshape(2, 3) / 7
    t = nc.Tensor.from_host(cl_device.queue, host, dtype=nc.float32)
    assert t.device is cl_device and t.queue is cl_device.queue and isinstance(t.data, cl.Buffer)
    np.testing.assert_array_equal(t.to_host(), host.astype(np.float32))
    foreign = cl.CommandQueue(cl.Context([cl_device.cl_device]))
    with pytest.raises(nc.DeviceError, match="does not belong to any netcl device context"):
        nc.Tensor.from_host(foreign, host)


def test_cpu_backend_holds_numpy(device: nc.Device) -> None:
    t = nc.Tensor.from_host(device, np.ones((2, 2), np.float32))
    if device.kind == "cpu":
        assert t.queue is None and isinstance(t.data, np.ndarray) and t.data.shape == (2, 2)
    else:
        assert isinstance(t.data, cl.Buffer) and t.data.size >= t.nbytes


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a[:, ::2],
        lambda a: a.T,
        lambda a: np.asfortranarray(a),
        lambda a: a[::-1, 1:],
        lambda a: np.broadcast_to(a[:1], a.shape),
    ],
    ids=["strided", "transposed", "fortran", "reversed", "broadcast"],
)
def test_non_contiguous_host_arrays_are_copied(device: nc.Device, make) -> None:
    source = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = make(source)
    expected = np.array(view, copy=True)
    t = nc.Tensor.from_host(device, view)
    assert t.shape == view.shape
    source[...] = -1  # the tensor owns its data: later host writes do not leak in
    np.testing.assert_array_equal(t.to_host(), expected)


def test_to_host_is_a_copy(device: nc.Device) -> None:
    t = nc.Tensor.from_host(device, np.arange(4, dtype=np.int32))
    out = t.to_host()
    out[:] = 0
    np.testing.assert_array_equal(t.to_host(), [0, 1, 2, 3])


@pytest.mark.parametrize("shape", [(), 5, (2, 3), (0, 4)], ids=str)
def test_empty_and_zeros(device: nc.Device, shape: int | tuple[int, ...]) -> None:
    dims = (shape,) if isinstance(shape, int) else shape
    for dtype in _supported(device):
        t = nc.Tensor.empty(shape, dtype=dtype, device=device)
        assert (t.shape, t.dtype, t.device) == (dims, dtype, device)
        _write(t, _values(dtype, dims, seed=1))  # dirty the storage so zeros must really clear it
        z = nc.Tensor.zeros(shape, dtype=dtype, device=device)
        np.testing.assert_array_equal(z.to_host(), np.zeros(dims, dtype))
        assert z.to_host().dtype == dtype
    assert nc.Tensor.zeros(3, device=device).dtype == nc.float32  # float32 is the default dtype
    assert nc.Tensor.zeros(np.int64(3), device=device).shape == (3,)


def test_empty_uses_default_device(device: nc.Device) -> None:
    assert nc.Tensor.empty((2,)).device is nc.get_device()
    assert nc.Tensor.empty((2,), device=device.spec).device is device


def test_reshape_view_shares_buffer(device: nc.Device) -> None:
    t = nc.Tensor.from_host(device, np.arange(12, dtype=np.float32))
    v = t.reshape(3, -1)
    assert v.shape == (3, 4) and v.base is t and v.dtype == t.dtype and v.device is device
    assert t.reshape((2, 6)).shape == (2, 6) and t.reshape([-1]).shape == (12,)
    w = v.reshape(2, 2, 3)
    assert w.base is t  # views of views keep the root alive
    np.testing.assert_array_equal(w.to_host(), np.arange(12).reshape(2, 2, 3))

    _write(v, np.full((3, 4), 7.0))  # write through the view ...
    np.testing.assert_array_equal(t.to_host(), np.full(12, 7.0, np.float32))  # ... read through the base
    _write(t, np.arange(12) * 2.0)  # and the other way round
    np.testing.assert_array_equal(v.to_host(), (np.arange(12) * 2.0).reshape(3, 4))


def test_reshape_zero_d_and_zero_size(device: nc.Device) -> None:
    s = nc.Tensor.from_host(device, np.float32(2.5))
    assert s.shape == () and s.reshape(1, 1).shape == (1, 1)
    back = s.reshape(1).reshape(())
    assert back.shape == () and back.base is s and back.to_host() == np.float32(2.5)
    assert s.reshape(-1).shape == (1,)
    z = nc.Tensor.zeros((0, 3), device=device)
    assert z.reshape(3, 0).reshape(0).base is z
    assert z.reshape(0, 5).shape == (0, 5)


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((-1, -1), r"reshape \(12,\) -> \(-1, -1\): only one dimension may be -1"),
        ((5, -1), r"reshape \(12,\) -> \(5, -1\): cannot infer -1 for 12 elements"),
        ((0, -1), r"cannot infer -1 for 12 elements"),
        ((5, 2), r"cannot reshape \(12,\) \(12 elements\) to \(5, 2\) \(10 elements\)"),
        ((3, -2), r"negative dimension -2"),
        ((2.0, 6), r"non-integer dimension 2\.0"),
    ],
)
def test_reshape_errors(device: nc.Device, shape: tuple, match: str) -> None:
    t = nc.Tensor.zeros(12, device=device)
    with pytest.raises(nc.ShapeError, match=match):
        t.reshape(*shape)


def test_reshape_remembers_an_asked_tuple_by_value_and_type(device: nc.Device) -> None:
    """A resolved reshape is kept for the tuple asked, found again by an equal tuple of plain ints (a loop's
    constant, or ``reshape(batch, -1)``'s new tuple each call); an equal tuple of other objects (``True`` equals
    1, ``3.0`` equals 3) is checked in full, and another shape resolves on its own."""
    t = nc.Tensor.zeros(12, device=device)
    asked, ones = (3, -1), (1, 12)
    assert t.reshape(asked).shape == (3, 4) and t.reshape(asked).shape == (3, 4)
    assert t.reshape(tuple([3, -1])).shape == (3, 4) and t.reshape(3, -1).shape == (3, 4)
    assert t.reshape(np.int64(3), -1).shape == (3, 4)
    assert t.reshape(ones).shape == (1, 12)
    with pytest.raises(nc.ShapeError, match="non-integer dimension True"):
        t.reshape((True, 12))
    with pytest.raises(nc.ShapeError, match=r"non-integer dimension 3\.0"):
        t.reshape((3.0, -1))
    assert nc.Tensor.zeros((6, 4), device=device).reshape(asked).shape == (3, 8)


def test_copy_is_independent(device: nc.Device) -> None:
    host = np.arange(10, dtype=np.int32)
    t = nc.Tensor.from_host(device, host)
    c = t.copy()
    assert c.data is not t.data and c.base is None and (c.shape, c.dtype) == (t.shape, t.dtype)
    np.testing.assert_array_equal(c.to_host(), host)
    _write(c, -host)
    np.testing.assert_array_equal(t.to_host(), host)
    np.testing.assert_array_equal(c.to_host(), -host)
    assert nc.Tensor.zeros((0, 2), device=device).copy().shape == (0, 2)
    view_copy = t.reshape(2, 5).copy()
    assert view_copy.shape == (2, 5) and view_copy.base is None


def test_tensor_convenience(device: nc.Device) -> None:
    f = nc.tensor([[1.5, 2.0], [3.0, 4.0]], device=device)
    assert f.dtype == nc.float32 and f.shape == (2, 2) and f.device is device  # float64 input -> float32
    np.testing.assert_array_equal(f.to_host(), np.array([[1.5, 2.0], [3.0, 4.0]], np.float32))
    assert nc.tensor(np.linspace(0, 1, 5), device=device).dtype == nc.float32
    scalar = nc.tensor(0.1, device=device)
    assert scalar.shape == () and scalar.to_host() == np.float32(0.1)
    assert nc.tensor([1, 2, 3], device=device).dtype == np.asarray([1, 2, 3]).dtype  # ints keep their dtype
    assert nc.tensor([True, False], device=device).dtype == nc.bool_
    assert nc.tensor(np.arange(3, dtype=np.uint8), device=device).dtype == nc.uint8
    explicit = nc.tensor([1, 2], dtype="int32", device=device)
    assert explicit.dtype == nc.int32 and explicit.to_host().tolist() == [1, 2]
    if device.supports(nc.float64):
        double = nc.tensor(np.array([0.1]), dtype=nc.float64, device=device)
        assert double.dtype == nc.float64 and double.to_host()[0] == 0.1
    assert nc.tensor([0.5], device=device.spec).device is device
    assert nc.tensor([0.5]).device is nc.get_device()


def test_repr_and_len(device: nc.Device) -> None:
    t = nc.Tensor.zeros((3, 2), dtype=nc.int32, device=device)
    assert repr(t) == f"tensor([[0, 0],\n        [0, 0],\n        [0, 0]], device={device.spec}, dtype=int32)"
    assert len(t) == 3
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(nc.tensor(1.0, device=device))


def test_repr_shortens_like_numpy_and_skips_huge_tensors(device: nc.Device, monkeypatch) -> None:
    import sys

    from netcl.core import tensor as tensor_function  # noqa: F401 - the module is patched below

    long = nc.tensor(np.arange(5000, dtype=np.float32), device=device)
    assert "..." in repr(long) and repr(long).startswith("tensor([0.000e+00,")  # NumPy's summarization
    monkeypatch.setattr(sys.modules["netcl.core.tensor"], "REPR_MAX_BYTES", 1000)
    assert (
        repr(long) == f"tensor(<0 MiB, shape=(5000,): call .numpy() to read it>, device={device.spec}, dtype=float32)"
    )


def test_numpy_and_to(device: nc.Device) -> None:
    t = nc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.to(device) is t and t.to(device.spec) is t
    moved = t.to("cpu")
    assert moved.device is nc.get_device("cpu") and moved.dtype == t.dtype
    np.testing.assert_array_equal(moved.numpy(), t.numpy())


def test_tensor_arithmetic_runs_the_runtime_ops(device: nc.Device) -> None:
    import netcl.runtime  # noqa: F401 - installs the operators

    a = nc.tensor(np.array([1.0, 2.0, 4.0], np.float32), device=device)
    b = nc.tensor(np.array([0.5, 0.25, 2.0], np.float32), device=device)
    cases = [
        (a + b, [1.5, 2.25, 6.0]),
        (a - 1, [0.0, 1.0, 3.0]),
        (2 - a, [1.0, 0.0, -2.0]),
        (a * b, [0.5, 0.5, 8.0]),
        (np.float32(3) * a, [3.0, 6.0, 12.0]),
        (a / b, [2.0, 8.0, 2.0]),
        (1 / a, [1.0, 0.5, 0.25]),
        (a**2, [1.0, 4.0, 16.0]),
        (-a, [-1.0, -2.0, -4.0]),
    ]
    for result, expected in cases:  # each is one exactly representable float32 operation
        assert isinstance(result, nc.Tensor) and result.device is device
        np.testing.assert_array_equal(result.numpy(), np.array(expected, np.float32))
    assert a.__add__("text") is NotImplemented  # other types get their reflected operator (a Node's)
