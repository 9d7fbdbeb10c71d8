"""The backend of a ``RowStep``, chosen once when the step is built: OpenCL row kernels or NumPy functions.

``OpenCLRowKernels`` generates OpenCL C, builds it through the runtime's program cache and launches
one work-group per row on GPUs (``row_source``) or one work-item per row on CPU devices (``row_serial``;
``jit_row_mode``), or per ``rows_per_group`` rows where a kernel sums per-column gradients itself,
leaving per-group partial sums. ``NumpyRowKernels`` generates and runs Python functions (``row_numpy``)
on the host arrays; its column gradients come whole.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import numpy as np

from netcl.core import Device, Tensor
from netcl.jit import row_numpy, row_serial, row_source
from netcl.jit.row_ir import PARAM, RowInput, RowProgram
from netcl.runtime import results
from netcl.runtime.cache import program_cache
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops.rowwise import row_mode

_F32 = np.dtype(np.float32)
#: Work-items (rows) per work-group of the serial row kernels.
SERIAL_LOCAL = 8


def jit_row_mode(device: Device) -> str:
    """The runtime row kernels' mode on ``device`` (``rowwise.row_mode``: "serial", a work-item a row, on CPU
    devices; "group" on GPUs), or ``NETCL_ROW_MODE`` ("group" / "serial") where set (tests, tuning)."""
    mode = os.environ.get("NETCL_ROW_MODE", "").strip()
    if mode and mode not in ("group", "serial"):
        raise ValueError(f"NETCL_ROW_MODE must be 'group' or 'serial', got {mode!r}")
    return mode or row_mode(device)


class RowKernels:
    """Builds and runs the row programs of one row group (``rows`` rows of ``C`` values) on ``device``."""

    def __init__(self, device: Device, label: str, rows: int, row_length: int) -> None:
        self.device = device
        self.label = label
        self.rows = rows
        self.C = row_length

    def build(self, name: str, program: RowProgram, column_sums: frozenset[int] = frozenset()) -> tuple[str, Any]:
        """(source, runnable form) of ``program``; ``column_sums``: outputs the kernel may sum over rows."""
        raise NotImplementedError

    def run(self, compiled: Any, program_inputs: list[RowInput], values: list[Any], outs: list[Tensor]) -> None:
        """Run ``compiled`` on the values of ``program_inputs`` (Tensors or numbers), writing ``outs``."""
        raise NotImplementedError

    def empty(self, shape: tuple[int, ...]) -> Tensor:
        """A new float32 tensor of ``shape`` (straight from the device's allocator)."""
        raise NotImplementedError

    def partial_groups(self, compiled: Any) -> int:
        """How many per-group partial sums ``compiled`` leaves for a column gradient; 0 when it sums all rows."""
        return 0


class CompiledRowKernel(NamedTuple):
    """An OpenCL row kernel ready to run: its launch (per call the inputs' and outputs' buffers and the parameters)
    and the work-groups or work-items that leave partial column sums (the row count where none do)."""

    launch: PreparedLaunch
    partial: int


class OpenCLRowKernels(RowKernels):
    """OpenCL row kernels built through ``program_cache``: a work-group a row (group mode) or a work-item a row."""

    def __init__(self, device: Device, label: str, rows: int, row_length: int, rows_per_group: int) -> None:
        super().__init__(device, label, rows, row_length)
        #: rows a backward work-group takes when it sums a per-column gradient
        self.rows_per_group = rows_per_group

    def build(self, name: str, program: RowProgram, column_sums: frozenset[int] = frozenset()) -> tuple[str, Any]:
        """(source, its ``CompiledRowKernel``)."""
        if jit_row_mode(self.device) == "serial":
            return self._build_serial(name, program, column_sums)
        cl_device = self.device.cl_device
        config = row_source.row_config(self.C, self.device.is_gpu, int(cl_device.max_work_group_size))
        long_index = row_source.needs_long(self.rows, self.C)
        per_group = self.rows_per_group if column_sums else 1
        online = self.device.is_gpu
        vector = not self.device.is_gpu and os.environ.get("NETCL_ROW_VECTOR_BODY", "1").strip() not in ("0", "")
        source = row_source.kernel_source(
            name, program, config, long_index, column_sums, per_group, online, vector_body=vector
        )
        kernel = self._kernel(name, program, source, long_index)
        groups = -(-self.rows // per_group)
        return source, self._compiled(kernel, groups * config.local, config.local, groups)

    def _build_serial(self, name: str, program: RowProgram, column_sums: frozenset[int]) -> tuple[str, Any]:
        """A work-item a row (``row_serial``), or ``rows_per_group`` rows where it sums per-column gradients."""
        long_index = row_source.needs_long(self.rows, self.C)
        per_item = self.rows_per_group if column_sums else 1
        vw = row_serial.vector_width(self.C, self.device.vector_width)
        source = row_serial.serial_kernel_source(name, program, vw, long_index, column_sums, per_item)
        kernel = self._kernel(name, program, source, long_index)
        items = -(-self.rows // per_item)
        local = max(1, min(SERIAL_LOCAL, items))
        return source, self._compiled(kernel, -(-items // local) * local, local, items)

    def _compiled(self, kernel: Any, global_size: int, local: int, partial: int) -> CompiledRowKernel:
        """``kernel``'s launch over ``global_size`` work-items in groups of ``local``, the row count (its last
        argument) bound."""
        prepared = PreparedLaunch.binding(kernel, global_size, local, {kernel.num_args - 1: self.rows})
        return CompiledRowKernel(prepared, partial)

    def _kernel(self, name: str, program: RowProgram, source: str, long_index: bool) -> Any:
        handle = program_cache.get_or_compile(("jit", self.label), source, self.device.context)
        dtypes = [np.float32 if i.kind == PARAM else None for i in program.inputs]
        dtypes += [None] * len(program.outputs) + [np.int64 if long_index else np.int32]
        return handle.kernel(name, dtypes)

    def run(self, compiled, program_inputs: list[RowInput], values: list[Any], outs: list[Tensor]) -> None:
        # a strided view among the inputs is read through its gathered copy (a kernel reads C-contiguous buffers);
        # numbers go to their declared float32 arguments
        args = [v.contiguous().data if isinstance(v, Tensor) else v for v in values]
        compiled.launch.call(*args, *[o.data for o in outs])

    def empty(self, shape: tuple[int, ...]) -> Tensor:
        device = self.device
        return results.tensor(device.allocator(device, max(1, math.prod(shape)) * 4), shape, _F32, device)

    def partial_groups(self, compiled) -> int:
        groups = compiled.partial
        return groups if groups != self.rows else 0


class NumpyRowKernels(RowKernels):
    """Generated NumPy functions (``row_numpy``) run on the host arrays, all rows at once."""

    def build(self, name: str, program: RowProgram, column_sums: frozenset[int] = frozenset()) -> tuple[str, Any]:
        fn = row_numpy.compile_function(name, program)
        return fn.source, fn

    def run(self, compiled, program_inputs: list[RowInput], values: list[Any], outs: list[Tensor]) -> None:
        arrays = [v.data if isinstance(v, Tensor) else v for v in values]
        ins = row_numpy.shaped_inputs_for(program_inputs, arrays, self.rows, self.C)
        views = [o.data.reshape(self.rows, -1) for o in outs]
        compiled(ins, views, self.rows)

    def empty(self, shape: tuple[int, ...]) -> Tensor:
        return Tensor(np.empty(shape, _F32), shape, _F32, self.device)


def row_kernels(device: Device, label: str, rows: int, row_length: int, rows_per_group: int) -> RowKernels:
    """The backend for ``device``: OpenCL row kernels on an OpenCL device, NumPy functions otherwise."""
    if device.kind == "opencl":
        return OpenCLRowKernels(device, label, rows, row_length, rows_per_group)
    return NumpyRowKernels(device, label, rows, row_length)
