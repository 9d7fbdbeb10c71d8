"""``Tensor``: a device buffer (or a NumPy array on the ``cpu`` backend) with shape and dtype.

What differs between backends (allocating, uploading, reading, viewing, copying) is the device's
``storage`` (``netcl.core.storage``), chosen once per ``Device``.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl

from netcl.core.broadcast import Shape, normalize_shape
from netcl.core.devices import Device, device_of_queue, get_device
from netcl.core.dtypes import as_dtype, float32
from netcl.core.errors import ShapeError

#: name -> function of two operands (``neg``: one), installed by ``netcl.runtime.ops`` on import.
ARITHMETIC: dict[str, Callable[..., Any]] = {}

#: (dtype argument, device) -> the dtype ``device.check_dtype`` returned for it (an equal key is the same dtype)
_CHECKED_DTYPES: dict[tuple[Any, Any], np.dtype] = {}
_INT = frozenset({int})
#: shape tuples that passed ``Tensor.empty``'s check, by identity: an op's plan passes the same tuple object
#: on every call, so its check is one lookup. An equal tuple of other objects (``(True, 2)`` equals ``(1, 2)``)
#: finds a different object here and is checked in full. Tuples are immutable: a checked one stays valid.
_CHECKED_SHAPES: dict[Any, tuple[int, ...]] = {}
_CHECKED_SHAPES_MAX = 4096
_MISSING = object()
#: (shape, the tuple a reshape was asked for) -> (that tuple, the shape it resolved to), kept by identity as
#: ``_CHECKED_SHAPES`` is: a loop's ``reshape(x, (-1, 16))`` passes the same constant tuple on every call
_RESHAPES: dict[tuple[Any, Any], tuple[Any, tuple[int, ...]]] = {}

#: Tensors of more bytes than this print their shape, not their values (a repr must stay cheap).
REPR_MAX_BYTES = 64 << 20


def _arithmetic(name: str) -> Callable[..., Any]:
    fn = ARITHMETIC.get(name)
    if fn is None:
        raise TypeError(
            f"netcl.core.Tensor arithmetic ({name}) runs kernels, which netcl-runtime provides: import "
            f"netcl.runtime (or netcl.autograd) first, or call netcl.runtime.ops.{name}(...) directly; "
            "to update parameters from their .grad use an optimizer from netcl.optim"
        )
    return fn


def _operator(name: str, reflected: bool = False) -> Callable[[Tensor, Any], Any]:
    def method(self: Tensor, other: Any) -> Any:
        if not isinstance(other, (Tensor, numbers.Number, np.generic)):
            return NotImplemented  # e.g. a Node: its reflected operator records the op on the tape
        fn = _arithmetic(name)
        return fn(other, self) if reflected else fn(self, other)

    method.__name__ = f"__{'r' if reflected else ''}{name}__"
    method.__doc__ = f"Elementwise {name} through netcl.runtime.ops (a new tensor)."
    return method


def format_values(tensor: Tensor, prefix: str = "") -> str:
    """The values as NumPy prints them (shortened past 1000 elements); a note for huge tensors."""
    if tensor.nbytes > REPR_MAX_BYTES:
        return f"<{tensor.nbytes >> 20} MiB, shape={tensor.shape}: call .numpy() to read it>"
    values = tensor.to_host()
    return np.array2string(values, separator=", ", prefix=prefix, threshold=1000, edgeitems=3)


class Tensor:
    """An n-dimensional, C-contiguous array on one device.

    On OpenCL ``data`` is a ``cl.Buffer``; on the NumPy backend it is an ``np.ndarray``.
    Views made by ``reshape`` share ``data`` and keep their base alive through ``base``; the subclass
    ``netcl.core.strided_view.StridedView`` reads another tensor's memory in another order.
    """

    __slots__ = ("data", "shape", "dtype", "device", "base", "grad", "_written_at", "__weakref__")
    #: whether this is a ``netcl.core.strided_view.StridedView`` (its ``data`` is gathered at each read)
    strided = False

    def __init__(self, data: Any, shape: Shape, dtype: np.dtype, device: Device, base: Tensor | None = None):
        self.data = data
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.base = base
        #: Gradient slot kept in sync with ``Node.grad`` by netcl.autograd.
        self.grad: Tensor | None = None
        #: ``netcl.core.writes``' number of the latest in-place write into this buffer (0: none)
        self._written_at = 0

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_host(cls, queue_or_device: cl.CommandQueue | Device | str | None, array: Any, dtype: Any = None) -> Tensor:
        """Copy a host array to the device; a non-contiguous array is copied, not rejected."""
        device = _resolve_device(queue_or_device)
        host = np.asarray(array)
        target = device.check_dtype(dtype if dtype is not None else _default_dtype(host))
        host = np.asarray(host, dtype=target, order="C")  # ascontiguousarray would turn 0-d into (1,)
        return device.storage.from_host(cls, host, target, device)

    @classmethod
    def empty(cls, shape: int | tuple[int, ...], dtype: Any = float32, device: Device | str | None = None) -> Tensor:
        """An uninitialized tensor."""
        try:
            known = _CHECKED_SHAPES.get(shape, _MISSING) is shape  # this very tuple passed the check below before
        except TypeError:  # unhashable: normalize_shape says what is wrong with it
            known = False
        if known:
            dims = shape
        elif type(shape) is tuple and {*map(type, shape)} <= _INT and min(shape, default=0) >= 0:
            dims = shape  # already a shape: a tuple of ints >= 0 (no bools, no NumPy ints)
            if len(_CHECKED_SHAPES) >= _CHECKED_SHAPES_MAX:
                _CHECKED_SHAPES.clear()
            _CHECKED_SHAPES[shape] = shape
        else:
            dims = normalize_shape(shape)
        if type(device) is not Device:  # an op's output names its Device: no lookup
            device = get_device(device)
        try:
            target = _CHECKED_DTYPES.get((dtype, device))
        except TypeError:  # an unhashable dtype argument: check_dtype says what is wrong with it
            target = None
        if target is None:
            target = device.check_dtype(dtype)
            if len(_CHECKED_DTYPES) < 1024:
                _CHECKED_DTYPES[(dtype, device)] = target
        data = device.storage.allocate(device, dims, target, math.prod(dims) * target.itemsize)
        return cls(data, dims, target, device)

    @classmethod
    def zeros(cls, shape: int | tuple[int, ...], dtype: Any = float32, device: Device | str | None = None) -> Tensor:
        """A tensor filled with zeros."""
        tensor = cls.empty(shape, dtype, device)
        tensor.device.storage.zero(tensor)
        return tensor

    # ---- properties ----------------------------------------------------------------------
    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def queue(self) -> cl.CommandQueue | None:
        return self.device.queue

    # ---- copying and pickling ----------------------------------------------------------------
    def __deepcopy__(self, memo: dict[int, Any]) -> Tensor:
        """``copy.deepcopy``: a tensor with its own buffer on the same device (and a copy of ``grad``), as
        torch's; what a deep-copied model (an EMA or target network) needs."""
        out = self.copy()
        memo[id(self)] = out
        if self.grad is not None:
            out.grad = copy.deepcopy(self.grad, memo)
        return out

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its values and its device's spec (``get_device(spec)`` on loading, as torch's
        ``map_location`` default loads onto the saving device)."""
        return (_unpickle, (self.to_host(), self.device.spec))

    # ---- movement ------------------------------------------------------------------------
    def to_host(self) -> np.ndarray:
        """A NumPy copy of the contents (waits for pending work on the device's queue).

        IndexError when a kernel recorded an out-of-range index since the last wait (``device_errors``).
        """
        return self.device.storage.to_host(self)

    def reshape(self, *shape: int | tuple[int, ...]) -> Tensor:
        """A view with a new shape sharing this tensor's buffer; one dim may be -1."""
        asked = shape[0] if len(shape) == 1 and type(shape[0]) is tuple else shape
        try:
            seen = _RESHAPES.get((self.shape, asked), _MISSING)
        except TypeError:  # an unhashable dim (a list inside): _infer_shape resolves or says what is wrong
            seen = None
        if type(seen) is tuple and (seen[0] is asked or {*map(type, asked)} <= _INT):
            # an equal tuple of plain ints (or this very tuple) was resolved from this shape before: no bool or
            # float equal to an int gets past here unchecked
            dims = seen[1]
        else:
            dims = asked
            size = math.prod(self.shape)
            # the common call: a tuple of plain ints >= 0 with the same element count (no -1 to infer)
            if not ({*map(type, dims)} <= _INT and min(dims, default=0) >= 0 and math.prod(dims) == size):
                dims = _infer_shape(shape, size, self.shape)
            if seen is not None:  # hashable: kept for the next call with this tuple
                if len(_RESHAPES) >= _CHECKED_SHAPES_MAX:
                    _RESHAPES.clear()
                _RESHAPES[(self.shape, asked)] = (asked, dims)
        device, base = self.device, self.base
        storage = device.storage
        data = self.data if storage.view_is_data else storage.view(self.data, dims)
        return Tensor(data, dims, self.dtype, device, self if base is None else base)

    def copy(self) -> Tensor:
        """A new tensor with its own buffer and the same contents."""
        return self.device.storage.copy(self, Tensor)

    def contiguous(self) -> Tensor:
        """This tensor (already C-contiguous; a ``StridedView`` returns a gathered copy)."""
        return self

    def is_contiguous(self) -> bool:
        """Whether ``data`` holds the elements in C order (False only for a ``StridedView``)."""
        return True

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the contents (as ``to_host``)."""
        return self.to_host()

    def to(self, device: Device | str) -> Tensor:
        """This tensor on ``device`` (itself when it is already there; else a copy through the host)."""
        target = get_device(device)
        if target is self.device:
            return self
        return Tensor.from_host(target, self.to_host(), self.dtype)

    def __repr__(self) -> str:
        return f"tensor({format_values(self, 'tensor(')}, device={self.device.spec}, dtype={self.dtype})"

    # ---- arithmetic: provided by netcl.runtime.ops (core runs no kernels) ------------------
    __array_ufunc__ = None  # NumPy scalars defer to the reflected operators below

    __add__ = _operator("add")
    __radd__ = _operator("add", reflected=True)
    __sub__ = _operator("sub")
    __rsub__ = _operator("sub", reflected=True)
    __mul__ = _operator("mul")
    __rmul__ = _operator("mul", reflected=True)
    __truediv__ = _operator("div")
    __rtruediv__ = _operator("div", reflected=True)
    __pow__ = _operator("pow")
    __rpow__ = _operator("pow", reflected=True)

    def __neg__(self) -> Tensor:
        return _arithmetic("neg")(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]


def tensor(data: Any, dtype: Any = None, device: Device | str | None = None) -> Tensor:
    """Make a ``Tensor`` from host data (lists, scalars, NumPy arrays) on ``device``."""
    return Tensor.from_host(device, data, dtype)


def _default_dtype(host: np.ndarray) -> np.dtype:
    """float64 data (and Python floats) become float32, as in PyTorch; others keep their dtype."""
    return float32 if host.dtype == np.float64 else as_dtype(host.dtype)


def _resolve_device(queue_or_device: cl.CommandQueue | Device | str | None) -> Device:
    if isinstance(queue_or_device, cl.CommandQueue):
        return device_of_queue(queue_or_device)
    return get_device(queue_or_device)


def _infer_shape(shape: tuple[Any, ...], size: int, old: Shape) -> Shape:
    dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    unknown = [i for i, d in enumerate(dims) if d == -1]
    if len(unknown) > 1:
        raise ShapeError(f"reshape {old} -> {dims}: only one dimension may be -1")
    if unknown:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise ShapeError(f"reshape {old} -> {dims}: cannot infer -1 for {size} elements")
        dims = tuple(size // known if d == -1 else d for d in dims)
    result = normalize_shape(dims)
    if math.prod(result) != size:
        raise ShapeError(f"cannot reshape {old} ({size} elements) to {result} ({math.prod(result)} elements)")
    return result


def _unpickle(host: np.ndarray, spec: str) -> Tensor:
    """A pickled ``Tensor``: ``host``'s values on the device ``spec`` names."""
    return Tensor.from_host(spec, host, host.dtype)
