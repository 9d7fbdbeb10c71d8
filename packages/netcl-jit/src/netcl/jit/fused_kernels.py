"""The backend of a ``FusedStep``, chosen once when the step is built: OpenCL kernels or NumPy functions.

``OpenCLFusedKernels`` generates OpenCL C (``opencl_source``, or ``column_source`` where a bias-like
gradient is summed over the rows inside the kernel), builds it through the runtime's program cache
and runs each kernel through a ``PreparedLaunch`` whose element count is bound once.
``NumpyFusedKernels`` generates and runs Python functions (``numpy_source``); it has no column
sums and no direct (prepared) call.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.jit import numpy_source, opencl_source
from netcl.jit.column_source import ColumnLayout, column_kernel_source, column_layout
from netcl.jit.tuning import column_groups, launch_config
from netcl.runtime import results
from netcl.runtime.cache import program_cache
from netcl.runtime.launch import PreparedLaunch

_F32 = np.dtype(np.float32)

Shapes = list[tuple[int, ...] | None]


class FusedKernels:
    """Builds and runs the kernels of one fused group (shape ``shape``, inputs ``input_shapes``) on ``device``."""

    def __init__(self, device: Device, label: str, input_shapes: Shapes, shape: tuple[int, ...]) -> None:
        self.device = device
        self.label = label
        #: per external input: its shape, or None for a scalar parameter
        self.input_shapes = input_shapes
        self.shape = shape
        self.size = math.prod(shape)
        self.nbytes = self.size * 4

    def source(self, name: str, body, has_gout: bool) -> str:
        """The source of kernel ``name`` computing ``body`` (a backward one when ``has_gout``)."""
        raise NotImplementedError

    def build(self, name: str, source: str, n_out: int, has_gout: bool, work_items: int | None = None) -> Any:
        """The runnable form of ``source`` (``n_out`` outputs; ``work_items`` for a column kernel)."""
        raise NotImplementedError

    def run(self, compiled: Any, values: list[Any], outs: list[Tensor], gout: Tensor | None) -> None:
        """Run ``compiled`` on the input values (Tensors or numbers), writing ``outs``."""
        raise NotImplementedError

    def empty(self) -> Tensor:
        """A new float32 tensor of the group's shape (straight from the device's allocator)."""
        raise NotImplementedError

    def column_layout(self) -> ColumnLayout | None:
        """The backward kernels' column layout; None where column sums are off or inputs do not fit."""
        return None

    def column_source(self, name: str, body, layout: ColumnLayout, columns: list[bool]) -> str:
        """The source of a backward kernel that sums the ``columns`` gradients over the rows (``layout``)."""
        raise NotImplementedError(f"{type(self).__name__} has no column kernels")

    def direct_call(self, compiled: Any):
        """``call(*args)``: one prepared launch of ``compiled`` on raw arguments, or None where there is none."""
        return None


class OpenCLFusedKernels(FusedKernels):
    """OpenCL kernels built through ``program_cache``; a prepared launch per kernel, column sums where tuned on."""

    def __init__(self, device: Device, label: str, input_shapes: Shapes, shape: tuple[int, ...]) -> None:
        super().__init__(device, label, input_shapes, shape)
        self.configs = {d: launch_config(device, d) for d in ("forward", "backward")}
        #: id of a compiled (kernel, global, local) -> its PreparedLaunch (``run``)
        self._launches: dict[int, PreparedLaunch] = {}

    def source(self, name: str, body, has_gout: bool) -> str:
        config = self.configs["backward" if has_gout else "forward"]
        return opencl_source.kernel_source(
            name,
            self.input_shapes,
            self.shape,
            body,
            int(has_gout),
            config.vector_width,
            config.items,
            config.vector_body,
        )

    def build(self, name: str, source: str, n_out: int, has_gout: bool, work_items: int | None = None):
        """(kernel, global size, local size)."""
        handle = program_cache.get_or_compile(("jit", self.label), source, self.device.context)
        index_dtype = np.int64 if "const long n" in source else np.int32
        dtypes = [None if s is not None else np.float32 for s in self.input_shapes]
        dtypes += [None] * (int(has_gout) + n_out) + [index_dtype]
        kernel = handle.kernel(name, dtypes)
        config = self.configs["backward" if has_gout else "forward"]
        local = config.local_size
        if work_items is None:
            gsize = opencl_source.global_size(
                self.size, self.shape, self.input_shapes, local, config.vector_width, config.items
            )
        else:
            gsize = max(local, -(-work_items // local) * local)
        return (kernel, gsize, local)

    def prepared(self, compiled) -> PreparedLaunch:
        """The launch of ``compiled`` with its element count (the last argument) bound once."""
        kernel, gsize, local = compiled
        return PreparedLaunch.binding(kernel, gsize, local, {kernel.num_args - 1: self.size})

    def direct_call(self, compiled):
        return self.prepared(compiled).call

    def run(self, compiled, values: list[Any], outs: list[Tensor], gout: Tensor | None) -> None:
        prepared = self._launches.get(id(compiled))  # a prepared launch per kernel: its element count is set once
        if prepared is None:
            prepared = self._launches[id(compiled)] = self.prepared(compiled)
        args = [v.data if isinstance(v, Tensor) else np.float32(v) for v in values]
        if gout is not None:
            args.append(gout.data)
        prepared.call(*args, *[o.data for o in outs])

    def empty(self) -> Tensor:
        device = self.device
        return results.tensor(device.allocator(device, self.nbytes), self.shape, _F32, device)

    def column_layout(self) -> ColumnLayout | None:
        if not self.configs["backward"].column_sums:
            return None
        layout = column_layout(self.input_shapes, self.shape, self.configs["backward"].vector_width)
        return None if layout is None else layout.with_groups(column_groups(self.device, layout.vectors))

    def column_source(self, name: str, body, layout: ColumnLayout, columns: list[bool]) -> str:
        vector_body = self.configs["backward"].vector_body
        return column_kernel_source(name, self.input_shapes, self.shape, layout, body, columns, vector_body)


class NumpyFusedKernels(FusedKernels):
    """Generated NumPy functions (``numpy_source``) run on the host arrays."""

    def source(self, name: str, body, has_gout: bool) -> str:
        return numpy_source.function_source(name, self.input_shapes, self.shape, body, has_gout)

    def build(self, name: str, source: str, n_out: int, has_gout: bool, work_items: int | None = None):
        return numpy_source.compile_function(name, source)

    def run(self, compiled, values: list[Any], outs: list[Tensor], gout: Tensor | None) -> None:
        ins = [v.data if isinstance(v, Tensor) else np.float32(v) for v in values]
        compiled(ins, [o.data for o in outs], gout.data if gout is not None else None)

    def empty(self) -> Tensor:
        return Tensor(np.empty(self.shape, _F32), self.shape, _F32, self.device)


def fused_kernels(device: Device, label: str, input_shapes: Shapes, shape: tuple[int, ...]) -> FusedKernels:
    """The backend for ``device``: OpenCL kernels on an OpenCL device, NumPy functions otherwise."""
    kind = OpenCLFusedKernels if device.kind == "opencl" else NumpyFusedKernels
    return kind(device, label, input_shapes, shape)
