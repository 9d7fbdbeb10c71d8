"""Render fused bodies into one OpenCL kernel with the shared skeleton.

Same-shape inputs take the vector path: each work-item handles ``VECTOR_WIDTH`` elements
with ``vload``/``vstore`` and a scalar tail. Broadcast inputs read through core's
``broadcast_index_lines``. Indices are 64-bit when any buffer has 2**31 elements or more.
"""

from __future__ import annotations

import math

from netcl.core import broadcast_index_lines
from netcl.core.kernels import PRIMITIVE_PREAMBLE
from netcl.core.kernels.vector_primitives import vector_preamble, vectorize
from netcl.jit.codegen import Body
from netcl.jit.primitive_registry import custom_preamble
from netcl.runtime.ops._common import index_ctype

VECTOR_WIDTH = 4


def kernel_source(
    name: str,
    input_shapes: list[tuple[int, ...] | None],
    out_shape: tuple[int, ...],
    body: Body,
    extra_inputs: int = 0,
    vector_width: int = VECTOR_WIDTH,
    items: int = 1,
    vector_body: bool = False,
) -> str:
    """A complete program: preamble plus ``__kernel void name(...)``.

    ``input_shapes[k]`` is the shape of tensor input ``k``, or None for a scalar parameter.
    ``extra_inputs`` more same-shape tensor inputs follow (the backward's upstream gradient,
    read into ``gout``). Results are written to ``out0``, ``out1``, ... of ``out_shape``.
    ``vector_body``: on the vector paths, evaluate the body once on ``float{vector_width}``
    values (``vector_primitives``) instead of once per lane, when every expression allows it.
    """
    index_type = "long" if needs_long_index(out_shape, input_shapes, vector_width, items) else "int"
    params = []
    for k, shape in enumerate(input_shapes):
        params.append(f"__global const float* restrict in{k}" if shape is not None else f"const float p{k}")
    params += [f"__global const float* restrict gin_buf{j}" for j in range(extra_inputs)]
    params += [f"__global float* restrict out{j}" for j in range(len(body.results))]
    params.append(f"const {index_type} n")
    modes = vector_modes(input_shapes, out_shape, vector_width)
    header = f"__kernel void {name}(\n    " + ",\n    ".join(params) + "\n) {\n"
    vector = vector_body and modes is not None and vector_width > 1 and vectorizable(body)
    if modes is not None and all(m in ("same", "param") for m in modes):
        code = _vector_kernel(input_shapes, body, extra_inputs, index_type, vector_width, items, vector)
    elif modes is not None:
        code = _broadcast_vector_kernel(
            input_shapes, out_shape, modes, body, extra_inputs, index_type, vector_width, vector
        )
    else:
        code = _scalar_kernel(input_shapes, out_shape, body, extra_inputs, index_type)
    preamble = PRIMITIVE_PREAMBLE + (vector_preamble(vector_width) if vector else "")
    return preamble + "\n" + custom_preamble() + header + code + "}\n"


def vectorizable(body: Body) -> bool:
    """Whether every expression of ``body`` has a ``floatN`` form (built-in helpers and operators only)."""
    return all(vectorize(expr) is not None for _, expr in body.lines)


#: Largest work-group a fused kernel is launched with (PoCL allows 4096).
MAX_LOCAL_SIZE = 4096


def needs_long_index(out_shape: tuple[int, ...], input_shapes, vector_width: int = 1, items: int = 1) -> bool:
    """64-bit indices when a buffer has 2**31 elements, or when the grid, rounded up to whole
    work-groups, forms an index (``get_global_id``, ``v * width``) past 2**31 - 1."""
    padding = MAX_LOCAL_SIZE * max(vector_width, 1) * max(items, 1)
    counts = [math.prod(s) for s in (out_shape, *(s for s in input_shapes if s))]
    return index_ctype(*counts, math.prod(out_shape) + padding, headroom=0) == "long"


def vector_modes(input_shapes, out_shape: tuple[int, ...], width: int) -> list[str] | None:
    """How each input is read by a work-item of ``width`` elements, or None for the scalar path.

    "same": the input has the output's layout; "lanes": broadcast, but contiguous along the
    last dim (a vload at the first lane's index); "splat": broadcast along the last dim (one
    value for all lanes); "param": a scalar kernel argument.
    """
    if width <= 1:
        return None
    total = math.prod(out_shape)
    modes = []
    for shape in input_shapes:
        if shape is None:
            modes.append("param")
        elif math.prod(shape) == total:
            modes.append("same")
        elif not out_shape or out_shape[-1] % width:
            return None
        elif shape and shape[-1] == out_shape[-1]:
            modes.append("lanes")
        else:
            modes.append("splat")
    return modes


def _statements(body: Body, indent: str) -> list[str]:
    return [f"{indent}float {var} = {expr};" for var, expr in body.lines]


def _scalar_element(input_shapes, body: Body, extra_inputs: int, read, write, indent: str) -> list[str]:
    lines = []
    for k, shape in enumerate(input_shapes):
        lines.append(f"{indent}float x{k} = {read(k) if shape is not None else f'p{k}'};")
    if extra_inputs:
        lines.append(f"{indent}float gout = {read('g')};")
    lines += _statements(body, indent)
    lines += [f"{indent}{write(j, var)}" for j, var in enumerate(body.results)]
    return lines


def _scalar_kernel(input_shapes, out_shape, body: Body, extra_inputs: int, index_type: str) -> str:
    lines = [f"    {index_type} i = get_global_id(0);", "    if (i >= n) return;"]
    for k, shape in enumerate(input_shapes):
        if shape is not None:
            lines += ["    " + s for s in broadcast_index_lines(shape, out_shape, "i", f"i{k}", index_type)]

    def read(k):
        return "gin_buf0[i]" if k == "g" else f"in{k}[i{k}]"

    def write(j, var):
        return f"out{j}[i] = {var};"

    lines += _scalar_element(input_shapes, body, extra_inputs, read, write, "    ")
    return "\n".join(lines) + "\n"


def _vector_kernel(
    input_shapes, body: Body, extra_inputs: int, index_type: str, width: int, items: int = 1, vector: bool = False
) -> str:
    """``items`` vectors of ``width`` elements per work-item, strided by the grid (coalesced)."""
    lines = [
        f"    {index_type} stride = get_global_size(0);",
        f"    for (int item = 0; item < {items}; ++item) {{",
        f"    {index_type} v = get_global_id(0) + item * stride;",
        f"    {index_type} first = v * {width};",
        "    if (first >= n) return;",
        f"    if (first + {width} <= n) {{",
    ]
    for k, shape in enumerate(input_shapes):
        if shape is not None:
            lines.append(f"        float{width} a{k} = vload{width}(v, in{k});")
    if extra_inputs:
        lines.append(f"        float{width} ag = vload{width}(v, gin_buf0);")
    lines += vector_lanes(input_shapes, body, extra_inputs, width, "        ", vector)
    lines.append("    } else {")
    if vector:  # the tail on zero-padded vectors: no scalar helpers in the kernel (10% on Debian's PoCL)
        lines += _vector_tail(input_shapes, body, extra_inputs, index_type, width)
        lines += ["    }", "    }"]
        return "\n".join(lines) + "\n"
    lines.append(f"        for ({index_type} i = first; i < n; ++i) {{")

    def read_tail(k):
        return "gin_buf0[i]" if k == "g" else f"in{k}[i]"

    def write_tail(j, var):
        return f"out{j}[i] = {var};"

    lines += _scalar_element(input_shapes, body, extra_inputs, read_tail, write_tail, "            ")
    lines += ["        }", "    }", "    }"]
    return "\n".join(lines) + "\n"


def _vector_tail(input_shapes, body: Body, extra_inputs: int, index_type: str, width: int) -> list[str]:
    """The last ``n - first < width`` elements: inputs copied into zero-padded vectors, the body on
    ``VF`` values, then only the lanes below ``n`` stored."""
    indent = "        "
    lines = []
    sources = [(f"a{k}", f"in{k}") for k, shape in enumerate(input_shapes) if shape is not None]
    sources += [("ag", "gin_buf0")] if extra_inputs else []
    for name, buffer in sources:
        lines.append(f"{indent}float {name}_t[{width}];")
        lines.append(
            f"{indent}for (int j = 0; j < {width}; ++j) {name}_t[j] = first + j < n ? {buffer}[first + j] : 0.0f;"
        )
        lines.append(f"{indent}VF {name} = vload{width}(0, {name}_t);")
    body_lines = vector_lanes(input_shapes, body, extra_inputs, width, indent, True)
    stores = [line for line in body_lines if line.lstrip().startswith("vstore")]
    lines += [line for line in body_lines if line not in stores]
    for j, var in enumerate(body.results):
        lines.append(f"{indent}float r{j}_t[{width}];")
        lines.append(f"{indent}vstore{width}({var}, 0, r{j}_t);")
        lines.append(f"{indent}for ({index_type} i = first; i < n; ++i) out{j}[i] = r{j}_t[i - first];")
    return lines


def _broadcast_vector_kernel(
    input_shapes, out_shape, modes, body: Body, extra_inputs: int, index_type: str, width: int, vector: bool = False
):
    """``width`` consecutive outputs per work-item, which share one row of every broadcast input."""
    lines = [
        f"    {index_type} v = get_global_id(0);",
        f"    {index_type} first = v * {width};",
        "    if (first >= n) return;",
    ]
    for k, (shape, mode) in enumerate(zip(input_shapes, modes, strict=True)):
        if mode == "same":
            lines.append(f"    float{width} a{k} = vload{width}(v, in{k});")
        elif mode == "lanes":
            lines += ["    " + s for s in broadcast_index_lines(shape, out_shape, "first", f"i{k}", index_type)]
            lines.append(f"    float{width} a{k} = vload{width}(0, in{k} + i{k});")
        elif mode == "splat":
            lines += ["    " + s for s in broadcast_index_lines(shape, out_shape, "first", f"i{k}", index_type)]
            lines.append(f"    float{width} a{k} = (float{width})(in{k}[i{k}]);")
    if extra_inputs:
        lines.append(f"    float{width} ag = vload{width}(v, gin_buf0);")
    lines += vector_lanes(input_shapes, body, extra_inputs, width, "    ", vector)
    return "\n".join(lines) + "\n"


def vector_lanes(
    input_shapes, body: Body, extra_inputs: int, width: int, indent: str, vector: bool, store=None
) -> list[str]:
    """The element body on the loaded vectors ``a{k}``/``ag``: once on ``VF`` values (``vector``), else
    once per lane; each result vector handed to ``store(j, value)`` (default: ``vstore`` at vector ``v``)."""
    if store is None:

        def store(j, value):
            return f"vstore{width}({value}, v, out{j});"

    if vector:
        lines = [
            f"{indent}VF x{k} = {f'a{k}' if shape is not None else f'(VF)(p{k})'};"
            for k, shape in enumerate(input_shapes)
        ]
        if extra_inputs:
            lines.append(f"{indent}VF gout = ag;")
        lines += [f"{indent}VF {var} = {vectorize(expr)};" for var, expr in body.lines]
        lines += [f"{indent}{store(j, var)}" for j, var in enumerate(body.results)]
        return lines
    lines = [f"{indent}float{width} r{j};" for j in range(len(body.results))]
    for lane in (f"s{lane:x}" for lane in range(width)):
        lines.append(indent + "{")

        def read(k, lane=lane):
            return f"ag.{lane}" if k == "g" else f"a{k}.{lane}"

        def write(j, var, lane=lane):
            return f"r{j}.{lane} = {var};"

        lines += _scalar_element(input_shapes, body, extra_inputs, read, write, indent + "    ")
        lines.append(indent + "}")
    lines += [f"{indent}{store(j, f'r{j}')}" for j in range(len(body.results))]
    return lines


def global_size(
    n: int, out_shape: tuple[int, ...], input_shapes, local_size: int, vector_width: int = VECTOR_WIDTH, items: int = 1
) -> int:
    """Global work size for ``n`` elements, rounded up to ``local_size``."""
    modes = vector_modes(input_shapes, out_shape, vector_width)
    if modes is None:
        work = n
    elif all(m in ("same", "param") for m in modes):
        work = -(-n // (vector_width * items))
    else:
        work = -(-n // vector_width)
    return max(local_size, -(-work // local_size) * local_size)
