"""``StridedView``: a tensor that reads another tensor's memory in an order of its own, with no copy.

A transpose (``x.T``, ``x.permute(...)``) or a basic index that is not one contiguous block of its source
(``x[:, 0]``, ``x[::2]``; on NVIDIA also a block whose start misses the device's sub-buffer alignment) is
a ``StridedView``: the source's C-contiguous memory under ``(shape, strides, offset)``, counted in elements.
Making one launches nothing, as torch's views do.

Reading one gathers it: ``view.data`` (what every kernel argument and host read takes) is a new C-contiguous
buffer holding the view's elements at that point of the device's queue, so a view always reads its
source's current values, as an alias does; ``contiguous()`` keeps that buffer as a tensor of its own. The
gather is ``GATHER[0](view)``, installed by ``netcl.runtime`` (core runs no kernels); every backend's
strided copy serves it.

Views are read-only: ``netcl.core.writes.written`` (called by every in-place writer before it enqueues)
raises ``ValueError`` for a view, so an in-place write can never land in a gathered copy and be lost.
A view shares its source's in-place-write stamp (``base`` is the source's root tensor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from netcl.core.tensor import Tensor

#: ``[gather]``: ``gather(view) -> Tensor``, a new C-contiguous tensor of the view's elements (netcl.runtime)
GATHER: list[Callable[[StridedView], Tensor]] = []


def _gather(view: StridedView) -> Tensor:
    if not GATHER:
        raise TypeError(
            "reading a strided view runs a gather kernel, which netcl-runtime provides: import netcl.runtime "
            "(or netcl.autograd) first"
        )
    return GATHER[0](view)


class StridedView(Tensor):
    """Elements ``source[offset + sum(i_k * strides[k])]`` of ``source``'s C-contiguous memory for every
    index ``i`` of ``shape`` (``source`` is a plain ``Tensor``; a view of a view is made of the first
    view's source). See the module docstring for when its values are read."""

    __slots__ = ("source", "strides", "offset")
    strided = True

    def __init__(self, source: Tensor, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> None:
        if source.strided:
            raise TypeError("a StridedView's source must be a plain Tensor (compose the two views instead)")
        # Tensor's slots but ``data`` (a property here: Tensor.__init__ would set it)
        self.shape = shape
        self.dtype = source.dtype
        self.device = source.device
        self.base = source.base if source.base is not None else source
        self.grad = None
        self._written_at = 0
        self.source = source
        self.strides = strides
        self.offset = offset

    @property
    def data(self) -> Any:  # type: ignore[override]
        """A new C-contiguous buffer of the view's elements, gathered now (one copy per read)."""
        return _gather(self).data

    def contiguous(self) -> Tensor:
        """A new C-contiguous tensor of the view's elements (its own memory; later writes to the source do
        not reach it)."""
        return _gather(self)

    def is_contiguous(self) -> bool:
        return False

    def copy(self) -> Tensor:
        """A new tensor with its own buffer and the view's elements."""
        return _gather(self)

    def reshape(self, *shape: int | tuple[int, ...]) -> Tensor:
        """The view's elements under a new shape: a gathered copy, as torch's reshape of a non-contiguous
        tensor copies."""
        return _gather(self).reshape(*shape)

    def __repr__(self) -> str:
        return (
            f"{super().__repr__()[:-1]}, strides={self.strides}, offset={self.offset}, "
            f"source shape={self.source.shape})"
        )
