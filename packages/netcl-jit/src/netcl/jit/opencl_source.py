"""Render fused bodies into one OpenCL kernel with the shared skeleton.

Same-shape inputs take the vector path: each work-item handles ``VECTOR_WIDTH`` elements
with ``vload``/``vstore`` and a scalar tail. Broadcast inputs read through core's
``broadcast_index_lines``. Indices are 64-bit when any buffer has 2**31 elements or more.
"""

from __future__ import annotations

import math

from netcl.core import broadcast_index_lines, needs_64bit_index
from netcl.core.kernels import PRIMITIVE_PREAMBLE
from netcl.jit.codegen import Body

VECTOR_WIDTH = 4


def kernel_source(
    name: str,
    input_shapes: list[tuple[int, ...] | None],
    out_shape: tuple[int, ...],
    body: Body,
    extra_inputs: int = 0,
    vector_width: int = VECTOR_WIDTH,
) -> str:
    """A complete program: preamble plus ``__kernel void name(...)``.

    ``input_shapes[k]`` is the shape of tensor input ``k``, or None for a scalar parameter.
    ``extra_inputs`` more same-shape tensor inputs follow (the backward's upstream gradient,
    read into ``gout``). Results are written to ``out0``, ``out1``, ... of ``out_shape``.
    """
    index_type = "long" if needs_64bit_index(out_shape, *(s for s in input_shapes if s)) else "int"
    params = []
    for k, shape in enumerate(input_shapes):
        params.append(f"__global const float* restrict in{k}" if shape is not None else f"const float p{k}")
    params += [f"__global const float* restrict gin_buf{j}" for j in range(extra_inputs)]
    params += [f"__global float* restrict out{j}" for j in range(len(body.results))]
    params.append(f"const {index_type} n")
    same_shape = all(s is None or math.prod(s) == math.prod(out_shape) for s in input_shapes)
    vectorize = same_shape and vector_width > 1
    header = f"__kernel void {name}(\n    " + ",\n    ".join(params) + "\n) {\n"
    if vectorize:
        code = _vector_kernel(input_shapes, body, extra_inputs, index_type, vector_width)
    else:
        code = _scalar_kernel(input_shapes, out_shape, body, extra_inputs, index_type)
    return PRIMITIVE_PREAMBLE + "\n" + header + code + "}\n"


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


def _vector_kernel(input_shapes, body: Body, extra_inputs: int, index_type: str, width: int) -> str:
    lanes = [f"s{lane:x}" for lane in range(width)]
    lines = [
        f"    {index_type} v = get_global_id(0);",
        f"    {index_type} first = v * {width};",
        "    if (first >= n) return;",
        f"    if (first + {width} <= n) {{",
    ]
    for k, shape in enumerate(input_shapes):
        if shape is not None:
            lines.append(f"        float{width} a{k} = vload{width}(v, in{k});")
    if extra_inputs:
        lines.append(f"        float{width} ag = vload{width}(v, gin_buf0);")
    lines += [f"        float{width} r{j};" for j in range(len(body.results))]
    for lane in lanes:
        lines.append("        {")

        def read(k, lane=lane):
            return f"ag.{lane}" if k == "g" else f"a{k}.{lane}"

        def write(j, var, lane=lane):
            return f"r{j}.{lane} = {var};"

        lines += _scalar_element(input_shapes, body, extra_inputs, read, write, "            ")
        lines.append("        }")
    lines += [f"        vstore{width}(r{j}, v, out{j});" for j in range(len(body.results))]
    lines.append("    } else {")
    lines.append(f"        for ({index_type} i = first; i < n; ++i) {{")

    def read_tail(k):
        return "gin_buf0[i]" if k == "g" else f"in{k}[i]"

    def write_tail(j, var):
        return f"out{j}[i] = {var};"

    lines += _scalar_element(input_shapes, body, extra_inputs, read_tail, write_tail, "            ")
    lines += ["        }", "    }"]
    return "\n".join(lines) + "\n"


def global_size(n: int, out_shape: tuple[int, ...], input_shapes, local_size: int, vector_width: int = VECTOR_WIDTH):
    """Global work size for ``n`` elements, rounded up to ``local_size``."""
    same_shape = all(s is None or math.prod(s) == math.prod(out_shape) for s in input_shapes)
    items = -(-n // vector_width) if same_shape and vector_width > 1 else n
    return max(local_size, -(-items // local_size) * local_size)
