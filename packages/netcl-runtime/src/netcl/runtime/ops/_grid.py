"""Launch plumbing shared by the shape-generic layer kernels (strided copies, indexing, conv, pool).

Their sources are specialized only on the index type (``int``/``long``), the element types and,
for strided copies, the rank; every size, stride and count is a kernel argument, so a new batch
size or image size reuses the built program.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from netcl.core import Device, Tensor
from netcl.runtime.cache import register_cache
from netcl.runtime.launch import PreparedLaunch
from netcl.runtime.ops._common import get_kernel, index_ctype, pow2_ceil, remember, round_up  # noqa: F401 (index_ctype: re-exported)


def index_dtype(ctype: str) -> np.dtype:
    return np.dtype(np.int64 if ctype == "long" else np.int32)


#: prepared launches by (kernel key, device, global size, local size)
_PREPARED: dict[tuple, PreparedLaunch] = {}
register_cache(_PREPARED.clear)


def launch_prepared(key: Hashable, device: Device, kernel: Any, gsize: Any, lsize: Any, args: Sequence[Any]) -> None:
    """Enqueue ``kernel`` (declared scalar dtypes) with ``args`` through one ``PreparedLaunch`` per key
    and sizes: generated code sets every argument per call, without ``launch``'s general checks and
    conversions (see benchmarks/RESULTS.md, "Measurements moved out of source docstrings", _grid.py)."""
    prepared_for(key, device, kernel, gsize, lsize).call(*[a.data if isinstance(a, Tensor) else a for a in args])


def prepared_for(key: Hashable, device: Device, kernel: Any, gsize: Any, lsize: Any) -> PreparedLaunch:
    """The ``PreparedLaunch`` ``launch_prepared`` goes through (nothing bound: ``call`` takes every argument,
    raw ``cl.Buffer``s and numbers), for a caller that keeps it in a plan of its own."""
    size = (key, device, gsize, lsize)
    prepared = _PREPARED.get(size)
    if prepared is None:
        prepared = remember(_PREPARED, size, PreparedLaunch.binding(kernel, gsize, lsize, {}, device.queue))
    return prepared


def run_1d(
    key: Hashable,
    device: Device,
    make_source: Callable[[], str],
    name: str,
    arg_types: Sequence[Any],
    n: int,
    *args: Any,
) -> None:
    """Launch kernel ``name`` (built from ``make_source`` once per ``key``) over ``n`` work-items."""
    if n <= 0:
        return
    prepared = prepare_1d(key, device, make_source, name, arg_types, n)
    prepared.call(*[a.data if isinstance(a, Tensor) else a for a in args])


def prepare_1d(
    key: Hashable, device: Device, make_source: Callable[[], str], name: str, arg_types: Sequence[Any], n: int
) -> PreparedLaunch:
    """The launch ``run_1d`` makes over ``n`` > 0 work-items (nothing bound), for a caller's plan."""
    full = ("layers", *key) if isinstance(key, tuple) else ("layers", key)
    resolved = get_kernel(full, device, make_source, name, arg_types)
    local = resolved.max_local
    return prepared_for(full, device, resolved.kernel, round_up(n, local), local)


def run_rows(
    key: Hashable,
    device: Device,
    make_source: Callable[[], str],
    name: str,
    arg_types: Sequence[Any],
    shape: tuple[int, int, int],
    *args: Any,
) -> None:
    """Launch kernel ``name`` on a 3-D grid covering ``shape`` = (columns, rows, planes).

    Work-groups are one row of up to 256 columns, so values that depend only on the row and plane
    (``get_global_id(1)``, ``get_global_id(2)``) are uniform within a group; the kernel must
    return for ``get_global_id(0) >= columns``.
    """
    if min(shape) <= 0:
        return
    full = ("layers", *key) if isinstance(key, tuple) else ("layers", key)
    resolved = get_kernel(full, device, make_source, name, arg_types)
    local = min(resolved.max_local, pow2_ceil(shape[0]))
    gsize = (round_up(shape[0], local), shape[1], shape[2])
    launch_prepared(full, device, resolved.kernel, gsize, (local, 1, 1), args)


def params(ctype: str, names: Sequence[str]) -> str:
    """``const <ctype> a, const <ctype> b, ...`` for a kernel's scalar parameters."""
    return ", ".join(f"const {ctype} {name}" for name in names)


def scalars(ctype: str, values: Sequence[int]) -> list[Any]:
    """The values as NumPy scalars of the kernel's index type."""
    dtype = index_dtype(ctype)
    return [dtype.type(int(v)) for v in values]


def prod(values: Sequence[int]) -> int:
    return math.prod(int(v) for v in values)
